/**
 * The GPU panel (loaded on first show): live charts of own memory against the limit and own
 * compute against the share (history filled from the server), use per kernel / notebook, the
 * grant, the low-utilisation hint, the team's use against guarantee and budget, preemption.
 * Where there is no grant or no GPU it says so in words instead of drawing empty axes.
 */
import {
  IGrantAnswer,
  IHistory,
  IOwnGPU,
  ISample,
  ITeamAnswer,
  requestAPI
} from './api';
import { IPoint, LineChart } from './charts';
import { countdown, gib, pct } from './format';
import { IActiveNotice, NoticeBoard } from './notices';
import { MetricsStream } from './stream';

const WINDOW_MS = 5 * 60 * 1000;
const SLOW_REFRESH_MS = 30000;

export interface IPanelContext {
  stream: MetricsStream;
  notices: NoticeBoard;
  switchHardware?: () => void;
}

function h(tag: string, cls = '', text = ''): HTMLElement {
  const e = document.createElement(tag);
  if (cls) {
    e.className = cls;
  }
  if (text) {
    e.textContent = text;
  }
  return e;
}

function ownMemory(gpus: IOwnGPU[]): number {
  return gpus.reduce((a, g) => a + g.own_memory_mib, 0) / 1024;
}

function ownCompute(gpus: IOwnGPU[]): number | null {
  const u = gpus.map(g => g.own_utilization_pct).filter((v): v is number => v !== null);
  return u.length ? u.reduce((a, b) => a + b, 0) / u.length : null;
}

export class GPUPanelContent {
  constructor(
    readonly host: HTMLElement,
    private readonly ctx: IPanelContext
  ) {
    host.classList.add('jp-gpushare-panel');
    this._title.append(h('h2', '', 'GPU'), this._sim);
    this._sim.className = 'jp-gpushare-sim';
    this._sim.textContent = 'simulated';
    this._sim.hidden = true;
    this._sim.title = 'No real GPU is measured: the figures come from the simulated sampler.';
    this._message.className = 'jp-gpushare-message';
    this._charts.className = 'jp-gpushare-charts';
    this._charts.append(this._mem.node, this._cpu.node);
    host.append(
      this._title,
      this._preempt,
      this._message,
      this._charts,
      this._hints,
      this._kernels,
      this._grant,
      this._team
    );
    this._preempt.className = 'jp-gpushare-preempt';
    this._preempt.hidden = true;
    ctx.stream.sample.connect(this.onSample, this);
    ctx.notices.changed.connect(this.onNotice, this);
    this.onNotice(ctx.notices, ctx.notices.active);
  }

  /** Called whenever the panel is shown: fill the history, refresh grant and team. */
  async shown(): Promise<void> {
    this._visible = true;
    await Promise.all([this.loadHistory(), this.refreshSlow()]);
    if (!this._slowTimer) {
      this._slowTimer = window.setInterval(() => {
        if (this._visible && !document.hidden) {
          void this.refreshSlow();
        }
      }, SLOW_REFRESH_MS);
    }
  }

  hidden(): void {
    this._visible = false;
  }

  dispose(): void {
    window.clearInterval(this._slowTimer);
    this.ctx.stream.sample.disconnect(this.onSample, this);
    this.ctx.notices.changed.disconnect(this.onNotice, this);
  }

  private async loadHistory(): Promise<void> {
    let hist: IHistory;
    try {
      hist = await requestAPI<IHistory>('metrics/history');
    } catch (e) {
      this._message.textContent = `Could not read the GPU history: ${(e as Error).message}`;
      return;
    }
    const mem: IPoint[] = [];
    const cpu: IPoint[] = [];
    for (const s of hist.samples) {
      mem.push({ t: s.ts * 1000, v: ownMemory(s.gpus) });
      cpu.push({ t: s.ts * 1000, v: ownCompute(s.gpus) });
    }
    this._limits = hist.limits;
    const latest = this.ctx.stream.latest;
    const nGpu = latest?.gpus.length || hist.samples[hist.samples.length - 1]?.gpus.length || 1;
    this._mem.setData(mem, this.memLimit(nGpu));
    this._cpu.setData(cpu, hist.limits.compute_pct);
    if (latest) {
      this.onSample(this.ctx.stream, latest);
    }
  }

  private memLimit(nGpu: number): number | null {
    const l = this._limits?.memory_mib;
    return l === null || l === undefined ? null : (l * nGpu) / 1024;
  }

