"""kill -9 of the broker under load: time to serve again, client-visible 5xx, grants lost or
duplicated (issue 23, finding 19).

Runs ``broker/ops/supervisor.py`` the way the hub does (this script stands in for the hub: it is
the supervisor's parent) and keeps ``--spawners`` concurrent spawn-like clients busy (each:
``POST /requests`` with a fresh idempotency key through :class:`BrokerClient`, hold the grant
a moment, read it, release it) plus ``--readers`` concurrent readers (team usage, profiles,
grants), all through ``BrokerClient`` as the spawner uses it. Every ``--interval`` seconds it
kills the broker with SIGKILL, ``--kills`` times, and measures the time from the kill to the
first ``/health`` answer of the new broker.

At the end it checks, against the database: every grant answered to a client exists, is live
unless the client released it, and is released if the release was acknowledged; no request
has two grants, no idempotency key two requests, no key got two different grants; and the
live grants are exactly those the clients hold (nothing admitted behind their back).

    .venv/bin/python benchmarks/broker_kill.py --kills 5

Prints the median and max time to serve again, how long the admissions that overlapped a
kill took as the spawner saw them (from its first try to the answer, its retries included)
against the others, the count of client-visible 5xx (errors after the client's retries), and
grants lost / duplicated.

``--baseline DIR`` (a ``git archive`` of an earlier commit, unpacked) runs the same load
against that tree's supervisor and broker first, then this tree's, ``--reps`` times
alternated; the clients are this tree's in both arms.

    git archive 153c775 | (mkdir -p /tmp/base && tar -x -C /tmp/base)
    .venv/bin/python benchmarks/broker_kill.py --kills 8 --baseline /tmp/base --reps 3
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(HERE), str(REPO / "tests")]

from brokerkit import static_tokens  # noqa: E402
from ports import free_port  # noqa: E402
from sqlalchemy import func, select  # noqa: E402
from tornado.httpclient import AsyncHTTPClient, HTTPRequest  # noqa: E402

from jupyter_gpushare.broker.client import BrokerClient, BrokerError  # noqa: E402
from jupyter_gpushare.broker.store.db import grants_table, make_engine, requests_table  # noqa: E402
from jupyter_gpushare.core.model import GPUAsk, Policy, Profile  # noqa: E402

AsyncHTTPClient.configure(None, max_clients=256)
PREFIX = "/services/gpushare/api/v1"
TEAMS = 8


def kill_policy() -> Policy:
    """``brokerpolicies.crash`` (10 nodes x 4 GPUs per pool, 8 teams) with two profiles."""
    from brokerpolicies import crash

    pol = crash()
    profiles = (
        Profile("eighth", "1/8 GPU", "shared", GPUAsk(fraction_milli=125), "interactive",
                cpu_milli=100, memory_mib=256),
        Profile("one", "1 GPU", "train", GPUAsk(whole=1), "interactive", cpu_milli=100,
                memory_mib=256),
    )
    return dataclasses.replace(pol, profiles=profiles)


@dataclasses.dataclass
class Tally:
    granted: dict[str, str] = dataclasses.field(default_factory=dict)  # key -> grant id
    seen: dict[str, set[str]] = dataclasses.field(default_factory=dict)  # key -> grant ids
    released: set[str] = dataclasses.field(default_factory=set)
    statuses: dict[str, int] = dataclasses.field(default_factory=dict)
    calls: int = 0
    errors_5xx: list[str] = dataclasses.field(default_factory=list)
    errors_other: list[str] = dataclasses.field(default_factory=list)
    admissions: list[tuple[float, float]] = dataclasses.field(default_factory=list)  # (t0, t1)

    def error(self, exc: BrokerError, what: str) -> None:
        (self.errors_5xx if exc.status >= 500 else self.errors_other).append(
            f"{what}: {exc}")


class Run:
    def __init__(self, args: argparse.Namespace, code: str | None = None) -> None:
        self.args = args
        self.code = code  # another tree's supervisor and broker (--baseline), else ours
        self.tmp = Path(getattr(args, "tmp", None) or tempfile.mkdtemp(prefix="gpushare-kill-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}{PREFIX}"
        self.db_url = f"sqlite:///{self.tmp}/b.sqlite"
        self.tally = Tally()
        self.running = True
        self.rng = random.Random(23)

    def start_supervisor(self) -> subprocess.Popen[bytes]:
        tokens = self.tmp / "tokens.json"
        tokens.write_text(json.dumps(static_tokens({})))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([*([self.code] if self.code else []), str(HERE),
                                             str(REPO / "tests"), env.get("PYTHONPATH", "")])
        env.setdefault("GPUSHARE_SUPERVISOR_STANDBY", "1")
        cmd = [sys.executable, "-m", "jupyter_gpushare.broker.ops.supervisor",
               "--BrokerApp.policy_factory=broker_kill:kill_policy",
               f"--BrokerApp.db_url={self.db_url}", f"--BrokerApp.port={self.port}",
               "--BrokerApp.ip=127.0.0.1", "--BrokerApp.use_hub=False",
               "--BrokerApp.reconcile_on_start=False", "--BrokerApp.reconcile_interval_s=0",
               "--BrokerApp.authenticator_class="
               "jupyter_gpushare.broker.api.auth.StaticTokenAuthenticator",
               f"--StaticTokenAuthenticator.tokens_file={tokens}",
               "--BrokerApp.log_level=WARN"]
        self.log = open(self.tmp / "supervisor.log", "wb")  # noqa: SIM115 - closed in main
        return subprocess.Popen(cmd, cwd=self.tmp, env=env, stdout=self.log,
                                stderr=subprocess.STDOUT)

    def broker_pid(self) -> int:
        try:
            return int(json.loads((self.tmp / "gpushare-broker.pid").read_text())["pid"])
        except (OSError, ValueError, KeyError):
            return 0

    async def healthy(self) -> bool:
        req = HTTPRequest(self.url + "/health", request_timeout=0.5, connect_timeout=0.5)
        try:
            resp = await AsyncHTTPClient().fetch(req, raise_error=False)
        except Exception:  # noqa: BLE001 - not serving, whatever the way
            return False
        return resp.code == 200

    def client(self, token: str) -> BrokerClient:
        return BrokerClient(self.url, token, request_timeout=10, connect_timeout=2,
                            retry_window_s=self.args.retry_window)

    async def spawner(self, i: int) -> None:
        client = self.client("tok-spawner")
        t = self.tally
        n = 0
        while self.running:
            key = f"s{i}-{n}"
            n += 1
            profile = "eighth" if self.rng.random() < 0.75 else "one"
            t0 = time.monotonic()
            try:
                t.calls += 1
                ans = await client.request(user=f"u{i}", server=f"srv{n}",
                                           groups=[f"t{i % TEAMS}"], profile=profile,
                                           idempotency_key=key)
            except BrokerError as exc:
                t.error(exc, f"request {key}")
                continue
            finally:
                t.admissions.append((t0, time.monotonic()))
            t.statuses[ans.status] = t.statuses.get(ans.status, 0) + 1
            if ans.status != "granted" or ans.grant is None:
                await asyncio.sleep(0.1)
                continue
            gid = ans.grant.id
            t.seen.setdefault(key, set()).add(gid)
            t.granted[key] = gid
            await asyncio.sleep(self.rng.uniform(0.1, 0.8))  # the server starts
            try:
                t.calls += 1
                await client.get_grant(gid)
                t.calls += 1
                await client.release_grant(gid)
                t.released.add(gid)
            except BrokerError as exc:
                t.error(exc, f"grant {gid}")

    async def reader(self, i: int) -> None:
        client = self.client("tok-admin")
        t = self.tally
        while self.running:
            try:
                t.calls += 1
                if i % 3 == 0:
                    await client.team_usage(f"t{i % TEAMS}")
                elif i % 3 == 1:
                    await client.profiles(f"u{i}")
                else:
                    await client.call("GET", "/grants")
            except BrokerError as exc:
                t.error(exc, f"reader {i}")
            await asyncio.sleep(0.05)

    async def kills(self) -> list[float]:
        times: list[float] = []
        self.windows: list[tuple[float, float]] = []  # (kill, serving again)
        for _ in range(self.args.kills):
            await asyncio.sleep(self.args.interval)
            pid = self.broker_pid()
            os.kill(pid, signal.SIGKILL)
            t0 = time.monotonic()
            while not (self.broker_pid() not in (0, pid) and await self.healthy()):
                if time.monotonic() - t0 > 60:
                    raise RuntimeError("no broker 60 s after the kill:\n"
                                       + (self.tmp / "supervisor.log").read_text()[-3000:])
                await asyncio.sleep(0.01)
            times.append(time.monotonic() - t0)
            self.windows.append((t0, time.monotonic()))
            print(f"  kill {len(times)}: serving again after {times[-1]:.2f} s", flush=True)
        await asyncio.sleep(1.0)
        return times

    def check_database(self) -> dict[str, int]:
        t = self.tally
        engine = make_engine(self.db_url)
        with engine.connect() as conn:
            rows = {r.id: r for r in conn.execute(select(grants_table))}
            dup_req = conn.execute(
                select(grants_table.c.request_id).group_by(grants_table.c.request_id)
                .having(func.count() > 1)).all()
            dup_key = conn.execute(
                select(requests_table.c.idempotency_key)
                .group_by(requests_table.c.username, requests_table.c.idempotency_key)
                .having(func.count() > 1)).all()
        engine.dispose()
        held = {gid for gid in t.granted.values() if gid not in t.released}
        live = {gid for gid, r in rows.items() if r.released_at is None}
        lost = [gid for gid in t.granted.values() if gid not in rows]
        lost += [gid for gid in held if gid in rows and rows[gid].released_at is not None]
        unreleased = [gid for gid in t.released if gid in rows and rows[gid].released_at is None]
        two = [k for k, ids in t.seen.items() if len(ids) > 1]
        extra = live - held  # admitted without any client knowing (a duplicate)
        return {"lost": len(lost) + len(unreleased),
                "duplicated": len(dup_req) + len(dup_key) + len(two) + len(extra)}


def split_by_kills(
    admissions: list[tuple[float, float]], windows: list[tuple[float, float]]
) -> tuple[list[float], list[float]]:
    """Admission times (ms): those whose call overlapped a kill window (the kill to serving
    again), and the others."""
    during: list[float] = []
    calm: list[float] = []
    for t0, t1 in admissions:
        hit = any(t0 <= end and start <= t1 for start, end in windows)
        (during if hit else calm).append((t1 - t0) * 1000)
    return during, calm


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile, nearest rank (nan for none)."""
    if not values:
        return float("nan")
    ranked = sorted(values)
    rank = int(-(-len(ranked) * q // 100))  # ceil(n q / 100), 1-based
    return ranked[min(len(ranked) - 1, max(0, rank - 1))]


async def run(args: argparse.Namespace, code: str | None = None) -> dict[str, Any]:
    r = Run(args, code)
    sup = r.start_supervisor()
    try:
        deadline = time.monotonic() + 90
        while not await r.healthy():
            if time.monotonic() > deadline:
                raise RuntimeError((r.tmp / "supervisor.log").read_text()[-3000:])
            await asyncio.sleep(0.05)
        await asyncio.sleep(2.0)  # the warm standby imports
        load = [asyncio.ensure_future(r.spawner(i)) for i in range(args.spawners)]
        load += [asyncio.ensure_future(r.reader(i)) for i in range(args.readers)]
        times = await r.kills()
        r.running = False
        await asyncio.wait_for(asyncio.gather(*load), 60)
    finally:
        sup.send_signal(signal.SIGTERM)  # hand over: the broker lingers while we live
        sup.wait(10)
        pid = r.broker_pid()
        if pid:
            os.kill(pid, signal.SIGTERM)
            for _ in range(100):
                if r.broker_pid() != pid:
                    break
                await asyncio.sleep(0.1)
        r.log.close()
    checked = r.check_database()
    t = r.tally
    during, calm = split_by_kills(t.admissions, r.windows)
    return {"times": times, "during": during, "calm": calm, "calls": t.calls,
            "statuses": t.statuses,
            "errors_5xx": t.errors_5xx, "errors_other": t.errors_other, **checked,
            "log": str(r.tmp / "supervisor.log")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--spawners", type=int, default=25)
    parser.add_argument("--readers", type=int, default=25)
    parser.add_argument("--interval", type=float, default=4.0,
                        help="seconds of load between two kills")
    parser.add_argument("--retry-window", type=float, default=10.0,
                        help="BrokerClient.retry_window_s of the clients (0: no retries)")
    parser.add_argument("--baseline", metavar="DIR",
                        help="an unpacked git archive: its supervisor and broker run first")
    parser.add_argument("--reps", type=int, default=1, help="runs of each arm, alternated")
    args = parser.parse_args()
    arms = ([("baseline", str(Path(args.baseline).resolve()))] if args.baseline else []) + [
        ("this tree", None)]
    for rep in range(args.reps):
        for name, code in arms:
            print(f"-- {name}, run {rep + 1} of {args.reps}, load {os.getloadavg()[0]:.1f}",
                  flush=True)
            report(args, asyncio.run(run(args, code)))


def report(args: argparse.Namespace, out: dict[str, Any]) -> None:
    times = sorted(out["times"])
    print(f"kill -9 of the broker x{args.kills} under {args.spawners} spawners + "
          f"{args.readers} readers ({os.cpu_count()} CPUs, retry window {args.retry_window} s)")
    print(f"serving again: median {statistics.median(times):.2f} s, max {times[-1]:.2f} s")
    during, calm = out["during"], out["calm"]
    print(f"admission as the spawner saw it (ms), overlapping a kill: p50 "
          f"{percentile(during, 50):.0f}, p99 {percentile(during, 99):.0f}, max "
          f"{max(during, default=float('nan')):.0f} ({len(during)}); the others: p50 "
          f"{percentile(calm, 50):.0f}, p99 {percentile(calm, 99):.0f} ({len(calm)})")
    print(f"calls {out['calls']}, answers {out['statuses']}")
    print(f"client-visible 5xx: {len(out['errors_5xx'])}; other errors: "
          f"{len(out['errors_other'])}")
    for line in (out["errors_5xx"] + out["errors_other"])[:5]:
        print("   ", line[:200])
    print(f"grants lost: {out['lost']}, duplicated: {out['duplicated']}")
    print(f"supervisor log: {out['log']}")


if __name__ == "__main__":
    main()
