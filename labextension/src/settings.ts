/** The extension's settings (schema/plugin.json), read from JupyterLab's setting registry. */
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { ISignal, Signal } from '@lumino/signaling';

export type Figure = 'gpu-memory' | 'gpu-compute' | 'host-cpu' | 'host-memory';

export interface IGPUShareSettings {
  memoryWarnRatio: number;
  memoryHighRatio: number;
  refreshIntervalSeconds: number;
  statusBarFigures: Figure[];
}

export const DEFAULTS: IGPUShareSettings = {
  memoryWarnRatio: 0.75,
  memoryHighRatio: 0.9,
  refreshIntervalSeconds: 5,
  statusBarFigures: ['gpu-memory', 'gpu-compute', 'host-cpu', 'host-memory']
};

/** The current settings, with a signal when the user changes them. */
export class Settings {
  get current(): IGPUShareSettings {
    return this._current;
  }

  get changed(): ISignal<this, IGPUShareSettings> {
    return this._changed;
  }

  get refreshMs(): number {
    return this._current.refreshIntervalSeconds * 1000;
  }

  /** Follow the registry's settings of `pluginId` (defaults stay where it fails). */
  async follow(registry: ISettingRegistry | null, pluginId: string): Promise<void> {
    if (!registry) {
      return;
    }
    try {
      const s = await registry.load(pluginId);
      this.read(s);
      s.changed.connect(() => this.read(s));
    } catch (e) {
      console.warn('jupyter-gpushare: settings not loaded, defaults apply', e);
    }
  }

  private read(s: ISettingRegistry.ISettings): void {
    const c = s.composite as unknown as Partial<IGPUShareSettings>;
    this._current = { ...DEFAULTS, ...c };
    this._changed.emit(this._current);
  }

  private _current: IGPUShareSettings = { ...DEFAULTS };
  private _changed = new Signal<this, IGPUShareSettings>(this);
}
