/**
 * Tells the user when a job ends, also for jobs that ended while the browser was closed: the
 * ids of jobs already told about are kept in localStorage. The list is read once at start,
 * then every POLL_MS only while a job is unfinished and the tab is visible.
 */
import { Notification } from '@jupyterlab/apputils';
import { ISignal, Signal } from '@lumino/signaling';

import { IJob, TERMINAL, errorSummary, listJobs } from './jobsapi';

const KEY = 'jupyter-gpushare:jobs-told';
const POLL_MS = 5000;
const MAX_AT_ONCE = 5;

export class JobWatcher {
  constructor(private readonly openOutput: (job: IJob) => void, private readonly showJobs: () => void) {
    document.addEventListener('visibilitychange', () => {
      if (!document.hidden) {
        this.schedule(0);
      }
    });
  }

  get changed(): ISignal<this, IJob[]> {
    return this._changed;
  }

  get jobs(): IJob[] {
    return this._jobs;
  }

  /** A job was just submitted from this tab: watch it. */
  track(job: IJob): void {
    this._jobs = [job, ...this._jobs.filter(j => j.id !== job.id)];
    this._changed.emit(this._jobs);
    this.schedule(1000);
  }

  async refresh(): Promise<void> {
    let jobs: IJob[];
    try {
      jobs = await listJobs();
    } catch {
      this._available = false; // no broker (e.g. a server not started by the hub)
      return;
    }
    this._available = true;
    this._jobs = jobs;
    this._changed.emit(jobs);
    const told = this.told();
    let dirty = false;
    let shown = 0;
    const weekAgo = Date.now() - 7 * 24 * 3600 * 1000;
    for (const j of jobs) {
      if (TERMINAL.has(j.state) && !told.has(j.id)) {
        told.add(j.id);
        dirty = true;
        const ended = j.ended_at ? Date.parse(j.ended_at) : Date.now();
        // ended while the browser was closed: tell about recent ones, a few at most
        if (ended >= weekAgo && shown < MAX_AT_ONCE) {
          this.notify(j);
          shown++;
        }
      }
    }
    if (dirty) {
      this.save(told, jobs);
    }
    if (jobs.some(j => !TERMINAL.has(j.state))) {
      this.schedule(POLL_MS);
    }
  }

  start(): void {
    void this.refresh();
  }

  get available(): boolean {
    return this._available;
  }

  private schedule(ms: number): void {
    if (this._timer || !this._available) {
      return;
    }
    this._timer = window.setTimeout(() => {
      this._timer = 0;
      if (!document.hidden) {
        void this.refresh();
      }
    }, ms);
  }

  private notify(j: IJob): void {
    const actions: Notification.IAction[] = [];
    if (j.output_path && TERMINAL.has(j.state)) {
      // a failed or cancelled run may have written nothing: the action then says why
      const label = j.state === 'succeeded' ? 'Open output' : 'Open output (if any)';
      actions.push({ label, callback: () => this.openOutput(j), displayType: 'accent' });
    }
    actions.push({ label: 'Show jobs', callback: () => this.showJobs() });
    const text = `Batch job ${j.name} ${j.state}`;
    if (j.state === 'succeeded') {
      Notification.success(`${text}.`, { autoClose: 10000, actions });
    } else if (j.state === 'failed') {
      Notification.error(`${text}: ${errorSummary(j)}`, { autoClose: false, actions });
    } else {
      Notification.warning(`${text}: ${j.reason}`, { autoClose: 10000, actions });
    }
  }

  private told(): Set<string> {
    try {
      return new Set(JSON.parse(window.localStorage.getItem(KEY) || '[]'));
    } catch {
      return new Set();
    }
  }

  private save(told: Set<string>, jobs: IJob[]): void {
    // keep only ids the broker still lists: bounded by its own per-user limit
    const listed = new Set(jobs.map(j => j.id));
    try {
      window.localStorage.setItem(KEY, JSON.stringify([...told].filter(id => listed.has(id))));
    } catch {
      // storage full or disabled: the user may be told twice, nothing worse
    }
  }

  private _jobs: IJob[] = [];
  private _timer = 0;
  private _available = true;
  private _changed = new Signal<this, IJob[]>(this);
}
