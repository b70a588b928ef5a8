"""The real stack of a soak run, started with the tests' own helpers (``tests/realhub.py``):
JupyterHub with configurable-http-proxy, the broker under its supervisor (``hubsetup``),
single-user servers with simulated GPUs (``SimpleLocalGPUShareSpawner``) and the local batch
backend; the hub can be started again on the same ports and folder after it was killed.

Everything the audit reads of the stack is read here, directly: the broker's database rows
(SQLite opened read-only), the hub's REST API, the job folders the backend left.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from realhub import RealHub, free_port, start_hub

from jupyter_gpushare.policy import load_policy

PREFIX = "/services/gpushare/api/v1"
PG_DATABASE = "gpushare_soak"
TABLES = {
    "grants": "gpushare_grants",
    "requests": "gpushare_requests",
    "jobs": "gpushare_jobs",
    "job_events": "gpushare_job_events",
}
JSON_COLUMNS = {"slices", "spec", "handle", "error", "request_spec", "parameters", "gpus"}


def hub_config(
    policy: Path,
    broker_port: int,
    settings: dict[str, Any],
    broker_outside: bool = False,
    db_url: str | None = None,
    slurm_conf: str | None = None,
) -> str:
    reconcile = settings["reconcile_interval_s"]
    slurm_args = [] if slurm_conf is None else [
        "--JobManager.backend_class=jupyter_gpushare.backends.slurm.SlurmBackend",
        f"--SlurmBackend.slurm_conf={slurm_conf}",
        "--SlurmBackend.pass_account=True",  # accepted as is: the test cluster has no slurmdbd
        "--SlurmBackend.pass_qos=True",
        "--SlurmBackend.min_poll_interval_s=0.5",
        "--SlurmBackend.node_return_interval_s=1.0",
    ]
    slurm = "".join(f", {a!r}" for a in slurm_args)
    return f"""
c.SimpleLocalProcessSpawner.home_dir_template = HUB_TMP + "/home/{{username}}"
from jupyter_gpushare.hubsetup import setup_gpushare
setup_gpushare(c, {str(policy)!r}, spawner="simple", broker_port={broker_port},
               data_dir=HUB_TMP, admin_users=["boss"], broker_managed={not broker_outside},
               db_url={db_url!r},
               broker_args=["--BrokerApp.reconcile_interval_s={reconcile}",
                            "--BrokerApp.reconcile_min_age_s={reconcile}",
                            "--BrokerApp.log_level=INFO",
                            "--JobManager.cancel_grace_s=2"{slurm}])
c.GPUShareSpawner.policy_file = {str(policy)!r}
c.GPUShareSpawner.queue_poll_interval = 0.5
c.JupyterHub.allow_named_servers = True
c.JupyterHub.cleanup_servers = False
c.Spawner.http_timeout = 90
c.Spawner.start_timeout = 120
c.Spawner.args = ["--allow-root", "--GPUShareServerApp.heartbeat_interval_s=2",
                  "--GPUShareServerApp.notices_interval_s=1"]
