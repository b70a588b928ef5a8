/**
 * The jobs panel (loaded on first show): the job history with names, submit/start/end times
 * (local time), state, queue position, runtime, GPU-hours; sorting and filtering; a live log
 * that follows new lines; cancel (after a confirmation); open, download or write HTML of the
 * output notebook; delete a finished job; a failed job's error with the failing cell named.
 */
import {
  confirmCancel,
  deleteJob,
  deletedJobs,
  downloadOutput,
  fileExists,
  openOutputOf,
  writeHtml
} from './jobactions';
import { DEFAULT_QUERY, IJobQuery, SortKey, StateFilter, select } from './jobfilter';
import { JobLog } from './joblog';
import { trans } from './i18n';
import { IJob, TERMINAL, cancelJob, duration, errorSummary, jobStatusText, stripAnsi } from './jobsapi';
import { JobWatcher } from './jobwatch';
import { Settings } from './settings';
import { localFull, localTime } from './when';

export { xsrfCookie } from './joblog';

function h(tag: string, cls = '', text = ''): HTMLElement {
  const e = document.createElement(tag);
  if (cls) {
    e.className = cls;
  }
  if (text) {
    e.textContent = text;
  }
  return e;
}

function button(text: string, cls: string, action: string, onClick: () => void): HTMLButtonElement {
  const b = h('button', `jp-mod-styled ${cls}`.trim(), text) as HTMLButtonElement;
  b.dataset.action = action;
  b.addEventListener('click', onClick);
  return b;
}

export interface IJobsContext {
  watcher: JobWatcher;
  openOutput: (path: string) => void;
  settings?: Settings;
}

export class JobsPanelContent {
  constructor(
    readonly host: HTMLElement,
    private readonly ctx: IJobsContext
  ) {
    host.classList.add('jp-gpushare-jobs');
    const head = h('div', 'jp-gpushare-title');
    head.append(h('h2', '', trans().__('GPU jobs')));
    host.append(head, this.toolbar(), this._empty, this._list);
    ctx.watcher.changed.connect((_, jobs) => this.render(jobs), this);
  }

  async shown(): Promise<void> {
    this._visible = true;
    this.render(this.ctx.watcher.jobs);
    await this.ctx.watcher.refresh();
    this.schedule();
  }

  hidden(): void {
    this._visible = false;
    this.closeLog();
  }

  /** While the panel is shown, keep running times and positions fresh. */
  private schedule(): void {
    if (this._timer) {
      return;
    }
    this._timer = window.setTimeout(() => {
      this._timer = 0;
      if (this._visible && !document.hidden && this.ctx.watcher.jobs.some(j => !TERMINAL.has(j.state))) {
        void this.ctx.watcher.refresh();
      }
      this.schedule();
    }, this.ctx.settings?.refreshMs ?? 5000);
  }

  private toolbar(): HTMLElement {
    const t = trans();
    const bar = h('div', 'jp-gpushare-jobs-toolbar');
    const search = h('input', 'jp-mod-styled jp-gpushare-jobs-search') as HTMLInputElement;
    search.type = 'search';
    search.placeholder = t.__('Filter by name, profile or id');
    search.addEventListener('input', () => this.query({ text: search.value }));
    const state = h('select', 'jp-mod-styled jp-gpushare-jobs-state') as HTMLSelectElement;
    const states: [StateFilter, string][] = [
      ['all', t.__('All states')],
      ['active', t.__('Queued or running')],
      ['succeeded', t.__('Succeeded')],
      ['failed', t.__('Failed')],
      ['cancelled', t.__('Cancelled or lost')]
    ];
    for (const [v, label] of states) {
      const o = h('option', '', label) as HTMLOptionElement;
      o.value = v;
      state.append(o);
    }
    state.addEventListener('change', () => this.query({ state: state.value as StateFilter }));
    const sort = h('select', 'jp-mod-styled jp-gpushare-jobs-sort') as HTMLSelectElement;
    const sorts: [SortKey, string][] = [
      ['newest', t.__('Newest first')],
      ['oldest', t.__('Oldest first')],
      ['name', t.__('Name')],
      ['state', t.__('State')],
      ['gpu_hours', t.__('Most GPU-hours')]
    ];
    for (const [v, label] of sorts) {
      const o = h('option', '', label) as HTMLOptionElement;
      o.value = v;
      sort.append(o);
    }
    sort.addEventListener('change', () => this.query({ sort: sort.value as SortKey }));
    bar.append(search, state, sort);
    return bar;
  }

