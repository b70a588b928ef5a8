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
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Widget } from '@lumino/widgets';

import { gpuIcon } from './icon';
import { NoticeBoard } from './notices';
import { GPUStatusItem } from './statusbar';
import { MetricsStream } from './stream';
import { showWatchdog } from './watchdog';

export const PANEL_ID = 'jp-gpushare-panel';

export namespace CommandIDs {
  export const openPanel = 'gpushare:open-panel';
}

interface IPanelContent {
  shown(): Promise<void>;
  hidden(): void;
}

/** The side panel's shell; the content (charts included) is a lazily loaded chunk. */
class PanelHost extends Widget {
  constructor(private readonly load: () => Promise<IPanelContent>) {
    super();
    this.id = PANEL_ID;
    this.title.caption = 'GPU use of this server';
    this.title.label = 'GPU';
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

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-gpushare:plugin',
  description: 'GPU use against your own limit, preemption countdown and GPU panel.',
  autoStart: true,
  optional: [IStatusBar, ILabShell, INotebookTracker, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    statusBar: IStatusBar | null,
    labShell: ILabShell | null,
    notebooks: INotebookTracker | null,
    palette: ICommandPalette | null
  ) => {
    const stream = new MetricsStream();
    const notices = new NoticeBoard({
      save: () => void app.commands.execute('docmanager:save-all')
    });
    stream.notice.connect((_, n) => notices.add(n));
    stream.watchdog.connect((_, ev) => showWatchdog(notebooks, ev));

    const host: PanelHost = new PanelHost(async (): Promise<IPanelContent> => {
      const mod = await import('./panel');
      return new mod.GPUPanelContent(host.node, { stream, notices });
    });
    host.title.icon = gpuIcon;
    app.shell.add(host, 'right', { rank: 900 });

    app.commands.addCommand(CommandIDs.openPanel, {
      label: 'Show GPU Panel',
      caption: 'GPU memory and compute of this server against its grant',
      execute: () => {
        if (labShell) {
          labShell.activateById(PANEL_ID);
        } else {
          app.shell.activateById(PANEL_ID);
        }
      }
    });
    palette?.addItem({ command: CommandIDs.openPanel, category: 'GPU' });

    if (statusBar) {
      const item = new GPUStatusItem(() => void app.commands.execute(CommandIDs.openPanel));
      stream.sample.connect((_, s) => item.update_(s));
      notices.changed.connect((_, n) => item.setNotice(n));
      statusBar.registerStatusItem('jupyter-gpushare:status', {
        item,
        align: 'left',
        rank: 10
      });
    }
    // for benchmarks and browser tests: how many stream messages this tab received
    (window as unknown as Record<string, unknown>).__gpushare = { stream, notices };
    stream.start();
  }
};

export default [plugin];
