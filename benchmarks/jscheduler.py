"""jupyter-scheduler through the broker against the gpushare submit path: time from
"Create" to "running", same run (issue 25, item 2; target: at most 10 % more).

    .venv/bin/python benchmarks/jscheduler.py [--pairs 10]

One real broker (local backend, papermill) and one real ``jupyter lab`` whose
jupyter-scheduler uses :mod:`jupyter_gpushare.scheduler` (``tests/jscheduler_kit.py``).
Each pair submits the same notebook to the same profile once each way, in random order:

* **gpushare**: ``POST /gpushare/api/jobs`` (what the submit dialog's Submit button sends);
* **jupyter-scheduler**: ``POST /scheduler/jobs`` (what its Create button sends).

Two figures per way, both from the client's clock just before the POST (one machine, one
clock, so no polling interval is in them):

* **started**: until the broker's ``started_at`` (the job's process started, state
  ``running``);
* **shown running**: until the job is started *and* the POST has answered, i.e. the
  earliest moment the UI that sent it can show it running (the target's figure).

Each job is left to finish before the next, so both ways meet an idle pool. Prints medians
and the ratio of each; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from jscheduler_kit import Stack, scheduler_stack  # noqa: E402

PROFILE = {"profile": "job-1gpu", "priority": "training", "max_runtime": 300}


def started_at(job: dict[str, Any]) -> float:
    return datetime.fromisoformat(job["started_at"].replace("Z", "+00:00")).timestamp()


async def until_finished(s: Stack, job_id: str, timeout_s: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        _, job = await s.broker_api("GET", f"/jobs/{job_id}")
        if job["state"] in ("succeeded", "failed", "cancelled", "lost"):
            return dict(job)
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job_id} did not finish: {job}")
        await asyncio.sleep(0.1)


async def via_gpushare(s: Stack) -> tuple[float, float]:
    """(Create->started, Create->answered) in seconds."""
    t0 = time.time()
    status, job = await s.lab_api("POST", "gpushare/api/jobs", {"path": "hello.ipynb", **PROFILE})
    answered = time.time() - t0
    if status != 201:
        raise RuntimeError(f"gpushare submit: {status} {job}")
    done = await until_finished(s, job["id"])
    return started_at(done) - t0, answered


async def via_jupyter_scheduler(s: Stack) -> tuple[float, float]:
    form = {
        "input_uri": "hello.ipynb",
        "name": "hello",
        "output_formats": ["ipynb"],
        "runtime_environment_name": PROFILE["profile"],
        "compute_type": PROFILE["priority"],
        "parameters": {"gpushare_max_runtime": str(PROFILE["max_runtime"])},
    }
    t0 = time.time()
    status, made = await s.lab_api("POST", "scheduler/jobs", form)
    answered = time.time() - t0
    if status != 200:
        raise RuntimeError(f"jupyter-scheduler create: {status} {made}")
    done = await until_finished(s, made["job_id"])
    return started_at(done) - t0, answered


async def main(pairs: int) -> None:
    ways = {"gpushare": via_gpushare, "jupyter-scheduler": via_jupyter_scheduler}
    started: dict[str, list[float]] = {w: [] for w in ways}
    shown: dict[str, list[float]] = {w: [] for w in ways}
    with tempfile.TemporaryDirectory() as tmp:
        async with scheduler_stack(Path(tmp)) as s:
            await via_gpushare(s)  # warm-up: the first kernel start and imports
            await via_jupyter_scheduler(s)
            for _ in range(pairs):
                order = list(ways)
                random.shuffle(order)
                for way in order:
                    running, answered = await ways[way](s)
                    started[way].append(running)
                    shown[way].append(max(running, answered))
    print(f"{pairs} pairs, profile {PROFILE['profile']}, local backend (papermill)")
    for figure, values in (("Create->started", started), ("Create->shown running", shown)):
        for way in ways:
            ms = [t * 1000 for t in values[way]]
            print(
                f"  {figure:22s} {way:18s} median {statistics.median(ms):7.1f} ms"
                f" (min {min(ms):.1f}, max {max(ms):.1f})"
            )
        ratio = statistics.median(values["jupyter-scheduler"]) / statistics.median(
            values["gpushare"]
        )
        print(
            f"  {figure:22s} ratio jupyter-scheduler / gpushare (medians): {ratio:.3f} "
            f"({(ratio - 1) * 100:+.1f} %; target <= +10 %)"
        )
        pairs_ms = zip(values["jupyter-scheduler"], values["gpushare"], strict=True)
        diffs = [(a - b) * 1000 for a, b in pairs_ms]
        print(
            f"  {figure:22s} paired difference jupyter-scheduler - gpushare: median "
            f"{statistics.median(diffs):+.1f} ms over {len(diffs)} pairs"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=10, help="paired submissions (default 10)")
    asyncio.run(main(parser.parse_args().pairs))