  private query(change: Partial<IJobQuery>): void {
    this._query = { ...this._query, ...change };
    this.render(this.ctx.watcher.jobs);
  }

  private render(all: IJob[]): void {
    const t = trans();
    const jobs = select(all, this._query, deletedJobs());
    this._empty.textContent = this.ctx.watcher.available
      ? jobs.length
        ? ''
        : all.length
          ? t.__('No job matches the filter.')
          : t.__('No batch jobs yet. Use "Submit as batch job" on a notebook (toolbar, file browser, or the command palette).')
      : t.__('Batch jobs need the gpushare broker: this server was not started by a hub with gpushare.');
    this._empty.hidden = !this._empty.textContent;
    const keep = new Set<string>();
    for (const j of jobs) {
      keep.add(j.id);
      let row = this._rows.get(j.id);
      if (!row) {
        row = h('div', 'jp-gpushare-job');
        row.dataset.jobId = j.id;
        this._rows.set(j.id, row);
      }
      this.fill(row, j);
      this._list.append(row);
    }
    for (const [id, row] of this._rows) {
      if (!keep.has(id)) {
        row.remove();
        this._rows.delete(id);
      }
    }
    this._log?.restore(); // moving the rows reset the log's scroll position
  }

  private times(j: IJob): HTMLElement {
    const t = trans();
    const box = h('div', 'jp-gpushare-job-times');
    const items: [string, string | null | undefined][] = [
      [t.__('submitted'), j.created_at],
      [t.__('started'), j.started_at],
      [t.__('ended'), j.ended_at]
    ];
    for (const [label, at] of items) {
      if (at) {
        const span = h('span', 'jp-gpushare-job-time', `${label} ${localTime(at)}`);
        span.title = localFull(at);
        span.dataset.what = label;
        box.append(span);
      }
    }
    return box;
  }

  private fill(row: HTMLElement, j: IJob): void {
    const t = trans();
    row.dataset.state = j.state;
    const head = h('div', 'jp-gpushare-job-head');
    head.append(h('span', 'jp-gpushare-job-name', j.name), h('span', 'jp-gpushare-badge', j.state));
    const facts = h(
      'div',
      'jp-gpushare-job-facts',
      [
        j.profile,
        j.priority,
        j.state === 'queued' && j.position ? t.__('position %1', j.position) : '',
        t.__('runtime %1', duration(j.runtime_s)),
        `${(j.gpu_hours ?? 0).toFixed(3)} GPU-h`,
        j.attempt > 1 ? t.__('attempt %1', j.attempt) : ''
      ]
        .filter(Boolean)
        .join(' · ')
    );
    const status = h('div', 'jp-gpushare-job-status', jobStatusText(j));
    const parts: HTMLElement[] = [head, this.times(j), facts, status];
    if (j.state === 'failed' && j.error) {
      parts.push(errorBox(j));
    }
    parts.push(this.buttons(j, status));
    if (this._log?.jobId === j.id) {
      parts.push(this._log.node);
    }
    row.replaceChildren(...parts);
  }

