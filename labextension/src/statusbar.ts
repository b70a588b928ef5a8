/**
 * The status bar item: own GPU memory vs limit, own compute vs share, this server's host CPU
 * and memory (the figures the settings choose, in their order), preemption countdown.
 */
import { Widget } from '@lumino/widgets';

import { ISample } from './api';
import { countdown, figures, IFigures, pct } from './format';
import { IHostUse } from './host';
import { trans } from './i18n';
import { IActiveNotice } from './notices';
import { Figure, IGPUShareSettings } from './settings';

/** "812 MiB" below a GiB, "1.2 GiB" above. */
export function hostMemory(mib: number): string {
  return mib < 1024 ? `${Math.round(mib)} MiB` : `${(mib / 1024).toFixed(1)} GiB`;
}

/** The host part of the status bar and its tooltip lines. */
export function hostFigures(h: IHostUse | null, show: Figure[]): { parts: string[]; tooltip: string } {
  const t = trans();
  if (!h) {
    return { parts: [], tooltip: '' };
  }
  const parts: string[] = [];
  const lines: string[] = [];
  const from =
    h.source === 'jupyter-resource-usage'
      ? t.__("from jupyter-resource-usage's /api/metrics/v1")
      : t.__('measured by gpushare');
  for (const f of show) {
    if (f === 'host-cpu') {
      parts.push(h.cpu_pct === null ? t.__('CPU n/a') : t.__('CPU %1', pct(h.cpu_pct)));
      lines.push(
        h.cpu_pct === null
          ? t.__('Host CPU: not measured (jupyter-resource-usage: set ResourceUseDisplay.track_cpu_percent).')
          : t.__(
              "Host CPU of this server's processes: %1 (100 % = one core%2).",
              pct(h.cpu_pct),
              h.cpu_count ? t.__('; %1 cores', h.cpu_count) : ''
            )
      );
    } else if (f === 'host-memory' && h.rss_mib !== null) {
      const lim = h.memory_limit_mib;
      parts.push(t.__('Mem %1', lim ? `${hostMemory(h.rss_mib).replace(/ [MG]iB/, '')}/${hostMemory(lim)}` : hostMemory(h.rss_mib)));
      lines.push(
        t.__("Host memory of this server's processes: %1", hostMemory(h.rss_mib)) +
          (lim ? t.__(' of %1', hostMemory(lim)) : t.__(' (no limit set)')) +
          '.'
      );
    }
  }
  return { parts, tooltip: lines.length ? `${lines.join('\n')}\n(${from})` : '' };
}

export class GPUStatusItem extends Widget {
  constructor(
    private readonly onOpen: () => void,
    private settings: IGPUShareSettings
  ) {
    super();
    this.addClass('jp-gpushare-status');
    this.node.setAttribute('role', 'button');
    this.node.tabIndex = 0;
    this.node.dataset.level = 'none';
    this._text.className = 'jp-gpushare-status-text';
    this._sim.className = 'jp-gpushare-sim';
    this._sim.textContent = 'sim';
    this._sim.hidden = true;
    this._count.className = 'jp-gpushare-countdown';
    this._count.hidden = true;
    this._text.textContent = 'GPU …';
    this.node.title = trans().__('GPU use of this server: waiting for the first sample');
    this.node.append(this._count, this._text, this._sim);
    this.node.addEventListener('click', () => this.onOpen());
    this.node.addEventListener('keydown', ev => {
      if (ev.key === 'Enter' || ev.key === ' ') {
        this.onOpen();
      }
    });
  }

  update_(s: ISample): void {
    this._sample = s;
    this.render();
  }

  setHost(h: IHostUse | null): void {
    this._host = h;
    this.render();
  }

  setSettings(s: IGPUShareSettings): void {
    this.settings = s;
    this.render();
  }

  setNotice(n: IActiveNotice | null): void {
    this._notice = n;
    if (!n) {
      this._count.hidden = true;
      this.node.dataset.preempt = '';
    } else {
      const left = (n.deadline - Date.now()) / 1000;
      this._count.hidden = false;
      this._count.textContent =
        left > 0 ? trans().__('⚠ preempted in %1', countdown(left)) : trans().__('⚠ preempting now');
      this.node.dataset.preempt = 'yes';
    }
    this.refreshTitle();
  }

  private render(): void {
    const show = this.settings.statusBarFigures;
    const parts: string[] = [];
    let f: IFigures | null = null;
    if (this._sample) {
      f = figures(this._sample, { warn: this.settings.memoryWarnRatio, high: this.settings.memoryHighRatio });
      const gpuNone = f.computeText === '';
      if (gpuNone || show.includes('gpu-memory')) {
        parts.push(f.memoryText);
      }
      if (!gpuNone && show.includes('gpu-compute')) {
        parts.push(show.includes('gpu-memory') ? f.computeText : `GPU ${f.computeText}`);
      }
      this._sim.hidden = !f.simulated;
      this.node.dataset.level = f.level;
      this.node.dataset.memory = f.memoryLevel;
      this.node.dataset.compute = f.computeLevel;
    }
    const host = hostFigures(this._host, show);
    parts.push(...host.parts);
    this.node.dataset.figures = show.join(' ');
    this.node.dataset.hostSource = this._host?.source ?? '';
    if (parts.length) {
      this._text.textContent = parts.join(' · ');
    }
    this._tooltip = [f?.tooltip ?? '', host.tooltip].filter(Boolean).join('\n');
    this.refreshTitle();
  }

  private refreshTitle(): void {
    const n = this._notice;
    const pre = n
      ? trans().__(
          'This server will be stopped for preemption in %1%2: save and checkpoint now.\n',
          countdown((n.deadline - Date.now()) / 1000),
          n.notice.reason ? ` (${n.notice.reason})` : ''
        )
      : '';
    this.node.title = pre + this._tooltip;
  }

  private _text = document.createElement('span');
  private _sim = document.createElement('span');
  private _count = document.createElement('span');
  private _tooltip = '';
  private _sample: ISample | null = null;
  private _host: IHostUse | null = null;
  private _notice: IActiveNotice | null = null;
}
