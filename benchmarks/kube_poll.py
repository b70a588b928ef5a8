"""Kubernetes batch backend: API calls the broker's job loop causes, and what one poll pass costs.

    .venv/bin/python benchmarks/kube_poll.py [--jobs 200] [--seconds 10] [--loop 0.25]

``--jobs`` running attempts (admitted by the stand-in of Kueue, ``tests/kubefake.FakeKube``:
no API server can run here, so this counts calls, it does not time a real server) are polled
the way ``JobManager`` polls them: all of them every ``--loop`` seconds, for ``--seconds``.
Baseline: ``poll_min_interval_s = 0`` (every poll asks the API server) against the default
(2 s), in the same run. Prints API calls per second and the time of one pass over all jobs
(the backend's own work: building answers from the API objects). Asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from kubefake import FakeKube  # noqa: E402
from kubejobkit import run_spec  # noqa: E402

from jupyter_gpushare.backends.kube import KubeJobsBackend  # noqa: E402


def measure(jobs: int, seconds: float, loop: float, interval: float) -> tuple[float, float]:
    fake = FakeKube()
    backend = KubeJobsBackend(client=fake, poll_min_interval_s=interval)
    handles = []
    for i in range(jobs):
        handle = backend.submit(run_spec("whole", job_id=f"job-{i:06d}"))
        fake.admit(handle.ref["name"])
        handles.append(handle)
    before = sum(1 for c in fake.calls if c[0] == "get_job")
    passes = []
    end = time.monotonic() + seconds
    lists = 0
    pods, workloads = fake.list_pods, fake.list_workloads

    def counted_pods(namespace: str, selector: str) -> list[dict]:
        nonlocal lists
        lists += 1
        return pods(namespace, selector)

    def counted_workloads(namespace: str, selector: str) -> list[dict]:
        nonlocal lists
        lists += 1
        return workloads(namespace, selector)

    fake.list_pods = counted_pods  # type: ignore[method-assign]
    fake.list_workloads = counted_workloads  # type: ignore[method-assign]
    while time.monotonic() < end:
        t0 = time.perf_counter()
        for handle in handles:
            assert backend.poll(handle).alive
        passes.append(time.perf_counter() - t0)
        time.sleep(max(0.0, loop - passes[-1]))
    gets = sum(1 for c in fake.calls if c[0] == "get_job") - before
    calls = gets + lists  # a live poll that reaches the server: Job, Workloads, pods
    return calls / seconds, statistics.median(passes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--loop", type=float, default=0.25)
    args = parser.parse_args()
    base_rate, base_pass = measure(args.jobs, args.seconds, args.loop, 0.0)
    rate, one_pass = measure(args.jobs, args.seconds, args.loop,
                             KubeJobsBackend().poll_min_interval_s)
    print(f"{args.jobs} running jobs, the job loop every {args.loop:g} s, {args.seconds:g} s")
    print(f"  every poll asks the API server: {base_rate:8.0f} API calls/s, "
          f"one pass {base_pass * 1000:6.1f} ms")
    print(f"  poll_min_interval_s = 2 (default): {rate:8.0f} API calls/s, "
          f"one pass {one_pass * 1000:6.1f} ms")
    print(f"  ratio (default / baseline): calls {rate / base_rate:.3f}, "
          f"pass time {one_pass / base_pass:.3f}")


if __name__ == "__main__":
    main()
