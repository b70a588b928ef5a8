/**
 * "Switch hardware": move this server to another profile the user may use. A confirmation says
 * what restarts and what is kept; then, with the user's own hub session (the hub's REST API
 * with its XSRF token, as the hub's own pages do), the server is stopped and started with the
 * new profile, and JupyterLab reloads into it. A refused start restarts the old profile.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { PageConfig, URLExt } from '@jupyterlab/coreutils';
import { Widget } from '@lumino/widgets';

import { requestAPI } from './api';
import { trans } from './i18n';

interface ISwitchProfile {
  slug: string;
  display_name: string;
  pool: string;
  gpu: { describe: string; count?: number; fraction?: number };
  availability: Record<
    string,
    {
      in_use: number;
      guaranteed: number;
      within_guarantee: boolean;
      within_borrow_limit: boolean;
      fits_now: boolean;
      decision?: { outcome: string; reason: string; borrowed: boolean | null };
    }
  >;
}

interface ISwitchOptions {
  hub: { prefix: string; user: string; server_name: string };
  current: string | null;
  restarts: string[];
  kept: string[];
  profiles: ISwitchProfile[];
  teams?: string[];
  error: string | null;
}

function h(tag: string, text = '', cls = ''): HTMLElement {
  const e = document.createElement(tag);
  if (text) {
    e.textContent = text;
  }
  if (cls) {
    e.className = cls;
  }
  return e;
}

function outlook(p: ISwitchProfile): { ok: boolean; text: string } {
  if (!p.gpu.count && !p.gpu.fraction) {
    // no GPU: no team quota to count it against, so no team availability to show
    return { ok: true, text: trans().__('no GPU: starts now, outside every GPU quota') };
  }
  for (const [team, a] of Object.entries(p.availability)) {
    const d = a.decision;
    if (d) {
      const ok = d.outcome === 'granted';
      const text = ok
        ? `starts now${d.borrowed ? ' (borrowed: may be preempted)' : ''}`
        : d.outcome === 'preempting'
          ? `starts after reclaiming borrowed capacity: ${d.reason}`
          : `${d.outcome}: ${d.reason}`;
      return { ok: ok || d.outcome === 'preempting', text: `team ${team}: ${text}` };
    }
    if (a.fits_now && a.within_borrow_limit) {
      return { ok: true, text: `team ${team}: ${a.within_guarantee ? 'starts now' : 'would borrow'}` };
    }
    return { ok: false, text: `team ${team}: ${a.in_use} of ${a.guaranteed} in use; would not start now` };
  }
  return { ok: false, text: 'not for your teams' };
}

class SwitchBody extends Widget {
  constructor(o: ISwitchOptions) {
    super();
    this.addClass('jp-gpushare-switch');
    this.node.append(h('p', `Current profile: ${o.current || 'none'}`));
    const sel = this._select;
    sel.name = 'profile';
    for (const p of o.profiles.filter(p => p.slug !== o.current)) {
      const look = outlook(p);
      const opt = h('option', `${p.display_name} (${p.gpu.describe}) — ${look.text}`) as HTMLOptionElement;
      opt.value = p.slug;
      sel.append(opt);
    }
    const label = h('label', 'Switch to');
    this.node.append(label, sel);
    const restarts = h('ul');
    for (const r of o.restarts) {
      restarts.append(h('li', r));
    }
    const kept = h('ul');
    for (const k of o.kept) {
      kept.append(h('li', k));
    }
    this.node.append(h('p', 'This stops and restarts the server. What restarts:', 'jp-gpushare-switch-head'), restarts);
    this.node.append(h('p', 'What is kept:', 'jp-gpushare-switch-head'), kept);
  }

  getValue(): string {
    return this._select.value;
  }

  private _select = document.createElement('select');
}

/** The hub's XSRF token, read from one of the hub's own pages (as its JavaScript does). */
async function hubXsrf(prefix: string): Promise<string> {
  const r = await fetch(URLExt.join(prefix, 'home'), { credentials: 'same-origin' });
  const html = await r.text();
  const m = html.match(/xsrf_token:\s*"([^"]+)"/);
  if (!m) {
    throw new Error('cannot read the hub session (log in to the hub again)');
  }
  return m[1];
}

