/**
 * One live feed per browser tab: the server extension's `/gpushare/api/metrics/stream`
 * WebSocket (samples, preemption notices, watchdog events). It is closed while the tab is
 * hidden, so a hidden tab costs no requests and no messages at all; it reopens (and the
 * server replays the latest sample and open notices) when the tab is shown again.
 */
import { ISignal, Signal } from '@lumino/signaling';

import { INotice, ISample, IWatchdogEvent, wsUrl } from './api';

export type StreamState = 'connecting' | 'open' | 'paused' | 'closed';

export class MetricsStream {
  constructor(private readonly doc: Document = document) {
    this.doc.addEventListener('visibilitychange', this.onVisibility);
  }

  get sample(): ISignal<this, ISample> {
    return this._sample;
  }
  get notice(): ISignal<this, INotice> {
    return this._notice;
  }
  get watchdog(): ISignal<this, IWatchdogEvent> {
    return this._watchdog;
  }
  get stateChanged(): ISignal<this, StreamState> {
    return this._stateChanged;
  }
  get state(): StreamState {
    return this._state;
  }
  get latest(): ISample | null {
    return this._latest;
  }
  /** Messages received since the page loaded (benchmarks and tests read it). */
  get received(): number {
    return this._received;
  }

  start(): void {
    if (this._stopped) {
      return;
    }
    if (this.doc.hidden) {
      this.setState('paused');
      return;
    }
    this.connect();
  }

  dispose(): void {
    this._stopped = true;
    this.doc.removeEventListener('visibilitychange', this.onVisibility);
    this.close();
    Signal.clearData(this);
  }

  private connect(): void {
    if (this._ws || this._stopped) {
      return;
    }
    this.setState('connecting');
    const ws = new WebSocket(wsUrl('metrics/stream'));
    this._ws = ws;
    ws.onopen = () => {
      this._retryMs = 1000;
      this.setState('open');
    };
    ws.onmessage = ev => this.onMessage(ev.data);
    ws.onclose = () => {
      if (this._ws !== ws) {
        return;
      }
      this._ws = null;
      if (this._stopped || this.doc.hidden) {
        return;
      }
      this.setState('closed');
      this._retry = window.setTimeout(() => {
        this._retry = 0;
        if (!this.doc.hidden) {
          this.connect();
        }
      }, this._retryMs);
      this._retryMs = Math.min(this._retryMs * 2, 30000);
    };
  }

  private close(): void {
    if (this._retry) {
      window.clearTimeout(this._retry);
      this._retry = 0;
    }
    const ws = this._ws;
    this._ws = null;
    if (ws) {
      ws.onclose = null;
      ws.onmessage = null;
      ws.close();
    }
  }

  private onMessage(data: unknown): void {
    if (typeof data !== 'string') {
      return;
    }
    let msg: Record<string, unknown>;
    try {
      msg = JSON.parse(data);
    } catch {
      return;
    }
    this._received++;
    switch (msg.type) {
      case 'sample':
        this._latest = msg as unknown as ISample;
        this._sample.emit(this._latest);
        break;
      case 'notice':
        if (msg.notice && typeof msg.notice === 'object') {
          this._notice.emit(msg.notice as INotice);
        }
        break;
      case 'watchdog':
        this._watchdog.emit(msg as unknown as IWatchdogEvent);
        break;
    }
  }

  private onVisibility = (): void => {
    if (this.doc.hidden) {
      this.close();
      this.setState('paused');
    } else {
      this.connect();
    }
  };

  private setState(s: StreamState): void {
    if (s !== this._state) {
      this._state = s;
      this._stateChanged.emit(s);
    }
  }

  private _ws: WebSocket | null = null;
  private _retry = 0;
  private _retryMs = 1000;
  private _stopped = false;
  private _received = 0;
  private _latest: ISample | null = null;
  private _state: StreamState = 'closed';
  private _sample = new Signal<this, ISample>(this);
  private _notice = new Signal<this, INotice>(this);
  private _watchdog = new Signal<this, IWatchdogEvent>(this);
  private _stateChanged = new Signal<this, StreamState>(this);
}
