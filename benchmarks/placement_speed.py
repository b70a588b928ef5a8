"""Micro-benchmark: time of one ``place()`` decision on the Alibaba cluster (1,213 nodes).

Streams (each fills the cluster from empty with pods drawn from the trace, then keeps it
full with churn: release a random grant, place the next pod):

* ``whole``     exclusive pool, whole-GPU requests (the trace's GPU pods as 1/2/4/8 GPUs);
* ``fraction``  shared pool, the trace's fractional pods;
* ``mixed``     shared pool, the trace as it comes (whole, fraction, CPU-only pods), plus
                one in ten fractions with explicit memory (the best-fit path);
* ``cpu-heavy`` shared pool, the synthetic cpu-heavy trace.

Usage: ``python benchmarks/placement_speed.py [--decisions N] [--streams whole,mixed]
[--scale K]``. ``--scale K`` replicates the node and pod lists K times (names suffixed per
copy). Prints p50/p99/max decision time in ms of CPU time (``time.thread_time``, so other
processes on a shared machine do not inflate it) per stream, for the decisions while the
cluster fills and, separately, for those right after a release (the placement index first
syncs the released grant's node).
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for p in (HERE, REPO):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import packing_sim as sim  # noqa: E402
from packing_gpushare import GPU_MEMORY_MIB, POOL, request_for  # noqa: E402
from packing_synthetic import synthesize  # noqa: E402

from jupyter_gpushare.core.model import (  # noqa: E402
    GPU,
    GPUAsk,
    Grant,
    Node,
    Policy,
    Pool,
    PriorityClass,
    Request,
    SharingMode,
    Team,
)
from jupyter_gpushare.core.placement import place  # noqa: E402
from jupyter_gpushare.core.state import ClusterState  # noqa: E402

DATA = REPO.parent / "shared" / "data" / "alibaba-gpu-v2023"
NODES = DATA / "openb_node_list_gpu_node.csv"
PODS = DATA / "openb_pod_list_default.csv"


def build(specs: list[sim.NodeSpec], mode: SharingMode, seed: int) -> ClusterState:
    order = list(range(len(specs)))
    random.Random(seed).shuffle(order)
    nodes = []
    for i in order:
        s = specs[i]
        gpus = tuple(
            GPU(f"{s.name}/gpu{k}", s.model, GPU_MEMORY_MIB, index=k) for k in range(s.gpus)
        )
        nodes.append(Node(s.name, POOL, gpus, s.cpu_milli, s.memory_mib))
    policy = Policy(
        nodes=tuple(nodes),
        pools=(Pool(POOL, mode, memory_headroom=0.0),),
        priority_classes=(PriorityClass("bench", 1, False),),
        teams=(Team("bench", ("bench",)),),
    )
    return ClusterState(policy)


def requests(stream: str, pods: list[sim.PodSpec], rng: random.Random) -> list[Request]:
    out = []
    for pod in pods:
        if stream == "whole":
            if pod.num_gpu == 0:
                continue
            r = request_for(pod)
            n = pod.num_gpu if pod.gpu_milli >= 1000 else 1
            out.append(Request(r.id, "bench", "bench", POOL, GPUAsk(whole=n), "bench",
                               cpu_milli=r.cpu_milli, memory_mib=r.memory_mib,
                               gpu_models=r.gpu_models))  # fmt: skip
        elif stream == "fraction":
            if pod.num_gpu == 1 and 0 < pod.gpu_milli < 1000:
                out.append(request_for(pod))
        else:
            r = request_for(pod)
            if stream == "mixed" and r.gpu.is_fraction and rng.random() < 0.1:
                ask = GPUAsk(fraction_milli=r.gpu.fraction_milli,
                             memory_mib=GPU_MEMORY_MIB * r.gpu.fraction_milli // 1000)  # fmt: skip
                r = Request(r.id, "bench", "bench", POOL, ask, "bench", cpu_milli=r.cpu_milli,
                            memory_mib=r.memory_mib, gpu_models=r.gpu_models)  # fmt: skip
            out.append(r)
    return out


def run(stream: str, specs: list[sim.NodeSpec], pods: list[sim.PodSpec], decisions: int,
        seed: int) -> tuple[list[float], list[float], int, int]:  # fmt: skip
    rng = random.Random(seed)
    mode = SharingMode.EXCLUSIVE if stream == "whole" else SharingMode.SHARED
    state = build(specs, mode, seed)
    reqs = requests(stream, pods, rng)
    times: list[float] = []
    churn: list[float] = []  # decisions right after a release (the index syncs it first)
    granted = failed = 0
    live: list[str] = []
    gc.disable()
    try:
        for n in range(decisions):
            base = reqs[rng.randrange(len(reqs))]
            # cluster full (the last few requests failed): churn, one release per decision
            released = failed > 20 and bool(live)
            if released:
                j = rng.randrange(len(live))
                live[j], live[-1] = live[-1], live[j]
                state.release(live.pop())
            t0 = time.thread_time()
            placement = place(state, base)
            (churn if released else times).append((time.thread_time() - t0) * 1000.0)
            if placement is None:
                failed += 1
                continue
            granted += 1
            failed = 0 if failed <= 20 else failed
            gid = f"g{n}"
            state.apply(Grant(gid, base, placement, base.gpu.units_milli, False, 1, False, 0.0))
            live.append(gid)
    finally:
        gc.enable()
    return times, churn, granted, decisions - granted


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decisions", type=int, default=20000)
    ap.add_argument("--streams", default="whole,fraction,mixed,cpu-heavy")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--scale", type=int, default=1, help="replicate nodes and pods K times")
    args = ap.parse_args(argv)
    specs, pods = sim.replicate(sim.load_nodes(str(NODES)), sim.load_pods(str(PODS)), args.scale)
    print(f"{len(specs)} nodes, {sum(s.gpus for s in specs)} GPUs; {args.decisions} decisions")
    for stream in args.streams.split(","):
        src = pods
        if stream == "cpu-heavy":
            src = synthesize(pods, specs, "cpu-heavy", args.seed)
        times, churn, ok, no = run(stream, specs, src, args.decisions, args.seed)
        line = (f"{stream:10s} filling: {len(times)} decisions, p50 {pct(times, 0.5):.3f} ms  "
                f"p99 {pct(times, 0.99):.3f} ms  max {max(times):.3f} ms  "
                f"max after 100 {max(times[100:], default=0.0):.3f} ms")  # fmt: skip
        if churn:
            line += (f" | full, one release before each: {len(churn)} decisions, p50 "
                     f"{pct(churn, 0.5):.3f} ms  p99 {pct(churn, 0.99):.3f} ms")  # fmt: skip
        print(f"{line} | granted {ok} refused {no}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