  private onSample(_: MetricsStream, s: ISample): void {
    this._sim.hidden = !s.simulated;
    this._limits = s.limits;
    const noGrant = !s.grant?.has_grant;
    const noGpu = (s.gpus || []).length === 0;
    this._charts.hidden = noGrant || noGpu;
    if (noGrant) {
      this._message.textContent =
        'This server has no GPU grant, so there is nothing to chart: its profile has no GPU ' +
        '(or it was not started by the hub). Switch hardware to a GPU profile, or submit a ' +
        'notebook as a batch job to run it on a GPU.';
    } else if (noGpu) {
      this._message.textContent =
        `No GPU sample covers this server's grant${s.error ? ` (${s.error})` : ''}. ` +
        (s.notes || []).join(' ');
    } else {
      this._message.textContent = s.simulated
        ? 'Simulated GPU: the figures below are generated, not measured (no NVIDIA GPU or driver here).'
        : '';
    }
    this._message.hidden = !this._message.textContent;
    if (!noGrant && !noGpu) {
      this._mem.push({ t: s.ts * 1000, v: ownMemory(s.gpus) }, this.memLimit(s.gpus.length));
      this._cpu.push({ t: s.ts * 1000, v: ownCompute(s.gpus) }, s.limits.compute_pct);
    }
    this.renderKernels(s);
    this.renderHints(s);
  }

  private renderKernels(s: ISample): void {
    const ks = s.attribution?.kernels || [];
    this._kernels.replaceChildren(h('h3', '', 'Per notebook'));
    if (!ks.length) {
      this._kernels.append(h('p', 'jp-gpushare-muted', 'No kernel of this server uses the GPU.'));
      return;
    }
    const t = h('table', 'jp-gpushare-table');
    t.append(row(['Notebook / kernel', 'GPU memory', 'Compute'], 'th'));
    for (const k of [...ks].sort((a, b) => b.memory_mib - a.memory_mib)) {
      t.append(
        row([
          k.path || `kernel ${k.kernel_id.slice(0, 8)}`,
          gib(k.memory_mib),
          k.sm_util_pct === null ? 'n/a' : pct(k.sm_util_pct)
        ])
      );
    }
    this._kernels.append(t);
  }

  private renderHints(s: ISample): void {
    this._hints.replaceChildren();
    for (const hint of s.hints || []) {
      const box = h('div', 'jp-gpushare-hint');
      box.append(
        h('strong', '', 'Low GPU utilisation'),
        h('p', '', hint.message),
        h(
          'p',
          'jp-gpushare-muted',
          `Mean ${pct(hint.mean_util_pct)} (threshold ${pct(hint.threshold_pct)}) over ` +
            `${Math.round(hint.window_s / 60)} min while holding ${gib(hint.mean_memory_mib)}: ` +
            'likely a data-loading bottleneck (more DataLoader workers, pinned memory, prefetching).'
        )
      );
      this._hints.append(box);
    }
  }

  private async refreshSlow(): Promise<void> {
    const [g, t] = await Promise.allSettled([
      requestAPI<IGrantAnswer>('grant'),
      requestAPI<ITeamAnswer>('team')
    ]);
    if (g.status === 'fulfilled') {
      this.renderGrant(g.value);
      for (const n of g.value.notices || []) {
        this.ctx.notices.add(n);
      }
    }
    if (t.status === 'fulfilled') {
      this.renderTeam(t.value);
    }
  }

  private renderGrant(a: IGrantAnswer): void {
    this._grant.replaceChildren(h('h3', '', 'Grant'));
    const g = a.grant;
    if (!g.has_grant) {
      this._grant.append(h('p', 'jp-gpushare-muted', 'No GPU grant for this server.'));
      this.appendSwitch();
      return;
    }
    const bg = (a.broker_grant || {}) as Record<string, unknown>;
    const dl = h('dl', 'jp-gpushare-dl');
    const items: [string, string][] = [
      ['Profile', g.profile || '?'],
      ['Team', g.team || '?'],
      ['Pool', g.pool || '?'],
      ['GPU units', g.units === null ? '?' : String(g.units)],
      ['Memory limit', g.memory_limit_mib === null ? 'none' : gib(g.memory_limit_mib)],
      ['Compute share', g.compute_pct === null ? 'none' : pct(g.compute_pct)],
      [
        'Borrowed',
        g.borrowed
          ? 'yes: above the team guarantee, may be preempted when the owner needs it'
          : 'no: inside the team guarantee'
      ],
      ['Enforcement', g.enforcement || 'none']
    ];
    if (typeof bg.priority === 'string') {
      items.push(['Priority', bg.priority]);
    }
    const life = bg.max_lifetime_s;
    if (typeof life === 'number') {
      const ends = typeof bg.ends_at === 'string' ? Date.parse(bg.ends_at) : NaN;
      items.push([
        'Max lifetime',
        Number.isNaN(ends) ? lifetime(life) : `${lifetime(life)}, stops at ${stopsAt(ends)}`
      ]);
    } else if (bg.id !== undefined) {
      items.push(['Max lifetime', 'none: the server is not stopped for its age']);
    }
    if (typeof bg.granted_at === 'string') {
      items.push(['Granted at', new Date(bg.granted_at).toLocaleString()]);
    }
    for (const [k, v] of items) {
      dl.append(h('dt', '', k), h('dd', '', v));
    }
    this._grant.append(dl);
    this.appendSwitch();
    if (a.broker && !a.broker.ok && a.broker.error) {
      this._grant.append(h('p', 'jp-gpushare-muted', `Broker: ${a.broker.error}`));
    }
  }