"""


@dataclass
class Stack:
    tmp: Path
    hub: RealHub
    broker_port: int
    policy_file: Path
    policy_text: str
    broker_proc: subprocess.Popen[bytes] | None = None  # the broker outside the hub, if so
    pg: Any = None  # the PostgreSQL server (tests/pgserver.py) of a --db postgresql run
    slurm: Any = None  # the Slurm cluster (tests/slurmcluster.py) the jobs run on (--slurm)

    @property
    def db_path(self) -> Path:
        return self.hub.tmp / "gpushare.sqlite"

    @property
    def db_url(self) -> str:
        return self.pg_url if self.pg is not None else f"sqlite:///{self.db_path}"

    @property
    def pg_url(self) -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.pg.port}/{PG_DATABASE}"

    @property
    def broker_url(self) -> str:
        return f"http://127.0.0.1:{self.broker_port}{PREFIX}"

    @property
    def jobs_dir(self) -> Path:
        return self.hub.tmp / "gpushare-jobs"

    def tokens(self) -> dict[str, str]:
        return dict(json.loads((self.hub.tmp / "gpushare_tokens.json").read_text()))

    def broker_pid(self) -> int:
        try:
            doc = json.loads((self.hub.tmp / "gpushare-broker.pid").read_text())
            return int(doc["pid"])
        except (OSError, ValueError, KeyError):
            return 0

    def broker_healthy(self, timeout: float = 1.0) -> bool:
        try:
            with urllib.request.urlopen(self.broker_url + "/health", timeout=timeout) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def hub_up(self) -> bool:
        try:
            return self.hub.api("GET", "/user", timeout=2)[0] == 200
        except OSError:
            return False

    def relaunch_hub(self, timeout: float = 90) -> None:
        """Start the hub again from its own config (same ports, database and tokens)."""
        hub = self.hub
        env = dict(os.environ)
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
        log = open(hub.tmp / "hub.log", "ab")  # noqa: SIM115 - closed with the process
        hub.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(hub.tmp / "jupyterhub_config.py")],
            cwd=hub.tmp,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if hub.proc.poll() is not None:
                raise RuntimeError(
                    f"the hub exited with {hub.proc.returncode} on restart:\n"
                    + hub.log_text()[-3000:]
                )
            if self.hub_up():
                return
            time.sleep(0.2)
        raise RuntimeError("the hub did not answer after its restart:\n" + hub.log_text()[-3000:])

    def launch_broker(self) -> None:
        """Start the broker outside the hub, from the launch file the hub's config wrote."""
        log = open(self.hub.tmp / "broker.log", "ab")  # noqa: SIM115 - closed with the process
        self.broker_proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_gpushare.broker.ops.external",
             str(self.hub.tmp / "gpushare_broker.json")],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop(self) -> None:
        """The hub, then the broker outside it (stopped as an admin would: SIGTERM)."""
        self.hub.stop()
        proc = self.broker_proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(40)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                proc.wait(10)

    def read_rows(self) -> dict[str, list[dict[str, Any]]]:
        """The broker's stored history, read directly (read-only) from its database."""
        if self.pg is not None:
            return self._read_pg_rows()
        conn = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=30)
        conn.row_factory = sqlite3.Row
        try:
            rows = {
                name: [_row(dict(r)) for r in conn.execute(f"SELECT * FROM {table}")]
                for name, table in TABLES.items()
            }
            rows["heartbeats"] = [
                dict(r) for r in conn.execute("SELECT grant_id, ts FROM gpushare_heartbeats")
            ]
        finally:
            conn.close()
        return rows

    def _read_pg_rows(self) -> dict[str, list[dict[str, Any]]]:
        """The same rows from PostgreSQL (psycopg2, a read-only transaction; retried while
        the server is being stopped and started by a fault)."""
        import psycopg2
        import psycopg2.extras

        deadline = time.monotonic() + 60
        while True:
            try:
                conn = psycopg2.connect(host="127.0.0.1", port=self.pg.port, user="postgres",
                                        dbname=PG_DATABASE, connect_timeout=5)
                break
            except psycopg2.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        try:
            conn.set_session(readonly=True)
            with conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
                rows: dict[str, list[dict[str, Any]]] = {}
                for name, table in TABLES.items():
                    cur.execute(f"SELECT * FROM {table}")
                    rows[name] = [_row(dict(r)) for r in cur.fetchall()]
                cur.execute("SELECT grant_id, ts FROM gpushare_heartbeats")
                rows["heartbeats"] = [dict(r) for r in cur.fetchall()]
        finally:
            conn.close()
        return rows

    def attempts(self) -> dict[str, list[list[int]]]:
        """What each checkpointing job's notebook wrote at the start of each attempt."""
        found: dict[str, list[list[int]]] = {}
        for path in sorted(self.jobs_dir.glob("*/checkpoint/attempts.txt")):
            lines = [ln.split() for ln in path.read_text().splitlines() if ln.strip()]
            found[path.parent.parent.name] = [[int(a), int(s)] for a, s in lines]
        return found


def _row(row: dict[str, Any]) -> dict[str, Any]:
    for key in JSON_COLUMNS & row.keys():
        if isinstance(row[key], str):
            with contextlib.suppress(ValueError):
                row[key] = json.loads(row[key])
    return row


def policy_facts(path: Path) -> dict[str, Any]:
    """What the audit needs of the policy: capacities, quotas, the units of each profile."""
    pol = load_policy(path)
    gpus = {
        g.uuid: {"memory_mib": g.memory_mib, "pool": n.pool, "node": n.name}
        for n in pol.nodes
        for g in n.gpus
    }
    quotas = {
        t.name: {
            pool: {
                "guaranteed": q.guaranteed_milli,
                "borrow": q.borrow_limit_milli,
                "cap": q.per_user_cap_milli,
            }
            for pool, q in t.quotas
        }
        for t in pol.teams
    }
    profiles = {
        p.slug: {"pool": p.pool, "units": p.gpu.units_milli if p.gpu else 0} for p in pol.profiles
    }
    grace = {c.name: c.grace_period_s for c in pol.priority_classes}
    return {"gpus": gpus, "quotas": quotas, "profiles": profiles, "grace": grace}


def start(
    tmp: Path,
    policy_text: str,
    settings: dict[str, Any],
    broker_outside: bool = False,
    pg: Any = None,
    slurm: Any = None,
    proxy_outside: bool = False,
) -> Stack:
    """The stack; with ``broker_outside`` the broker runs outside the hub (``hubsetup``'s
    ``broker_managed=False``, started from its launch file) and outlives the hub's faults;
    with ``pg`` (a running ``PgServer``) the broker's database is PostgreSQL; with
    ``slurm`` (a running ``SlurmCluster`` whose nodes are the policy's job nodes) the jobs
    run as Slurm jobs (``SlurmBackend``); with ``proxy_outside`` the proxy runs apart from the
    hub (``realhub.start_proxy``) and goes on through hub faults."""
    tmp.mkdir(parents=True, exist_ok=True)
    policy = tmp / "policy.yaml"
    policy.write_text(policy_text)
    broker_port = free_port()
    db_url = pg.new_database(PG_DATABASE) if pg is not None else None
    conf = slurm.conf_path if slurm is not None else None
    config = hub_config(policy, broker_port, settings, broker_outside, db_url, conf)
    hub = start_hub(tmp / "hub", extra_config=config, proxy_outside=proxy_outside)
    stack = Stack(tmp, hub, broker_port, policy, policy_text, pg=pg, slurm=slurm)
    if broker_outside:
        stack.launch_broker()
    deadline = time.monotonic() + 90
    while not stack.broker_healthy():
        if time.monotonic() > deadline:
            stack.stop()
            log = hub.tmp / "broker.log"
            raise RuntimeError(
                "the broker did not start:\n"
                + (log.read_text(errors="replace") if log.exists() else hub.log_text())[-4000:]
            )
        time.sleep(0.3)
    return stack
