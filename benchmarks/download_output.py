"""Downloading a large job output: the broker's memory and its ``/health`` meanwhile.

    .venv/bin/python benchmarks/download_output.py [--size-mib 1024] [--dir /tmp]

Issue 23, finding 7: downloading a 1.2 GB executed notebook grew the broker from 124 MiB to
2.5 GiB and stalled ``/health`` for 5.3 s (the whole file was read into memory). This starts
a real broker (``python -m jupyter_gpushare.broker``, its own process, the local backend,
the jobs policy of the tests), runs one small job to the end, then plants a ``--size-mib``
notebook as that job's output (``attempt-1/output.ipynb``), downloads it through
``GET /jobs/{id}/output`` with a client that keeps nothing, while another client probes
``GET /health`` every 20 ms (on a schedule: a stall delays every probe sent during it) and
the broker's RSS is sampled every 20 ms.

Prints the broker's RSS before and at its peak (growth in MiB), the ``/health`` latencies
(p50, p99, max) and the download's throughput, against the targets: RSS growth <= 50 MiB,
``/health`` p99 <= 50 ms. Everything it wrote (the planted file included) is removed at
the end. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from tornado.httpclient import AsyncHTTPClient, HTTPRequest

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

import jobnotebooks as nbs  # noqa: E402
from brokerkit import BASE, call, free_port, static_tokens  # noqa: E402

POLICY = TESTS / "data" / "jobs_policy.yaml"
TARGET_RSS_MIB = 50.0
TARGET_P99_MS = 50.0


def start_broker(tmp: Path, port: int) -> subprocess.Popen[bytes]:
    tokens = tmp / "tokens.json"
    tokens.write_text(json.dumps(static_tokens({"alice": ["vision"]})))
    (tmp / "home" / "alice").mkdir(parents=True)
    cmd = [
        sys.executable, "-m", "jupyter_gpushare.broker",
        f"--BrokerApp.policy_file={POLICY}",
        f"--BrokerApp.db_url=sqlite:///{tmp}/broker.sqlite",
        f"--BrokerApp.port={port}", "--BrokerApp.ip=127.0.0.1",
        "--BrokerApp.use_hub=False", "--BrokerApp.reconcile_on_start=False",
        "--BrokerApp.authenticator_class=jupyter_gpushare.broker.api.auth.StaticTokenAuthenticator",
        f"--StaticTokenAuthenticator.tokens_file={tokens}",
        f"--JobManager.jobs_dir={tmp}/jobs",
        f"--JobManager.user_root_template={tmp}/home/{{username}}",
    ]
    log = (tmp / "broker.log").open("ab")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tmp)


async def wait_ready(url: str, proc: subprocess.Popen[bytes], tmp: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise SystemExit((tmp / "broker.log").read_text()[-3000:])
        try:
            if (await call(url, "GET", "/health"))[0] == 200:
                return
        except ConnectionError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("the broker did not start:\n" + (tmp / "broker.log").read_text())
        await asyncio.sleep(0.1)


async def finished_job(url: str) -> str:
    status, job = await call(url, "POST", "/jobs", "tok-alice-srv", {
        "notebook": nbs.simple(), "profile": "job-1gpu", "max_runtime": 300,
        "output_path": "bench.ipynb"})
    if status != 201:
        raise SystemExit(f"submit: {status} {job}")
    deadline = time.monotonic() + 120
    while True:
        _, job = await call(url, "GET", f"/jobs/{job['id']}", "tok-alice")
        if job["state"] in ("succeeded", "failed"):
            if job["state"] != "succeeded":
                raise SystemExit(f"the small job failed: {job['reason']}")
            return str(job["id"])
        if time.monotonic() > deadline:
            raise SystemExit(f"the small job did not end: {job}")
        await asyncio.sleep(0.2)


def plant(path: Path, size_mib: int) -> int:
    """A notebook of ``size_mib`` MiB (one cell with a long output), written in pieces."""
    head = b'{"cells": [{"cell_type": "code", "metadata": {}, "source": "", "outputs": ' \
           b'[{"output_type": "stream", "name": "stdout", "text": "'
    tail = b'"}]}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}\n'
    block = b"x" * (1 << 20)
    path.unlink()
    with path.open("wb") as f:
        f.write(head)
        for _ in range(size_mib):
            f.write(block)
        f.write(tail)
    return path.stat().st_size


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpushare-download-", dir=args.dir))
    port = free_port()
    url = f"http://127.0.0.1:{port}{BASE}"
    proc = start_broker(tmp, port)
    try:
        await wait_ready(url, proc, tmp)
        job_id = await finished_job(url)
        output = tmp / "jobs" / job_id / "attempt-1" / "output.ipynb"
        size = plant(output, args.size_mib)
        await report(url, proc.pid, job_id, size)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


async def report(url: str, pid: int, job_id: str, size: int) -> None:
    broker = psutil.Process(pid)
    await asyncio.sleep(1.0)  # settle after the job
    before = broker.memory_info().rss
    peak = before
    health: list[float] = []
    done = asyncio.Event()

    async def one_probe() -> None:
        t0 = time.perf_counter()
        status, _ = await call(url, "GET", "/health")
        if status == 200:
            health.append(time.perf_counter() - t0)

    async def probe() -> None:
        # on a fixed schedule, not one after another: a stall delays every probe sent
        # during it, so it weighs in the p99 as long as it lasts
        probes = []
        while not done.is_set():
            probes.append(asyncio.ensure_future(one_probe()))
            await asyncio.sleep(0.02)
        await asyncio.gather(*probes)

    async def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, broker.memory_info().rss)
            await asyncio.sleep(0.02)

    got = 0

    def keep_nothing(chunk: bytes) -> None:
        nonlocal got
        got += len(chunk)

    async def download() -> Any:
        req = HTTPRequest(f"{url}/jobs/{job_id}/output",
                          headers={"Authorization": "token tok-alice"},
                          streaming_callback=keep_nothing, request_timeout=600)
        try:
            return await AsyncHTTPClient(force_instance=True, max_body_size=size + (1 << 20)).fetch(
                req, raise_error=False)
        finally:
            done.set()

    t0 = time.perf_counter()
    tasks = [asyncio.ensure_future(probe()), asyncio.ensure_future(sample())]
    resp = await download()
    took = time.perf_counter() - t0
    await asyncio.gather(*tasks)
    growth = (peak - before) / (1 << 20)
    p99 = pct(health, 0.99) * 1000
    print(f"output {size / (1 << 20):.0f} MiB: HTTP {resp.code}, {got / (1 << 20):.0f} MiB "
          f"received in {took:.1f} s ({got / (1 << 20) / took:.0f} MiB/s)")
    print(f"broker RSS: {before / (1 << 20):.0f} MiB before, {peak / (1 << 20):.0f} MiB peak, "
          f"growth {growth:.1f} MiB (target <= {TARGET_RSS_MIB:g}: "
          f"{'met' if growth <= TARGET_RSS_MIB else 'MISSED'})")
    print(f"/health during the download: p50 {statistics.median(health) * 1000:.1f} ms, "
          f"p99 {p99:.1f} ms, max {max(health) * 1000:.1f} ms, n={len(health)} "
          f"(target p99 <= {TARGET_P99_MS:g} ms: {'met' if p99 <= TARGET_P99_MS else 'MISSED'})")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    asyncio.run(main())
