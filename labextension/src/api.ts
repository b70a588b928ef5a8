/**
 * Calls to the jupyter-gpushare server extension (all under `<base>/gpushare/api/`),
 * and the JSON shapes they answer with.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

export interface IOwnGPU {
  uuid: string;
  index: number;
  name: string;
  memory_used_mib: number;
  memory_total_mib: number;
  own_memory_mib: number;
  memory_limit_mib: number | null;
  utilization_pct: number | null;
  own_utilization_pct: number | null;
}

export interface IKernelUse {
  kernel_id: string;
  path: string | null;
  pid: number | null;
  memory_mib: number;
  sm_util_pct: number | null;
}

export interface IHint {
  gpu_uuid: string;
  kind: string;
  message: string;
  window_s: number;
  mean_util_pct: number;
  threshold_pct: number;
  mean_memory_mib: number;
}

export interface ILimits {
  memory_mib: number | null;
  compute_pct: number | null;
  enforcement: string | null;
  memory_hard_limited: boolean;
}

export interface IGrantSummary {
  has_grant: boolean;
  status?: string;
  grant_id?: string;
  profile?: string | null;
  team?: string | null;
  pool?: string | null;
  borrowed?: boolean;
  units?: number | null;
  gpu_uuids?: string[];
}

export interface IWatchdogEvent {
  type?: 'watchdog';
  message: string;
  action?: string;
  outcome?: string;
  kernel_id?: string | null;
  path?: string | null;
  ts?: number;
}

export interface ISample {
  ts: number;
  simulated: boolean;
  source: string;
  error: string | null;
  notes: string[];
  grant: IGrantSummary;
  limits: ILimits;
  gpus: IOwnGPU[];
  attribution: { mode: string; note: string | null; kernels: IKernelUse[] };
  hints: IHint[];
  watchdog: { active: boolean; reason: string; action: string; events: IWatchdogEvent[] };
}

export interface INotice {
  grant_id: string;
  kind?: string;
  reason?: string;
  deadline?: string;
  deadline_ts?: number;
  seconds_left?: number | null;
  holder_kind?: string;
}

export interface IHistory {
  simulated: boolean;
  interval_s: number;
  history_s: number;
  limits: ILimits;
  samples: { ts: number; gpus: IOwnGPU[] }[];
}

export interface IGrantAnswer {
  simulated: boolean;
  grant: {
    has_grant: boolean;
    grant_id: string | null;
    profile: string | null;
    team: string | null;
    pool: string | null;
    borrowed: boolean;
    preemptible: boolean;
    units: number | null;
    memory_limit_mib: number | null;
    compute_pct: number | null;
    enforcement: string | null;
  };
  notices: INotice[];
  preemption: INotice | null;
  broker: { ok: boolean; error: string | null } | null;
  broker_grant?: Record<string, unknown> | null;
}

export interface ITeamPool {
  guaranteed: number;
  borrow_limit: number;
  in_use: number;
  borrowed: number;
  lent: number;
  gpu_hours_month: number;
  gpu_hours_budget: number | null;
  queued: number;
}

export interface ITeamAnswer {
  team: string | null;
  usage: { team: string; month: string; pools: Record<string, ITeamPool> } | null;
  error: string | null;
  simulated: boolean;
}

/** An error answer of the server extension, with the reason it gave. */
export class APIError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly body: unknown = null
  ) {
    super(message);
  }
}

export function settings(): ServerConnection.ISettings {
  return ServerConnection.makeSettings();
}

export function apiUrl(path: string, s: ServerConnection.ISettings = settings()): string {
  return URLExt.join(s.baseUrl, 'gpushare/api', path);
}

/** The reason in an error body: `message`, `reason`, `error` or `detail`. */
export function reasonOf(body: unknown, fallback: string): string {
  if (body && typeof body === 'object') {
    const b = body as Record<string, unknown>;
    for (const k of ['message', 'reason', 'error', 'detail']) {
      const v = b[k];
      if (typeof v === 'string' && v) {
        return v;
      }
    }
  }
  return fallback;
}

export async function requestAPI<T>(path: string, init: RequestInit = {}): Promise<T> {
  const s = settings();
  const response = await ServerConnection.makeRequest(apiUrl(path, s), init, s);
  const text = await response.text();
  let body: unknown = null;
  if (text) {
    try {
      body = JSON.parse(text);
    } catch {
      body = text;
    }
  }
  if (!response.ok) {
    throw new APIError(response.status, reasonOf(body, `${response.status} ${response.statusText}`), body);
  }
  return body as T;
}

export function wsUrl(path: string): string {
  const s = settings();
  const url = URLExt.join(s.wsUrl, 'gpushare/api', path);
  return s.token ? `${url}?token=${encodeURIComponent(s.token)}` : url;
}
