"""A REAL JupyterHub with configurable-http-proxy for tests (reusable by every test module).

API::

    from realhub import RealHub, real_hub, free_port

    # as a context manager (sync; works from sync and async tests)
    with real_hub(tmp_path, extra_config="c.JupyterHub.log_level = 'DEBUG'") as hub:
        hub.url            # public URL through the proxy, e.g. http://127.0.0.1:41234
        hub.api_url        # hub.url + "/hub/api"
        hub.admin_token    # token of the service "test-admin" holding JupyterHub's "admin" role
        hub.api("POST", "/users/alice")                       # -> (status, JSON or None)
        hub.create_user("alice", groups=["vision"])           # user (+ groups, created if missing)
        hub.token_for("alice", scopes=["custom:gpushare:use"])  # a user token
        hub.log_text()     # the hub's log so far (for failure messages)
        hub.server_pid("alice")   # pid of alice's default server, as THIS hub's spawner has it
        hub.server_env("alice")   # that process's environment (checked to belong to this hub)

    # or as a pytest fixture in your module:
    @pytest.fixture(scope="module")
    def hub(tmp_path_factory):
        with real_hub(tmp_path_factory.mktemp("hub"), extra_config=...) as h:
            yield h

``start_hub(tmp_dir, extra_config="", env=None, timeout=90) -> RealHub`` / ``hub.stop()`` do
the same without ``with``. ``extra_config`` is Python appended to the generated
``jupyterhub_config.py`` (``c`` is the config; the variables ``HUB_TMP`` (the folder) and
``HUB_PORT``/``HUB_API_PORT`` are defined). The hub uses ``DummyAuthenticator`` with
``allow_all``, ``SimpleLocalProcessSpawner`` with ``--allow-root`` and a SQLite database in the
folder; everything it writes stays in the folder. Every port is a free one (never the demo
hub's 8000, 8081 or 10101), and a test finds its processes through this hub (the spawner's
state, the hub's process group), never by searching the machine's processes by name, so a
demo hub or another test's hub running beside it with the same user names is never seen.
The proxy is the repository's ``hub_config/proxy/node_modules/.bin/configurable-http-proxy``;
if it is missing,
``proxy_available()`` is False and callers should ``pytest.skip`` with that reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ports import free_port

REPO = Path(__file__).resolve().parent.parent
PROXY = REPO / "hub_config" / "proxy" / "node_modules" / ".bin" / "configurable-http-proxy"


def proxy_available() -> bool:
    return PROXY.exists()


class RealHub:
    """A running JupyterHub (see the module docstring)."""

    def __init__(
        self, tmp: Path, port: int, api_port: int, admin_token: str, proc: subprocess.Popen[bytes]
    ) -> None:
        self.tmp = tmp
        self.port = port
        self.api_port = api_port
        self.url = f"http://127.0.0.1:{port}"
        self.api_url = self.url + "/hub/api"
        self.admin_token = admin_token
        self.proc = proc
        self.proxy_proc: subprocess.Popen[bytes] | None = None  # a proxy run apart, if so

    def api(
        self,
        method: str,
        path: str,
        body: Any = None,
        token: str | None = None,
        timeout: float = 30,
    ) -> tuple[int, Any]:
        """Call the hub REST API (``path`` below ``/hub/api``) with the admin token."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.api_url + path,
            data=data,
            method=method,
            headers={
                "Authorization": f"token {token or self.admin_token}",
                "Content-Type": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                return exc.code, json.loads(raw) if raw else None
            except ValueError:
                return exc.code, raw.decode(errors="replace")

    def create_user(self, name: str, groups: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
        status, model = self.api("GET", f"/users/{name}")
        if status == 404:
            status, model = self.api("POST", f"/users/{name}")
            assert status == 201, (status, model)
        for group in groups:
            status, _ = self.api("GET", f"/groups/{group}")
            if status == 404:
                status, _ = self.api("POST", f"/groups/{group}")
                assert status == 201, status
            status, _ = self.api("POST", f"/groups/{group}/users", {"users": [name]})
            assert status == 200, status
        return model

    def token_for(self, user: str, scopes: list[str] | None = None, note: str = "test") -> str:
        """A new API token of ``user`` (default scopes: the user's own, i.e. role ``token``)."""
        body: dict[str, Any] = {"note": note, "expires_in": 3600}
        if scopes is not None:
            body["scopes"] = scopes
        status, model = self.api("POST", f"/users/{user}/tokens", body)
        assert status == 201, (status, model)
        return str(model["token"])

    def server_pid(self, user: str, server: str = "") -> int:
        """The pid of ``user``'s ``server`` as this hub's spawner recorded it.

        Read from the spawner's state (``admin:server_state``, held by the admin token);
        the process is checked to talk to this hub's API port, so a server of another hub
        (the demo's alice, say) is never taken for it.
        """
        import psutil

        status, model = self.api("GET", f"/users/{user}")
        assert status == 200, (status, model)
        srv = (model.get("servers") or {}).get(server)
        assert srv, f"{user} has no server {server!r} on this hub: {model}"
        pid = (srv.get("state") or {}).get("pid")
        assert isinstance(pid, int) and pid > 0, f"no pid in the spawner state: {srv}"
        env = psutil.Process(pid).environ()
        assert env.get("JUPYTERHUB_USER") == user, (pid, env.get("JUPYTERHUB_USER"))
        assert env.get("JUPYTERHUB_SERVER_NAME", "") == server, pid
        assert f":{self.api_port}/" in env.get("JUPYTERHUB_API_URL", ""), (
            f"pid {pid} talks to {env.get('JUPYTERHUB_API_URL')}, not this hub"
        )
        return pid

    def server_env(self, user: str, server: str = "") -> dict[str, str]:
        """The environment of ``user``'s ``server`` process (see :meth:`server_pid`)."""
        import psutil

        return dict(psutil.Process(self.server_pid(user, server)).environ())

    def log_text(self) -> str:
        path = self.tmp / "hub.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        # the proxy and managed services run in the hub's process group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proxy_proc is not None and self.proxy_proc.poll() is None:
            self.proxy_proc.kill()
            self.proxy_proc.wait(10)


def start_proxy(tmp: Path, port: int, proxy_api: int, hub_api_port: int,
                token: str) -> subprocess.Popen[bytes]:
    """configurable-http-proxy run apart from the hub (as z2jh and TLJH deploy it): the hub
    neither stops nor starts it when it restarts (``ConfigurableHTTPProxy.should_start``)."""
    log = open(tmp / "proxy.log", "wb")  # noqa: SIM115 - closed with the process
    hub = f"http://127.0.0.1:{hub_api_port}"
    return subprocess.Popen(
        [str(PROXY), "--ip", "127.0.0.1", "--port", str(port), "--api-ip", "127.0.0.1",
         "--api-port", str(proxy_api), "--default-target", hub,
         "--error-target", f"{hub}/hub/error"],
        cwd=tmp, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env=dict(os.environ, CONFIGPROXY_AUTH_TOKEN=token),
    )


def start_hub(
    tmp: Path | str, extra_config: str = "", env: dict[str, str] | None = None, timeout: float = 90,
    proxy_outside: bool = False,
) -> RealHub:
    """A JupyterHub in ``tmp`` with its proxy (started by the hub, or with ``proxy_outside``
    run apart: :func:`start_proxy`), answering its API, or an error with its log."""
    tmp = Path(tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    port, api_port, proxy_api = free_port(), free_port(), free_port()
    admin_token = secrets.token_hex(24)
    proxy_token = secrets.token_hex(24)
    if proxy_outside:
        extra_config += (f"\nc.ConfigurableHTTPProxy.should_start = False"
                         f"\nc.ConfigurableHTTPProxy.auth_token = {proxy_token!r}\n")
    venv_bin = Path(sys.executable).parent
    config = f"""
HUB_TMP = {str(tmp)!r}
HUB_PORT = {port}
HUB_API_PORT = {api_port}
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {api_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api}"
c.ConfigurableHTTPProxy.command = [{str(PROXY)!r}]
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allow_all = True
c.JupyterHub.spawner_class = "simple"
c.Spawner.cmd = [{str(venv_bin / "jupyterhub-singleuser")!r}]
c.Spawner.args = ["--allow-root"]
c.JupyterHub.db_url = "sqlite:///{tmp}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{tmp}/jupyterhub_cookie_secret"
c.JupyterHub.pid_file = "{tmp}/jupyterhub.pid"
c.JupyterHub.services = [{{"name": "test-admin", "api_token": {admin_token!r}}}]
c.JupyterHub.load_roles = [{{"name": "admin", "services": ["test-admin"]}}]
"""
    (tmp / "jupyterhub_config.py").write_text(config + "\n" + extra_config + "\n")
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env["PATH"] = f"{venv_bin}:{full_env.get('PATH', '')}"
    proxy_proc = (start_proxy(tmp, port, proxy_api, api_port, proxy_token)
                  if proxy_outside else None)
    log = open(tmp / "hub.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterhub", "-f", str(tmp / "jupyterhub_config.py")],
        cwd=tmp,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=full_env,
        start_new_session=True,
    )
    hub = RealHub(tmp, port, api_port, admin_token, proc)
    hub.proxy_proc = proxy_proc
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"JupyterHub exited with {proc.returncode}:\n{hub.log_text()[-5000:]}"
            )
        try:
            status, _ = hub.api("GET", "/user", timeout=2)
            if status == 200:
                return hub
        except OSError:
            pass
        time.sleep(0.3)
    hub.stop()
    raise RuntimeError(f"JupyterHub did not answer within {timeout}s:\n{hub.log_text()[-5000:]}")


@contextlib.contextmanager
def real_hub(
    tmp: Path | str, extra_config: str = "", env: dict[str, str] | None = None, timeout: float = 90
) -> Iterator[RealHub]:
    hub = start_hub(tmp, extra_config, env, timeout)
    try:
        yield hub
    finally:
        hub.stop()
