/**
 * A tiny SVG time-series chart (no charting library): one line for the measured figure and a
 * dashed line for its limit, a time axis with distinct relative labels. Loaded with the panel.
 */
const NS = 'http://www.w3.org/2000/svg';

export interface IPoint {
  t: number; // ms since epoch
  v: number | null;
}

export interface IChartOptions {
  title: string;
  unit: string;
  windowMs: number;
  /** The figure's limit (drawn dashed), e.g. the memory limit or the compute share. */
  limitLabel: string;
}

function el<K extends keyof SVGElementTagNameMap>(
  name: K,
  attrs: Record<string, string | number>
): SVGElementTagNameMap[K] {
  const e = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) {
    e.setAttribute(k, String(v));
  }
  return e;
}

export function relativeLabel(ms: number): string {
  if (ms <= 500) {
    return 'now';
  }
  const s = Math.round(ms / 1000);
  return s < 60 ? `-${s}s` : `-${Math.floor(s / 60)}:${String(s % 60).padStart(2, '0')}`;
}

export class LineChart {
  readonly node: HTMLElement;

  constructor(private readonly opts: IChartOptions) {
    this.node = document.createElement('figure');
    this.node.className = 'jp-gpushare-chart';
    const cap = document.createElement('figcaption');
    this._title.textContent = opts.title;
    this._title.className = 'jp-gpushare-chart-title';
    this._value.className = 'jp-gpushare-chart-value';
    cap.append(this._title, ' ', this._value);
    this._svg = el('svg', { viewBox: `0 0 ${this.w} ${this.h}`, role: 'img' });
    this._svg.setAttribute('aria-label', opts.title);
    this.node.append(cap, this._svg);
  }

  /** Says whose figure it is (the caption) and what its dashed line is. */
  setTitle(title: string, limitLabel: string = this.opts.limitLabel): void {
    if (title === this.opts.title && limitLabel === this.opts.limitLabel) {
      return;
    }
    this.opts.title = title;
    this.opts.limitLabel = limitLabel;
    this._title.textContent = title;
    this._svg.setAttribute('aria-label', title);
    this.render(Date.now());
  }

  setData(points: IPoint[], limit: number | null, now: number = Date.now()): void {
    this._points = points;
    this._limit = limit;
    this.render(now);
  }

  push(p: IPoint, limit: number | null): void {
    this._points.push(p);
    this._limit = limit;
    const cut = p.t - this.opts.windowMs;
    while (this._points.length && this._points[0].t < cut) {
      this._points.shift();
    }
    this.render(p.t);
  }

  get pointCount(): number {
    return this._points.length;
  }

  private render(now: number): void {
    const { w, h, padL, padB, padT } = this;
    const svg = this._svg;
    while (svg.firstChild) {
      svg.removeChild(svg.firstChild);
    }
    const t0 = now - this.opts.windowMs;
    const vals = this._points.map(p => p.v).filter((v): v is number => v !== null);
    const top = Math.max(this._limit ?? 0, ...vals, 1) * 1.1;
    const x = (t: number) => padL + ((t - t0) / this.opts.windowMs) * (w - padL - 4);
    const y = (v: number) => padT + (1 - v / top) * (h - padT - padB);
    // grid and value axis
    for (const f of [0, 0.5, 1]) {
      const v = (top / 1.1) * f;
      svg.append(el('line', { x1: padL, x2: w - 4, y1: y(v), y2: y(v), class: 'grid' }));
      const label = el('text', { x: padL - 4, y: y(v) + 3, class: 'axis', 'text-anchor': 'end' });
      label.textContent = fmt(v);
      svg.append(label);
    }
    // time axis: distinct relative labels
    for (const f of [0, 1 / 3, 2 / 3, 1]) {
      const t = t0 + f * this.opts.windowMs;
      const label = el('text', {
        x: x(t),
        y: h - 4,
        class: 'axis',
        'text-anchor': f === 0 ? 'start' : f === 1 ? 'end' : 'middle'
      });
      label.textContent = relativeLabel(now - t);
      svg.append(label);
    }
    if (this._limit !== null) {
      svg.append(
        el('line', { x1: padL, x2: w - 4, y1: y(this._limit), y2: y(this._limit), class: 'limit' })
      );
      const lab = el('text', { x: w - 6, y: y(this._limit) - 3, class: 'limit-label', 'text-anchor': 'end' });
      lab.textContent = `${this.opts.limitLabel} ${fmt(this._limit)} ${this.opts.unit}`;
      svg.append(lab);
    }
    let d = '';
    let pen = false;
    for (const p of this._points) {
      if (p.t < t0 || p.v === null) {
        pen = false;
        continue;
      }
      d += `${pen ? 'L' : 'M'}${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`;
      pen = true;
    }
    if (d) {
      svg.append(el('path', { d, class: 'series' }));
    }
    const last = [...this._points].reverse().find(p => p.v !== null);
    this._value.textContent = last ? `${fmt(last.v as number)} ${this.opts.unit}` : 'no data';
    const over = last && this._limit !== null && (last.v as number) > this._limit;
    this.node.dataset.over = over ? 'yes' : 'no';
  }

  private readonly w = 300;
  private readonly h = 130;
  private readonly padL = 36;
  private readonly padB = 16;
  private readonly padT = 8;
  private _svg: SVGSVGElement;
  private _value = document.createElement('span');
  private _points: IPoint[] = [];
  private _limit: number | null = null;
  private _title = document.createElement('span');
}

function fmt(v: number): string {
  return v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2).replace(/\.?0+$/, '') || '0';
}
