/**
 * A job's live log box: the server pushes new text (server-sent events); the box follows the
 * newest line unless the user scrolled up to read, and keeps following or keeps its place
 * when the jobs list is redrawn (moving a node in the DOM resets its scroll position).
 */
import { apiUrl } from './api';
import { stripAnsi } from './jobsapi';

const TAIL_CHARS = 8000;
/** Within this many pixels of the bottom counts as "at the end": keep following. */
const SLACK_PX = 8;

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

export interface ILogEvents {
  state: () => void;
  end: () => void;
}

export class JobLog {
  readonly node = document.createElement('pre');

  constructor(
    readonly jobId: string,
    events: ILogEvents
  ) {
    this.node.className = 'jp-gpushare-log jp-gpushare-log-tail';
    this.node.dataset.follow = 'yes';
    this.node.addEventListener('scroll', () => {
      const n = this.node;
      this._follow = n.scrollTop + n.clientHeight >= n.scrollHeight - SLACK_PX;
      this._top = n.scrollTop;
      n.dataset.follow = this._follow ? 'yes' : 'no';
    });
    // EventSource cannot send headers: the XSRF token (required for cookie-authenticated API
    // calls behind JupyterHub) goes in the query, as jupyter_server accepts it
    const xsrf = xsrfCookie();
    const q = `follow=1${xsrf ? `&_xsrf=${encodeURIComponent(xsrf)}` : ''}`;
    const src = new EventSource(apiUrl(`jobs/${encodeURIComponent(jobId)}/log?${q}`), {
      withCredentials: true
    });
    this._source = src;
    src.addEventListener('log', ev => {
      try {
        this.append(JSON.parse((ev as MessageEvent).data).text || '');
      } catch {
        this.append((ev as MessageEvent).data);
      }
    });
    src.addEventListener('state', () => events.state());
    src.addEventListener('end', () => {
      src.close();
      events.end();
    });
    src.onerror = () => {
      if (src.readyState === EventSource.CLOSED) {
        this.append('\n[log stream closed]\n');
      }
    };
  }

  get following(): boolean {
    return this._follow;
  }

  append(text: string): void {
    this.node.textContent = (this.node.textContent + stripAnsi(text)).slice(-TAIL_CHARS);
    this.restore();
  }

  /** After the box was (re)attached or grew: at the end if following, else where it was. */
  restore(): void {
    const n = this.node;
    const want = this._follow ? n.scrollHeight : this._top;
    if (n.isConnected && n.scrollTop !== want) {
      n.scrollTop = want;
    }
  }

  close(): void {
    this._source?.close();
    this._source = null;
  }

  private _source: EventSource | null;
  private _follow = true;
  private _top = 0;
}