async function hubApi(prefix: string, xsrf: string, method: string, path: string, body?: unknown): Promise<Response> {
  return fetch(URLExt.join(prefix, 'api', path), {
    method,
    credentials: 'same-origin',
    headers: { 'X-XSRFToken': xsrf, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body)
  });
}

async function waitFor(check: () => Promise<boolean>, timeoutMs: number): Promise<boolean> {
  const end = Date.now() + timeoutMs;
  while (Date.now() < end) {
    if (await check()) {
      return true;
    }
    await new Promise(r => setTimeout(r, 1000));
  }
  return false;
}

export async function switchHardware(saveAll: () => Promise<unknown>): Promise<void> {
  const o = await requestAPI<ISwitchOptions>('switch');
  const prefix = o.hub.prefix || PageConfig.getOption('hubPrefix');
  if (o.error || !prefix || !o.hub.user) {
    await showDialog({
      title: 'Switch hardware',
      body: o.error || 'This server was not started by JupyterHub: there is nothing to switch.',
      buttons: [Dialog.okButton()]
    });
    return;
  }
  if (!o.profiles.some(p => p.slug !== o.current)) {
    await showDialog({ title: 'Switch hardware', body: 'No other profile is open to your teams.', buttons: [Dialog.okButton()] });
    return;
  }
  const body = new SwitchBody(o);
  const res = await showDialog({
    title: 'Switch hardware',
    body,
    buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Save, stop and restart' })]
  });
  if (!res.button.accept || !res.value) {
    return;
  }
  const slug = res.value;
  const user = encodeURIComponent(o.hub.user);
  const server = o.hub.server_name;
  const serverPath = server ? `users/${user}/servers/${encodeURIComponent(server)}` : `users/${user}/server`;
  const progress = h('p', 'Saving…');
  const wait = new Widget();
  wait.node.append(progress);
  const waiting = new Dialog({ title: 'Switching hardware', body: wait, buttons: [] });
  waiting.addClass('jp-gpushare-switch-progress');
  void waiting.launch();
  const say = (t: string) => {
    progress.textContent = t;
  };
  try {
    await saveAll();
    const xsrf = await hubXsrf(prefix);
    say('Stopping this server…');
    const stop = await hubApi(prefix, xsrf, 'DELETE', serverPath);
    if (!stop.ok && stop.status !== 204) {
      throw new Error(`the hub refused to stop the server (${stop.status})`);
    }
    const stopped = await waitFor(async () => {
      const r = await hubApi(prefix, xsrf, 'GET', `users/${user}`);
      const m = await r.json();
      return !(server in (m.servers || {}));
    }, 120000);
    if (!stopped) {
      throw new Error('the server did not stop within 2 minutes');
    }
    say(`Starting with profile ${slug}…`);
    let start = await hubApi(prefix, xsrf, 'POST', serverPath, { profile: slug });
    if (!start.ok) {
      const why = await start.text();
      say(`The new profile was refused; restarting ${o.current || 'the old profile'}…`);
      start = await hubApi(prefix, xsrf, 'POST', serverPath, o.current ? { profile: o.current } : {});
      throw new Error(`${slug} was refused: ${(() => {
        try {
          return JSON.parse(why).message || why;
        } catch {
          return why;
        }
      })()}`);
    }
    say('Waiting for the new server…');
  } catch (e) {
    waiting.dispose();
    await showDialog({ title: 'Switch hardware', body: String((e as Error).message || e), buttons: [Dialog.okButton()] });
    // the hub's spawn-pending page shows the start and opens the server when it is ready
    window.location.href = URLExt.join(prefix, 'spawn-pending', o.hub.user, server);
    return;
  }
  // the hub's spawn-pending page follows the start and opens JupyterLab when it is ready
  window.location.href = URLExt.join(prefix, 'spawn-pending', o.hub.user, server);
}