  private buttons(j: IJob, status: HTMLElement): HTMLElement {
    const t = trans();
    const box = h('div', 'jp-gpushare-job-buttons');
    const say = (e: unknown) => {
      status.textContent = (e as Error).message;
    };
    if (!TERMINAL.has(j.state)) {
      const cancel = button(t.__('Cancel'), 'jp-mod-warn', 'cancel', () => {
        void (async () => {
          const running = j.state === 'running' || j.state === 'admitted';
          if (running && !(await confirmCancel(j))) {
            return;
          }
          cancel.disabled = true;
          try {
            await cancelJob(j.id);
            await this.ctx.watcher.refresh();
          } catch (e) {
            status.textContent = t.__('Cancel refused: %1', (e as Error).message);
          }
        })();
      });
      box.append(cancel);
    }
    if (j.output_path && TERMINAL.has(j.state)) {
      const partial = j.state !== 'succeeded';
      const open = button(partial ? t.__('Open partial output') : t.__('Open output'), 'jp-mod-accept', 'open', () => {
        void openOutputOf(j, this.ctx.openOutput, () => this.openLog(j)).catch(say);
      });
      open.title = j.output_path;
      if (partial) {
        // offered only where the run wrote something (a failed or cancelled run may not have)
        open.hidden = true;
        const none = button(t.__('No output?'), '', 'no-output', () => {
          void openOutputOf(j, this.ctx.openOutput, () => this.openLog(j)).catch(say);
        });
        none.title = t.__('Why there is no output notebook');
        none.hidden = true;
        void this.outputThere(j).then(there => {
          open.hidden = !there;
          none.hidden = there;
          box.dataset.output = there ? 'yes' : 'no';
        });
        box.append(none);
      }
      box.append(open);
      if (j.state === 'succeeded') {
        box.append(
          button(t.__('Download'), '', 'download', () => void downloadOutput(j).catch(say)),
          button(t.__('HTML'), '', 'html', () => {
            void writeHtml(j)
              .then(p => this.ctx.openOutput(p))
              .catch(say);
          })
        );
      }
    }
    if (TERMINAL.has(j.state)) {
      box.append(
        button(t.__('Delete'), '', 'delete', () => {
          void deleteJob(j).then(gone => gone && this.render(this.ctx.watcher.jobs));
        })
      );
    }
    const showing = this._log?.jobId === j.id;
    box.append(
      button(showing ? t.__('Hide log') : t.__('Log'), '', 'log', () => (showing ? this.closeLog() : this.openLog(j)))
    );
    return box;
  }

  /** Whether a finished job's output notebook is in the user's files (asked once per job). */
  private outputThere(j: IJob): Promise<boolean> {
    const key = `${j.id}:${j.state}`;
    let known = this._exists.get(key);
    if (!known) {
      known = fileExists(j.output_path as string).catch(() => false);
      this._exists.set(key, known);
    }
    return known;
  }

  private openLog(j: IJob): void {
    this.closeLog();
    const log = new JobLog(j.id, {
      state: () => void this.ctx.watcher.refresh(),
      end: () =>
        void this.ctx.watcher.refresh().then(() => {
          // the log ends saying how the job ended (cancelled, failed, ...) and when
          const now = this.ctx.watcher.jobs.find(x => x.id === j.id);
          if (now && TERMINAL.has(now.state)) {
            const when = now.ended_at ? localTime(now.ended_at, true) : '';
            log.append(trans().__('\n[job %1 %2: %3]\n', now.state, when ? `at ${when}` : '', now.reason));
          }
        })
    });
    this._log = log;
    this.render(this.ctx.watcher.jobs);
  }

  private closeLog(): void {
    this._log?.close();
    this._log = null;
    this.render(this.ctx.watcher.jobs);
  }

  private _visible = false;
  private _timer = 0;
  private _query: IJobQuery = { ...DEFAULT_QUERY };
  private _rows = new Map<string, HTMLElement>();
  private _list = h('div', 'jp-gpushare-job-list');
  private _empty = h('p', 'jp-gpushare-muted');
  private _log: JobLog | null = null;
  private _exists = new Map<string, Promise<boolean>>();
}

function errorBox(j: IJob): HTMLElement {
  const e = j.error || {};
  const box = h('div', 'jp-gpushare-job-error');
  box.append(h('strong', '', errorSummary(j)));
  if (e.source) {
    box.append(
      h(
        'div',
        'jp-gpushare-help',
        e.cell_index !== null && e.cell_index !== undefined
          ? trans().__('In cell %1:', e.cell_index + 1)
          : trans().__('In the cell:')
      ),
      h('pre', 'jp-gpushare-job-cell', stripAnsi(e.source))
    );
  }
  const tb = Array.isArray(e.traceback) ? e.traceback.join('\n') : e.traceback || '';
  if (tb) {
    const det = h('details');
    det.append(h('summary', '', trans().__('Traceback')), h('pre', 'jp-gpushare-log', stripAnsi(tb)));
    box.append(det);
  }
  return box;
}
