#!/usr/bin/env bash
# The demo hub at http://127.0.0.1:8000, from a fresh clone:
#   virtual environment (.venv) -> pip install the project -> proxy from npm ->
#   lab extension build (once it exists) -> jupyterhub with hub_config/jupyterhub_config.py
# Needs python3 (3.10+, with venv) and node/npm (20+). Works as root too (servers get --allow-root).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}

# step WHAT CMD...: runs CMD, saying every 10 s that it still runs (the first start takes minutes)
step() {
  local what=$1; shift
  echo "== $what"
  "$@" &
  local pid=$! t=0
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1; t=$((t + 1))
    if [ $((t % 10)) -eq 0 ]; then echo "   ... still $what (${t} s)"; fi
  done
  wait "$pid"
}

if [ ! -x .venv/bin/python ]; then
  step "creating .venv" "$PY" -m venv .venv
fi
# The project is installed editable: code changes need no reinstall, only pyproject.toml's do.
# A .venv made by ./scripts/test.sh (test extras include the demo's) counts as installed.
WANT=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat .venv/.gpushare-demo-extras 2>/dev/null)" != "$WANT" ] \
    && [ "$(cat .venv/.gpushare-test-extras 2>/dev/null)" != "$WANT" ]; then
  step "installing jupyter-gpushare into .venv (first start: a few minutes)" \
    sh -c '.venv/bin/pip install -q --upgrade pip && .venv/bin/pip install -q -e ".[lab]"'
  echo "$WANT" > .venv/.gpushare-demo-extras
fi

if [ ! -x hub_config/proxy/node_modules/.bin/configurable-http-proxy ]; then
  step "installing configurable-http-proxy (npm)" \
    sh -c 'cd hub_config/proxy && npm install --no-audit --no-fund --silent'
fi

if [ -f labextension/package.json ] && { [ ! -f jupyter_gpushare/labextension/static/style.js ] \
    || [ ! -f .venv/share/jupyter/labextensions/jupyter-gpushare/package.json ]; }; then
  step "building the JupyterLab extension (once)" \
    sh -c 'cd labextension && npm install --no-audit --no-fund --silent && npm run build:prod >/dev/null' \
    && step "installing the built extension" .venv/bin/pip install -q -e ".[lab]" \
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
  Ports (environment): GPUSHARE_DEMO_PORT=${PORT} (the hub's public port),
    GPUSHARE_DEMO_HUB_PORT=${GPUSHARE_DEMO_HUB_PORT:-8081}, GPUSHARE_DEMO_PROXY_API_PORT=${GPUSHARE_DEMO_PROXY_API_PORT:-8001},
    GPUSHARE_DEMO_BROKER_PORT=${GPUSHARE_DEMO_BROKER_PORT:-10101}: set all four (and GPUSHARE_DEMO_DIR) to run two demos.

MSG
export PATH="$ROOT/.venv/bin:$PATH"
exec .venv/bin/jupyterhub -f hub_config/jupyterhub_config.py "$@"
