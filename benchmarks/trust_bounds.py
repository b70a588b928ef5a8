"""Bounds on what one client can make the broker store or hold open (issue 23, 8 and 9).

    .venv/bin/python benchmarks/trust_bounds.py [--requests 1000] [--streams 1000]

An in-process broker (static tokens, the small test policy, SQLite in a temporary folder,
the default ``BrokerLimits``) is sent ``--requests`` ``POST /requests`` by one user as fast
as one client can (each refused by the decision, so each would leave a row), then the
user opens ``--streams`` notice streams. Prints the answers by status and the rows stored,
whether another user is still served, and how long request-row retention takes on 100,000
refused rows of 50 users (half older than ``request_retention_days``). Asserts nothing.
Before the fix: 1,000 requests in 4 s, all stored; one user held all 1,000 stream slots.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from brokerkit import BASE, call, start_broker, static_tokens  # noqa: E402
from brokerpolicies import small  # noqa: E402
from sqlalchemy import func, insert, select  # noqa: E402
from tornado.httpclient import AsyncHTTPClient, HTTPRequest  # noqa: E402
from traitlets.config import Config  # noqa: E402

from jupyter_gpushare.broker.ops.retention import DAY, RequestRetention  # noqa: E402
from jupyter_gpushare.broker.service.limits import BrokerLimits  # noqa: E402
from jupyter_gpushare.broker.store.db import requests_table  # noqa: E402

REFUSED = {"pool": "debug", "gpu": {"count": 4}}


def _count(app: Any) -> int:
    with app.broker.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(requests_table)).scalar_one())


async def flood_requests(app: Any, n: int) -> None:
    codes: collections.Counter[int] = collections.Counter()
    t0 = time.monotonic()
    for i in range(n):
        body = {**REFUSED, "server": f"s{i}"}
        status, _ = await call(app, "POST", "/requests", "tok-alice", body)
        codes[status] += 1
    took = time.monotonic() - t0
    other, _ = await call(app, "POST", "/requests", "tok-bob", {**REFUSED, "server": "b"})
    print(f"requests: {n} by one user in {took:.1f} s -> {dict(sorted(codes.items()))}; "
          f"rows stored {_count(app)}; another user meanwhile: {other}")


async def open_stream(app: Any, token: str, clients: list[Any]) -> str:
    seen: list[bytes] = []
    client = AsyncHTTPClient(force_instance=True)
    clients.append(client)
    done = asyncio.ensure_future(client.fetch(HTTPRequest(
        f"http://127.0.0.1:{app.port}{BASE}/notices/stream",
        headers={"Authorization": f"token {token}"}, streaming_callback=seen.append,
        request_timeout=60), raise_error=False))
    for _ in range(200):
        if b"connected" in b"".join(seen):
            return "open"
        if done.done():
            return str(done.result().code)
        await asyncio.sleep(0.01)
    return "no answer"


async def flood_streams(app: Any, n: int) -> None:
    clients: list[Any] = []
    results = collections.Counter([await open_stream(app, "tok-alice", clients)
                                   for _ in range(n)])
    other = await open_stream(app, "tok-bob", clients)
    print(f"notice streams: {n} by one user -> {dict(results)}; another user: {other}")
    for client in clients:
        client.close()


def retention(app: Any, rows: int = 100_000) -> None:
    now = app.broker.clock()
    old = now - (BrokerLimits().request_retention_days + 100) * DAY
    with app.broker.engine.begin() as conn:
        conn.execute(insert(requests_table), [dict(
            id=f"r-bench-{i}", username=f"u{i % 50}", server="", team="a", pool="debug",
            kind="interactive", profile="", status="refused", reason="bench", code="quota",
            spec={}, grant_id=None, idempotency_key=None,
            created_at=old if i % 2 else now, updated_at=old if i % 2 else now,
        ) for i in range(rows)])
    before = _count(app)
    pruner = RequestRetention(app.broker)
    times = []
    batch = app.broker.limits.request_prune_batch
    while True:
        t0 = time.perf_counter()
        deleted = pruner.prune_once()
        times.append(time.perf_counter() - t0)
        if deleted < batch:
            break
    times.sort()
    print(f"retention: {before} rows -> {_count(app)} in {len(times)} passes of at most {batch}; "
          f"pass median {times[len(times) // 2] * 1000:.0f} ms, max {times[-1] * 1000:.0f} ms")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--streams", type=int, default=1000)
    args = parser.parse_args()
    config = Config()
    config.BrokerLimits.requests_per_minute_per_user = BrokerLimits().requests_per_minute_per_user
    with tempfile.TemporaryDirectory() as folder:
        app = await start_broker(small(), f"sqlite:///{folder}/b.sqlite",
                                 static_tokens({"alice": ["a"], "bob": ["b"]}), config=config)
        try:
            await flood_requests(app, args.requests)
            await flood_streams(app, args.streams)
            retention(app)
        finally:
            await app.stop_async()


if __name__ == "__main__":
    asyncio.run(main())
