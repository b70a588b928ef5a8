/**
 * Preemption notices: one JupyterLab notification per notice that says what will happen,
 * when, and what to do, plus a countdown that the status bar and the panel show.
 */
import { Notification } from '@jupyterlab/apputils';
import { ISignal, Signal } from '@lumino/signaling';

import { INotice } from './api';
import { countdown, noticeDeadline } from './format';

export interface IActiveNotice {
  notice: INotice;
  deadline: number;
}

export class NoticeBoard {
  constructor(private readonly actions: { submitAsJob?: () => void; save?: () => void } = {}) {}

  get changed(): ISignal<this, IActiveNotice | null> {
    return this._changed;
  }

  /** The notice with the nearest deadline still ahead, if any. */
  get active(): IActiveNotice | null {
    const now = Date.now();
    let best: IActiveNotice | null = null;
    for (const n of this._notices.values()) {
      if (n.deadline > now - 5000 && (!best || n.deadline < best.deadline)) {
        best = n;
      }
    }
    return best;
  }

  add(notice: INotice): void {
    const key = `${notice.grant_id}|${notice.deadline ?? notice.deadline_ts ?? ''}`;
    if (this._notices.has(key)) {
      return;
    }
    const deadline = noticeDeadline(notice, Date.now());
    if (deadline < Date.now() - 5000) {
      return; // an old notice replayed by the server: the deadline has passed
    }
    this._notices.set(key, { notice, deadline });
    const actions: Notification.IAction[] = [];
    if (this.actions.save) {
      const save = this.actions.save;
      actions.push({ label: 'Save all', callback: () => save(), displayType: 'accent' });
    }
    if (this.actions.submitAsJob) {
      const submit = this.actions.submitAsJob;
      actions.push({ label: 'Submit as batch job', callback: () => submit() });
    }
    this._notifications.set(
      key,
      Notification.warning(noticeText(notice, deadline), { autoClose: false, actions })
    );
    this.tick();
    if (!this._timer) {
      this._timer = window.setInterval(() => this.tick(), 1000);
    }
  }

  dispose(): void {
    window.clearInterval(this._timer);
    this._timer = 0;
    Signal.clearData(this);
  }

  private tick(): void {
    const now = Date.now();
    for (const [key, n] of this._notices) {
      const id = this._notifications.get(key);
      if (id && n.deadline > now - 1000) {
        Notification.update({ id, message: noticeText(n.notice, n.deadline), type: 'warning', autoClose: false });
      }
      if (n.deadline < now - 60000) {
        this._notices.delete(key);
      }
    }
    this._changed.emit(this.active);
    if (this._notices.size === 0) {
      window.clearInterval(this._timer);
      this._timer = 0;
    }
  }

  private _notices = new Map<string, IActiveNotice>();
  private _notifications = new Map<string, string>();
  private _timer = 0;
  private _changed = new Signal<this, IActiveNotice | null>(this);
}

export function noticeText(n: INotice, deadline: number): string {
  const left = (deadline - Date.now()) / 1000;
  const what = n.holder_kind === 'job' ? 'this job' : 'this server';
  const when =
    left > 0 ? `in ${countdown(left)}: ${what} stops at ${new Date(deadline).toLocaleTimeString()}` : `now: ${what} is stopping`;
  const why = n.reason ? ` Reason: ${n.reason}.` : '';
  if (n.kind === 'idle') {
    // the broker's GPU idle culler: no GPU activity for the pool's window
    return (
      `GPU idle: ${what} will be stopped ${when} and its GPU share released.${why} ` +
      'Run GPU work in a kernel before then to keep it; your files are kept.'
    );
  }
  return (
    `GPU preemption ${when}. Save and checkpoint now (your files are kept); ` +
    `submit the notebook as a batch job to keep it running.${why}`
  );
}
