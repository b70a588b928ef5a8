#!/usr/bin/env bash
# The demo hub at http://127.0.0.1:8000, from a fresh clone:
#   virtual environment (.venv) -> pip install the project -> proxy from npm ->
#   lab extension build (once it exists) -> jupyterhub with hub_config/jupyterhub_config.py
# Needs python3 (3.10+, with venv) and node/npm (20+). Works as root too (servers get --allow-root).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}

if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  "$PY" -m venv .venv
fi
echo "== installing jupyter-gpushare into .venv"
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e ".[lab]"

echo "== configurable-http-proxy (npm)"
if [ ! -x hub_config/proxy/node_modules/.bin/configurable-http-proxy ]; then
  (cd hub_config/proxy && npm install --no-audit --no-fund --silent)
fi

if [ -f labextension/package.json ] && { [ ! -f jupyter_gpushare/labextension/static/style.js ] \
    || ! .venv/bin/jupyter labextension list 2>&1 | grep -q jupyter-gpushare; }; then
  echo "== building the JupyterLab extension (once)"
  (cd labextension && npm install --no-audit --no-fund --silent && npm run build:prod >/dev/null) \
    && .venv/bin/pip install -q -e ".[lab]" \
    || echo "!! lab extension build failed: the hub still runs, without the GPU panel" >&2
fi

PORT=${GPUSHARE_DEMO_PORT:-8000}
cat <<MSG

  jupyter-gpushare demo hub: http://127.0.0.1:${PORT}
  Log in with any password as one of:
    alice, amy   (team vision)     bob, bea  (team nlp)     rita  (team research)
    admin        (hub and gpushare admin)
  Pick a server profile on the spawn page; GPUs are simulated unless NVML finds real ones.
  The gpushare admin page (as admin): http://127.0.0.1:${PORT}/services/gpushare/admin/
  Data (databases, homes): ${GPUSHARE_DEMO_DIR:-hub_config/.demo}.  Stop with Ctrl-C.

MSG
export PATH="$ROOT/.venv/bin:$PATH"
exec .venv/bin/jupyterhub -f hub_config/jupyterhub_config.py "$@"
