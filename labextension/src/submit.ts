/**
 * "Submit as batch job": a dialog with the profiles the user's team may use (each with what
 * the team has left), the allowed priorities, maximum runtime, checkpointing, the notebook's
 * papermill parameters and the backend; it validates before sending and shows the broker's
 * answer (running, queued with position and reason, or refused with the reason).
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { APIError } from './api';
import {
  IJob,
  IJobOptions,
  IJobProfile,
  ISubmit,
  fieldOf,
  jobOptions,
  submitJob
} from './jobsapi';

function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, string> = {},
  text = ''
): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    e.setAttribute(k, v);
  }
  if (text) {
    e.textContent = text;
  }
  return e;
}

function availabilityText(p: IJobProfile, team: string): string {
  const a = p.availability[team];
  if (!a) {
    return 'not for your team';
  }
  const left = Math.max(0, a.guaranteed - a.in_use);
  const head = `team ${team}: ${a.in_use} of ${a.guaranteed} in use, ${left} left`;
  if (a.within_guarantee && a.fits_now) {
    return `${head}; starts now`;
  }
  if (a.within_borrow_limit && a.fits_now) {
    return `${head}; would borrow (preemptible)`;
  }
  return `${head}; beyond what the team may use now (queues; a pool without queue refuses)`;
}

const NO_KERNEL =
  'This notebook names no kernel (metadata.kernelspec): open it, choose a kernel, save, then submit.';

export interface IFormValue {
  value: ISubmit;
  errors: Record<string, string>;
}

/** The dialog's body: a form; `getValue()` returns the request and what is wrong with it. */
export class SubmitForm extends Widget {
  constructor(
    private readonly options: IJobOptions,
    private readonly path: string,
    previous: ISubmit | null,
    private readonly problem: { field: string | null; message: string } | null
  ) {
    super({ node: document.createElement('form') });
    this.addClass('jp-gpushare-submit');
    this.build(previous);
  }

  private field(name: string, label: string, input: HTMLElement, help = ''): HTMLElement {
    const row = h('div', { class: 'jp-gpushare-field', 'data-field': name });
    const l = h('label', {}, label);
    const err = h('div', { class: 'jp-gpushare-field-error' });
    row.append(l, input);
    if (help) {
      row.append(h('div', { class: 'jp-gpushare-help' }, help));
    }
    row.append(err);
    this._errors[name] = err;
    this.node.append(row);
    return row;
  }