  private appendSwitch(): void {
    const go = this.ctx.switchHardware;
    if (go) {
      const sw = h('button', 'jp-mod-styled jp-gpushare-switch-button', 'Switch hardware…');
      sw.title = 'Restart this server on another profile (your files are kept)';
      sw.addEventListener('click', () => go());
      this._grant.append(sw);
    }
  }

  private renderTeam(a: ITeamAnswer): void {
    this._team.replaceChildren(h('h3', '', a.team ? `Team ${a.team}` : 'Team'));
    if (!a.usage) {
      this._team.append(h('p', 'jp-gpushare-muted', a.error || 'No team usage available.'));
      return;
    }
    const t = h('table', 'jp-gpushare-table');
    t.append(row(['Pool', 'In use / guaranteed', 'Borrowed', `GPU-hours ${a.usage.month}`], 'th'));
    for (const [pool, p] of Object.entries(a.usage.pools)) {
      const budget = p.gpu_hours_budget;
      const tr = row([
        pool,
        `${p.in_use} / ${p.guaranteed} (+${p.borrow_limit} borrowable)`,
        String(p.borrowed),
        budget ? `${p.gpu_hours_month.toFixed(1)} of ${budget}` : p.gpu_hours_month.toFixed(1)
      ]);
      if (budget && p.gpu_hours_month > 0.9 * budget) {
        tr.dataset.level = 'high';
      } else if (p.in_use > p.guaranteed) {
        tr.dataset.level = 'warn';
      }
      t.append(tr);
    }
    this._team.append(t);
  }

  private onNotice(_: NoticeBoard, n: IActiveNotice | null): void {
    if (!n) {
      this._preempt.hidden = true;
      return;
    }
    const left = (n.deadline - Date.now()) / 1000;
    this._preempt.hidden = false;
    this._preempt.replaceChildren(
      h('strong', '', left > 0 ? `Preemption in ${countdown(left)}` : 'Preemption now'),
      h(
        'p',
        '',
        `This server will be stopped at ${new Date(n.deadline).toLocaleTimeString()}` +
          `${n.notice.reason ? ` (${n.notice.reason})` : ''}. Save and checkpoint now; your files ` +
          'are kept. Submit the notebook as a batch job to let it queue and resume.'
      )
    );
  }

  private _visible = false;
  private _slowTimer = 0;
  private _limits: ISample['limits'] | null = null;
  private _title = h('div', 'jp-gpushare-title');
  private _sim = h('span');
  private _preempt = h('div');
  private _message = h('p');
  private _charts = h('div');
  private _hints = h('div');
  private _kernels = h('div', 'jp-gpushare-section');
  private _grant = h('div', 'jp-gpushare-section');
  private _team = h('div', 'jp-gpushare-section');
  private _mem = new LineChart({ title: 'Your GPU memory', unit: 'GiB', windowMs: WINDOW_MS, limitLabel: 'limit' });
  private _cpu = new LineChart({ title: 'Your compute', unit: '%', windowMs: WINDOW_MS, limitLabel: 'share' });
}

function row(cells: string[], tag = 'td'): HTMLElement {
  const tr = h('tr');
  for (const c of cells) {
    tr.append(h(tag, '', c));
  }
  return tr;
}

/** "10 min", "8 h", "1.5 h", "3 d": a profile's max lifetime. */
export function lifetime(seconds: number): string {
  if (seconds < 3600) {
    return `${Math.max(1, Math.round(seconds / 60))} min`;
  }
  if (seconds < 2 * 86400) {
    return `${Number((seconds / 3600).toFixed(1))} h`;
  }
  return `${Number((seconds / 86400).toFixed(1))} d`;
}

/** "18:40" today, or "Wed 18:40" on another day (local time). */
function stopsAt(ms: number): string {
  const d = new Date(ms);
  const time = d.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', hour12: false });
  return d.toDateString() === new Date().toDateString()
    ? time
    : `${d.toLocaleDateString([], { weekday: 'short', day: 'numeric', month: 'short' })} ${time}`;
}
