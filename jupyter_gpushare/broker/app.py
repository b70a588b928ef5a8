"""The broker application: a JupyterHub managed service (tornado), configured with traitlets.

Run ``python -m jupyter_gpushare.broker --BrokerApp.policy_file=gpushare.yaml``; under
JupyterHub the hub starts it (``hubsetup.setup_gpushare`` writes the service entry) and passes
``JUPYTERHUB_API_TOKEN``, ``JUPYTERHUB_API_URL``, ``JUPYTERHUB_SERVICE_URL`` and
``JUPYTERHUB_SERVICE_PREFIX`` in the environment, from which the defaults below are taken.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import signal
import sys
from typing import Any
from urllib.parse import urlparse

from sqlalchemy import Engine
from tornado import web
from tornado.httpserver import HTTPServer
from traitlets import Any as AnyTrait
from traitlets import Bool, Float, Instance, Integer, Type, Unicode, default
from traitlets.config import Application

from ..core.model import Policy
from .api.admin_page import admin_routes
from .api.auth import (
    BrowserLogin,
    HubTokenAuthenticator,
    Identity,
    TokenAuthenticator,
    cookie_secret,
)
from .api.handler_base import Context, request_logger
from .api.handlers import routes
from .api.pages import page_routes
from .hubclient import HubClient
from .jobs.runner import JobManager, JobsBatchBackend
from .ops.background import Background
from .ops.carry import Carry
from .ops.culler import GPUCuller
from .ops.gcpace import load_frozen
from .ops.handoff import listen, tell_supervisor_ready
from .ops.lifetime import Lifetime
from .ops.metrics import BrokerMetrics
from .ops.reconcile import HolderChecker, HubHolderChecker
from .ops.reload import PolicyReloader
from .ops.standby import AheadBuild, StartClock
from .service.broker import Broker
from .service.heartbeats import HeartbeatBounds
from .service.limits import BrokerLimits
from .service.preempt import BatchBackend, NoticeHub, PreemptionRunner
from .store.commitmode import commit_mode_for
from .store.db import make_engine
from .tuning import BrokerTuning


def _import(path: str) -> Any:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


class BrokerApp(Application, BrokerTuning):
    """The gpushare broker: owner of all GPU grants, quotas and the GPU-hour ledger."""

    name = "gpushare-broker"
    description = "jupyter-gpushare broker service"

    classes = [BrokerLimits, PolicyReloader, HeartbeatBounds]

    aliases = {
        "policy": "BrokerApp.policy_file",
        "db-url": "BrokerApp.db_url",
        "port": "BrokerApp.port",
        "ip": "BrokerApp.ip",
        "config": "BrokerApp.config_file",
        "log-level": "Application.log_level",
    }

    config_file = Unicode("", config=True, help="A Python config file (c.BrokerApp... lines).")
    policy_file = Unicode("", config=True, help="The policy file (YAML).")
    policy_factory = Unicode(
        "",
        config=True,
        help="Instead of policy_file: 'module:function' returning a core Policy (tests).",
    )
    db_url = Unicode(
        config=True,
        help="SQLAlchemy URL. Default: sqlite file gpushare.sqlite in the working directory "
        "(under JupyterHub: next to the hub's database).",
    )
    sqlite_synchronous = Unicode(
        "NORMAL",
        config=True,
        help="SQLite synchronous: NORMAL survives a crash of the process, FULL power loss too.",
    )
    ip = Unicode(config=True, help="Address to listen on (default from $JUPYTERHUB_SERVICE_URL).")
    port = Integer(config=True, help="Port to listen on (default from $JUPYTERHUB_SERVICE_URL).")
    base_url = Unicode(config=True, help="URL prefix (default $JUPYTERHUB_SERVICE_PREFIX).")
    hub_api_url = Unicode(config=True, help="Hub API URL (default $JUPYTERHUB_API_URL).")
    api_token = Unicode(
        config=True, help="This service's hub token (default $JUPYTERHUB_API_TOKEN)."
    )
    use_hub = Bool(True, config=True, help="Ask the hub for groups, server liveness and stops.")
    authenticator_class = Type(
        HubTokenAuthenticator,
        klass=TokenAuthenticator,
        config=True,
        help="How tokens are checked (HubTokenAuthenticator in production).",
    )
    holder_checker_class = Type(
        HubHolderChecker,
        klass=HolderChecker,
        config=True,
        help="Decides whether a grant's holder (server, job, pod) still exists.",
    )
    batch_backend_class = Type(
        JobsBatchBackend,
        klass=BatchBackend,
        config=True,
        help="Where batch jobs run (preemption and liveness of jobs).",
    )
    reconcile_on_start = Bool(True, config=True, help="Reconcile with the hub after start.")
    reconcile_interval_s = Float(300.0, config=True, help="Reconcile periodically (0: never).")
    reconcile_min_age_s = Float(60.0, config=True, help="Leave grants younger than this alone.")
    groups_ttl_s = Float(60.0, config=True, help="How long a user's hub groups are cached.")
    groups_stale_max_s = Float(
        3600.0,
        config=True,
        help="While the hub cannot be asked (it restarts), a user's groups as last read from "
        "it stand for at most this long (seconds); then requests that need them get 503.",
    )
    watch_interval_s = Float(
        0.5,
        config=True,
        help="Seconds between checks that the hub ($GPUSHARE_HUB_PID) and the supervisor "
        "($GPUSHARE_SUPERVISOR_PID) still run: the broker stops when its hub is gone, and "
        "when its supervisor is gone unless it lingers (see broker/ops/supervisor.py).",
    )
    linger_max_s = Float(
        300.0,
        config=True,
        help="After the supervisor asks it to linger (SIGUSR1: the hub is shutting down and "
        "will stop the servers next), the broker serves the servers' releases until the hub "
        "is gone, but at most this many seconds.",
    )
    pid_file = Unicode(
        config=True,
        help="File recording this broker's pid, port and hub pid (relative to the working "
        "directory; default gpushare-broker.pid under the supervisor, else none). A new "
        "broker whose port is taken stops the broker named there if that one's hub is gone.",
    )

    @default("pid_file")
    def _pid_file(self) -> str:
        return "gpushare-broker.pid" if os.environ.get("GPUSHARE_SUPERVISOR_PID") else ""

    ahead = Instance(AheadBuild, args=(), help="What a warm standby built before it was needed.")
    carry_file = Unicode(
        config=True,
        help="File of the hub's recent answers (tokens' identities, users' groups) for the "
        "broker that takes over (broker/ops/carry.py); default gpushare-carry.jsonl under "
        "the supervisor, else none.",
    )

    @default("carry_file")
    def _carry_file(self) -> str:
        return "gpushare-carry.jsonl" if os.environ.get("GPUSHARE_SUPERVISOR_PID") else ""
    port_wait_s = Float(
        15.0,
        config=True,
        help="How long to wait for the port when another process holds it (a previous broker "
        "that is still stopping) before giving up.",
    )
    browser_login = Bool(
        True,
        config=True,
        help="Accept the hub's OAuth login for browsers (pages under the service prefix and "
        "the JSON API, with XSRF protection on changes); needs use_hub. Tokens always work.",
    )
    cookie_secret_file = Unicode(
        config=True,
        help="File holding the secret that signs login cookies (created, mode 0600, if "
        "missing; relative to the working directory). Default: gpushare_cookie_secret when "
        "run as a hub service (in the data dir), else none. Empty: a new secret each start "
        "(browsers then log in again after a restart).",
    )

    @default("cookie_secret_file")
    def _cookie_secret_file(self) -> str:
        return "gpushare_cookie_secret" if os.environ.get("JUPYTERHUB_SERVICE_NAME") else ""

    policy = AnyTrait(None, allow_none=True, help="A core Policy object (set in-process).")
    _lifetime: Lifetime | None = None

    @default("db_url")
    def _db_url(self) -> str:
        return os.environ.get("GPUSHARE_DB_URL", "sqlite:///gpushare.sqlite")

    @default("ip")
    def _ip(self) -> str:
        url = os.environ.get("JUPYTERHUB_SERVICE_URL")
        return urlparse(url).hostname or "127.0.0.1" if url else "127.0.0.1"

    @default("port")
    def _port(self) -> int:
        url = os.environ.get("JUPYTERHUB_SERVICE_URL")
        return (urlparse(url).port or 10101) if url else 10101

    @default("base_url")
    def _base_url(self) -> str:
        return os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/gpushare/")

    @default("hub_api_url")
    def _hub_api_url(self) -> str:
        return os.environ.get("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api")

    @default("api_token")
    def _api_token(self) -> str:
        return os.environ.get("JUPYTERHUB_API_TOKEN", "")

    def initialize(self, argv: Any = None) -> None:
        super().initialize(argv)
        if self.config_file:
            self.load_config_file(self.config_file)
        self.log.setLevel(self.log_level)  # type: ignore[arg-type]
        logging.getLogger("gpushare").setLevel(self.log_level)  # type: ignore[arg-type]
        if not logging.getLogger("gpushare").handlers:
            logging.getLogger("gpushare").addHandler(
                self.log.handlers[0] if self.log.handlers else logging.StreamHandler()
            )

    # -- wiring -----------------------------------------------------------------------------

    def load_policy(self) -> Policy:
        if self.policy is not None:
            return self.policy
        if self.policy_factory:
            return _import(self.policy_factory)()
        if not self.policy_file:
            raise SystemExit("gpushare broker: set BrokerApp.policy_file (the policy YAML)")
        from ..discovery import discover
        from ..policy import load_policy

        return load_policy(self.policy_file, discover)

    def build(self) -> web.Application:
        """Create the service, the database and the tornado app (no listening yet)."""
        policy = self.load_policy()
        self.engine: Engine = make_engine(self.db_url, sqlite_synchronous=self.sqlite_synchronous)
        self.hub = (
            HubClient(self.hub_api_url, self.api_token, self.groups_ttl_s, self.groups_stale_max_s)
            if self.use_hub
            else None
        )
        self.backend = self.batch_backend_class(parent=self)
        self.notices = NoticeHub()
        self.runner = PreemptionRunner(self.hub, self.backend, self.notices)
        self.metrics = BrokerMetrics()
        self.broker = Broker(
            policy,
            self.engine,
            effects=self.runner,
            observer=self.metrics,
            raw_sql=self.raw_sql,
            checkpoint_interval_s=self.sqlite_checkpoint_interval_s,
            wal_restart_bytes=int(self.sqlite_wal_restart_mib * (1 << 20)),
            limits=BrokerLimits(parent=self),
        )
        self.runner.broker = self.broker
        self.broker.heartbeat_bounds = HeartbeatBounds(parent=self)
        self.jobs = JobManager(self.broker, parent=self)
        if isinstance(self.backend, JobsBatchBackend):
            self.backend.manager = self.jobs
        self.metrics.broker = self.broker
        self.culler = GPUCuller(
            self.broker, self.hub, self.notices, on_cull=self.metrics.cull, parent=self
        )
        auth_kwargs: dict[str, Any] = {"parent": self}
        if issubclass(self.authenticator_class, HubTokenAuthenticator):
            auth_kwargs.update(api_url=self.hub_api_url, api_token=self.api_token)
        self.auth = self.authenticator_class(**auth_kwargs)
        self.checker = self.holder_checker_class(parent=self, hub=self.hub, backend=self.backend)
        carry = self.carry_file  # (the hub's answers, for the broker that takes over)
        self.carry = Carry(carry, self.auth, self.hub, Identity) if carry else None
        self.ctx = Context(
            self.broker,
            self.auth,
            self.hub,
            self.notices,
            self.metrics,
            self.checker,
            self.reconcile_min_age_s,
            self.jobs,
        )
        self.login: BrowserLogin | None = None
        if self.browser_login and self.use_hub:
            self.login = BrowserLogin(
                api_url=self.hub_api_url, api_token=self.api_token, base_url=self.base_url,
                parent=self,
            )
        self.ctx.login = self.login
        self.web_app = web.Application(
            admin_routes(self.base_url, self.ctx, self.culler, self.policy_file)
            + routes(self.base_url, self.ctx) + page_routes(self.base_url, self.ctx),
            log_function=request_logger(self.log),
            cookie_secret=(
                cookie_secret(self.cookie_secret_file, self.log)
                if self.login is not None else None
            ),
        )
        return self.web_app

    async def start_async(self) -> None:
        """Load the state from the database, listen, and reconcile in the background."""
        clock = StartClock()
        ahead = self.ahead.used(self.policy_file)
        if not ahead:
            self.build()
        clock.mark("built ahead by the standby" if ahead else "build")
        changes = load_frozen(self.broker.load) if self.gc_freeze else self.broker.load()
        clock.mark(f"state ({len(self.broker.state.grants)} live grants, {len(self.broker.queue)}"
                   f" queued, {len(self.broker.pending)} preempting, {len(changes)} changed)")
        self._switch_interval_before: float | None = None
        mode = commit_mode_for(self.commit_mode, self.engine, self.broker.fast is not None)
        if mode != "inline":
            self.broker.start_commits(asyncio.get_running_loop(), mode)
            if mode == "thread" and self.gil_switch_interval_ms > 0:
                self._switch_interval_before = sys.getswitchinterval()
                sys.setswitchinterval(self.gil_switch_interval_ms / 1000)
        if self.policy_file and self.policy is None and not self.policy_factory:
            self.reloader = PolicyReloader(
                self.broker, self.policy_file, self.metrics.registry, parent=self
            )
            self.reloader.started()
            self.ctx.reloader = self.reloader
        if self.carry is not None:
            self.carry.hand_over()
            clock.mark(f"carried ({len(self.carry.identities)} token identities)")
        self.server = HTTPServer(self.web_app, xheaders=True)
        self.sockets = await listen(
            self.server, self.port, self.ip, self.port_wait_s, self.lifetime.stop_stale_broker
        )
        clock.mark("listen")
        self.log.info("gpushare broker listening on http://%s:%d%s (%s)", self.ip, self.port,
                      self.base_url, clock.text())
        self.lifetime.write_pid_file()
        tell_supervisor_ready(self.sockets)
        # the jobs' runs are asked after the broker serves: a backend's poll per unfinished
        # job (a Slurm listing, the attempt's files) took 30-90 ms of a takeover in the soak,
        # and admissions do not wait for it; a job submitted meanwhile waits for the loop
        jobs = StartClock()
        await self.jobs.start()
        jobs.mark("jobs")
        self.log.info("jobs recovered after the start (%s)", jobs.text())
        self.background = Background(
            self.broker, self.culler, self.gc_pace_interval_s,
            self.why_warm_interval_s, self.why_warm_nodes, self.why_warm_at,
            self.why_warm_positions,
        )
        self.retention, self.gc_pacer = self.background.retention, self.background.pacer
        self.metrics.warmer = self.background.warmer
        self.background.start(
            self.ctx.reloader,
            self.checker,
            self.reconcile_min_age_s,
            self.reconcile_interval_s,
            self.reconcile_on_start,
        )

    # -- lifecycle next to the hub (see broker/ops/supervisor.py) --------------------------------

    @property
    def lifetime(self) -> Lifetime:
        """The pid file and the reasons to stop (:mod:`.ops.lifetime`), made once."""
        if self._lifetime is None:
            self._lifetime = Lifetime(self.pid_file, self.port, self.linger_max_s, self.log)
        return self._lifetime

    def linger(self) -> None:
        self.lifetime.linger()

    def why_stop(self) -> str | None:
        return self.lifetime.why_stop()

    async def stop_async(self) -> None:
        if getattr(self, "server", None) is not None:
            self.server.stop()
        self.lifetime.remove_pid_file()
        if getattr(self, "background", None) is not None:
            self.background.stop()
        if getattr(self, "jobs", None) is not None:
            await self.jobs.stop()
        self.runner.close()
        self.broker.close()
        self.engine.dispose()
        before = getattr(self, "_switch_interval_before", None)
        if before is not None:
            sys.setswitchinterval(before)

    def start(self) -> None:
        async def run() -> None:
            await self.start_async()
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            loop.add_signal_handler(signal.SIGUSR1, self.linger)
            if self.ctx.reloader is not None:  # SIGHUP: read the policy file again
                reload = self.ctx.reloader.reload
                loop.add_signal_handler(
                    signal.SIGHUP, lambda: asyncio.ensure_future(reload("SIGHUP"))
                )
            watcher = asyncio.ensure_future(self.lifetime.watch(stop, self.watch_interval_s))
            await stop.wait()
            watcher.cancel()
            await self.stop_async()

        asyncio.run(run())


def main(argv: list[str] | None = None) -> None:
    app = BrokerApp.instance()
    app.initialize(argv)
    app.start()
