/**
 * jupyter-gpushare in JupyterLab: a status bar item (own GPU memory and compute against the
 * grant), a GPU side panel (loaded when first shown), preemption notifications with a
 * countdown, and the watchdog's messages in the notebook that caused them.
 */
import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, ToolbarButton } from '@jupyterlab/apputils';
import { IDefaultFileBrowser } from '@jupyterlab/filebrowser';
import { ILauncher } from '@jupyterlab/launcher';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { ITranslator } from '@jupyterlab/translation';
import { Widget } from '@lumino/widgets';

// the styles travel in this chunk: one request less at start than a separate style module
import '../style/base.css';
import { HostMetrics } from './host';
import { setTranslator, trans } from './i18n';
import { gpuIcon, jobsIcon } from './icon';
import { openOutputOf } from './jobactions';
import { IJob } from './jobsapi';
import { JobWatcher } from './jobwatch';
import { NoticeBoard } from './notices';
import { GPUStatusItem } from './statusbar';
import { Settings } from './settings';
import { MetricsStream } from './stream';
import { showWatchdog } from './watchdog';

export const PANEL_ID = 'jp-gpushare-panel';
export const JOBS_ID = 'jp-gpushare-jobs';

export namespace CommandIDs {
  export const openPanel = 'gpushare:open-panel';
  export const openJobs = 'gpushare:open-jobs';
  export const submit = 'gpushare:submit-job';
  export const submitFromBrowser = 'gpushare:submit-job-from-file-browser';
  export const switchHardware = 'gpushare:switch-hardware';
  export const jobHistory = 'gpushare:job-history';
}

interface IPanelContent {
  shown(): Promise<void>;
  hidden(): void;
}

/** The side panel's shell; the content (charts included) is a lazily loaded chunk. */
class PanelHost extends Widget {
  constructor(
    id: string,
    label: string,
    caption: string,
    private readonly load: () => Promise<IPanelContent>
  ) {
    super();
    this.id = id;
    this.title.caption = caption;
    this.title.label = label;
    this.addClass('jp-gpushare-panel-host');
  }

  protected onAfterShow(): void {
    void this.content().then(c => c.shown());
  }

  protected onAfterHide(): void {
    void this._content?.then(c => c.hidden());
  }

  private content(): Promise<IPanelContent> {
    if (!this._content) {
      this._content = this.load();
    }
    return this._content;
  }

  private _content: Promise<IPanelContent> | null = null;
}

