/**
 * Host CPU and memory of this server's processes, beside the GPU figure.
 *
 * Where jupyter-resource-usage runs, its own endpoint (`/api/metrics/v1`) is the source and
 * nothing polls it twice: every answer it gives in this tab (its own status bar polls it) is
 * seen here through the shared `ServerConnection.makeRequest`, and this extension asks only
 * when no answer came within one refresh interval. Without it, the gpushare server measures
 * the same figures and pushes them with each GPU sample (no request at all).
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';

import { ISample } from './api';

export const RESOURCE_USAGE = 'jupyter-resource-usage';
const ENDPOINT = 'api/metrics/v1';

export interface IHostUse {
  source: string;
  rss_mib: number | null;
  memory_limit_mib: number | null;
  cpu_pct: number | null;
  cpu_count: number | null;
}

/** jupyter-resource-usage's answer (the fields read here). */
interface IResourceUsageAnswer {
  rss?: number;
  pss?: number;
  limits?: { memory?: { rss?: number; pss?: number } };
  cpu_percent?: number;
  cpu_count?: number;
}

type MakeRequest = typeof ServerConnection.makeRequest;

function isEndpoint(url: string): boolean {
  const path = url.split('?')[0].replace(/\/+$/, '');
  return path.endsWith('/' + ENDPOINT);
}

export function fromResourceUsage(a: IResourceUsageAnswer): IHostUse {
  const mib = (b: number | undefined) => (typeof b === 'number' && b > 0 ? b / 1048576 : null);
  return {
    source: RESOURCE_USAGE,
    // the figure its own status bar shows: PSS where the system gives it, else RSS
    rss_mib: mib(a.pss ?? a.rss),
    memory_limit_mib: mib(a.limits?.memory?.pss ?? a.limits?.memory?.rss),
    cpu_pct: typeof a.cpu_percent === 'number' ? a.cpu_percent : null,
    cpu_count: typeof a.cpu_count === 'number' ? a.cpu_count : null
  };
}

export class HostMetrics {
  constructor(private readonly refreshMs: () => number) {
    this.observe();
  }

  get changed(): ISignal<this, IHostUse | null> {
    return this._changed;
  }

  get latest(): IHostUse | null {
    return this._latest;
  }

  /** Requests this tab sent to jupyter-resource-usage's endpoint: ours and its own. */
  get endpointRequests(): { ours: number; all: number } {
    return { ours: this._ours, all: this._all };
  }

  /** Each GPU sample says where the host figures are (or carries them). */
  onSample(s: ISample): void {
    const host = (s as ISample & { host?: IHostUse }).host;
    if (!host) {
      return;
    }
    if (host.source === RESOURCE_USAGE) {
      this.ensureTimer();
      return;
    }
    this.stopTimer();
    this.set(host);
  }

  dispose(): void {
    this.stopTimer();
    Signal.clearData(this);
  }

  private set(h: IHostUse): void {
    this._latest = h;
    this._changed.emit(h);
  }

  /** See every answer of the endpoint in this tab, whoever asked. */
  private observe(): void {
    const original: MakeRequest = ServerConnection.makeRequest;
    if ((original as unknown as { __gpushare?: boolean }).__gpushare) {
      return;
    }
    const wrapped = (async (url: string, init: RequestInit, settings: ServerConnection.ISettings) => {
      const response = await original(url, init, settings);
      if (isEndpoint(url) && (init?.method ?? 'GET') === 'GET') {
        this._all++;
        this._seenAt = Date.now();
        if (response.ok) {
          response
            .clone()
            .json()
            .then(a => this.set(fromResourceUsage(a as IResourceUsageAnswer)))
            .catch(() => undefined);
        }
      }
      return response;
    }) as MakeRequest;
    (wrapped as unknown as { __gpushare?: boolean }).__gpushare = true;
    (ServerConnection as { makeRequest: MakeRequest }).makeRequest = wrapped;
  }

  private ensureTimer(): void {
    if (this._timer) {
      return;
    }
    const tick = () => {
      this._timer = window.setTimeout(tick, this.refreshMs());
      if (document.hidden || Date.now() - this._seenAt < this.refreshMs()) {
        return; // an answer is fresh (its own status bar asked): nothing to ask
      }
      void this.ask();
    };
    this._timer = window.setTimeout(tick, 0);
  }

  private stopTimer(): void {
    window.clearTimeout(this._timer);
    this._timer = 0;
  }

  private async ask(): Promise<void> {
    const s = ServerConnection.makeSettings();
    this._ours++;
    try {
      await ServerConnection.makeRequest(URLExt.join(s.baseUrl, ENDPOINT), {}, s);
    } catch {
      // the next tick asks again
    }
  }

  private _latest: IHostUse | null = null;
  private _timer = 0;
  private _seenAt = 0;
  private _ours = 0;
  private _all = 0;
  private _changed = new Signal<this, IHostUse | null>(this);
}
