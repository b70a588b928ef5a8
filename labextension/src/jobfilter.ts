/** The job history's sorting and filtering (pure functions, no DOM). */
import { IJob, TERMINAL } from './jobsapi';

export type SortKey = 'newest' | 'oldest' | 'name' | 'state' | 'gpu_hours';
export type StateFilter = 'all' | 'active' | 'succeeded' | 'failed' | 'cancelled';

export interface IJobQuery {
  text: string;
  state: StateFilter;
  sort: SortKey;
}

export const DEFAULT_QUERY: IJobQuery = { text: '', state: 'all', sort: 'newest' };

function time(s: string | null | undefined): number {
  const t = s ? Date.parse(s) : NaN;
  return Number.isNaN(t) ? 0 : t;
}

export function matches(j: IJob, q: IJobQuery): boolean {
  const text = q.text.trim().toLowerCase();
  if (text && ![j.name, j.path, j.profile, j.id].some(v => (v || '').toLowerCase().includes(text))) {
    return false;
  }
  switch (q.state) {
    case 'all':
      return true;
    case 'active':
      return !TERMINAL.has(j.state);
    case 'cancelled':
      return j.state === 'cancelled' || j.state === 'lost';
    default:
      return j.state === q.state;
  }
}

export function compare(sort: SortKey): (a: IJob, b: IJob) => number {
  switch (sort) {
    case 'oldest':
      return (a, b) => time(a.created_at) - time(b.created_at);
    case 'name':
      return (a, b) => a.name.localeCompare(b.name) || time(b.created_at) - time(a.created_at);
    case 'state':
      return (a, b) => a.state.localeCompare(b.state) || time(b.created_at) - time(a.created_at);
    case 'gpu_hours':
      return (a, b) => (b.gpu_hours ?? 0) - (a.gpu_hours ?? 0);
    default:
      return (a, b) => time(b.created_at) - time(a.created_at);
  }
}

export function select(jobs: IJob[], q: IJobQuery, hidden: ReadonlySet<string>): IJob[] {
  return jobs.filter(j => !hidden.has(j.id) && matches(j, q)).sort(compare(q.sort));
}