  private build(prev: ISubmit | null): void {
    const o = this.options;
    this.node.append(h('div', { class: 'jp-gpushare-submit-path' }, `Notebook: ${this.path}`));
    if (this.problem) {
      this.node.append(
        h('div', { class: 'jp-gpushare-refused', role: 'alert' }, `Refused: ${this.problem.message}`)
      );
    }
    // team (only where the user is in more than one)
    this._team.name = 'team';
    for (const t of o.teams) {
      this._team.append(h('option', { value: t }, t));
    }
    if (prev?.team) {
      this._team.value = prev.team;
    }
    if (o.teams.length > 1) {
      this.field('team', 'Team', this._team);
    }
    this._profile.name = 'profile';
    this.field('profile', 'Profile', this._profile);
    this._priority.name = 'priority';
    this.field('priority', 'Priority', this._priority);
    this._runtime.type = 'number';
    this._runtime.min = '1';
    this._runtime.name = 'max_runtime';
    this._runtime.value = String(
      prev?.max_runtime ? Math.round(prev.max_runtime / 60) : Math.round(o.limits.default_max_runtime / 60)
    );
    this._runtimeTyped = !!prev?.max_runtime;
    this._runtime.addEventListener('input', () => (this._runtimeTyped = true));
    this._runtimeHelp = this.field('max_runtime', 'Maximum runtime (minutes)', this._runtime, ' ');
    this._checkpoint.type = 'checkbox';
    this._checkpoint.name = 'checkpoint';
    this._checkpoint.checked = !!prev?.checkpoint;
    this._ckHelp = this.field(
      'checkpoint',
      'Checkpoints ($GPUSHARE_CHECKPOINT_DIR, resumed after preemption)',
      this._checkpoint,
      ' '
    );
    // parameters: the notebook's parameters cell, one input per parameter
    const nb = o.notebook;
    if (nb && !nb.kernelspec) {
      // the broker refuses a notebook that names no kernel: say so before submitting
      this.field('notebook', 'Kernel', h('span', {}, 'none'));
      this._errors.notebook.textContent = NO_KERNEL;
    }
    const params = h('div', { class: 'jp-gpushare-params' });
    if (nb?.parameters_cell) {
      params.append(h('pre', { class: 'jp-gpushare-params-cell' }, nb.parameters_cell));
      for (const p of nb.parameters) {
        const input = h('input', { name: `param:${p.name}`, placeholder: p.default });
        const prevVal = prev?.parameters?.[p.name];
        if (prevVal !== undefined) {
          input.value = typeof prevVal === 'string' ? prevVal : JSON.stringify(prevVal);
        }
        this._params.set(p.name, input);
        const row = h('div', { class: 'jp-gpushare-param' });
        const type = p.type && p.type !== 'None' ? p.type : '';
        row.append(h('code', {}, p.name), input, h('span', { class: 'jp-gpushare-help' }, type));
        params.append(row);
      }
    } else {
      params.append(
        h(
          'div',
          { class: 'jp-gpushare-help' },
          'No cell tagged "parameters" in this notebook: add one to pass parameters (papermill style).'
        )
      );
    }
    this._extra.name = 'parameters';
    this._extra.rows = 2;
    this._extra.placeholder = '{"other": 1}';
    params.append(this._extra);
    this.field('parameters', 'Parameters', params);
    if (o.backends.length > 1) {
      this._backend.name = 'backend';
      for (const b of o.backends) {
        this._backend.append(h('option', { value: b.name }, `${b.name} (${b.enforces.join(', ')})`));
      }
      this.field('backend', 'Backend', this._backend);
    }
    this._team.addEventListener('change', () => this.fillProfiles(null));
    this._profile.addEventListener('change', () => this.fillPriorities(null));
    this._priority.addEventListener('change', () => {
      this.defaultRuntime();
      this.refreshHelp();
    });
    this._checkpoint.addEventListener('change', () => this.defaultRuntime());
    this._runtime.addEventListener('input', () => this.refreshHelp());
    this.fillProfiles(prev);
    // errors shown go away as soon as the value is fixed
    const recheck = () => {
      if (Object.values(this._errors).some(e => e.textContent)) {
        this.showErrors(this.getValue().errors);
      }
    };
    this.node.addEventListener('input', recheck);
    this.node.addEventListener('change', recheck);
    if (this.problem?.field && this._errors[this.problem.field]) {
      this._errors[this.problem.field].textContent = this.problem.message;
    }
  }

  private get team(): string {
    return this._team.value || this.options.teams[0] || '';
  }

  private fillProfiles(prev: ISubmit | null): void {
    this._profile.replaceChildren();
    const team = this.team;
    const ps = this.options.profiles.filter(p => p.availability[team]);
    for (const p of ps) {
      this._profile.append(
        h('option', { value: p.slug }, `${p.display_name} (${p.gpu.describe}) — ${availabilityText(p, team)}`)
      );
    }
    if (!ps.length) {
      this._profile.append(h('option', { value: '' }, `no GPU profile for team ${team}`));
    }
    if (prev?.profile && ps.some(p => p.slug === prev.profile)) {
      this._profile.value = prev.profile;
    }
    this.fillPriorities(prev);
  }

  private profile(): IJobProfile | undefined {
    return this.options.profiles.find(p => p.slug === this._profile.value);
  }

  private fillPriorities(prev: ISubmit | null): void {
    this._priority.replaceChildren();
    const p = this.profile();
    const allowed = p ? p.priorities[this.team] || [p.priority] : [];
    for (const name of allowed) {
      const pc = this.options.priorities.find(c => c.name === name);
      const label = pc
        ? `${name}${pc.preemptible ? ' (preemptible)' : ''}${name === p?.priority ? ' — default' : ''}`
        : name;
      this._priority.append(h('option', { value: name }, label));
    }
    this._priority.value = prev?.priority && allowed.includes(prev.priority) ? prev.priority : p?.priority || '';
    this.defaultRuntime();
    this.refreshHelp();
  }

