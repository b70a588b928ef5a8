/** The batch-job routes of the server extension (`/gpushare/api/jobs...`) and their shapes. */
import { APIError, requestAPI } from './api';

export interface ITeamAvailability {
  guaranteed: number;
  borrow_limit: number;
  in_use: number;
  within_guarantee: boolean;
  within_borrow_limit: boolean;
  fits_now: boolean;
}

export interface IJobProfile {
  slug: string;
  display_name: string;
  description?: string | null;
  pool: string;
  gpu: { describe: string; count: number; fraction: number };
  priority: string;
  max_lifetime_s: number | null;
  availability: Record<string, ITeamAvailability>;
  priorities: Record<string, string[]>;
}

export interface IPriorityClass {
  name: string;
  value: number;
  preemptible: boolean;
  grace_period_s: number;
  checkpoint_required_after_s: number | null;
  description?: string | null;
}

export interface IBackend {
  name: string;
  enforces: string[];
  notes?: string;
}

export interface INotebookParameter {
  name: string;
  type: string;
  default: string;
  help: string;
}

export interface IJobOptions {
  user: string;
  teams: string[];
  profiles: IJobProfile[];
  priorities: IPriorityClass[];
  backends: IBackend[];
  limits: {
    default_max_runtime: number;
    max_runtime: number;
    max_unfinished_jobs: number;
    unfinished_jobs: number;
  };
  notebook: {
    path: string;
    name: string;
    kernelspec: { name: string; display_name: string } | null;
    parameters_cell: string | null;
    parameters: INotebookParameter[];
  } | null;
}

export interface IJobError {
  summary?: string;
  cell_index?: number | null;
  executed_cell_index?: number | null;
  source?: string | null;
  ename?: string | null;
  evalue?: string | null;
  traceback?: string | string[] | null;
}

export type JobState =
  | 'queued'
  | 'admitted'
  | 'running'
  | 'succeeded'
  | 'failed'
  | 'cancelled'
  | 'preempted'
  | 'lost';

export const TERMINAL: ReadonlySet<string> = new Set(['succeeded', 'failed', 'cancelled', 'lost']);

export interface IJob {
  id: string;
  name: string;
  path: string;
  profile: string;
  pool: string;
  priority: string;
  team: string;
  state: JobState;
  reason: string;
  queue_reason?: string | null;
  position?: number | null;
  attempt: number;
  output_path?: string;
  error?: IJobError | null;
  gpu_hours?: number;
  runtime_s?: number | null;
  created_at: string;
  started_at?: string | null;
  ended_at?: string | null;
  preemption?: { reason: string; deadline: string } | null;
}

export interface ISubmit {
  path: string;
  profile: string;
  team?: string;
  priority?: string;
  max_runtime?: number;
  checkpoint?: boolean;
  parameters?: Record<string, unknown>;
  backend?: string;
}

export async function jobOptions(path: string | null): Promise<IJobOptions> {
  const q = path ? `?path=${encodeURIComponent(path)}` : '';
  return requestAPI<IJobOptions>(`jobs/options${q}`);
}

export async function listJobs(): Promise<IJob[]> {
  return (await requestAPI<{ jobs: IJob[] }>('jobs')).jobs;
}

export async function submitJob(body: ISubmit): Promise<IJob> {
  return requestAPI<IJob>('jobs', { method: 'POST', body: JSON.stringify(body) });
}

export async function cancelJob(id: string): Promise<IJob> {
  return requestAPI<IJob>(`jobs/${encodeURIComponent(id)}`, { method: 'DELETE' });
}

export function fieldOf(e: unknown): string | null {
  if (e instanceof APIError && e.body && typeof e.body === 'object') {
    const f = (e.body as Record<string, unknown>).field;
    return typeof f === 'string' ? f : null;
  }
  return null;
}

const ANSI = new RegExp(String.fromCharCode(27) + '\\[[0-9;]*[A-Za-z]', 'g');

export function stripAnsi(s: string): string {
  return s.replace(ANSI, '');
}

export function duration(s: number | null | undefined): string {
  if (s === null || s === undefined) {
    return '–';
  }
  const t = Math.round(s);
  const h = Math.floor(t / 3600);
  const m = Math.floor((t % 3600) / 60);
  return h ? `${h}h ${m}m` : m ? `${m}m ${t % 60}s` : `${t}s`;
}

/** One line a person can read for a job's state. */
export function jobStatusText(j: IJob): string {
  switch (j.state) {
    case 'queued':
      return `queued${j.position ? ` #${j.position}` : ''}: ${j.queue_reason || j.reason}`;
    case 'failed':
      return `failed: ${errorSummary(j)}`;
    default:
      return `${j.state}${j.reason && j.reason !== j.state ? `: ${j.reason}` : ''}`;
  }
}

export function errorSummary(j: IJob): string {
  const e = j.error;
  if (!e) {
    return j.reason;
  }
  const cell =
    e.cell_index !== null && e.cell_index !== undefined ? `cell ${e.cell_index + 1} raised ` : '';
  const what = [e.ename, e.evalue].filter(Boolean).join(': ');
  return stripAnsi(e.summary || `${cell}${what}` || j.reason);
}
