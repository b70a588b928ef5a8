"""Admissions around a broker takeover: how long the admissions sent in the second after a kill
take, by how long after the kill they were sent (issue 28: admission p99 <= 100 ms during broker
faults).

The stack is the soak's broker half: a real JupyterHub (its tokens and groups), the broker
outside it under its supervisor with a warm standby (``broker/ops/external.py``), SQLite;
``--grants`` live grants of ``--teams`` teams and ``--history`` grants this month already
closed (written to the database directly). ``--kills`` times (SIGKILL and SIGTERM alternately,
each once a new warm standby waits) one client asks for a 1/8 debug GPU as the soak's prober
does (``BrokerClient``, the spawner's token, an idempotency key; then releases it), back to
back, from ``--before`` s before the kill to ``--after`` s after it.

It prints per kill the time from the kill to the first answer and the new broker's
``listening`` line (its start, step by step), then the admission times (ms, as the client saw
them, its retries included) by when they were sent, relative to the kill: p50, p99, max and
count per bucket over all kills, and the slowest admissions with their send times. The load
average is printed with each arm.

    nice .venv/bin/python benchmarks/broker_takeover.py --kills 6

``--baseline DIR`` (a ``git archive`` of an earlier commit, unpacked) runs the same first with
that tree's hub setup, supervisor and broker (this tree's client), then this tree's, ``--reps``
times alternated:

    git archive HEAD | (mkdir -p /tmp/base && tar -x -C /tmp/base)
    nice .venv/bin/python benchmarks/broker_takeover.py --kills 6 --baseline /tmp/base
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(HERE), str(REPO / "tests")]

from ports import free_port  # noqa: E402
from realhub import RealHub, start_hub  # noqa: E402
from soak.stack import Stack  # noqa: E402
from sqlalchemy import insert  # noqa: E402

from jupyter_gpushare.broker.client import BrokerClient, BrokerError  # noqa: E402
from jupyter_gpushare.broker.store.db import grants_table, make_engine  # noqa: E402
from jupyter_gpushare.core.ledger import month_bounds, month_of  # noqa: E402

PROBE_USER, PROBE_TEAM = "probe", "ops"
# fmt: off
HISTORY_ROW = dict(pool="interactive", profile="eighth", kind="interactive", node="lab-0",
                   slices=[], units_milli=125, borrowed=False, preemptible=False,
                   priority="interactive", priority_value=500, grace_period_s=2, spec={},
                   release_reason="released", end_kind="released")
BUCKETS = ((-1e9, 0, "before"), (0, 50, "0-50"), (50, 100, "50-100"), (100, 200, "100-200"),
           (200, 500, "200-500"), (500, 1000, "500-1000"), (1000, 1e9, ">1000"))
# fmt: on


def policy_text(teams: int) -> str:
    """The soak's kind of site, bigger: a shared pool of 10 nodes x 8 GPUs the teams' grants
    live on, and the debug pool the probe asks from."""
    text = """
inventory:
  source: simulated
  simulated:
    - {name: lab, pool: interactive, nodes: 10, gpus_per_node: 8, model: H200,
       gpu_memory: 80GiB, cpu: 64, memory: 512GiB}
    - {name: dbg, pool: debug, nodes: 1, gpus_per_node: 1, model: H200,
       gpu_memory: 80GiB, cpu: 16, memory: 64GiB}
pools:
  interactive: {mode: shared}
  debug: {mode: debug}
priority_classes:
  interactive: {value: 500, preemptible: false, grace_period: 2s}
teams:
"""
    for i in range(teams):
        text += f"""  team{i}:
    groups: [team{i}]
    quotas:
      interactive: {{guaranteed: 6, borrow_limit: 4, per_user_cap: 2}}
      debug: {{guaranteed: 1/8, borrow_limit: 1/8}}
"""
    return (
        text
        + """  ops:
    groups: [ops]
    quotas:
      debug: {guaranteed: 1/8}
profiles:
  - {slug: debug-eighth, display_name: Debug 1/8 GPU, pool: debug, gpu: {fraction: 1/8},
     cpu: 1, memory: 1GiB, max_lifetime: 30m}
  - {slug: eighth, display_name: 1/8 GPU, pool: interactive, gpu: {fraction: 1/8},
     cpu: 1, memory: 1GiB}
