/**
 * What a job's buttons do: open the output notebook (or say why there is none), download it,
 * write its HTML beside it, delete a finished job from the history, and confirm a cancel.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { apiUrl } from './api';
import { trans } from './i18n';
import { IJob } from './jobsapi';
import { localTime } from './when';

const HIDDEN_KEY = 'jupyter-gpushare:jobs-deleted';

function contentsUrl(path: string, s: ServerConnection.ISettings): string {
  return URLExt.join(s.baseUrl, 'api/contents', URLExt.encodeParts(path));
}

/** Whether a file is in the user's files (the contents API: 200, or 404). */
export async function fileExists(path: string): Promise<boolean> {
  const s = ServerConnection.makeSettings();
  const r = await ServerConnection.makeRequest(`${contentsUrl(path, s)}?content=0`, {}, s);
  return r.ok;
}

/** Why a job has no output notebook, in words. */
export function noOutputText(j: IJob): string {
  const t = trans();
  const why =
    j.state === 'failed'
      ? t.__('it failed before writing one: %1', j.error?.summary || j.reason)
      : j.state === 'cancelled'
        ? t.__('it was cancelled before its first cell finished')
        : t.__('it ended %1: %2', j.state, j.reason);
  return t.__('Job %1 has no output notebook (%2) at %3: %4. Its log says what it did.', j.name, j.id, j.output_path || '?', why);
}

/** Open the output notebook if it is there; otherwise say why not (no silent 404). */
export async function openOutputOf(j: IJob, open: (path: string) => void, showLog: () => void): Promise<boolean> {
  const path = j.output_path;
  if (path && (await fileExists(path))) {
    open(path);
    return true;
  }
  const t = trans();
  const res = await showDialog({
    title: t.__('No output notebook'),
    body: noOutputText(j),
    buttons: [Dialog.cancelButton({ label: t.__('Close') }), Dialog.okButton({ label: t.__('Show log') })]
  });
  if (res.button.accept) {
    showLog();
  }
  return false;
}

/** The executed notebook as a download, named by the server (Content-Disposition). */
export async function downloadOutput(j: IJob): Promise<void> {
  const s = ServerConnection.makeSettings();
  const r = await ServerConnection.makeRequest(apiUrl(`jobs/${encodeURIComponent(j.id)}/output`, s), {}, s);
  if (!r.ok) {
    throw new Error(noOutputText(j));
  }
  const blob = await r.blob();
  const a = document.createElement('a');
  a.href = URL.createObjectURL(blob);
  a.download = (j.output_path || `${j.name}-${j.id}.ipynb`).split('/').pop() as string;
  a.className = 'jp-gpushare-download';
  document.body.append(a);
  a.click();
  window.setTimeout(() => {
    URL.revokeObjectURL(a.href);
    a.remove();
  }, 1000);
}

export function htmlPathOf(notebookPath: string): string {
  return notebookPath.replace(/\.ipynb$/i, '') + '.html';
}

/** Convert the output notebook with jupyter_server's nbconvert and save it beside it. */
export async function writeHtml(j: IJob): Promise<string> {
  const path = j.output_path as string;
  const s = ServerConnection.makeSettings();
  const conv = await ServerConnection.makeRequest(
    URLExt.join(s.baseUrl, 'nbconvert/html', URLExt.encodeParts(path)) + '?download=false',
    {},
    s
  );
  if (!conv.ok) {
    throw new Error(trans().__('HTML conversion of %1 failed: %2 %3', path, conv.status, conv.statusText));
  }
  const html = await conv.text();
  const target = htmlPathOf(path);
  const put = await ServerConnection.makeRequest(
    contentsUrl(target, s),
    { method: 'PUT', body: JSON.stringify({ type: 'file', format: 'text', content: html }) },
    s
  );
  if (!put.ok) {
    throw new Error(trans().__('Could not save %1: %2 %3', target, put.status, put.statusText));
  }
  return target;
}

/** Ask before stopping a running job. */
export async function confirmCancel(j: IJob): Promise<boolean> {
  const t = trans();
  const since = j.started_at ? t.__(' (running since %1)', localTime(j.started_at, true)) : '';
  const res = await showDialog({
    title: t.__('Cancel job %1?', j.name),
    body: t.__(
      'The run%1 is stopped (SIGTERM, then SIGKILL). Its GPU is released; output written so far is kept as a partial output notebook.',
      since
    ),
    buttons: [Dialog.cancelButton({ label: t.__('Keep running') }), Dialog.warnButton({ label: t.__('Cancel job') })]
  });
  return res.button.accept;
}

/** Jobs the user deleted from the history (the broker keeps its record until retention). */
export function deletedJobs(): Set<string> {
  try {
    return new Set(JSON.parse(window.localStorage.getItem(HIDDEN_KEY) || '[]'));
  } catch {
    return new Set();
  }
}

/** Delete a finished job from the history and its output files, after asking. */
export async function deleteJob(j: IJob): Promise<boolean> {
  const t = trans();
  const files = j.output_path ? [j.output_path, htmlPathOf(j.output_path)] : [];
  const res = await showDialog({
    title: t.__('Delete job %1?', j.name),
    body: files.length
      ? t.__('It leaves your job history and its output files are deleted: %1.', files.join(', '))
      : t.__('It leaves your job history.'),
    buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: t.__('Delete') })]
  });
  if (!res.button.accept) {
    return false;
  }
  const s = ServerConnection.makeSettings();
  for (const f of files) {
    if (await fileExists(f)) {
      await ServerConnection.makeRequest(contentsUrl(f, s), { method: 'DELETE' }, s);
    }
  }
  const gone = deletedJobs();
  gone.add(j.id);
  window.localStorage.setItem(HIDDEN_KEY, JSON.stringify([...gone]));
  return true;
}
