/**
 * When the watchdog stops a kernel for its GPU memory limit, the notebook using that kernel
 * shows the watchdog's own message in a banner above the cells, and a notification appears.
 */
import { Notification } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';

import { Widget } from '@lumino/widgets';

import { IWatchdogEvent } from './api';

export const BANNER_CLASS = 'jp-gpushare-watchdog';

export function panelsForKernel(tracker: INotebookTracker | null, kernelId: string | null | undefined): NotebookPanel[] {
  const out: NotebookPanel[] = [];
  tracker?.forEach(p => {
    const kid = p.sessionContext.session?.kernel?.id;
    if (kernelId && kid === kernelId) {
      out.push(p);
    }
  });
  return out;
}

export function showWatchdog(tracker: INotebookTracker | null, ev: IWatchdogEvent): void {
  const panels = panelsForKernel(tracker, ev.kernel_id);
  Notification.error(`GPU watchdog: ${ev.message}`, { autoClose: false });
  for (const p of panels) {
    let banner = bannerOf(p);
    if (!banner) {
      banner = new Widget();
      banner.addClass(BANNER_CLASS);
      banner.node.setAttribute('role', 'alert');
      const text = document.createElement('span');
      const close = document.createElement('button');
      close.className = 'jp-gpushare-banner-close';
      close.textContent = '×';
      close.title = 'Dismiss';
      const w = banner;
      close.addEventListener('click', () => w.dispose());
      banner.node.append(text, close);
      // the notebook's content header: between the toolbar and the cells
      p.contentHeader.addWidget(banner);
    }
    (banner.node.firstChild as HTMLElement).textContent = `GPU watchdog: ${ev.message}`;
  }
}

function bannerOf(p: NotebookPanel): Widget | undefined {
  return p.contentHeader.widgets.find(w => w.hasClass(BANNER_CLASS));
}