"""
    )


def hub_config(policy: Path, broker_port: int, log_level: str) -> str:
    """The soak's hub config, broker outside the hub; reconcile as the soak's (every 5 s) but
    with grants older than an hour only (the seeded grants have no servers)."""
    return f"""
from jupyter_gpushare.hubsetup import setup_gpushare
setup_gpushare(c, {str(policy)!r}, spawner="simple", broker_port={broker_port},
               data_dir=HUB_TMP, admin_users=["boss"], broker_managed=False,
               broker_args=["--BrokerApp.reconcile_interval_s=5",
                            "--BrokerApp.reconcile_min_age_s=3600",
                            "--BrokerApp.log_level={log_level}",
                            "--Application.log_format=%(asctime)s.%(msecs)03d %(message)s",
                            "--Application.log_datefmt=%H:%M:%S"])
c.JupyterHub.allow_named_servers = True
"""


@dataclass
class Admission:
    sent: float  # monotonic
    ms: float
    status: int


@dataclass
class Kill:
    sig: str
    at: float  # monotonic
    wall: float = 0.0  # the same moment, time.time()
    admissions: list[Admission] = field(default_factory=list)
    listening: str = ""

    def first_answer_ms(self) -> float:
        """From the kill to the answer of the first admission sent after it."""
        after = [
            a.sent + a.ms / 1000 for a in self.admissions if a.status < 500 and a.sent >= self.at
        ]
        return 1000 * (min(after) - self.at) if after else float("nan")


class Bench:
    def __init__(self, args: argparse.Namespace, code: str | None) -> None:
        self.args, self.code = args, code
        self.tmp = Path(tempfile.mkdtemp(prefix="gpushare-takeover-"))
        self.stack: Stack | None = None

    def start(self) -> Stack:
        tmp, args = self.tmp, self.args
        policy = tmp / "policy.yaml"
        policy.write_text(policy_text(args.teams))
        port = free_port()
        env = {
            "PYTHONPATH": os.pathsep.join(
                [*([self.code] if self.code else []), os.environ.get("PYTHONPATH", "")]
            )
        }
        hub = start_hub(tmp / "hub", extra_config=hub_config(policy, port, args.log_level), env=env)
        self.stack = stack = Stack(tmp, hub, port, policy, policy.read_text())
        saved = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = env["PYTHONPATH"]
        try:
            stack.launch_broker()
        finally:
            if saved is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = saved
        wait(stack.broker_healthy, 90, "the broker answering")
        return stack

    def users(self, hub: RealHub) -> dict[str, str]:
        per_team = max(1, self.args.grants // (8 * self.args.teams) + 1)
        people = {f"t{i}u{j}": f"team{i}" for i in range(self.args.teams) for j in range(per_team)}
        people[PROBE_USER] = PROBE_TEAM
        status, _ = hub.api("POST", "/users", {"usernames": list(people)})
        assert status == 201, status
        for team in sorted(set(people.values())):
            hub.api("POST", f"/groups/{team}")
            members = [u for u, t in people.items() if t == team]
            status, _ = hub.api("POST", f"/groups/{team}/users", {"users": members})
            assert status == 200, (team, status)
        return people

    def client(self) -> BrokerClient:
        assert self.stack is not None
        return BrokerClient(
            self.stack.broker_url,
            self.stack.tokens()["spawner"],
            request_timeout=30,
            connect_timeout=2,
            retry_window_s=10,
        )

    async def seed(self, people: dict[str, str]) -> None:
        client = self.client()
        owners = [u for u in people if u != PROBE_USER]
        sem = asyncio.Semaphore(8)

        async def one(k: int) -> None:
            async with sem:
                status, answer = await client.call(
                    "POST",
                    "/requests",
                    {
                        "user": owners[k % len(owners)],
                        "profile": "eighth",
                        "server": f"s{k}",
                        "idempotency_key": f"seed-{k}",
                    },
                )
                assert answer.get("status") == "granted", answer

        await asyncio.gather(*(one(k) for k in range(self.args.grants)))

    def pids(self) -> set[int]:
        assert self.stack is not None and self.stack.broker_proc is not None
        sup = self.stack.broker_proc.pid
        try:
            with open(f"/proc/{sup}/task/{sup}/children") as f:
                return {int(p) for p in f.read().split()}
        except OSError:
            return set()

    async def standby_ready(self) -> None:
        """Until a warm standby waits next to the serving broker, with its service built."""
        assert self.stack is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            serving = self.stack.broker_pid()
            others = self.pids() - {serving}
            if serving and others and all(blocked_on_stdin(p) for p in others):
                return
            await asyncio.sleep(0.1)
        raise RuntimeError("no warm standby within 60 s")

    async def probe(self, client: BrokerClient, n: int) -> Admission:
        t0 = time.monotonic()
        body = {
            "user": PROBE_USER,
            "profile": "debug-eighth",
            "server": "probe",
            "idempotency_key": f"takeover-{n}-{time.time()}",
        }
        try:
            status, answer = await client.call("POST", "/requests", body)
        except BrokerError as exc:
            status, answer = exc.status, str(exc)
        took = Admission(t0, 1000 * (time.monotonic() - t0), status)
        grant = answer.get("grant") if isinstance(answer, dict) else None
        if grant:
            with contextlib.suppress(BrokerError):
                await client.call("DELETE", f"/grants/{grant['id']}")
        elif status < 500:
            raise RuntimeError(f"the probe was not granted: {status} {answer}")
        return took

    async def one_kill(self, client: BrokerClient, sig: signal.Signals, n: int) -> Kill:
        assert self.stack is not None
        await self.standby_ready()
        await asyncio.sleep(0.3)  # the standby's own last work
        victim = self.stack.broker_pid()
        kill = Kill(sig.name, time.monotonic() + self.args.before, time.time() + self.args.before)
        loop = asyncio.get_running_loop()
        loop.call_at(loop.time() + self.args.before, os.kill, victim, sig)
        end = kill.at + self.args.after
        while time.monotonic() < end:
            n += 1
            kill.admissions.append(await self.probe(client, n))
        kill.listening = self.listening_lines()[-1] if self.listening_lines() else ""
        return kill

    def listening_lines(self) -> list[str]:
        assert self.stack is not None
        log = self.stack.hub.tmp / "broker.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        return re.findall(r"listening on \S+ \((ready[^\n]*)\)", text)

    def load_the_hub(self, hub: RealHub) -> list[subprocess.Popen[bytes]]:
        """``--hub-load`` processes asking the hub for its users every ``--hub-load-pause`` s
        (the soak's hub is busy: spawns, activity, the audit's snapshots)."""
        code = (
            "import sys, time, urllib.request\n"
            "req = urllib.request.Request(sys.argv[1], headers={'Authorization': "
            "'token ' + sys.argv[2]})\n"
            "while True:\n"
            "    urllib.request.urlopen(req, timeout=30).read()\n"
            "    time.sleep(float(sys.argv[3]))\n"
        )
        return [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    code,
                    hub.api_url + "/users?limit=50",
                    hub.admin_token,
                    str(self.args.hub_load_pause),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for _ in range(self.args.hub_load)
        ]

    def history(self, people: dict[str, str]) -> None:
        """``--history`` grants of this month already closed, written to the database
        directly (a month's history: what the broker's ledger sums at each start)."""
        assert self.stack is not None
        owners = [u for u in people if u != PROBE_USER]
        now = time.time()
        first = month_bounds(*month_of(now))[0]
        rows = []
        for k in range(self.args.history):
            granted = first + (now - 60 - first) * k / max(1, self.args.history)
            user = owners[k % len(owners)]
            rows.append(
                dict(
                    HISTORY_ROW,
                    id=f"h-{k}",
                    request_id=f"hr-{k}",
                    username=user,
                    server=f"h{k}",
                    team=people[user],
                    granted_at=granted,
                    released_at=granted + 1800,
                )
            )
        if rows:
            engine = make_engine(self.stack.db_url)
            with engine.begin() as conn:
                conn.execute(insert(grants_table), rows)
            engine.dispose()

    async def run(self) -> list[Kill]:
        stack = self.start()
        loaders: list[subprocess.Popen[bytes]] = []
        try:
            people = self.users(stack.hub)
            await self.seed(people)
            self.history(people)
            loaders = self.load_the_hub(stack.hub)
            client = self.client()
            await self.probe(client, 0)  # the probe user's first call, before any kill
            kills = []
            for i in range(self.args.kills):
                sig = signal.SIGKILL if i % 2 == 0 else signal.SIGTERM
                kills.append(await self.one_kill(client, sig, 1000 * (i + 1)))
            return kills
        finally:
            for proc in loaders:
                proc.kill()
                proc.wait()
            stack.stop()


def blocked_on_stdin(pid: int) -> bool:
    """Whether ``pid`` (a standby) sleeps waiting for its go (not importing or building)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read()
    except (OSError, IndexError):
        return False
    return state == "S" and ("select" in wchan or "poll" in wchan)


