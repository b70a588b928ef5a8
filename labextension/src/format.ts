/**
 * What the status bar says: this server's own GPU memory against its limit and its own
 * compute against its share, which figure is high, and why (pure functions, no DOM).
 */
import { INotice, ISample } from './api';

export type Level = 'ok' | 'warn' | 'high' | 'none';

export const MEMORY_WARN = 0.75;
export const MEMORY_HIGH = 0.9;

export interface IFigures {
  level: Level;
  text: string;
  tooltip: string;
  memoryLevel: Level;
  computeLevel: Level;
  simulated: boolean;
}

export function gib(mib: number): string {
  return `${(mib / 1024).toFixed(1)} GiB`;
}

export function pct(v: number): string {
  const r = Math.round(v * 10) / 10;
  return `${Number.isInteger(r) || r >= 100 ? Math.round(r) : r.toFixed(1)} %`;
}

/** `m:ss` until the deadline (never negative). */
export function countdown(secondsLeft: number): string {
  const s = Math.max(0, Math.round(secondsLeft));
  const m = Math.floor(s / 60);
  return `${m}:${String(s % 60).padStart(2, '0')}`;
}

export function noticeDeadline(n: INotice, receivedAt: number): number {
  if (typeof n.deadline_ts === 'number') {
    return n.deadline_ts * 1000;
  }
  if (n.deadline) {
    const t = Date.parse(n.deadline);
    if (!Number.isNaN(t)) {
      return t;
    }
  }
  return receivedAt + (n.seconds_left ?? 0) * 1000;
}

/** Own memory and limit summed over this server's GPUs; the worst GPU decides the level. */
export function figures(s: ISample): IFigures {
  const simulated = !!s.simulated;
  const sim = simulated ? ' (simulated)' : '';
  if (!s.grant?.has_grant) {
    return {
      level: 'none',
      memoryLevel: 'none',
      computeLevel: 'none',
      simulated,
      text: 'GPU: none',
      tooltip:
        'This server has no GPU grant (its profile has no GPU, or it was not started by the hub). ' +
        'Switch to a GPU profile or submit the notebook as a batch job to use a GPU.' +
        sim
    };
  }
  const gpus = s.gpus || [];
  if (gpus.length === 0) {
    return {
      level: 'none',
      memoryLevel: 'none',
      computeLevel: 'none',
      simulated,
      text: 'GPU: no data',
      tooltip: `The grant names GPUs, but no sample covers them${s.error ? `: ${s.error}` : ''}.${sim}`
    };
  }
  const perLimit = s.limits?.memory_mib ?? null;
  const share = s.limits?.compute_pct ?? null;
  let own = 0;
  let limit = 0;
  let worst = 0;
  let worstGpu = gpus[0];
  for (const g of gpus) {
    const lim = g.memory_limit_mib ?? perLimit ?? g.memory_total_mib;
    own += g.own_memory_mib;
    limit += lim;
    const ratio = lim > 0 ? g.own_memory_mib / lim : 0;
    if (ratio >= worst) {
      worst = ratio;
      worstGpu = g;
    }
  }
  const utils = gpus.map(g => g.own_utilization_pct).filter((u): u is number => u !== null);
  const ownUtil = utils.length ? utils.reduce((a, b) => a + b, 0) / utils.length : null;

  const why: string[] = [];
  let memoryLevel: Level = 'ok';
  if (worst >= MEMORY_HIGH) {
    memoryLevel = 'high';
    why.push(
      `Memory is high: ${gib(worstGpu.own_memory_mib)} of your ${gib(
        worstGpu.memory_limit_mib ?? perLimit ?? worstGpu.memory_total_mib
      )} limit on GPU ${worstGpu.index} (${Math.round(worst * 100)} %). ` +
        (s.limits?.memory_hard_limited
          ? 'Allocations past the limit fail with an out-of-memory error.'
          : `Past the limit the watchdog will ${s.watchdog?.action || 'restart'} the kernel.`) +
        ' Free tensors or switch to a bigger profile.'
    );
  } else if (worst >= MEMORY_WARN) {
    memoryLevel = 'warn';
    why.push(
      `Memory is getting close to your limit: ${gib(worstGpu.own_memory_mib)} of ${gib(
        worstGpu.memory_limit_mib ?? perLimit ?? worstGpu.memory_total_mib
      )} on GPU ${worstGpu.index} (${Math.round(worst * 100)} %).`
    );
  }
  let computeLevel: Level = 'ok';
  if (ownUtil !== null && share !== null && ownUtil > share * 1.05) {
    computeLevel = 'warn';
    why.push(
      `Compute is above your share: ${pct(ownUtil)} used, your share is ${pct(share)}. ` +
        'You are borrowing idle cycles; you will be slowed back to your share when others need them.'
    );
  }
  const lowUtil = (s.hints || []).find(h => h.kind === 'low_utilization');
  if (lowUtil) {
    why.push(`Hint: ${lowUtil.message}`);
  }
  const level: Level =
    memoryLevel === 'high' ? 'high' : memoryLevel === 'warn' || computeLevel === 'warn' ? 'warn' : 'ok';
  const computeText =
    ownUtil === null ? 'n/a' : share === null ? pct(ownUtil) : `${pct(ownUtil)} of ${pct(share)}`;
  const text = `GPU ${gib(own).replace(' GiB', '')}/${gib(limit)} · ${computeText}`;
  const head =
    `Your GPU memory: ${gib(own)} of your ${gib(limit)} limit` +
    (gpus.length > 1 ? ` (${gpus.length} GPUs)` : '') +
    '.\n' +
    (ownUtil === null
      ? 'Your compute use is not measurable here (no per-process utilisation).'
      : `Your compute: ${pct(ownUtil)}` + (share === null ? '.' : ` of your ${pct(share)} share.`)) +
    (s.grant.profile ? `\nProfile: ${s.grant.profile}` : '') +
    (s.grant.borrowed ? ' (borrowed capacity: may be preempted)' : '');
  const tail = simulated
    ? '\nSimulated data: no real GPU is measured here (' + (s.source || 'simulated') + ').'
    : '';
  return {
    level,
    memoryLevel,
    computeLevel,
    simulated,
    text,
    tooltip: [head, ...why].join('\n') + tail + '\nClick to open the GPU panel.'
  };
}
