"""Broker benchmark: admission latency and throughput with 1,000 nodes and 10,000 live grants.

    .venv/bin/python benchmarks/broker.py [--seconds 10] [--clients 200] [--rate 500]
                                          [--whole-share 0.0] [--db sqlite,postgresql]
                                          [--legacy-sql] [--nice -10] [--broker-arg=--X.y=z]

For each database (SQLite file; PostgreSQL when its binaries are installed, started in a temp
folder like the tests do) it

1. seeds 10,000 live grants (fractions in the shared pool) with the service in-process;
2. starts the broker as a subprocess pinned to ONE core (``taskset``-like affinity), with
   static tokens (no hub in the loop: the hub's answer is cached per token in production);
3. runs 200 concurrent keep-alive HTTP clients on the other cores:
   * *throughput*: closed loop, each client POSTs requests as fast as answered; admissions
     per second (with ``--release`` each grant is released at once, so the live count stays at
     ~10,000 and the broker serves two calls per admission);
   * *latency*: open loop, the 200 clients together offer ``--rate`` admissions per second;
     p50/p99 of the POST /requests latency seen by the client. Each admission is a new
     server; with ``--open-restarts`` it restarts a server of the closed loop instead (its
     grant is released first: two changes per admission). Until 2026-12-02 every open loop
     did that, without meaning to (its users were the closed loop's).

It also prints the broker's CPU time per admission (all its threads, from /proc): on a
machine shared with other work the latencies include time the broker's core spent on other
processes, the CPU figure does not. To compare with the code before a change, run this
script from a ``git worktree`` of the old commit (``cd old && PYTHONPATH=$PWD python
/path/to/benchmarks/broker.py``: the broker subprocess imports from the working directory);
``--legacy-sql`` runs today's broker with SQLAlchemy for every write.

``--queued N`` measures something else (SQLite, in-process): with N batch requests queued in
one pool (mixed users, two teams, two priority classes), the event-loop time of one release
plus the re-decision of the queue it triggers (the head is granted, the rest stays queued),
p50/p99 over ``--iterations`` releases, while a thread polls ``/health`` over HTTP; and the
time of ``GET /admin/queue``. Baselines in the same run: the same with an empty queue (the
cost of one decision) and with the shape-skipping of the re-decision turned off (a decision
per queued request, as before the change).

It prints figures; it asserts nothing. ``--whole-share`` makes that share of requests ask
for a whole GPU in the exclusive pool (the core's whole-GPU placement scans every node).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from broker_spread import arm_lines, ratio_lines  # noqa: E402
from brokerkit import static_tokens  # noqa: E402
from brokerpolicies import bench, bench_nodes  # noqa: E402
from pgserver import PgServer, pg_missing_reason  # noqa: E402
from ports import free_port  # noqa: E402

from jupyter_gpushare.broker.service.broker import Broker, new_id  # noqa: E402
from jupyter_gpushare.broker.store.db import make_engine  # noqa: E402
from jupyter_gpushare.core.model import GPUAsk, Kind, Request  # noqa: E402

TEAMS = 20
PATH = "/services/gpushare/api/v1"


def realtime_threads(pid: int) -> list[tuple[int, int]]:
    """(thread id, priority above --rt) of what --rt runs at SCHED_FIFO: the broker's event
    loop (its main thread), its commit thread one above (``gpushare-commit``: it mostly
    sleeps, and the kernel's wakeup preemption lets such a thread in first), and this
    process (the clients). Other threads of the broker (SQLite's checkpoints) stay as
    they are, running when the loop is idle."""
    chosen = [(pid, 0), (0, 0)]
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip() == "gpushare-commit":
                chosen.append((int(tid), 1))
    return chosen


def postgres_processes(db_url: str) -> list[int]:
    """The PostgreSQL server behind ``db_url`` (started by this script, on this machine):
    the backends serving its clients (the broker's connections). Not its other processes:
    the autovacuum workers, the checkpointer, the writers run at the machine's usual
    priority, as they would next to a busy database."""
    port = db_url.rpartition(":")[2].partition("/")[0]
    roots = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            if argv and argv[0].endswith(b"postgres") and port.encode() in argv:
                roots.append(int(entry))
    found: list[int] = []
    for root in roots:
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{root}/task"):
                children = Path(f"/proc/{root}/task/{task}/children").read_text().split()
                for child in children:
                    title = Path(f"/proc/{child}/cmdline").read_bytes()
                    if b"127.0.0.1(" in title:  # "postgres: USER DB 127.0.0.1(PORT) idle"
                        found.append(int(child))
    return found


def bench_policy(nodes: int) -> Any:
    """``bench`` (1,000 nodes), or ``bench_nodes`` with ``nodes`` nodes (``--nodes``)."""
    if not nodes:
        return bench()
    os.environ["GPUSHARE_BENCH_NODES"] = str(nodes)  # the broker subprocess reads it too
    return bench_nodes()


def seed(db_url: str, count: int, nodes: int = 0) -> float:
    engine = make_engine(db_url)
    # back-to-back commits: the WAL starts over every 64 MiB (else GBs; stalls do not matter)
    broker = Broker(bench_policy(nodes), engine, wal_restart_bytes=64 << 20)
    broker.load()
    rng = random.Random(1)
    t0 = time.perf_counter()
    for i in range(count):
        team = f"t{i % TEAMS}"
        req = Request(
            id=new_id("r"),
            user=f"seed{i}",
            team=team,
            pool="shared",
            gpu=GPUAsk(fraction_milli=rng.choice([125, 250])),
            priority="interactive",
            kind=Kind.INTERACTIVE,
            holder=f"s{i}",
            created_at=time.time(),
        )
        broker.submit(req)
    broker.close()  # the last connection: SQLite checkpoints its WAL (GBs after 100,000)
    engine.dispose()
    return time.perf_counter() - t0


class Conn:
    """A minimal keep-alive HTTP/1.1 client (cheap on the client side)."""

    def __init__(self, port: int, token: str = "tok-spawner") -> None:
        self.port = port
        self.token = token
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        payload = b"" if body is None else json.dumps(body).encode()
        head = (
            f"{method} {PATH}{path} HTTP/1.1\r\nHost: x\r\nAuthorization: token {self.token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        )
        self.writer.write(head.encode() + payload)
        assert self.reader is not None
        status_line = await self.reader.readline()
        status = int(status_line.split()[1])
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        data = await self.reader.readexactly(length) if length else b""
        return status, json.loads(data) if data[:1] == b"{" else None


def make_body(rng: random.Random, i: int, whole_share: float, prefix: str = "u") -> dict[str, Any]:
    team = f"t{rng.randrange(TEAMS)}"
    if rng.random() < whole_share:
        ask: dict[str, Any] = {"pool": "train", "gpu": {"count": 1}}
    else:
        ask = {"pool": "shared", "gpu": {"fraction": rng.choice([0.125, 0.25])}}
    return {**ask, "user": f"{prefix}{i}", "server": "", "groups": [team]}


async def closed_loop(
    port: int, clients: int, seconds: float, whole: float, release: bool
) -> dict[str, Any]:
    stop = time.perf_counter() + seconds
    lat: list[float] = []
    outcomes: dict[str, int] = {}

    async def client(c: int) -> None:
        rng = random.Random(c)
        conn = Conn(port)
        n = 0
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            status, ans = await conn.call(
                "POST", "/requests", make_body(rng, c * 100000 + n, whole)
            )
            lat.append(time.perf_counter() - t0)
            n += 1
            outcomes[ans["status"]] = outcomes.get(ans["status"], 0) + 1
            if release and ans["status"] == "granted":
                await conn.call("DELETE", f"/grants/{ans['grant']['id']}")

    t0 = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    elapsed = time.perf_counter() - t0
    return {"admissions_per_s": len(lat) / elapsed, "outcomes": outcomes, "lat": lat}


async def open_loop(
    port: int,
    clients: int,
    seconds: float,
    rate: float,
    whole: float,
    release: bool,
    restarts: bool = False,
) -> dict[str, Any]:
    lat: list[float] = []
    times: dict[str, tuple[float, float]] = {}  # user: (sent, answer read), unix time
    granted = [0]
    interval = clients / rate
    start = time.perf_counter() + 0.5
    stop = start + seconds

    async def client(c: int) -> None:
        rng = random.Random(1000 + c)
        conn = Conn(port)
        nxt = start + rng.random() * interval
        n = 0
        while nxt < stop:
            await asyncio.sleep(max(0.0, nxt - time.perf_counter()))
            t0, sent = time.perf_counter(), time.time()
            # new servers (users the closed loop did not use), or with --open-restarts the
            # closed loop's servers again (each admission first releases that server's grant)
            body = make_body(rng, c * 100000 + n, whole, "u" if restarts else "o")
            status, ans = await conn.call("POST", "/requests", body)
            lat.append(time.perf_counter() - t0)
            times[body["user"]] = (sent, time.time())
            n += 1
            granted[0] += ans["status"] == "granted" and not release
            if release and ans["status"] == "granted":
                await conn.call("DELETE", f"/grants/{ans['grant']['id']}")
            nxt += interval

    late: list[float] = []

    async def own_lag() -> None:  # this process's loop: the clients' side of the latency
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            late.append(time.perf_counter() - t0 - 0.001)

    await asyncio.gather(own_lag(), *(client(c) for c in range(clients)))
    return {
        "achieved_per_s": len(lat) / seconds,
        "lat": lat,
        "granted": granted[0],
        "late_p99": pct(late, 99),
        "times": times,
    }


def probe_switch(pid: int, lag_file: Path, on: bool, callbacks: bool = False) -> None:
    """Switch the broker's loop-lag probe on or off (``broker_lagprobe.py``); with
    ``callbacks`` it also times every callback of the loop (CPU; costly)."""
    Path(f"{lag_file}.ctl").write_text(("on callbacks" if callbacks else "on") if on else "off")
    os.kill(pid, signal.SIGUSR2)


def profiler(args: argparse.Namespace, pid: int, out: Path) -> subprocess.Popen[bytes] | None:
    """With ``--profile-open``: py-spy sampling the broker during the open loop, without
    stopping it (``--nonblocking``), its stacks collapsed into ``out``."""
    if not args.profile_open:
        return None
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return subprocess.Popen(
        [
            spy,
            "record",
            "--pid",
            str(pid),
            "--nonblocking",
            "--rate",
            "200",
            "--format",
            "raw",
            "--duration",
            str(int(args.seconds)),
            "--output",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_use(pid: int) -> dict[str, tuple[float, int]]:
    """Per thread name (the loop is ``MainThread``'s process name): CPU seconds so far and
    context switches (voluntary + involuntary), summed over threads of the same name."""
    use: dict[str, tuple[float, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
            status = (task / "status").read_text()
        except OSError:
            continue  # the thread ended meanwhile
        name = "loop" if task.name == str(pid) else stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rpartition(")")[2].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        switches = sum(
            int(line.split()[1]) for line in status.splitlines() if "ctxt_switches" in line
        )
        old = use.get(name, (0.0, 0))
        use[name] = (old[0] + cpu, old[1] + switches)
    return use


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] * 1000


def rss_mib(pid: int) -> float:
    """Resident memory of a process (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def reconcile_probe(port: int, pid: int, lag_file: Path) -> dict[str, Any]:
    """One admin reconcile pass while a probe asks /health back to back: the longest probe
    answer bounds the longest time the pass held the broker's event loop. The broker's own
    loop-lag probe (``broker_lagprobe.py``, switched on by SIGUSR2 meanwhile) tells the work
    that held the loop (CPU of its thread) from waits for a core (wall): see ``lag_figures``."""
    probe_switch(pid, lag_file, True, callbacks=True)
    done = asyncio.Event()
    probes: list[float] = []

    async def probe() -> None:
        conn = Conn(port)
        await conn.call("GET", "/health")
        while not done.is_set():
            t0 = time.perf_counter()
            await conn.call("GET", "/health")
            probes.append(time.perf_counter() - t0)

    task = asyncio.ensure_future(probe())
    await asyncio.sleep(0.3)
    before = len(probes)
    admin = Conn(port, "tok-admin")
    t0, since = time.perf_counter(), time.time()
    status, ans = await admin.call("POST", "/admin/reconcile", {})
    took, until = time.perf_counter() - t0, time.time()
    done.set()
    await task
    await asyncio.sleep(0.1)
    probe_switch(pid, lag_file, False)
    during = probes[before:]
    return {
        "reconcile_window": (since, until),
        "reconcile_s": took,
        "reconcile_checked": (ans or {}).get("checked", status),
        "loop_hold_ms": max(during, default=float("nan")) * 1000,
        "probe_idle_p50_ms": pct(probes[:before], 50),
        "probe_idle_max_ms": max(probes[:before], default=float("nan")) * 1000,
    }


def lag_figures(path: Path, window: tuple[float, float]) -> dict[str, float]:
    """The longest event-loop holds the broker's probe saw before and during the pass (ms)."""
    records = json.loads(path.read_text()) if path.exists() else []
    gc_path = Path(f"{path}.gc")
    collections = json.loads(gc_path.read_text()) if gc_path.exists() else []
    since, until = window
    idle = [r for r in records if since - 1.0 <= r[0] <= since]  # the probe's 0.3 s
    during = [r for r in records if since < r[0] <= until + 0.05]

    def top(rows: list[list[float]], i: int) -> float:
        return max((r[i] for r in rows), default=float("nan")) * 1000

    def collected(r: list[float]) -> bool:  # a collection ran in this wake-up's gap
        begin = r[0] - r[1] - 0.0015
        return any(c[0] > begin and c[0] - c[2] < r[0] for c in collections)

    passes = [c for c in collections if since < c[0] <= until + 0.05 and c[2] > 0.001]
    req_path = Path(f"{path}.req")
    steps = json.loads(req_path.read_text()) if req_path.exists() else []
    # single callbacks of the loop over SLOW (5 ms) of CPU: what held it at once, undivided
    slow = [r[2] for r in steps if r[0] == "slow" and since < r[1] <= until + 0.05]
    return {
        "lag_idle_wall_ms": top(idle, 1),
        "lag_idle_cpu_ms": top(idle, 2),
        "lag_wall_ms": top(during, 1),
        "lag_cpu_ms": top(during, 2),
        "lag_nogc_cpu_ms": top([r for r in during if not collected(r)], 2),
        "lag_over_5ms_cpu": float(sum(1 for r in during if r[2] > 0.005)),
        "lag_over_5ms_nogc": float(sum(1 for r in during if r[2] > 0.005 and not collected(r))),
        "lag_ticks": float(len(during)),
        "gc_max_ms": max((c[2] for c in passes), default=0.0) * 1000,
        "gc_count": float(len(passes)),
        "slow_callbacks": float(len(slow)),
        "slow_callback_max": max(slow, default=0.0) * 1000,
    }


def runqueue_s(pid: int) -> float:
    """Seconds the process's main thread (the event loop) waited for a core (schedstat)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9


def open_figures(
    path: Path, window: tuple[float, float], times: dict[str, tuple[float, float]]
) -> dict[str, float]:
    """Where the time of an admission went during the open loop (the probe's records, and
    ``times``: each request's send and answer as the clients saw them)."""
    since, until = window

    def inside(rows: list[list[Any]]) -> list[list[Any]]:
        return [r for r in rows if since < r[1 if isinstance(r[0], str) else 0] <= until]

    def load(suffix: str) -> list[list[Any]]:
        file = Path(f"{path}{suffix}")
        return inside(json.loads(file.read_text())) if file.exists() else []

    ticks, collections, steps = load(""), load(".gc"), load(".req")
    req = [r[2] for r in steps if r[0] == "req"]
    sub_wall = [r[2] for r in steps if r[0] == "submit"]
    sub_cpu = [r[3] for r in steps if r[0] == "submit"]
    write_wait = [r[2] - r[3] for r in steps if r[0] == "write"]
    seconds = max(1e-9, until - since)
    # the slowest 1 % as the clients saw them: before the broker read the request (in the
    # socket, or the loop busy with others), inside it, and after it answered
    split = []
    for r in steps:
        if r[0] == "req" and len(r) > 4 and r[4] in times:
            sent, got = times[r[4]]
            split.append((got - sent, r[3] - sent, r[2], got - r[3] - r[2]))
    split.sort(reverse=True)
    slowest = split[: max(1, len(split) // 100)]

    def med(i: int) -> float:
        return statistics.median(x[i] for x in slowest) * 1000 if split else float("nan")

    return {
        "slow_total": med(0),
        "slow_before": med(1),
        "slow_inside": med(2),
        "slow_after": med(3),
        "srv_p50": pct(req, 50),
        "srv_p99": pct(req, 99),
        "srv_max": max(req, default=float("nan")) * 1000,
        "submit_p99": pct(sub_wall, 99),
        "submit_cpu_p99": pct(sub_cpu, 99),
        "submit_cpu_mean": statistics.fmean(sub_cpu) * 1000 if sub_cpu else float("nan"),
        "write_wait_mean": statistics.fmean(write_wait) * 1000 if write_wait else float("nan"),
        "write_wait_p99": pct(write_wait, 99),
        "open_hold_cpu_max": max((r[2] for r in ticks), default=float("nan")) * 1000,
        "open_hold_wall_max": max((r[1] for r in ticks), default=float("nan")) * 1000,
        "open_holds_5ms": float(sum(1 for r in ticks if r[2] > 0.005)),
        "open_gc_per_s": len(collections) / seconds,
        "open_gc_ms_per_s": sum(c[2] for c in collections) * 1000 / seconds,
        "open_gc_max": max((c[2] for c in collections), default=0.0) * 1000,
        "open_gc2": float(sum(1 for c in collections if c[1] == 2)),
    }


def empty_rss(env: dict[str, str], cmd: list[str], tmp: Path) -> float:
    """Resident memory of the same broker started on an empty database."""
    port = free_port()
    own = ("--BrokerApp.db_url=", "--BrokerApp.port=", "--BrokerApp.commit_mode=")
    cmd = [c for c in cmd if not c.startswith(own)]  # (async needs PostgreSQL)
    # a database of its own: arms of different schema versions never share one
    cmd += [f"--BrokerApp.db_url=sqlite:///{tmp}/empty-{port}.sqlite", f"--BrokerApp.port={port}"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(proc, port, tmp / "empty.log")
        return rss_mib(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)


def wait_listening(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(log.read_text() if log.exists() else "broker exited") from None
            time.sleep(0.05)


def copy_db(seeded: str, arm: str, tmp: Path, pg: PgServer | None) -> str:
    """A copy of the seeded database for one arm: every arm starts from the same state."""
    if pg is None:
        target = tmp / f"{arm}.sqlite"
        shutil.copyfile(seeded.removeprefix("sqlite:///"), target)
        return f"sqlite:///{target}"
    return pg.new_database(arm, template=seeded.rpartition("/")[2])


def run_one(
    name: str,
    db_url: str,
    args: argparse.Namespace,
    tmp: Path,
    checkout: Path = REPO,
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One arm: the broker of ``checkout`` (this one, or ``--baseline``) on ``db_url``."""
    tokens = tmp / f"tokens-{name}.json"
    tokens.write_text(json.dumps(static_tokens({})))
    port = free_port()
    env = dict(os.environ)
    # the broker from ``checkout``; the policy factory (brokerpolicies) from this one's tests
    env["PYTHONPATH"] = os.pathsep.join(
        [str(checkout), str(REPO / "tests"), env.get("PYTHONPATH", "")]
    )
    profile = (
        ["-m", "cProfile", "-o", os.environ["BENCH_PROFILE"]]
        if os.environ.get("BENCH_PROFILE")
        else []
    )
    lag_file = tmp / f"lag-{name}.json"
    env["GPUSHARE_LAG_FILE"] = str(lag_file)
    cmd = [
        sys.executable,
        *profile,
        str(REPO / "benchmarks" / "broker_lagprobe.py"),  # the broker, with a loop-lag probe
        "--BrokerApp.policy_factory=brokerpolicies:" + ("bench_nodes" if args.nodes else "bench"),
        f"--BrokerApp.db_url={db_url}",
        f"--BrokerApp.port={port}",
        "--BrokerApp.ip=127.0.0.1",
        "--BrokerApp.use_hub=False",
        "--BrokerApp.reconcile_on_start=False",
        "--BrokerApp.reconcile_interval_s=0",
        "--BrokerApp.reconcile_min_age_s=0",  # the probed pass checks every live grant
        "--BrokerApp.log_level=WARN",
        # the path from before the broker's rooms, so that a --baseline checkout has it too
        "--BrokerApp.authenticator_class=jupyter_gpushare.broker.auth.StaticTokenAuthenticator",
        f"--StaticTokenAuthenticator.tokens_file={tokens}",
        f"--BrokerApp.raw_sql={not args.legacy_sql}",
        *args.broker_arg,
        *extra,
    ]
    t0 = time.perf_counter()
    log = open(tmp / f"broker-{name}.log", "wb")  # noqa: SIM115
    # its own session: with the kernel's autogroups, a nice value only counts against the
    # processes of the same session, so --nice sets the broker's group's nice as well
    proc = subprocess.Popen(
        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=bool(args.nice)
    )
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(proc.pid, {cpus[0]})
    if args.nice:
        os.setpriority(os.PRIO_PROCESS, proc.pid, args.nice)
        group = Path(f"/proc/{proc.pid}/autogroup")
        if group.exists():
            group.write_text(str(args.nice))
    try:
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError((tmp / f"broker-{name}.log").read_text()) from None
                time.sleep(0.05)
        start_s = time.perf_counter() - t0
        if len(cpus) > 1:
            os.sched_setaffinity(0, set(cpus[1:]))
        cpu0 = cpu_s(proc.pid)
        thr = asyncio.run(
            closed_loop(port, args.clients, args.seconds, args.whole_share, args.release)
        )
        cpu1 = cpu_s(proc.pid)
        # the broker's probe on for the open loop (--open-callbacks: naming slow callbacks)
        probe_switch(proc.pid, lag_file, True, callbacks=args.open_callbacks)
        rt_threads = realtime_threads(proc.pid) if args.rt else []
        # the database server, as if on a machine of its own: on the clients' cores, at
        # their priority (else each commit's round trip waits behind the clients for a core)
        db_procs = postgres_processes(db_url) if args.rt and db_url.startswith("postgres") else []
        for pid in db_procs:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(pid, set(cpus[1:]) or set(cpus))
        rt_threads += [(pid, 0) for pid in db_procs]
        for pid, prio in rt_threads:  # the broker's loop, its writer thread, the clients
            with contextlib.suppress(OSError):  # (a database process that ended meanwhile)
                os.sched_setscheduler(pid, os.SCHED_FIFO, os.sched_param(args.rt + prio))
        wait0, since = runqueue_s(proc.pid), time.time()
        use0 = thread_use(proc.pid)
        spy = profiler(args, proc.pid, tmp / f"pyspy-{name}.txt")
        try:
            lat = asyncio.run(
                open_loop(
                    port,
                    args.clients,
                    args.seconds,
                    args.rate,
                    args.whole_share,
                    args.release,
                    args.open_restarts,
                )
            )
        finally:
            open_window = (since, time.time())
            if spy is not None:
                spy.wait(30)
            waited = (runqueue_s(proc.pid) - wait0) / (open_window[1] - open_window[0])
            use1 = thread_use(proc.pid)
            for pid, _ in rt_threads:
                with contextlib.suppress(OSError):
                    os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
            for pid in db_procs:
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(pid, set(cpus))
        probe_switch(proc.pid, lag_file, False)
        cpu2 = cpu_s(proc.pid)
        rss = rss_mib(proc.pid)
        rec = asyncio.run(reconcile_probe(port, proc.pid, lag_file))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        os.sched_setaffinity(0, set(cpus))
    rec.update(lag_figures(lag_file, rec.pop("reconcile_window")))
    rec.update(open_figures(lag_file, open_window, lat["times"]))
    leak_file = Path(f"{lag_file}.leak")
    leak = json.loads(leak_file.read_text()) if leak_file.exists() else {}
    rec["frozen_k"] = leak.get("frozen", float("nan")) / 1000
    rec["leaked"] = float(leak.get("leaked", float("nan")))
    rec["open_runqueue"] = waited
    span = open_window[1] - open_window[0]
    answered = max(1, len(lat["lat"]))
    for key, names in (("loop", {"loop"}), ("commit", {"gpushare-commit"})):
        cpu = sum(use1[n][0] - use0.get(n, (0.0, 0))[0] for n in use1 if n in names)
        switches = sum(use1[n][1] - use0.get(n, (0.0, 0))[1] for n in use1 if n in names)
        rec[f"open_cpu_{key}"] = cpu / span
        rec[f"open_switch_{key}"] = switches / answered
    rec["client_late_p99"] = lat["late_p99"]
    rss0 = empty_rss(dict(env, GPUSHARE_LAG_FILE=str(tmp / "lag-empty.json")), cmd, tmp)
    live = args.grants + lat["granted"]
    if not args.release:
        live += thr["outcomes"].get("granted", 0)
    return {
        **rec,
        "load1": os.getloadavg()[0],
        "rss_mib": rss,
        # per live grant: the seeded ones and those the runs kept
        "mib_per_10k": (rss - rss0) * 10000 / max(1, live),
        "start_s": start_s,
        "throughput": thr["admissions_per_s"],
        # broker CPU per admission (all its threads): what one *dedicated* core could serve,
        # whatever else runs on a shared machine
        "cpu_ms": (cpu1 - cpu0) * 1000 / max(1, len(thr["lat"])),
        "open_cpu": (cpu2 - cpu1) / (args.seconds + 0.5),
        "closed_p99": pct(thr["lat"], 99),
        "outcomes": thr["outcomes"],
        "rate": lat["achieved_per_s"],
        "p50": pct(lat["lat"], 50),
        "p99": pct(lat["lat"], 99),
        "mean": statistics.fmean(lat["lat"]) * 1000 if lat["lat"] else float("nan"),
    }


def _health_poller(port: int, stop: threading.Event, lat: list[float]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    while not stop.is_set():
        t0 = time.perf_counter()
        conn.request("GET", PATH + "/health")
        conn.getresponse().read()
        lat.append(time.perf_counter() - t0)
        time.sleep(0.002)
    conn.close()


async def queued_case(tmp: Path, queued: int, iterations: int, skip: bool) -> dict[str, Any]:
    """Release + re-decision with ``queued`` requests waiting (see the module's docstring)."""
    from brokerkit import call, start_broker
    from brokerpolicies import small

    users = {f"u{i}": ["a" if i % 2 else "b"] for i in range(40)}
    url = f"sqlite:///{tmp}/queued-{queued}-{int(skip)}.sqlite"
    app = await start_broker(small(), url, static_tokens(users))
    broker = app.broker
    broker.limits.max_queued_per_user = 0
    broker.limits.max_queued_per_team = 0
    broker.drain_skips_same_shape = skip
    serial = iter(range(10**9))

    def batch(user: str, team: str) -> dict[str, Any]:
        n = next(serial)
        research = n % 3 == 0
        req = Request(
            id=new_id("r"),
            user=user,
            team=team,
            pool="train",
            gpu=GPUAsk(whole=4),
            priority="research" if research else "training",
            kind=Kind.BATCH,
            holder=f"job-{n}",
            checkpointing=research,
            created_at=time.time(),
        )
        return broker.submit(req)

    current = batch("u0", "b")["grant_id"]
    for i in range(queued):
        batch(f"u{i % 40}", "a" if i % 2 else "b")
    stop = threading.Event()
    health: list[float] = []
    poller = threading.Thread(target=_health_poller, args=(app.port, stop, health), daemon=True)
    poller.start()
    await asyncio.sleep(0.2)
    release: list[float] = []
    release_cpu: list[float] = []
    for i in range(iterations):
        c0, t0 = time.thread_time(), time.perf_counter()
        broker.release(current, "bench")
        release.append(time.perf_counter() - t0)
        release_cpu.append(time.thread_time() - c0)
        live = [g for g in broker.state.grants.values() if g.pool == "train"]
        if not live:  # nothing was queued: grant the next holder directly
            current = batch(f"u{i % 40}", "a" if i % 2 else "b")["grant_id"]
        else:
            current = live[0].id
            batch(f"u{i % 40}", "a" if i % 2 else "b")  # keep the queue at its length
        await asyncio.sleep(0.005)
    stop.set()
    poller.join(10)
    queue_s: list[float] = []
    for _ in range(10):
        t0 = time.perf_counter()
        status, body = await call(app, "GET", "/admin/queue", "tok-admin")
        queue_s.append(time.perf_counter() - t0)
        assert status == 200 and body["total"] == len(broker.queue)
    await app.stop_async()
    return {
        "release": release,
        "cpu": release_cpu,
        "health": health,
        "admin_queue": queue_s,
        "queued": len(broker.queue),
    }


def run_queued(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as tmpdir:
        tmp = Path(tmpdir)
        cases = [
            ("empty queue (one decision)", 0, True),
            (f"{args.queued} queued, shape-skipping (now)", args.queued, True),
            (f"{args.queued} queued, a decision per request (before)", args.queued, False),
        ]
        rows = []
        for label, n, skip in cases:
            res = asyncio.run(queued_case(tmp, n, args.iterations, skip))
            rows.append((label, res))
    base = pct(rows[0][1]["release"], 99)
    print(
        f"\nrelease + re-decision of the queue: {args.iterations} releases per case, "
        "SQLite, in-process; /health polled over HTTP by a thread meanwhile (ms)"
    )
    print(
        f"{'case':<48} {'p50':>6} {'p99':>7} {'max':>7} {'p99 CPU':>8} {'x empty':>8} "
        f"{'/health p99':>11} {'/admin/queue':>12}"
    )
    for label, res in rows:
        p99 = pct(res["release"], 99)
        print(
            f"{label:<48} {pct(res['release'], 50):>6.2f} {p99:>7.2f} "
            f"{max(res['release']) * 1000:>7.2f} {pct(res['cpu'], 99):>8.2f} "
            f"{p99 / base:>7.1f}x {pct(res['health'], 99):>11.2f} "
            f"{pct(res['admin_queue'], 50):>12.1f}"
        )
    print("targets: release + re-decision p99 <= 5 ms and /health p99 < 20 ms with 2,000 queued")


def variants(
    checkouts: list[tuple[str, Path]], args: argparse.Namespace, postgres: bool
) -> list[tuple[str, Path, tuple[str, ...], str]]:
    """The arms of one database: (name, checkout, extra broker options, PostgreSQL driver),
    one per checkout, ``--commit-modes`` value and (PostgreSQL) ``--pg-drivers`` value."""
    modes = [m for m in args.commit_modes.split(",") if m] or [""]
    drivers = [d for d in args.pg_drivers.split(",") if d] if postgres else [""]
    for driver in drivers:
        if driver not in ("", "psycopg2", "psycopg"):
            raise SystemExit(f"--pg-drivers: unknown driver {driver!r} (psycopg2, psycopg)")
    arms = []
    for arm, checkout in checkouts:
        for mode in modes:
            for driver in drivers:
                if driver == "psycopg" and mode != modes[0]:
                    continue  # no committer drives psycopg 3: one arm, inline
                mode = "" if driver == "psycopg" else mode
                name = "/".join(x for x in (arm, mode, driver if len(drivers) > 1 else "") if x)
                extra = (f"--BrokerApp.commit_mode={mode}",) if mode else ()
                arms.append((name, checkout, extra, driver))
    return arms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--grants", type=int, default=10000, help="live grants seeded")
    parser.add_argument(
        "--nodes",
        type=int,
        default=0,
        help="nodes in the policy (brokerpolicies:bench_nodes, 8 GPUs each, half per pool); "
        "default: brokerpolicies:bench's 1,000",
    )
    parser.add_argument("--whole-share", type=float, default=0.0)
    parser.add_argument("--db", default="sqlite,postgresql")
    parser.add_argument(
        "--release",
        action="store_true",
        help="release every granted request at once (admission + release cycles)",
    )
    parser.add_argument(
        "--legacy-sql",
        action="store_true",
        help="write through SQLAlchemy Core instead of the driver (BrokerApp.raw_sql=False)",
    )
    parser.add_argument(
        "--broker-arg",
        action="append",
        default=[],
        help="extra command-line option for the broker, e.g. "
        "--broker-arg=--BrokerApp.sqlite_checkpoint_interval_s=1",
    )
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="run the broker and the clients at this niceness (e.g. -10, needs root; the "
        "broker in its own session, whose autogroup gets it too): on a machine shared with "
        "other CPU-bound work this approximates the dedicated core the targets assume; "
        "reported in the output",
    )
    parser.add_argument(
        "--rt",
        type=int,
        default=0,
        help="during the open loop only, run the broker's event loop (and its commit thread, "
        "one above) and the clients at this SCHED_FIFO priority (e.g. 10, needs "
        "root): each then runs whenever it has work, as on a core of its own, while its "
        "~60 %% of a core leaves the rest to the machine's other work (the closed loop, "
        "which takes a whole core, stays as it is); with PostgreSQL the server's backends "
        "too, moved to the clients' cores (as a database on a machine of its own, whose "
        "answers do not wait behind the clients for a core); reported in the output",
    )
    parser.add_argument(
        "--open-restarts",
        action="store_true",
        help="the open loop's admissions restart the closed loop's servers (each first "
        "releases that server's grant: two changes per admission, as the open loop did "
        "until 2026-12-02 without meaning to); default: new servers",
    )
    parser.add_argument(
        "--profile-open",
        action="store_true",
        help="sample the broker with py-spy during the open loop (non-blocking, 200/s), "
        "collapsed stacks in pyspy-ARM.txt of the work folder (with --keep)",
    )
    parser.add_argument(
        "--open-callbacks",
        action="store_true",
        help="during the open loop, also time every callback of the broker's loop and name "
        "those over 5 ms of CPU (two system calls per callback: ~2 %% of the loop); kept in "
        "the probe's .req file (with --keep)",
    )
    parser.add_argument(
        "--queued",
        type=int,
        default=0,
        help="instead: release + re-decision with this many requests queued (see above)",
    )
    parser.add_argument("--iterations", type=int, default=200, help="releases per --queued case")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout (e.g. git archive OLD | tar -x -C DIR): its broker runs on a "
        "copy of the same seeded database with the same clients, in this run; ratios printed",
    )
    parser.add_argument("--reps", type=int, default=1, help="runs per arm (alternating order)")
    parser.add_argument(
        "--commit-modes",
        default="",
        help="comma list of BrokerApp.commit_mode values (inline, thread, async, loop): one "
        "arm each, in this run (default: the broker's own choice, one arm)",
    )
    parser.add_argument(
        "--pg-drivers",
        default="psycopg2",
        help="PostgreSQL: comma list of SQLAlchemy drivers (psycopg2, psycopg = psycopg 3): "
        "one arm each, in this run (the raw writer and its committers drive psycopg2 only: "
        "with psycopg the broker commits inline through SQLAlchemy)",
    )
    parser.add_argument("--keep", type=Path, help="work in this folder and leave it there")
    parser.add_argument(
        "--seed-cache",
        type=Path,
        help="SQLite: keep the seeded database in this folder and reuse it when one of the "
        "same --grants and --nodes is there (seeding 100,000 grants takes minutes)",
    )
    args = parser.parse_args()
    if args.queued:
        run_queued(args)
        return
    if args.nice:
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)
        own = Path("/proc/self/autogroup")
        if own.exists():  # this session's group (the clients): see run_one
            own.write_text(str(args.nice))
    results: dict[str, dict[str, Any]] = {}
    seeded: dict[str, float] = {}
    bench_policy(args.nodes)  # sets $GPUSHARE_BENCH_NODES for the brokers (seeded or not)
    checkouts = [("base", args.baseline.resolve())] if args.baseline else []
    checkouts.append(("now", REPO))
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as tmpdir:
        tmp = Path(tmpdir)
        if args.keep:  # the logs and the probe's records, for a look afterwards
            tmp = args.keep.resolve()
            tmp.mkdir(parents=True, exist_ok=True)
        for name in args.db.split(","):
            pg = None
            if name == "sqlite":
                url = f"sqlite:///{tmp}/bench.sqlite"
            elif name == "postgresql":
                reason = pg_missing_reason()
                if reason:
                    print(f"postgresql: skipped ({reason})")
                    continue
                pg = PgServer()
                url = pg.new_database("bench")
            else:
                raise SystemExit(f"--db: unknown database {name!r} (sqlite, postgresql)")
            try:
                cached = (
                    args.seed_cache / f"seed-{args.grants}-{args.nodes}.sqlite"
                    if args.seed_cache and pg is None
                    else None
                )
                if cached is not None and cached.exists():
                    shutil.copyfile(cached, url.removeprefix("sqlite:///"))
                    seeded[name] = float("nan")
                else:
                    print(f"{name}: seeding {args.grants} grants ...", flush=True)
                    seeded[name] = seed(url, args.grants, args.nodes)
                    if cached is not None:
                        cached.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copyfile(url.removeprefix("sqlite:///"), cached)
                arms = variants(checkouts, args, postgres=pg is not None)
                for rep in range(args.reps):
                    # alternate which arm goes first, so neither always meets the warmer box
                    order = arms if rep % 2 == 0 else arms[::-1]
                    for arm, checkout, extra, driver in order:
                        label = f"{name} {arm}" + (f" {rep + 1}" if args.reps > 1 else "")
                        key = label.replace(" ", "-").replace("/", "-")
                        db_url = (
                            copy_db(url, key, tmp, pg) if len(arms) > 1 or args.reps > 1 else url
                        )
                        if driver:
                            db_url = db_url.replace("+psycopg2://", f"+{driver}://")
                        print(f"{label}: running ...", flush=True)
                        results[label] = run_one(key, db_url, args, tmp, checkout, extra)
                        results[label]["seed_s"] = seeded[name]
                        results[label]["arm"] = (name, arm)
                        results[label]["rep"] = rep + 1
            finally:
                if pg is not None:
                    pg.stop()
    nodes = len(bench_policy(args.nodes).nodes)
    print(
        f"\nbroker benchmark: {nodes} nodes, {args.grants} live grants, {args.clients} clients, "
        f"broker on one core, whole-GPU share {args.whole_share:.0%}, "
        + ("each grant released at once" if args.release else "grants kept (live count grows)")
        + (
            ", open loop restarts the closed loop's servers"
            if args.open_restarts
            else ", open loop admits new servers"
        )
        + (f", broker (and its autogroup) and clients at nice {args.nice}" if args.nice else "")
        + (", SQLAlchemy writes (--legacy-sql)" if args.legacy_sql else "")
        + (
            f", open loop at SCHED_FIFO {args.rt} (broker loop and commit thread, clients; "
            "PostgreSQL's backends too, on the clients' cores)"
            if args.rt
            else ""
        )
    )
    names = list(results)
    rows = [
        (f"seed {args.grants} grants in-process (s)", "seed_s", "{:.1f}"),
        ("broker start incl. state rebuild (s)", "start_s", "{:.2f}"),
        ("throughput, closed loop (admissions/s)", "throughput", "{:.0f}"),
        ("  closed-loop p99 latency (ms)", "closed_p99", "{:.1f}"),
        ("  broker CPU per admission (ms)", "cpu_ms", "{:.3f}"),
        (f"offered {args.rate:.0f}/s: achieved (admissions/s)", "rate", "{:.0f}"),
        ("  p50 latency (ms)", "p50", "{:.2f}"),
        ("  p99 latency (ms)", "p99", "{:.2f}"),
        ("  broker CPU busy (share of its core)", "open_cpu", "{:.2f}"),
        ("    of it: event-loop thread / commit thread", "open_cpu_loop", "{:.2f}"),
        ("", "open_cpu_commit", "{:.2f}"),
        ("  context switches per admission: loop / commit", "open_switch_loop", "{:.2f}"),
        ("", "open_switch_commit", "{:.2f}"),
        ("  broker loop waiting for its core (share)", "open_runqueue", "{:.2f}"),
        ("  clients' own loop lateness, p99 (ms)", "client_late_p99", "{:.2f}"),
        ("  slowest 1 %: client-seen time, median (ms)", "slow_total", "{:.1f}"),
        ("    of it: before the broker read it", "slow_before", "{:.1f}"),
        ("    of it: inside the broker", "slow_inside", "{:.1f}"),
        ("    of it: after the broker answered", "slow_after", "{:.1f}"),
        ("  in the broker: request time p50 (ms)", "srv_p50", "{:.2f}"),
        ("  in the broker: request time p99 (ms)", "srv_p99", "{:.2f}"),
        ("  in the broker: request time max (ms)", "srv_max", "{:.1f}"),
        ("  submit (decide+commit+apply) wall p99 (ms)", "submit_p99", "{:.2f}"),
        ("  submit CPU mean / p99 (ms)", "submit_cpu_mean", "{:.3f}"),
        ("", "submit_cpu_p99", "{:.2f}"),
        ("  commit: wait for the database mean (ms)", "write_wait_mean", "{:.3f}"),
        ("  commit: wait for the database p99 (ms)", "write_wait_p99", "{:.2f}"),
        ("  loop holds: longest CPU / wall (ms)", "open_hold_cpu_max", "{:.1f}"),
        ("", "open_hold_wall_max", "{:.1f}"),
        ("  loop holds over 5 ms CPU", "open_holds_5ms", "{:.0f}"),
        ("  GC passes > 0.2 ms per s / ms per s", "open_gc_per_s", "{:.1f}"),
        ("", "open_gc_ms_per_s", "{:.1f}"),
        ("  GC: longest pass (ms) / full passes", "open_gc_max", "{:.1f}"),
        ("", "open_gc2", "{:.0f}"),
        ("broker RSS after the runs (MiB)", "rss_mib", "{:.0f}"),
        ("  memory per 10,000 grants (MiB)", "mib_per_10k", "{:.1f}"),
        ("reconcile pass over every grant (s)", "reconcile_s", "{:.2f}"),
        ("  longest /health answer during it (ms)", "loop_hold_ms", "{:.1f}"),
        ("  longest loop hold, CPU of its thread (ms)", "lag_cpu_ms", "{:.1f}"),
        ("  longest loop hold, wall (ms)", "lag_wall_ms", "{:.1f}"),
        ("  same, without a GC pass in it (ms)", "lag_nogc_cpu_ms", "{:.1f}"),
        ("  probe wake-ups during it", "lag_ticks", "{:.0f}"),
        ("  wake-ups after over 5 ms CPU", "lag_over_5ms_cpu", "{:.0f}"),
        ("  same, without a GC pass in it", "lag_over_5ms_nogc", "{:.0f}"),
        ("  single callbacks over 5 ms CPU (GC in them)", "slow_callbacks", "{:.0f}"),
        ("  longest such callback, CPU (ms; 0: none)", "slow_callback_max", "{:.1f}"),
        ("  GC passes over 1 ms during it", "gc_count", "{:.0f}"),
        ("  longest GC pass during it, CPU (ms)", "gc_max_ms", "{:.1f}"),
        ("  longest loop hold before it, CPU (ms)", "lag_idle_cpu_ms", "{:.1f}"),
        ("  longest loop hold before it, wall (ms)", "lag_idle_wall_ms", "{:.1f}"),
        ("  /health answer when idle, p50 (ms)", "probe_idle_p50_ms", "{:.2f}"),
        ("  /health answer when idle, max (ms)", "probe_idle_max_ms", "{:.1f}"),
        ("frozen objects at exit (thousands)", "frozen_k", "{:.0f}"),
        ("  garbage among them (objects; a leak)", "leaked", "{:.0f}"),
        ("load average (1 min) at the arm's end", "load1", "{:.2f}"),
    ]
    ratios = [f"{db} now/base" for db in seeded if args.baseline]

    def ratio(db: str, key: str) -> str:
        def med(arm: str) -> float:
            return statistics.median(
                r[key] for r in results.values() if r["arm"] == (db.split()[0], arm)
            )

        base = med("base")
        return f"{med('now') / base:.2f}" if base else "-"

    print(f"{'':45}" + "".join(f"{n:>18}" for n in names + ratios))
    for label, key, fmt in rows:
        print(
            f"{label:45}"
            + "".join(f"{fmt.format(results[n][key]):>18}" for n in names)
            + "".join(f"{ratio(db, key):>18}" for db in ratios)
        )
    if args.baseline:
        print(
            f"base: the broker of {args.baseline} (git archive), same seeded database "
            "(a copy per arm), same clients, same run; ratios of the medians over --reps"
        )
    for n in names:
        print(f"{n} outcomes (closed loop): {results[n]['outcomes']}")
    for line in arm_lines(results) + (ratio_lines(results) if args.baseline else []):
        print(line)
    print("targets: p99 < 20 ms and >= 500 admissions/s on SQLite, one core")
    print(f"load average now: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs (shared machine?)")


if __name__ == "__main__":
    main()