def wait(ok: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} within {timeout} s")
        time.sleep(0.2)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile, nearest rank (nan for none)."""
    if not values:
        return float("nan")
    ranked = sorted(values)
    rank = int(-(-len(ranked) * q // 100))
    return ranked[min(len(ranked) - 1, max(0, rank - 1))]


def bucket_of(ms_after: float) -> str:
    return next(name for lo, hi, name in BUCKETS if lo <= ms_after < hi)


def report(kills: list[Kill], slowest: int) -> dict[str, Any]:
    for i, k in enumerate(kills, 1):
        stamp = time.strftime("%H:%M:%S", time.localtime(k.wall)) + f".{k.wall % 1 * 1000:03.0f}"
        print(
            f"  kill {i} ({k.sig}) at {stamp}: first answer {k.first_answer_ms():.0f} ms after "
            f"the kill; {len(k.admissions)} admissions; {k.listening}"
        )
    by: dict[str, list[float]] = {name: [] for _, _, name in BUCKETS}
    rows: list[tuple[float, float, int, str]] = []
    for i, k in enumerate(kills, 1):
        for a in k.admissions:
            after = 1000 * (a.sent - k.at)
            by[bucket_of(after)].append(a.ms)
            rows.append((a.ms, after, i, k.sig))
    print("  sent (ms after the kill)  count    p50    p99    max   (admission ms)")
    for name, values in by.items():
        if values:
            print(
                f"  {name:>24}  {len(values):5d} {percentile(values, 50):6.1f} "
                f"{percentile(values, 99):6.1f} {max(values):6.1f}"
            )
    window = [ms for ms, after, _, _ in rows if 0 <= after < 1000]
    print(
        f"  sent 0-1000 ms after a kill: p50 {percentile(window, 50):.1f} ms, p99 "
        f"{percentile(window, 99):.1f} ms, max {max(window, default=float('nan')):.1f} ms, "
        f"over 100 ms: {sum(ms > 100 for ms in window)} of {len(window)}"
    )
    print(
        "  slowest: "
        + "; ".join(
            f"{ms:.0f} ms sent {after:+.0f} ms (kill {i} {sig})"
            for ms, after, i, sig in sorted(rows, reverse=True)[:slowest]
        )
    )
    return {"window": window, "by": by}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=6, help="alternately SIGKILL and SIGTERM")
    parser.add_argument("--grants", type=int, default=300, help="live grants seeded")
    parser.add_argument("--teams", type=int, default=6)
    parser.add_argument(
        "--history",
        type=int,
        default=0,
        help="grants of this month already closed, written to the database before the kills",
    )
    parser.add_argument(
        "--before", type=float, default=0.3, help="seconds of admissions before each kill"
    )
    parser.add_argument(
        "--after", type=float, default=1.0, help="seconds of admissions after each kill"
    )
    parser.add_argument("--log-level", default="INFO", help="the broker's (DEBUG: each request)")
    parser.add_argument(
        "--hub-load",
        type=int,
        default=0,
        help="processes keeping the hub busy (GET /users, 50 a page)",
    )
    parser.add_argument(
        "--hub-load-pause",
        type=float,
        default=0.02,
        help="seconds each of them waits between two calls",
    )
    parser.add_argument("--slowest", type=int, default=8)
    parser.add_argument(
        "--baseline",
        metavar="DIR",
        help="an unpacked git archive: its hub setup, supervisor and broker run first",
    )
    parser.add_argument("--reps", type=int, default=1, help="runs of each arm, alternated")
    args = parser.parse_args()
    arms = ([("baseline", str(Path(args.baseline).resolve()))] if args.baseline else []) + [
        ("this tree", None)
    ]
    for rep in range(args.reps):
        for name, code in arms:
            print(
                f"-- {name}, run {rep + 1} of {args.reps}: {args.kills} kills, "
                f"{args.grants} live grants, {args.history} closed this month, hub load "
                f"{args.hub_load}, {os.cpu_count()} CPUs, load average "
                f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}",
                flush=True,
            )
            bench = Bench(args, code)
            kills = asyncio.run(bench.run())
            report(kills, args.slowest)
            print(
                f"   load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
                f"logs in {bench.tmp}",
                flush=True,
            )


if __name__ == "__main__":
    main()