  /** Until the user types a runtime, the default is one the choices made allow: within the
   * profile's maximum and, for a preemptible priority without checkpoints, within the length
   * that would require them (a default the broker or the form refuses is no default). */
  private defaultRuntime(): void {
    if (this._runtimeTyped) {
      return;
    }
    let def = Math.min(this.options.limits.default_max_runtime, this.maxRuntimeS());
    const pc = this.options.priorities.find(c => c.name === this._priority.value);
    if (pc?.preemptible && pc.checkpoint_required_after_s && !this._checkpoint.checked) {
      def = Math.min(def, pc.checkpoint_required_after_s);
    }
    this._runtime.value = String(Math.max(1, Math.floor(def / 60)));
  }

  private maxRuntimeS(): number {
    const p = this.profile();
    const lim = this.options.limits.max_runtime;
    return p?.max_lifetime_s ? Math.min(lim, p.max_lifetime_s) : lim;
  }

  private refreshHelp(): void {
    const help = this._runtimeHelp.querySelector('.jp-gpushare-help');
    if (help) {
      help.textContent = `At most ${Math.round(this.maxRuntimeS() / 60)} min for this profile.`;
    }
    const ck = this._ckHelp.querySelector('.jp-gpushare-help');
    const pc = this.options.priorities.find(c => c.name === this._priority.value);
    if (ck) {
      ck.textContent =
        pc?.preemptible && pc.checkpoint_required_after_s
          ? `Required past ${Math.round(pc.checkpoint_required_after_s / 60)} min: "${pc.name}" jobs are preemptible (grace ${pc.grace_period_s} s).`
          : pc?.preemptible
            ? `"${pc.name}" jobs are preemptible: checkpoint to resume where you left off.`
            : 'Not preemptible at this priority.';
    }
  }

  getValue(): IFormValue {
    const errors: Record<string, string> = {};
    const value: ISubmit = { path: this.path, profile: this._profile.value };
    if (this.options.teams.length > 1) {
      value.team = this.team;
    }
    if (!value.profile) {
      errors.profile = 'Choose a profile.';
    }
    if (this._priority.value) {
      value.priority = this._priority.value;
    }
    if (this.options.notebook && !this.options.notebook.kernelspec) {
      errors.notebook = NO_KERNEL;
    }
    const minutes = Number(this._runtime.value);
    if (!Number.isFinite(minutes) || minutes <= 0 || !Number.isInteger(minutes)) {
      errors.max_runtime = 'Maximum runtime must be a whole number of minutes above 0.';
    } else {
      value.max_runtime = minutes * 60;
      if (value.max_runtime > this.maxRuntimeS()) {
        errors.max_runtime = `At most ${Math.round(this.maxRuntimeS() / 60)} minutes for this profile.`;
      }
    }
    value.checkpoint = this._checkpoint.checked;
    const pc = this.options.priorities.find(c => c.name === value.priority);
    if (
      pc?.preemptible &&
      pc.checkpoint_required_after_s &&
      (value.max_runtime ?? 0) > pc.checkpoint_required_after_s &&
      !value.checkpoint
    ) {
      errors.checkpoint = `A preemptible "${pc.name}" job longer than ${Math.round(
        pc.checkpoint_required_after_s / 60
      )} min must checkpoint: tick the box (and save state to $GPUSHARE_CHECKPOINT_DIR) or shorten it.`;
    }
    const params: Record<string, unknown> = {};
    const extra = this._extra.value.trim();
    if (extra) {
      try {
        const parsed = JSON.parse(extra);
        if (!parsed || typeof parsed !== 'object' || Array.isArray(parsed)) {
          throw new Error('not an object');
        }
        Object.assign(params, parsed);
      } catch {
        errors.parameters = 'Extra parameters must be a JSON object, e.g. {"lr": 0.01}.';
      }
    }
    for (const [name, input] of this._params) {
      const raw = input.value.trim();
      if (!raw) {
        continue;
      }
      try {
        params[name] = JSON.parse(raw);
      } catch {
        params[name] = raw; // a plain string
      }
    }
    for (const name of Object.keys(params)) {
      if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) {
        errors.parameters = `"${name}" is not a valid parameter name.`;
      }
    }
    if (Object.keys(params).length) {
      value.parameters = params;
    }
    if (this.options.backends.length > 1) {
      value.backend = this._backend.value;
    }
    return { value, errors };
  }

  showErrors(errors: Record<string, string>): void {
    for (const [k, el] of Object.entries(this._errors)) {
      el.textContent = errors[k] || '';
    }
  }

  private _team = h('select');
  private _profile = h('select');
  private _priority = h('select');
  private _runtime = h('input');
  private _runtimeTyped = false;
  private _checkpoint = h('input');
  private _extra = h('textarea');
  private _backend = h('select');
  private _params = new Map<string, HTMLInputElement>();
  private _errors: Record<string, HTMLElement> = {};
  private _runtimeHelp!: HTMLElement;
  private _ckHelp!: HTMLElement;
}

