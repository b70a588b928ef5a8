#!/usr/bin/env bash
# The whole test suite. Installs the project into .venv when it is missing, then runs pytest.
# Exit code 5 (no tests collected) is an error here: the suite must always run something.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# The test extras, (re)installed when missing or when pyproject.toml changed: a .venv made by
# ./hub_config/demo.sh holds only the demo's extras, so either quick-start command may come first.
STAMP=.venv/.gpushare-test-extras
WANT=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -x .venv/bin/ruff ] || [ ! -x .venv/bin/mypy ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  echo "== installing jupyter-gpushare with its test extras into .venv"
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e ".[test]"
  echo "$WANT" > "$STAMP"
fi
if [ ! -x hub_config/proxy/node_modules/.bin/configurable-http-proxy ]; then
  (cd hub_config/proxy && npm install --no-audit --no-fund --silent)
fi
if [ ! -f jupyter_gpushare/labextension/static/style.js ] && command -v npm >/dev/null 2>&1; then
  # the JupyterLab extension's build output (git-ignored); the browser tests load it
  (cd labextension && npm install --no-audit --no-fund --silent && npm run build:prod >/dev/null)
fi
export PATH="$PWD/.venv/bin:$PWD/hub_config/proxy/node_modules/.bin:$PATH"
.venv/bin/ruff check jupyter_gpushare tests benchmarks
.venv/bin/mypy
.venv/bin/lint-imports  # import layers: [tool.importlinter] in pyproject.toml
if [ "$#" -eq 0 ]; then
  # The whole suite: most tests wait on real processes (hubs, servers, Chromium, Slurm), so
  # several files run at once. A file's tests stay together on one worker (--dist loadfile):
  # module-scoped fixtures such as a Slurm cluster start once, as in a serial run.
  # GPUSHARE_TEST_WORKERS=0 runs everything in this one process.
  set -- -n "${GPUSHARE_TEST_WORKERS:-3}" --dist loadfile
fi
exec .venv/bin/python -m pytest -p no:cacheprovider -q "$@"
