/**
 * The jobs panel (loaded on first show): the user's jobs with state, queue position, runtime,
 * GPU-hours; a live log tail streamed from the server (server-sent events); cancel; "open
 * output notebook"; a failed job's error with the failing cell named, without ANSI codes.
 */
import { apiUrl } from './api';
import { IJob, TERMINAL, cancelJob, duration, errorSummary, jobStatusText, stripAnsi } from './jobsapi';
import { JobWatcher } from './jobwatch';

const TAIL_CHARS = 8000;

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

export interface IJobsContext {
  watcher: JobWatcher;
  openOutput: (path: string) => void;
}

export class JobsPanelContent {
  constructor(
    readonly host: HTMLElement,
    private readonly ctx: IJobsContext
  ) {
    host.classList.add('jp-gpushare-jobs');
    const head = h('div', 'jp-gpushare-title');
    head.append(h('h2', '', 'GPU jobs'));
    host.append(head, this._empty, this._list);
    ctx.watcher.changed.connect((_, jobs) => this.render(jobs), this);
  }

  async shown(): Promise<void> {
    this._visible = true;
    this.render(this.ctx.watcher.jobs);
    await this.ctx.watcher.refresh();
    if (!this._timer) {
      // while the panel is shown, keep running times and positions fresh
      this._timer = window.setInterval(() => {
        if (this._visible && !document.hidden && this.ctx.watcher.jobs.some(j => !TERMINAL.has(j.state))) {
          void this.ctx.watcher.refresh();
        }
      }, 5000);
    }
  }

  hidden(): void {
    this._visible = false;
    this.closeLog();
  }

  private render(jobs: IJob[]): void {
    this._empty.textContent = this.ctx.watcher.available
      ? jobs.length
        ? ''
        : 'No batch jobs yet. Use "Submit as batch job" on a notebook (toolbar, file browser, or the command palette).'
      : 'Batch jobs need the gpushare broker: this server was not started by a hub with gpushare.';
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
      this._list.append(row); // keeps the broker's order (newest first)
    }
    for (const [id, row] of this._rows) {
      if (!keep.has(id)) {
        row.remove();
        this._rows.delete(id);
      }
    }
  }

  private fill(row: HTMLElement, j: IJob): void {
    row.dataset.state = j.state;
    const head = h('div', 'jp-gpushare-job-head');
    head.append(h('span', 'jp-gpushare-job-name', j.name), h('span', 'jp-gpushare-badge', j.state));
    const facts = h(
      'div',
      'jp-gpushare-job-facts',
      [
        j.profile,
        j.priority,
        j.state === 'queued' && j.position ? `position ${j.position}` : '',
        `runtime ${duration(j.runtime_s)}`,
        `${(j.gpu_hours ?? 0).toFixed(3)} GPU-h`,
        j.attempt > 1 ? `attempt ${j.attempt}` : ''
      ]
        .filter(Boolean)
        .join(' · ')
    );
    const status = h('div', 'jp-gpushare-job-status', jobStatusText(j));
    const buttons = h('div', 'jp-gpushare-job-buttons');
    if (!TERMINAL.has(j.state)) {
      const cancel = h('button', 'jp-mod-styled jp-mod-warn', 'Cancel');
      cancel.addEventListener('click', () => {
        (cancel as HTMLButtonElement).disabled = true;
        void cancelJob(j.id)
          .then(() => this.ctx.watcher.refresh())
          .catch(e => {
            status.textContent = `Cancel refused: ${(e as Error).message}`;
          });
      });
      buttons.append(cancel);
    }
    if (j.output_path && (j.state === 'succeeded' || j.state === 'failed')) {
      const open = h('button', 'jp-mod-styled jp-mod-accept', 'Open output');
      open.title = j.output_path;
      const out = j.output_path;
      open.addEventListener('click', () => this.ctx.openOutput(out));
      buttons.append(open);
    }
    const logBtn = h('button', 'jp-mod-styled', this._logJob === j.id ? 'Hide log' : 'Log');
    logBtn.addEventListener('click', () => (this._logJob === j.id ? this.closeLog() : this.openLog(j)));
    buttons.append(logBtn);
    const parts: HTMLElement[] = [head, facts, status];
    if (j.state === 'failed' && j.error) {
      parts.push(errorBox(j));
    }
    parts.push(buttons);
    if (this._logJob === j.id && this._logNode) {
      parts.push(this._logNode);
    }
    row.replaceChildren(...parts);
  }

  private openLog(j: IJob): void {
    this.closeLog();
    this._logJob = j.id;
    const pre = h('pre', 'jp-gpushare-log jp-gpushare-log-tail');
    pre.textContent = '';
    this._logNode = pre;
    // server-sent events: the server pushes new log text and state changes as they come
    // EventSource cannot send headers: the XSRF token (required for cookie-authenticated API
    // calls behind JupyterHub) goes in the query, as jupyter_server accepts it
    const xsrf = xsrfCookie();
    const q = `follow=1${xsrf ? `&_xsrf=${encodeURIComponent(xsrf)}` : ''}`;
    const src = new EventSource(apiUrl(`jobs/${encodeURIComponent(j.id)}/log?${q}`), {
      withCredentials: true
    });
    this._source = src;
    const append = (text: string) => {
      pre.textContent = (pre.textContent + stripAnsi(text)).slice(-TAIL_CHARS);
      pre.scrollTop = pre.scrollHeight;
    };
    src.addEventListener('log', ev => {
      try {
        append(JSON.parse((ev as MessageEvent).data).text || '');
      } catch {
        append((ev as MessageEvent).data);
      }
    });
    src.addEventListener('state', () => void this.ctx.watcher.refresh());
    src.addEventListener('end', () => {
      src.close();
      void this.ctx.watcher.refresh();
    });
    src.onerror = () => {
      if (src.readyState === EventSource.CLOSED) {
        append('\n[log stream closed]\n');
      }
    };
    this.render(this.ctx.watcher.jobs);
  }

  private closeLog(): void {
    this._source?.close();
    this._source = null;
    this._logJob = null;
    this._logNode = null;
    this.render(this.ctx.watcher.jobs);
  }

  private _visible = false;
  private _timer = 0;
  private _rows = new Map<string, HTMLElement>();
  private _list = h('div', 'jp-gpushare-job-list');
  private _empty = h('p', 'jp-gpushare-muted');
  private _logJob: string | null = null;
  private _logNode: HTMLElement | null = null;
  private _source: EventSource | null = null;
}

/** The `_xsrf` cookie as the server reads it (the last of duplicates, like ServerConnection). */
export function xsrfCookie(): string | undefined {
  let found: string | undefined;
  for (const part of document.cookie.split(';')) {
    const [k, ...v] = part.trim().split('=');
    if (k === '_xsrf') {
      found = v.join('=');
    }
  }
  return found;
}

function errorBox(j: IJob): HTMLElement {
  const e = j.error || {};
  const box = h('div', 'jp-gpushare-job-error');
  box.append(h('strong', '', errorSummary(j)));
  if (e.source) {
    box.append(
      h('div', 'jp-gpushare-help', e.cell_index !== null && e.cell_index !== undefined ? `In cell ${e.cell_index + 1}:` : 'In the cell:'),
      h('pre', 'jp-gpushare-job-cell', stripAnsi(e.source))
    );
  }
  const tb = Array.isArray(e.traceback) ? e.traceback.join('\n') : e.traceback || '';
  if (tb) {
    const det = h('details');
    det.append(h('summary', '', 'Traceback'), h('pre', 'jp-gpushare-log', stripAnsi(tb)));
    box.append(det);
  }
  return box;
}