/** A dialog whose OK button validates first and stays open on errors. */
class SubmitDialog extends Dialog<IFormValue> {
  protected _evtClick(event: MouseEvent): void {
    if (this.validateFirst(event)) {
      super._evtClick(event);
    }
  }

  protected _evtKeydown(event: KeyboardEvent): void {
    if (event.key === 'Enter' && !(event.target instanceof HTMLTextAreaElement) && !this.valid()) {
      event.preventDefault();
      event.stopPropagation();
      return;
    }
    super._evtKeydown(event);
  }

  private validateFirst(event: MouseEvent): boolean {
    const target = event.target as HTMLElement;
    const btn = target.closest('.jp-Dialog-button');
    if (btn && btn.classList.contains('jp-mod-accept')) {
      return this.valid();
    }
    return true;
  }

  private valid(): boolean {
    const form = this.form;
    const { errors } = form.getValue();
    form.showErrors(errors);
    return Object.keys(errors).length === 0;
  }

  form!: SubmitForm;
}

export interface ISubmitResult {
  job: IJob | null;
  refused: string | null;
}

/** Open the dialog for `path`, submit, and say what the broker answered. */
export async function submitNotebook(path: string, onSubmitted: (job: IJob) => void): Promise<ISubmitResult> {
  let options: IJobOptions;
  try {
    options = await jobOptions(path);
  } catch (e) {
    await showDialog({
      title: 'Submit as batch job',
      body: `Cannot submit ${path}: ${(e as Error).message}`,
      buttons: [Dialog.okButton()]
    });
    return { job: null, refused: (e as Error).message };
  }
  let prev: ISubmit | null = null;
  let problem: { field: string | null; message: string } | null = null;
  for (;;) {
    const form: SubmitForm = new SubmitForm(options, path, prev, problem);
    const dialog: SubmitDialog = new SubmitDialog({
      title: 'Submit as batch job',
      body: form,
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Submit' })],
      focusNodeSelector: 'select'
    });
    dialog.form = form;
    dialog.addClass('jp-gpushare-submit-dialog');
    const res: Dialog.IResult<IFormValue> = await dialog.launch();
    if (!res.button.accept || !res.value) {
      return { job: null, refused: null };
    }
    const value: ISubmit = res.value.value;
    prev = value;
    try {
      const job = await submitJob(value);
      onSubmitted(job);
      await showDialog({
        title: job.state === 'queued' ? 'Job queued' : 'Job submitted',
        body: resultBody(job),
        buttons: [Dialog.okButton({ label: 'Show jobs' })]
      });
      return { job, refused: null };
    } catch (e) {
      const message = e instanceof APIError ? e.message : String(e);
      problem = { field: fieldOf(e), message };
      // show the form again with the broker's reason, values kept
    }
  }
}

function resultBody(job: IJob): Widget {
  const w = new Widget();
  w.addClass('jp-gpushare-submit-result');
  const state =
    job.state === 'queued'
      ? `Queued${job.position ? ` at position ${job.position}` : ''}: ${job.queue_reason || job.reason}`
      : `${job.state === 'admitted' || job.state === 'running' ? 'Running' : job.state}: ${job.reason}`;
  w.node.append(
    h('p', { 'data-state': job.state }, state),
    h('p', { class: 'jp-gpushare-help' }, `Job ${job.id} · ${job.profile} · ${job.priority}. The executed notebook will be ${job.output_path || 'next to the notebook'}.`)
  );
  return w;
}
