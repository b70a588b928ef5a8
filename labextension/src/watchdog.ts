/**
 * When the watchdog stops a kernel for its GPU memory limit, the notebook using that kernel
 * shows the watchdog's own message in a banner above the cells, and a notification appears.
 */
import { Notification } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';

import { Widget } from '@lumino/widgets';

import { IWatchdogEvent } from './api';
import { trans } from './i18n';
import { localTime } from './when';

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

/** One notification per kernel (or process): a repeat updates it with the count and time. */
const shown = new Map<string, { id: string; count: number }>();

export function watchdogKey(ev: IWatchdogEvent): string {
  const e = ev as IWatchdogEvent & { pid?: number | null };
  return ev.kernel_id ? `kernel:${ev.kernel_id}` : e.pid ? `pid:${e.pid}` : `message:${ev.message}`;
}

export function notifyWatchdog(ev: IWatchdogEvent): void {
  const key = watchdogKey(ev);
  const at = localTime(ev.ts ? ev.ts * 1000 : Date.now());
  const prev = shown.get(key);
  // the server counts its actions per kernel; events may arrive out of order
  const told = (ev as IWatchdogEvent & { times?: number }).times;
  const count = typeof told === 'number' ? told : (prev?.count ?? 0) + 1;
  if (prev && count < prev.count) {
    return; // an earlier action's event after a later one: the notification is newer
  }
  // what was done and how often first: a long message is cut short in the notification
  const t = trans();
  const verbs: Record<string, string> = {
    restart: t.__('restarted'),
    shutdown: t.__('shut down'),
    interrupt: t.__('interrupted')
  };
  const done = ev.kernel_id ? verbs[ev.action || ''] || ev.action || t.__('acted on') : t.__('stopped');
  const who = ev.kernel_id ? t.__('the kernel of %1', ev.path || ev.kernel_id) : t.__('a process of this server');
  const text =
    t.__('GPU watchdog %1 %2 at %3', done, who, at) +
    (count > 1 ? t.__(' (%1 times for this kernel)', count) : '') +
    `: ${ev.message}`;
  if (prev && Notification.manager.has(prev.id)) {
    Notification.update({ id: prev.id, message: text, type: 'error', autoClose: false });
    shown.set(key, { id: prev.id, count });
  } else {
    shown.set(key, { id: Notification.error(text, { autoClose: false }), count });
  }
}

export function showWatchdog(tracker: INotebookTracker | null, ev: IWatchdogEvent): void {
  const panels = panelsForKernel(tracker, ev.kernel_id);
  notifyWatchdog(ev);
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
    (banner.node.firstChild as HTMLElement).textContent = trans().__('GPU watchdog: %1', ev.message);
  }
}

function bannerOf(p: NotebookPanel): Widget | undefined {
  return p.contentHeader.widgets.find(w => w.hasClass(BANNER_CLASS));
}
