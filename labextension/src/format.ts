/**
 * What the status bar says: this server's own GPU memory against its limit and its own
 * compute against its share, which figure is high, and why (pure functions, no DOM).
 */
import { INotice, ISample } from './api';
import { trans } from './i18n';

export type Level = 'ok' | 'warn' | 'high' | 'none';

export const MEMORY_WARN = 0.75;
export const MEMORY_HIGH = 0.9;

export interface IThresholds {
  warn: number;
  high: number;
}

export const DEFAULT_THRESHOLDS: IThresholds = { warn: MEMORY_WARN, high: MEMORY_HIGH };

export interface IFigures {
  level: Level;
  text: string;
  memoryText: string;
  computeText: string;
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

/** Whose memory a sample's figures are, said in words (one meaning per figure). */
export interface IScope {
  /** 'own': this server's processes; 'card': the whole GPU, other users included. */
  kind: 'own' | 'card';
  label: string;
  gpus: number;
  used_mib: number;
  /** Summed over this server's GPUs: the limit (own) or the cards' memory (card). */
  of_mib: number;
  ofLabel: string;
}

export function memoryScope(s: ISample, perLimit: number | null = s.limits?.memory_mib ?? null): IScope {
  const gpus = s.gpus || [];
  const card = s.attribution?.mode === 'device_totals';
  let used = 0;
  let of = 0;
  for (const g of gpus) {
    used += g.own_memory_mib;
    of += card ? g.memory_total_mib : (g.memory_limit_mib ?? perLimit ?? g.memory_total_mib);
  }
  const t = trans();
  const n = gpus.length;
  const where = n > 1 ? t.__(' (total of %1 GPUs)', n) : '';
  return card
    ? {
        kind: 'card',
        label: t.__('Whole GPU memory, other users included') + where,
        gpus: n,
        used_mib: used,
        of_mib: of,
        ofLabel: t.__('card')
      }
    : {
        kind: 'own',
        label: t.__("Your GPU memory (this server's kernels)") + where,
        gpus: n,
        used_mib: used,
        of_mib: of,
        ofLabel: t.__('limit')
      };
}

/** Own memory and limit summed over this server's GPUs; the worst GPU decides the level. */
export function figures(s: ISample, th: IThresholds = DEFAULT_THRESHOLDS): IFigures {
  const t = trans();
  const simulated = !!s.simulated;
  const sim = simulated ? t.__(' (simulated)') : '';
  if (!s.grant?.has_grant) {
    return {
      level: 'none',
      memoryLevel: 'none',
      computeLevel: 'none',
      simulated,
      text: t.__('GPU: none'),
      memoryText: t.__('GPU: none'),
      computeText: '',
      tooltip:
        t.__(
          'This server has no GPU grant (its profile has no GPU, or it was not started by the hub). ' +
            'Switch to a GPU profile or submit the notebook as a batch job to use a GPU.'
        ) + sim
    };
  }
  const gpus = s.gpus || [];
  if (gpus.length === 0) {
    return {
      level: 'none',
      memoryLevel: 'none',
      computeLevel: 'none',
      simulated,
      text: t.__('GPU: no data'),
      memoryText: t.__('GPU: no data'),
      computeText: '',
      tooltip: t.__('The grant names GPUs, but no sample covers them%1.%2', s.error ? `: ${s.error}` : '', sim)
    };
  }
  const scope = memoryScope(s);
  const perLimit = s.limits?.memory_mib ?? null;
  const share = s.limits?.compute_pct ?? null;
  let worst = 0;
  let worstGpu = gpus[0];
  for (const g of gpus) {
    const lim = g.memory_limit_mib ?? perLimit ?? g.memory_total_mib;
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
  const worstLimit = worstGpu.memory_limit_mib ?? perLimit ?? worstGpu.memory_total_mib;
  if (scope.kind === 'card') {
    // others' memory is not this server's: it neither warns nor counts against the limit
    memoryLevel = 'none';
    why.push(
      t.__(
        "This server's own GPU memory cannot be told apart here (%1): the figure is the whole " +
          'GPU, other users included, against the card\'s memory. Your limit is %2.',
        s.attribution?.note || t.__('no process of it is visible on the GPU'),
        perLimit === null ? t.__('none') : gib(perLimit)
      )
    );
  } else if (worst >= th.high) {
    memoryLevel = 'high';
    why.push(
      t.__(
        'Memory is high: %1 of your %2 limit on GPU %3 (%4 %). ',
        gib(worstGpu.own_memory_mib),
        gib(worstLimit),
        worstGpu.index,
        Math.round(worst * 100)
      ) +
        (s.limits?.memory_hard_limited
          ? t.__('Allocations past the limit fail with an out-of-memory error.')
          : t.__('Past the limit the watchdog will %1 the kernel.', s.watchdog?.action || 'restart')) +
        t.__(' Free tensors or switch to a bigger profile.')
    );
  } else if (worst >= th.warn) {
    memoryLevel = 'warn';
    why.push(
      t.__(
        'Memory is getting close to your limit: %1 of %2 on GPU %3 (%4 %).',
        gib(worstGpu.own_memory_mib),
        gib(worstLimit),
        worstGpu.index,
        Math.round(worst * 100)
      )
    );
  }
  let computeLevel: Level = 'ok';
  if (scope.kind === 'own' && ownUtil !== null && share !== null && ownUtil > share * 1.05) {
    computeLevel = 'warn';
    why.push(
      t.__(
        'Compute is above your share: %1 used, your share is %2. ' +
          'You are borrowing idle cycles; you will be slowed back to your share when others need them.',
        pct(ownUtil),
        pct(share)
      )
    );
  }
  const lowUtil = (s.hints || []).find(h => h.kind === 'low_utilization');
  if (lowUtil) {
    why.push(t.__('Hint: %1', lowUtil.message));
  }
  const level: Level =
    memoryLevel === 'high'
      ? 'high'
      : memoryLevel === 'warn' || computeLevel === 'warn'
        ? 'warn'
        : scope.kind === 'card'
          ? 'none'
          : 'ok';
  const computeText =
    ownUtil === null
      ? 'n/a'
      : share === null || scope.kind === 'card'
        ? pct(ownUtil)
        : t.__('%1 of %2', pct(ownUtil), pct(share));
  const prefix =
    scope.kind === 'card'
      ? scope.gpus > 1
        ? t.__('%1 GPU cards', scope.gpus)
        : t.__('GPU card')
      : scope.gpus > 1
        ? t.__('%1 GPUs', scope.gpus)
        : t.__('GPU');
  const memoryText = `${prefix} ${gib(scope.used_mib).replace(' GiB', '')}/${gib(scope.of_mib)}`;
  const text = `${memoryText} · ${computeText}`;
  const head =
    (scope.kind === 'card'
      ? t.__('Whole GPU memory (other users included): %1 of the card\'s %2', gib(scope.used_mib), gib(scope.of_mib))
      : t.__("GPU memory of this server's kernels: %1 of your %2 limit", gib(scope.used_mib), gib(scope.of_mib))) +
    (gpus.length > 1 ? t.__(' (total of %1 GPUs)', gpus.length) : '') +
    '.\n' +
    (ownUtil === null
      ? t.__('Your compute use is not measurable here (no per-process utilisation).')
      : scope.kind === 'card'
        ? t.__('Whole GPU compute: %1.', pct(ownUtil))
        : t.__('Your compute: %1', pct(ownUtil)) + (share === null ? '.' : t.__(' of your %1 share.', pct(share)))) +
    (s.grant.profile ? t.__('\nProfile: %1', s.grant.profile) : '') +
    (s.grant.borrowed ? t.__(' (borrowed capacity: may be preempted)') : '');
  const tail = simulated
    ? t.__('\nSimulated data: no real GPU is measured here (%1).', s.source || 'simulated')
    : '';
  return {
    level,
    memoryLevel,
    computeLevel,
    simulated,
    text,
    memoryText,
    computeText,
    tooltip: [head, ...why].join('\n') + tail + t.__('\nClick to open the GPU panel.')
  };
}
