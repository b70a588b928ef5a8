"""The seeded fault schedule of a soak run and the injector that carries it out.

Kinds: kill -9 and SIGTERM of the broker, of the hub (started again on the same ports), of a
single-user server and of a job's kernel; a broken policy file for a while; the database
locked for a while (SQLite: another connection holds an exclusive lock) or stopped and
started again (PostgreSQL, with ``--db postgresql``); kill -9 of a Slurm node, its slurmd
and its jobs (with ``--slurm``). Each fault is
recorded with its target and, where the stack should heal by itself, the seconds until it
did (the broker serves again; the hub answers and every server has its grant again; the
hub and the broker both let go of a killed server).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sqlite3
import threading
import time
from dataclasses import dataclass
from typing import Any

import psutil

from .drivers import Faults, http
from .history import History
from .stack import Stack
from .world import BROKEN

KINDS = {  # kind -> weight after the first round (which has each kind once)
    "broker_kill9": 3,
    "broker_term": 1,
    "hub_kill9": 1,
    "hub_term": 1,
    "server_kill9": 2,
    "server_term": 1,
    "kernel_kill9": 2,
    "kernel_term": 1,
    "policy_broken": 1,
    "db_locked": 2,  # SQLite only
    "db_stopped": 2,  # PostgreSQL only
    "slurm_node_kill9": 2,  # --slurm only
    "slurm_ctld_kill9": 1,  # --slurm only
}
DB_KINDS = {"sqlite": "db_locked", "postgresql": "db_stopped"}
RECOVERY_LIMIT_S = 90.0


@dataclass(frozen=True)
class Planned:
    at_s: float  # after the start of the load
    kind: str
    hold_s: float  # how long a broken file or a lock lasts


def schedule(
    seed: int,
    minutes: float,
    interval_s: float,
    kinds: list[str] | None = None,
    db: str = "sqlite",
    slurm: bool = False,
) -> list[Planned]:
    """Faults from ``warmup`` to a little before the end, ``interval_s`` apart on average
    (of ``kinds`` only, when given: ``--faults``, to study one kind's recovery); the
    database's fault is the one of ``db`` (SQLite locked, PostgreSQL stopped)."""
    known = [
        k
        for k in KINDS
        if (k not in DB_KINDS.values() or k == DB_KINDS[db])
        and (slurm or not k.startswith("slurm_"))
    ]
    unknown = sorted(set(kinds or []) - set(known))
    if unknown:
        setup = f"--db {db}" + (" --slurm" if slurm else "")
        raise ValueError(
            f"--faults: unknown kind {', '.join(unknown)} with {setup} "
            f"(known: {', '.join(known)})"
        )
    weights = {k: KINDS[k] for k in known if not kinds or k in kinds}
    rng = random.Random(seed)
    first = list(weights)
    rng.shuffle(first)
    plan, at = [], min(20.0, minutes * 60 / 6)
    while at < minutes * 60 - 15:
        kind = first.pop(0) if first else rng.choices(list(weights), list(weights.values()))[0]
        hold = rng.uniform(4, 12) if kind == "policy_broken" else rng.uniform(2, 5)
        plan.append(Planned(round(at, 2), kind, round(hold, 2)))
        at += rng.uniform(0.6, 1.4) * interval_s
    return plan


class Injector(threading.Thread):
    def __init__(
        self,
        stack: Stack,
        history: History,
        faults: Faults,
        plan: list[Planned],
        rng: random.Random,
        stop: threading.Event,
    ) -> None:
        super().__init__(daemon=True, name="faults")
        self.stack, self.h, self.faults, self.plan = stack, history, faults, plan
        self.rng, self.stopping = rng, stop
        self.errors: list[str] = []

    def run(self) -> None:
        t0 = time.time()
        for p in self.plan:
            if self.stopping.wait(max(0.0, t0 + p.at_s - time.time())):
                return
            try:
                self.inject(p)
            except Exception as exc:  # noqa: BLE001 - a fault that could not be carried out
                self.errors.append(f"{p.kind}: {exc!r}")
                self.h.record("fault_error", fault=p.kind, error=repr(exc)[:500])

    def inject(self, p: Planned) -> None:
        started = time.time()
        target, recovered = getattr(self, p.kind)(p)
        self.h.record(
            "fault",
            t=started,
            fault=p.kind,
            target=target,
            hold_s=p.hold_s,
            recovered_s=None if recovered is None else round(recovered, 3),
        )

    # -- the broker ----------------------------------------------------------------------

    def _broker(self, sig: int) -> tuple[str, float | None]:
        pid = self.stack.broker_pid()
        if not pid:
            raise RuntimeError("no broker pid file")
        w = self.faults.open("broker", "broker")
        t0 = time.time()
        os.kill(pid, sig)
        while self.stack.broker_pid() in (pid, 0) or not self.stack.broker_healthy(0.5):
            if time.time() - t0 > RECOVERY_LIMIT_S:
                break
            time.sleep(0.02)
        took = time.time() - t0
        self.faults.close(w)
        return f"broker pid {pid}", took

    def broker_kill9(self, p: Planned) -> tuple[str, float | None]:
        return self._broker(signal.SIGKILL)

    def broker_term(self, p: Planned) -> tuple[str, float | None]:
        return self._broker(signal.SIGTERM)

    # -- the hub -------------------------------------------------------------------------

    def _hub(self, sig: int) -> tuple[str, float | None]:
        proc = self.stack.hub.proc
        w = self.faults.open("hub", "hub")
        t0 = time.time()
        proc.send_signal(sig)
        try:
            proc.wait(40)
        except Exception:  # noqa: BLE001 - it would not stop: kill it
            proc.kill()
            proc.wait(10)
        down = time.time() - t0
        self.stack.relaunch_hub()
        answers = time.time() - t0
        waited: dict[str, float] = {}  # what kept it inconsistent, and for how long
        while True:
            t = time.time()
            why = "the broker does not answer" if not self.stack.broker_healthy(0.5) else (
                self.inconsistency())
            if not why or t - t0 > RECOVERY_LIMIT_S:
                break
            time.sleep(0.2)
            waited[why] = waited.get(why, 0.0) + time.time() - t
        took = time.time() - t0
        self.faults.close(w, grace=5.0)
        spent = "; ".join(f"{why}: {s:.1f} s" for why, s in sorted(
            waited.items(), key=lambda kv: -kv[1]))
        return (
            f"hub pid {proc.pid} (gone after {down:.1f} s, the new hub answered after "
            f"{answers:.1f} s, broker and grants consistent after {took:.1f} s"
            + (f"; waited for: {spent}" if spent else "") + ")"
        ), took

    def hub_kill9(self, p: Planned) -> tuple[str, float | None]:
        return self._hub(signal.SIGKILL)

    def hub_term(self, p: Planned) -> tuple[str, float | None]:
        return self._hub(signal.SIGTERM)

    def consistent(self) -> bool:
        return not self.inconsistency()

    def inconsistency(self) -> str:
        """What is not yet consistent ("" when the hub checks no server any more, every ready
        GPU server holds exactly one live grant and no ready CPU-only server holds one: the
        hub's API against the database's rows)."""
        status, users = self.stack.hub.api("GET", "/users", timeout=5)
        if status != 200:
            return f"the hub's user list answers {status}"
        checking = sorted(
            f"{u['name']}/{n}" for u in users for n, s in (u.get("servers") or {}).items()
            if s.get("pending") == "check"
        )
        if checking:  # the new hub is still checking a server (a stop then answers 500)
            return f"the hub still checks {', '.join(checking)}"
        running = {
            f"{u['name']}/{n}": (s.get("user_options") or {}).get("profile", "")
            for u in users
            for n, s in (u.get("servers") or {}).items()
            if s.get("ready")
        }
        live: dict[str, int] = {}
        for g in self.stack.read_rows()["grants"]:
            if g["released_at"] is None and g["kind"] != "batch" and g["server"] != "probe":
                key = f"{g['username']}/{g['server']}"
                live[key] = live.get(key, 0) + 1
        gpu = self.h.policy["profiles"]
        wanted = {k for k, prof in running.items() if gpu.get(prof, {}).get("units")}
        # a grant of a server that is not ready is a spawn or a stop under way (the users go on
        # during the recovery); that no grant outlives its holder is the audit's to check
        wrong = sorted(
            [f"{k} holds none" for k in wanted if k not in live]
            + [f"{k} holds {n}" for k, n in live.items() if n > 1]
            + [f"{k} (no GPU) holds {n}" for k, n in live.items() if k in running
               and k not in wanted]
        )
        return ("grants against servers: " + ", ".join(wrong)) if wrong else ""

    # -- a single-user server ------------------------------------------------------------

    def _server(self, sig: int) -> tuple[str, float | None]:
        status, users = self.stack.hub.api("GET", "/users", timeout=10)
        ready = [
            (u["name"], s)
            for u in (users if status == 200 else [])
            for n, s in (u.get("servers") or {}).items()
            if n == "" and s.get("ready")
        ]
        if not ready:
            return "no server running", None
        user, srv = self.rng.choice(ready)
        pid = int((srv.get("state") or {}).get("pid") or 0)
        if not pid or psutil.Process(pid).environ().get("JUPYTERHUB_USER") != user:
            return f"{user}: no pid of this hub", None
        w = self.faults.open("server", f"server:{user}")
        t0 = time.time()
        os.kill(pid, sig)
        while time.time() - t0 < RECOVERY_LIMIT_S:  # the hub and the broker let it go
            status, model = self.stack.hub.api("GET", f"/users/{user}", timeout=5)
            gone = status == 200 and "" not in (model.get("servers") or {})
            if gone and not any(
                g["released_at"] is None
                and g["username"] == user
                and g["kind"] != "batch"
                and g["server"] == ""
                for g in self.stack.read_rows()["grants"]
            ):
                break
            time.sleep(0.25)
        took = time.time() - t0
        self.faults.close(w)
        return f"server of {user} pid {pid}", took

    def server_kill9(self, p: Planned) -> tuple[str, float | None]:
        return self._server(signal.SIGKILL)

    def server_term(self, p: Planned) -> tuple[str, float | None]:
        return self._server(signal.SIGTERM)

    # -- a job's kernel ------------------------------------------------------------------

    def _kernel(self, sig: int) -> tuple[str, float | None]:
        """``sig`` to the kernel (and every process under the job's runner) of a running job:
        the job fails or, checkpointed, is retried; the audit checks it ends once."""
        running = [j for j in self.stack.read_rows()["jobs"] if j["state"] == "running"]
        if not running:
            return "no job running", None
        job = self.rng.choice(running)
        pidfile = self.stack.jobs_dir / job["id"] / f"attempt-{job['attempt']}" / "pid"
        try:
            runner = psutil.Process(int(json.loads(pidfile.read_text())["pid"]))
            kernels = runner.children(recursive=True)
        except (OSError, ValueError, KeyError, psutil.Error):
            return f"job {job['id']}: no runner", None
        if not kernels:
            return f"job {job['id']}: no kernel yet", None
        for k in kernels:
            with contextlib.suppress(psutil.Error):
                k.send_signal(sig)
        return f"kernel of job {job['id']} ({len(kernels)} processes)", None

    def kernel_kill9(self, p: Planned) -> tuple[str, float | None]:
        return self._kernel(signal.SIGKILL)

    def kernel_term(self, p: Planned) -> tuple[str, float | None]:
        return self._kernel(signal.SIGTERM)

    # -- the policy file and the database ------------------------------------------------

    def policy_broken(self, p: Planned) -> tuple[str, float | None]:
        w = self.faults.open("policy", "policy")
        self.stack.policy_file.write_text(BROKEN)
        self.stopping.wait(p.hold_s)
        self.stack.policy_file.write_text(self.stack.policy_text)
        self.faults.close(w)
        return f"policy file broken for {p.hold_s} s", None

    def db_locked(self, p: Planned) -> tuple[str, float | None]:
        w = self.faults.open("db", "db")
        conn = sqlite3.connect(str(self.stack.db_path), timeout=30, isolation_level=None)
        try:
            conn.execute("BEGIN EXCLUSIVE")
            self.stopping.wait(p.hold_s)
            conn.execute("ROLLBACK")
        finally:
            conn.close()
        self.faults.close(w)
        return f"database locked for {p.hold_s} s", None


    def db_stopped(self, p: Planned) -> tuple[str, float | None]:
        """PostgreSQL stopped (fast shutdown: open connections are cut) for ``hold_s``, then
        started again on the same port; recovered when the broker answers again."""
        pg = self.stack.pg
        w = self.faults.open("db", "db")
        t0 = time.time()
        ctl = os.path.join(pg.bindir, "pg_ctl")
        pg._run([ctl, "-D", pg.data, "-m", "fast", "-w", "stop"])
        self.stopping.wait(p.hold_s)
        pg._run([ctl, "-D", pg.data, "-l", os.path.join(pg.dir, "pg.log"), "-w", "-t", "60",
                 "-o", f"-p {pg.port} -k {pg.dir} -h 127.0.0.1 -c fsync=off "
                 "-c max_connections=300", "start"])
        while not self.stack.broker_healthy(0.5) and time.time() - t0 < RECOVERY_LIMIT_S:
            time.sleep(0.1)
        took = time.time() - t0
        self.faults.close(w)
        return f"PostgreSQL stopped for {p.hold_s} s", took


    # -- a Slurm node ---------------------------------------------------------------------

    def slurm_node_kill9(self, p: Planned) -> tuple[str, float | None]:
        """kill -9 of a Slurm node (its slurmd and every job process on it: a dead machine),
        a node with a job running where there is one; started again after ``hold_s``;
        recovered when Slurm has the node in service again (idle, or running what it was
        given meanwhile)."""
        cluster = self.stack.slurm
        status, body = http(self.stack.broker_url + "/jobs?all=1",
                            self.stack.hub.token_for("boss", note="soak fault"))
        busy = sorted({j.get("node") for j in (body or {}).get("jobs", [])
                       if status == 200 and j.get("state") == "running"} & set(cluster.nodes))
        name = self.rng.choice(busy or sorted(cluster.nodes))
        w = self.faults.open("slurm", f"slurm node {name}")
        t0 = time.time()
        cluster.kill_node(name)
        self.stopping.wait(p.hold_s)
        cluster.restart_node(name, busy_ok=True)  # jobs land on it at once
        took = time.time() - t0
        self.faults.close(w)
        return f"Slurm node {name}" + (" (running a job)" if busy else ""), took


    def slurm_ctld_kill9(self, p: Planned) -> tuple[str, float | None]:
        """kill -9 of slurmctld alone (the nodes and their jobs go on; nothing answers
        sbatch, squeue or scancel), started again after ``hold_s``; recovered when it
        answers for every node (it recovers its jobs from its state folder)."""
        cluster = self.stack.slurm
        w = self.faults.open("slurm", "slurmctld")
        t0 = time.time()
        cluster.kill_ctld()
        self.stopping.wait(p.hold_s)
        cluster.restart_ctld()
        took = time.time() - t0
        self.faults.close(w)
        return f"slurmctld (down {p.hold_s} s)", took


def summary_of(plan: list[Planned]) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for p in plan:
        counts[p.kind] = counts.get(p.kind, 0) + 1
    return counts
