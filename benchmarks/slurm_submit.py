"""Submitting a batch job on Slurm, through the broker, against the local backend in the same run.

    .venv/bin/python benchmarks/slurm_submit.py [--jobs 15]

Starts the test Slurm cluster (``tests/slurmcluster.py``: slurmctld and five slurmd in their
own network namespaces) and, one after the other, two in-process brokers with the same
policy (``tests/data/slurm_jobs_policy.yaml``): one with the local backend (the baseline),
one with ``SlurmBackend``. Each submits ``--jobs`` small notebooks one at a time through
``POST /jobs`` (each waits for the previous to end, so every job finds its GPU free) and
times, from the call:

* **queued**: the backend holds the job (the broker's state ``running``: for Slurm, ``sbatch``
  returned and the Slurm job exists, pending or running; for local, the process started);
* **running**: the runner is executing on the node (its first log line is written).

Prints median and p90 of each, and the Slurm/local ratios. Target (issue 11): Slurm
submit-to-queued/running median under 1 s. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import jobnotebooks as nbs  # noqa: E402
from brokerkit import call, start_broker, static_tokens  # noqa: E402
from slurmcluster import SlurmCluster, have_slurm  # noqa: E402
from traitlets.config import Config  # noqa: E402

from jupyter_gpushare.backends.local import LocalBackend  # noqa: E402
from jupyter_gpushare.backends.slurm import SlurmBackend  # noqa: E402
from jupyter_gpushare.policy import load_policy  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
POLICY = ROOT / "tests" / "data" / "slurm_jobs_policy.yaml"
NODES = ["sl-t-0", "sl-x-0", "sl-x-1", "sl-s-0", "sl-w-0"]


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]


async def run_jobs(backend: type, cluster: SlurmCluster, jobs: int, tmp: Path
                   ) -> dict[str, list[float]]:
    config = Config()
    config.JobManager.backend_class = backend
    config.JobManager.jobs_dir = str(tmp / f"jobs-{backend.__name__}")
    config.JobManager.user_root_template = str(tmp / "home" / "{username}")
    config.SlurmBackend.slurm_conf = cluster.conf_path
    (tmp / "home" / "alice").mkdir(parents=True, exist_ok=True)
    app = await start_broker(load_policy(str(POLICY)),
                             f"sqlite:///{tmp}/{backend.__name__}.sqlite",
                             static_tokens({"alice": ["vision"]}), config=config)
    out: dict[str, list[float]] = {"queued": [], "running": []}
    try:
        for _ in range(jobs):
            t0 = time.perf_counter()
            status, job = await call(app, "POST", "/jobs", "tok-alice", {
                "notebook": nbs.simple(), "profile": "job-1gpu", "max_runtime": 300})
            assert status == 201, job
            queued = running = None
            deadline = time.monotonic() + 120
            while running is None or queued is None:
                live = app.jobs.store.live.get(job["id"])
                now = time.perf_counter()
                if queued is None and (live is None or live.state.value != "queued"
                                       and live.state.value != "admitted"):
                    queued = now - t0
                data, _ = app.jobs.backend.read_log(job["id"])
                if running is None and b"--- gpushare job" in data:
                    running = now - t0
                assert time.monotonic() < deadline, (job, data)
                await asyncio.sleep(0.01)
            out["queued"].append(queued)
            out["running"].append(running)
            while job["id"] in app.jobs.store.live:  # the GPU is free for the next one
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            _, done = await call(app, "GET", f"/jobs/{job['id']}", "tok-alice")
            assert done["state"] == "succeeded", done
    finally:
        await app.stop_async()
    return out


def line(name: str, values: list[float]) -> str:
    return (f"  {name:<24} median {1000 * statistics.median(values):7.0f} ms   "
            f"p90 {1000 * p90(values):7.0f} ms   (n={len(values)})")


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="slurm-bench-") as tmp, SlurmCluster(
        nodes=NODES, gpus_per_node=2, shards_per_gpu=4
    ) as cluster:
        print(f"Slurm cluster: {len(NODES)} slurmd + slurmctld in network namespaces "
              f"({cluster.subnet}); {args.jobs} jobs per backend, one at a time")
        local = await run_jobs(LocalBackend, cluster, args.jobs, Path(tmp))
        slurm = await run_jobs(SlurmBackend, cluster, args.jobs, Path(tmp))
    print("local backend (baseline):")
    print(line("call -> queued", local["queued"]))
    print(line("call -> running", local["running"]))
    print("Slurm backend:")
    print(line("call -> queued (sbatch)", slurm["queued"]))
    print(line("call -> running", slurm["running"]))
    for key in ("queued", "running"):
        ratio = statistics.median(slurm[key]) / statistics.median(local[key])
        print(f"  ratio Slurm/local, {key:<8} median {ratio:5.2f} x")
    ok = statistics.median(slurm["running"]) < 1.0
    print(f"target: Slurm call -> queued/running median < 1 s: queued "
          f"{statistics.median(slurm['queued']):.2f} s, running "
          f"{statistics.median(slurm['running']):.2f} s ({'met' if ok else 'NOT met'} for running)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=15)
    args = parser.parse_args()
    if not have_slurm():
        sys.exit("slurmctld is not on PATH (apt-get install slurm-wlm munge)")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
