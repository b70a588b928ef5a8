// Builds the federated extension into ../jupyter_gpushare/labextension with node alone:
// the core package data comes from @jupyterlab/core-meta (a devDependency), so the build
// needs neither a Python JupyterLab on PATH nor any host besides the npm registry.
// Usage: node build-labextension.mjs [--development]
import { spawnSync } from 'node:child_process';
import { copyFileSync, mkdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);
const coreMeta = dirname(require.resolve('@jupyterlab/core-meta/package.json'));
const coreDir = join(here, 'node_modules', '.jupyterlab-core');
mkdirSync(coreDir, { recursive: true });
copyFileSync(join(coreMeta, 'core.package.json'), join(coreDir, 'package.json'));
const builder = require.resolve('@jupyterlab/builder/lib/build-labextension.js');
const args = [builder, '--core-path', coreDir, ...process.argv.slice(2), here];
const r = spawnSync(process.execPath, args, { stdio: 'inherit', cwd: here });
process.exit(r.status ?? 1);
