/** The status bar item: own GPU memory vs limit, own compute vs share, preemption countdown. */
import { Widget } from '@lumino/widgets';

import { ISample } from './api';
import { countdown, figures } from './format';
import { IActiveNotice } from './notices';

export class GPUStatusItem extends Widget {
  constructor(private readonly onOpen: () => void) {
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
    this.node.title = 'GPU use of this server: waiting for the first sample';
    this.node.append(this._count, this._text, this._sim);
    this.node.addEventListener('click', () => this.onOpen());
    this.node.addEventListener('keydown', ev => {
      if (ev.key === 'Enter' || ev.key === ' ') {
        this.onOpen();
      }
    });
  }

  update_(s: ISample): void {
    const f = figures(s);
    this._text.textContent = f.text;
    this._sim.hidden = !f.simulated;
    this.node.dataset.level = f.level;
    this.node.dataset.memory = f.memoryLevel;
    this.node.dataset.compute = f.computeLevel;
    this._tooltip = f.tooltip;
    this.refreshTitle();
  }

  setNotice(n: IActiveNotice | null): void {
    this._notice = n;
    if (!n) {
      this._count.hidden = true;
      this.node.dataset.preempt = '';
    } else {
      const left = (n.deadline - Date.now()) / 1000;
      this._count.hidden = false;
      this._count.textContent = left > 0 ? `⚠ preempted in ${countdown(left)}` : '⚠ preempting now';
      this.node.dataset.preempt = 'yes';
    }
    this.refreshTitle();
  }

  private refreshTitle(): void {
    const n = this._notice;
    const pre = n
      ? `This server will be stopped for preemption in ${countdown((n.deadline - Date.now()) / 1000)}` +
        `${n.notice.reason ? ` (${n.notice.reason})` : ''}: save and checkpoint now.\n`
      : '';
    this.node.title = pre + this._tooltip;
  }

  private _text = document.createElement('span');
  private _sim = document.createElement('span');
  private _count = document.createElement('span');
  private _tooltip = '';
  private _notice: IActiveNotice | null = null;
}
