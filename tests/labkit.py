"""Real JupyterLab + headless Chromium for the browser tests and ``benchmarks/lab.py``.

API::

    from labkit import ensure_built, start_lab, browser, dismiss_news, chromium_available

    ensure_built()                       # npm install + production build when missing or stale
    with start_lab(tmp_path, grant_env(), args=[...]) as lab:   # jupyter lab on a free port
        lab.url("lab")                   # http://127.0.0.1:<port>/lab?token=...
        with browser() as b:             # Playwright's Chromium = Debian's /usr/bin/chromium
            page = b.new_page()

The lab always loads the extension from the repository's fresh build output
(``jupyter_gpushare/labextension``, put first on ``JUPYTER_PATH``), so a test never runs
against a stale copy installed earlier; ``with_extension=False`` disables it instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ports import free_port

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "labextension"
OUT = REPO / "jupyter_gpushare" / "labextension"
CHROMIUM = Path(os.environ.get("GPUSHARE_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
SCREENS = Path(os.environ.get("GPUSHARE_SCREENS", REPO / "benchmarks" / "out" / "screens"))


def chromium_available() -> str | None:
    """None when the browser tests can run, else the reason they cannot."""
    if not CHROMIUM.exists():
        return f"{CHROMIUM} missing (apt-get install -y chromium; .ci/run installs it)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[test]')"
    if shutil.which("npm") is None and not (OUT / "package.json").exists():
        return "npm is missing and the extension is not built"
    return None


def _newest(path: Path) -> float:
    files = [p for p in path.rglob("*") if p.is_file() and "node_modules" not in p.parts
             and "lib" not in p.relative_to(path).parts[:1]]
    return max((p.stat().st_mtime for p in files), default=0.0)


def ensure_built(force: bool = False) -> Path:
    """Build the extension (production) when its output is missing or older than the source."""
    marker = OUT / "static" / "style.js"
    newest = max(_newest(SRC / "src"), _newest(SRC / "style"),
                 (SRC / "package.json").stat().st_mtime)
    stale = not marker.exists() or newest > (OUT / "package.json").stat().st_mtime
    if force or stale:
        env = dict(os.environ)
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
        if not (SRC / "node_modules" / "@jupyterlab" / "builder").exists():
            subprocess.run(["npm", "install", "--no-audit", "--no-fund"], cwd=SRC, env=env,
                           check=True)
        subprocess.run(["npm", "run", "build:prod"], cwd=SRC, env=env, check=True)
    return OUT


class Lab:
    """A running ``jupyter lab`` (see the module docstring)."""

    def __init__(self, root: Path, port: int, token: str, proc: subprocess.Popen[bytes],
                 log: Path) -> None:
        self.root, self.port, self.token, self.proc, self.log = root, port, token, proc, log
        self.base = f"http://127.0.0.1:{port}"

    def url(self, path: str = "lab") -> str:
        return f"{self.base}/{path}?token={self.token}"

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"{self.base}/{path}", data=data, method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                raw = r.read()
                return r.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            return exc.code, json.loads(raw) if raw.startswith(b"{") else raw.decode()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)


def grant_env(**over: str) -> dict[str, str]:
    """The ``GPUSHARE_*`` environment of a simulated "Debug 1/8 GPU" grant (no broker)."""
    env = {
        "GPUSHARE_GRANT_ID": "g-lab-test",
        "GPUSHARE_GPU_UUIDS": "GPU-sim-lab-0",
        "GPUSHARE_MEMORY_LIMIT_MIB": "14336",
        "GPUSHARE_GPU_MEMORY_MIB": "143771",
        "GPUSHARE_COMPUTE_PCT": "12.5",
        "GPUSHARE_UNITS": "0.125",
        "GPUSHARE_PROFILE": "debug-eighth",
        "GPUSHARE_TEAM": "vision",
        "GPUSHARE_POOL": "debug",
        "GPUSHARE_BORROWED": "false",
        "GPUSHARE_ENFORCEMENT": "env",
        "GPUSHARE_SIMULATED": "1",
    }
    env.update(over)
    return env


def lab_dirs(tmp: Path, with_extension: bool = True) -> dict[str, str]:
    """Folders for one JupyterLab (or a hub's single-user servers) under ``tmp``, and the
    environment that points it at them: the fresh extension build first on ``JUPYTER_PATH``,
    no news pop-up, no update check, its own settings and workspaces."""
    jp = tmp / "jupyter-path" / "labextensions"
    jp.mkdir(parents=True, exist_ok=True)
    link = jp / "jupyter-gpushare"
    if not link.exists():
        link.symlink_to(OUT)
    cfg = tmp / "config"
    (cfg / "labconfig").mkdir(parents=True, exist_ok=True)
    disabled = {} if with_extension else {"jupyter-gpushare": True}
    page_config = {"disabledExtensions": disabled}
    (cfg / "labconfig" / "page_config.json").write_text(json.dumps(page_config))
    settings = tmp / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    return {
        "JUPYTER_PATH": str(tmp / "jupyter-path"),
        "JUPYTER_CONFIG_DIR": str(cfg),
        "JUPYTERLAB_SETTINGS_DIR": str(tmp / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"),
    }


@contextlib.contextmanager
def start_lab(
    tmp: Path, env: dict[str, str] | None = None, args: list[str] | None = None,
    with_extension: bool = True, timeout: float = 90,
) -> Iterator[Lab]:
    """``jupyter lab`` on a free port with its own root, config and data folders in ``tmp``."""
    tmp.mkdir(parents=True, exist_ok=True)
    root = tmp / "root"
    root.mkdir(exist_ok=True)
    dirs = lab_dirs(tmp, with_extension)
    port, token = free_port(), secrets.token_hex(16)
    full = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSHARE_", "JUPYTERHUB_"))}
    full.update(env or {})
    full.update(dirs)
    full["PATH"] = f"{Path(sys.executable).parent}:{full.get('PATH', '')}"
    log = tmp / "lab.log"
    cmd = [
        sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}",
        "--ip=127.0.0.1", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
        "--ServerApp.open_browser=False", "--LabApp.news_url=", *(args or []),
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=root, env=full, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    lab = Lab(root, port, token, proc, log)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"jupyter lab exited {proc.returncode}:\n{lab.log_text()[-4000:]}")
            with contextlib.suppress(OSError):
                if lab.api("GET", "api/status")[0] == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"jupyter lab did not start:\n{lab.log_text()[-4000:]}")
            time.sleep(0.3)
        yield lab
    finally:
        lab.stop()


@contextlib.contextmanager
def browser() -> Iterator[Any]:
    """A Playwright Chromium browser (Debian's binary, headless)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def wait_shell(page: Any, timeout_ms: int = 60000) -> None:
    page.wait_for_selector("#jp-main-dock-panel", timeout=timeout_ms)


def dismiss_news(page: Any) -> None:
    """Close the "Jupyter news" toast, if one shows (it would cover screenshots)."""
    with contextlib.suppress(Exception):
        for btn in page.locator(".jp-Notification-Toast-Close, .Toastify__close-button").all():
            if "news" in (btn.evaluate("b => b.closest('.Toastify__toast')?.innerText || ''")
                          .lower()):
                btn.click()


def screenshot(page: Any, name: str, selector: str | None = None) -> Path:
    SCREENS.mkdir(parents=True, exist_ok=True)
    path = SCREENS / f"{name}.png"
    if selector:
        page.locator(selector).first.screenshot(path=str(path))
    else:
        page.screenshot(path=str(path))
    print(f"screenshot: {path}")
    return path