export const PLUGIN_ID = 'jupyter-gpushare:plugin';

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'GPU use against your own limit, preemption countdown and GPU panel.',
  autoStart: true,
  optional: [
    IStatusBar,
    ILabShell,
    INotebookTracker,
    ICommandPalette,
    IDefaultFileBrowser,
    ISettingRegistry,
    ITranslator,
    ILauncher
  ],
  activate: (
    app: JupyterFrontEnd,
    statusBar: IStatusBar | null,
    labShell: ILabShell | null,
    notebooks: INotebookTracker | null,
    palette: ICommandPalette | null,
    fileBrowser: IDefaultFileBrowser | null,
    registry: ISettingRegistry | null,
    translator: ITranslator | null,
    launcher: ILauncher | null
  ) => {
    setTranslator(translator);
    const t = trans();
    const settings = new Settings();
    void settings.follow(registry, PLUGIN_ID);
    const hostMetrics = new HostMetrics(() => settings.refreshMs);
    const activate = (id: string) => {
      if (labShell) {
        labShell.activateById(id);
      } else {
        app.shell.activateById(id);
      }
    };
    const openOutput = (path: string) => void app.commands.execute('docmanager:open', { path });
    const openJobOutput = (job: IJob) =>
      void openOutputOf(job, openOutput, () => activate(JOBS_ID)).catch(e => console.error(e));
    const watcher = new JobWatcher(openJobOutput, () => activate(JOBS_ID));
    const submit = async (path: string | null | undefined) => {
      if (!path) {
        return;
      }
      const mod = await import('./submit');
      const res = await mod.submitNotebook(path, (job: IJob) => watcher.track(job));
      if (res.job) {
        activate(JOBS_ID);
      }
    };
    const currentNotebook = (): string | null => notebooks?.currentWidget?.context.path ?? null;
    const stream = new MetricsStream();
    const notices = new NoticeBoard({
      save: () => void app.commands.execute('docmanager:save-all'),
      submitAsJob: () => void submit(currentNotebook())
    });
    stream.notice.connect((_, n) => notices.add(n));
    stream.sample.connect((_, s) => hostMetrics.onSample(s));
    stream.watchdog.connect((_, ev) => showWatchdog(notebooks, ev));

    const host: PanelHost = new PanelHost(
      PANEL_ID,
      'GPU',
      t.__('GPU use of this server'),
      async (): Promise<IPanelContent> => {
        const mod = await import('./panel');
        return new mod.GPUPanelContent(host.node, {
          stream,
          notices,
          settings,
          host: hostMetrics,
          switchHardware: () => void app.commands.execute(CommandIDs.switchHardware)
        });
      }
    );
    host.title.icon = gpuIcon;
    app.shell.add(host, 'right', { rank: 900 });
    const jobsHost: PanelHost = new PanelHost(
      JOBS_ID,
      t.__('Jobs'),
      t.__('Your GPU batch jobs'),
      async (): Promise<IPanelContent> => {
        const mod = await import('./jobs');
        return new mod.JobsPanelContent(jobsHost.node, { watcher, openOutput, settings });
      }
    );
    jobsHost.title.icon = jobsIcon;
    app.shell.add(jobsHost, 'right', { rank: 901 });

    app.commands.addCommand(CommandIDs.openPanel, {
      label: t.__('Show GPU Panel'),
      caption: t.__('GPU memory and compute of this server against its grant'),
      execute: () => activate(PANEL_ID)
    });
    app.commands.addCommand(CommandIDs.openJobs, {
      label: args => (args.isLauncher ? t.__('GPU Jobs') : t.__('Show GPU Jobs')),
      icon: args => (args.isLauncher ? jobsIcon : undefined),
      caption: t.__('Your batch jobs: state, queue position, log, output'),
      execute: () => activate(JOBS_ID)
    });
    app.commands.addCommand(CommandIDs.submit, {
      label: t.__('Submit Notebook as Batch Job…'),
      caption: t.__('Run this notebook on a GPU in the batch queue (papermill) and get the executed notebook back'),
      icon: jobsIcon,
      isEnabled: () => !!currentNotebook(),
      execute: args => submit((args.path as string) || currentNotebook())
    });
    app.commands.addCommand(CommandIDs.submitFromBrowser, {
      label: t.__('Submit as Batch Job…'),
      icon: jobsIcon,
      execute: () => {
        const item = fileBrowser?.selectedItems().next();
        const model = item && !item.done ? item.value : null;
        return submit(model && model.type === 'notebook' ? model.path : null);
      }
    });
    app.contextMenu.addItem({
      command: CommandIDs.submitFromBrowser,
      selector: '.jp-DirListing-item[data-file-type="notebook"]',
      rank: 10
    });
    app.commands.addCommand(CommandIDs.switchHardware, {
      label: t.__('Switch Hardware (GPU Profile)…'),
      caption: t.__('Restart this server on another profile; your files are kept'),
      execute: async () => {
        const mod = await import('./switch');
        await mod.switchHardware(() => app.commands.execute('docmanager:save-all'));
      }
    });
    // the launcher tile: the job history, as jupyter-scheduler users find theirs
    launcher?.add({ command: CommandIDs.openJobs, category: t.__('GPU'), rank: 1, args: { isLauncher: true } });
    for (const command of [CommandIDs.openPanel, CommandIDs.openJobs, CommandIDs.submit, CommandIDs.switchHardware]) {
      palette?.addItem({ command, category: 'GPU' });
    }
    app.docRegistry.addWidgetExtension('Notebook', {
      createNew: (panel: NotebookPanel) => {
        const button = new ToolbarButton({
          icon: jobsIcon,
          label: t.__('Submit job'),
          tooltip: t.__('Submit this notebook as a GPU batch job'),
          className: 'jp-gpushare-submit-button',
          onClick: () => void submit(panel.context.path)
        });
        panel.toolbar.insertItem(10, 'gpushare-submit', button);
        return button;
      }
    });

    if (statusBar) {
      const item = new GPUStatusItem(() => void app.commands.execute(CommandIDs.openPanel), settings.current);
      stream.sample.connect((_, s) => item.update_(s));
      hostMetrics.changed.connect((_, h) => item.setHost(h));
      settings.changed.connect((_, c) => item.setSettings(c));
      notices.changed.connect((_, n) => item.setNotice(n));
      statusBar.registerStatusItem('jupyter-gpushare:status', {
        item,
        align: 'left',
        rank: 10
      });
    }
    // for benchmarks and browser tests: how many stream messages this tab received
    (window as unknown as Record<string, unknown>).__gpushare = { stream, notices, watcher, settings, host: hostMetrics };
    // nothing of ours competes with JupyterLab's own start-up requests
    void app.restored.then(() => {
      stream.start();
      watcher.start();
    });
  }
};

export default [plugin];
