/**
 * The extension's strings go through JupyterLab's translator (domain `jupyter_gpushare`):
 * `trans.__('…')` everywhere; the plugin sets the application's translator at activation,
 * before any widget is built, so every later string is translated.
 */
import { ITranslator, TranslationBundle, nullTranslator } from '@jupyterlab/translation';

export const DOMAIN = 'jupyter_gpushare';

let bundle: TranslationBundle = nullTranslator.load(DOMAIN);

export function setTranslator(translator: ITranslator | null): void {
  bundle = (translator ?? nullTranslator).load(DOMAIN);
}

/** The current bundle: `trans().__('Text %1', x)`. */
export function trans(): TranslationBundle {
  return bundle;
}
