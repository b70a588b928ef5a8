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
import { countdown, gib, memoryScope, pct } from './format';
import { HostMetrics, IHostUse } from './host';
import { trans } from './i18n';
import { IActiveNotice, NoticeBoard } from './notices';
import { Settings } from './settings';
import { hostMemory } from './statusbar';
import { MetricsStream } from './stream';
import { localFull, localTime } from './when';

const WINDOW_MS = 5 * 60 * 1000;
/** The grant and the team change slowly: re-read every this many refresh intervals. */
const SLOW_REFRESH_INTERVALS = 6;

export interface IPanelContext {
  stream: MetricsStream;
  notices: NoticeBoard;
  settings?: Settings;
  host?: HostMetrics;
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
      this._team,
      this._hostBox
    );
    this._hostBox.hidden = true;
    ctx.host?.changed.connect((_, hu) => this.renderHost(hu), this);
    this.renderHost(ctx.host?.latest ?? null);
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
      }, (this.ctx.settings?.refreshMs ?? 5000) * SLOW_REFRESH_INTERVALS);
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
    const scope = latest ? memoryScope(latest) : null;
    this._mem.setData(mem, scope ? scope.of_mib / 1024 : this.memLimit(nGpu));
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
      const scope = memoryScope(s);
      const card = scope.kind === 'card';
      const t = trans();
      this._mem.setTitle(scope.label, scope.ofLabel);
      this._cpu.setTitle(
        card ? t.__('Whole GPU compute, other users included') : t.__("Compute of this server's kernels"),
        t.__('share')
      );
      this._charts.dataset.scope = scope.kind;
      this._mem.push({ t: s.ts * 1000, v: scope.used_mib / 1024 }, scope.of_mib / 1024);
      // your share is not a line to read the whole card's compute against
      this._cpu.push({ t: s.ts * 1000, v: ownCompute(s.gpus) }, card ? null : s.limits.compute_pct);
    }
    this.renderKernels(s);
    this.renderHints(s);
  }

  private renderKernels(s: ISample): void {
    const ks = s.attribution?.kernels || [];
    this._kernels.replaceChildren(h('h3', '', trans().__('Per notebook')));
    if (s.attribution?.mode === 'device_totals') {
      this._kernels.append(
        h(
          'p',
          'jp-gpushare-muted',
          trans().__(
            "Per-notebook GPU use is not measurable here: no process of this server is visible on the GPU (%1). The charts above show the whole GPU, other users included.",
            s.attribution.note || trans().__('their PIDs are hidden or gone')
          )
        )
      );
      return;
    }
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
      items.push(['Granted at', localTime(bg.granted_at, true)]);
    }
    for (const [k, v] of items) {
      const dd = h('dd', '', v);
      if (k === 'Granted at' && typeof bg.granted_at === 'string') {
        dd.title = localFull(bg.granted_at);
      }
      dl.append(h('dt', '', k), dd);
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
    const t = trans();
    this._team.replaceChildren(h('h3', '', a.team ? t.__('Team %1', a.team) : t.__('Team')));
    if (!a.usage) {
      this._team.append(h('p', 'jp-gpushare-muted', a.error || t.__('No team usage available.')));
      return;
    }
    // three columns that fit the panel: the GPU-hours column is never cut off
    const table = h('table', 'jp-gpushare-table jp-gpushare-team-table');
    table.append(
      row([t.__('Pool'), t.__('GPUs in use of guaranteed'), t.__('GPU-hours\n%1', a.usage.month)], 'th')
    );
    for (const [pool, p] of Object.entries(a.usage.pools)) {
      const budget = p.gpu_hours_budget;
      const inUse =
        t.__('%1 of %2', num(p.in_use), num(p.guaranteed)) +
        (p.borrowed ? t.__(' (%1 borrowed)', num(p.borrowed)) : '') +
        (p.borrow_limit ? t.__('; may borrow %1', num(p.borrow_limit)) : '');
      const tr = row([
        pool,
        inUse,
        budget ? t.__('%1 of %2', p.gpu_hours_month.toFixed(1), num(budget)) : p.gpu_hours_month.toFixed(1)
      ]);
      if (budget && p.gpu_hours_month > 0.9 * budget) {
        tr.dataset.level = 'high';
      } else if (p.in_use > p.guaranteed) {
        tr.dataset.level = 'warn';
      }
      table.append(tr);
    }
    this._team.append(table);
  }

  private renderHost(hu: IHostUse | null): void {
    const t = trans();
    this._hostBox.hidden = !hu || (hu.rss_mib === null && hu.cpu_pct === null);
    if (!hu) {
      return;
    }
    const dl = h('dl', 'jp-gpushare-hostdl');
    const items: [string, string][] = [
      [t.__('CPU'), hu.cpu_pct === null ? t.__('not measured') : t.__('%1 (100 % = one core)', pct(hu.cpu_pct))],
      [
        t.__('Memory'),
        hu.rss_mib === null
          ? t.__('not measured')
          : hu.memory_limit_mib
            ? t.__('%1 of %2', hostMemory(hu.rss_mib), hostMemory(hu.memory_limit_mib))
            : hostMemory(hu.rss_mib)
      ],
      [
        t.__('Source'),
        hu.source === 'jupyter-resource-usage' ? t.__('jupyter-resource-usage') : t.__('gpushare (psutil)')
      ]
    ];
    for (const [k, v] of items) {
      dl.append(h('dt', '', k), h('dd', '', v));
    }
    this._hostBox.replaceChildren(h('h3', '', t.__("Host CPU and memory of this server's processes")), dl);
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
        `This server will be stopped at ${localTime(n.deadline, true)}` +
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
  private _hostBox = h('div', 'jp-gpushare-section jp-gpushare-host');
  private _mem = new LineChart({ title: "Your GPU memory (this server's kernels)", unit: 'GiB', windowMs: WINDOW_MS, limitLabel: 'limit' });
  private _cpu = new LineChart({ title: "Compute of this server's kernels", unit: '%', windowMs: WINDOW_MS, limitLabel: 'share' });
}

/** 0.25, 1.5, 2: GPU units without trailing zeros. */
function num(v: number): string {
  return String(Number(v.toFixed(3)));
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

/** Local time with the zone: "18:40 CET" today, "Wed 3 Dec 18:40 CET" another day. */
function stopsAt(ms: number): string {
  return localTime(ms, true);
}
