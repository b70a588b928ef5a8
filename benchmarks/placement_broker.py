"""Admission decisions in the broker's own regime: a trace's pods through ``Broker.submit``.

    .venv/bin/python benchmarks/placement_broker.py --traces default,cpu-heavy --seeds 42 \\
        [--scale 1] [--pace 0.1]

``placement_scale.py`` times ``place()`` in a harness process, where the garbage collector
runs on CPython's own schedule over every grant of the run (issue 29: single decisions of
19-111 ms there were full collections begun inside ``place()``). Here the pods go through
the broker's service instead, in a process of their own per run:

* ``Broker`` on SQLite in a temporary folder, writes as the broker makes them inline, with a
  policy of one shared pool of the trace's nodes (in the seed's node order, as
  ``packing.py``) and one team that may borrow all of it (so no preemption is planned);
* the broker's collector regime (``BrokerApp.gc_freeze`` and ``gc_pace_interval_s``):
  ``load_frozen`` around the start, then ``CollectorPacer.step`` every ``--pace`` seconds
  between two requests, as the event loop runs it between two callbacks;
* each pod of the inflated trace (``packing_sim.inflate``, the same pods and order as
  ``packing.py``) submitted in order until the pods that arrived ask for 100 % of the GPUs;
* each decision's CPU time is the broker's own figure, what its observer's ``decision`` hook
  gets (``gpushare_decision_cpu_seconds``): the core's decision, placement included, in the
  thread's CPU time, a collection begun inside included.

* in the third arm, the refusal tables made ahead (``BrokerApp.why_warm_interval_s`` and
  ``why_warm_nodes``, ``broker/ops/whywarm.py``): ``placement_why.warm`` every ``--warm``
  seconds between two requests (ten times that after a step with nothing to do), at most
  ``--warm-nodes`` nodes read per step; and in the same steps each pool's next placement
  target made ahead (``BrokerApp.why_warm_positions``, ``core/packnext.py``):
  ``placement.make_ahead``, at most ``--ahead`` node positions read per step, and with what
  is left the short lists in use kept up (``ShortLists.freshen``, ``core/packshort.py``).

The baseline arms, in the same invocation right before, are the same run with CPython's own
collector schedule and nothing frozen (``--pace 0``, as a harness), and the broker's
collector regime without the tables made ahead (``--warm 0``, the broker before them). Per
run it prints the decisions, p50 / p99 / the largest after the first 100 and how many of
those were over 10 ms, the collections begun inside a decision (and the longest), the
pacer's steps and its longest step (the pacer runs between requests, not inside one), and
the warm steps that read something, the longest and their CPU in all. It asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def run(
    trace: str,
    seed: int,
    scale: int,
    pace: float,
    warm: float = 0.0,
    warm_nodes: int = 250,
    ahead: int = 0,
) -> dict[str, Any]:
    """One run in this process (a fresh one: see ``main``)."""
    sys.path[:0] = [str(HERE)]
    import packing_gpushare as pg
    import packing_sim as sim
    from placement_scale import load

    from jupyter_gpushare.broker.ops.gcpace import CollectorPacer, load_frozen
    from jupyter_gpushare.broker.service.broker import Broker
    from jupyter_gpushare.broker.service.effects import NoObserver
    from jupyter_gpushare.broker.store.db import make_engine
    from jupyter_gpushare.core.model import Kind, PoolQuota, Team
    from jupyter_gpushare.core.placement import make_ahead
    from jupyter_gpushare.core.placement_why import warm as warm_step

    nodes, trace_pods = load(trace, scale)
    capacity = sim.gpu_capacity_milli(nodes)
    pods = sim.inflate(trace_pods, seed, capacity)
    ranks = sim.node_ranks(nodes, seed)
    order = sorted(range(len(ranks)), key=ranks.__getitem__)
    base = pg.build_state(sim.SimCluster(list(nodes)), order).policy
    quota = PoolQuota(guaranteed_milli=0, borrow_limit_milli=capacity)
    policy = dataclasses.replace(
        base, teams=(Team("bench", ("bench",), quotas=((pg.POOL, quota),)),), _index={}
    )

    times: list[float] = []
    inside: list[tuple[int, float]] = []  # collections begun inside a decision: (gen, ms)
    deciding = [False]
    began = [0.0, 0]

    outcomes: list[str] = []

    class Timed(NoObserver):
        def decision(self, pool: str, cpu_s: float) -> None:
            times.append(cpu_s * 1000.0)

        def admission(self, pool: str, outcome: str, code: str) -> None:
            outcomes.append(outcome)

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            began[0], began[1] = time.thread_time(), int(deciding[0])
        elif began[1]:
            inside.append((info["generation"], (time.thread_time() - began[0]) * 1000.0))

    from jupyter_gpushare.broker.service import lifecycle

    real = lifecycle.decide

    def flagged(*args: Any, **kwargs: Any) -> Any:
        deciding[0] = True
        try:
            return real(*args, **kwargs)
        finally:
            deciding[0] = False

    lifecycle.decide = flagged  # type: ignore[assignment] - only to tell a collection's place
    with tempfile.TemporaryDirectory() as tmp:
        engine = make_engine(f"sqlite:///{tmp}/bench.sqlite")
        broker = Broker(policy, engine, observer=Timed())
        if pace > 0:
            load_frozen(broker.load)
        else:
            broker.load()
        pacer = CollectorPacer(pace)
        gc.callbacks.append(on_gc)
        arrived = granted = 0
        next_step = time.monotonic() + pace
        next_warm = time.monotonic() + warm
        warm_steps, warm_cpu, warm_longest, warm_read = 0, 0.0, 0.0, 0
        t0, c0 = time.perf_counter(), time.process_time()
        for i, pod in enumerate(pods):
            if arrived >= capacity:
                break
            arrived += pod.gpu_request
            req = dataclasses.replace(
                pg.request_for(pod), id=f"r{i}", user=f"u{i}", holder=f"h{i}",
                kind=Kind.INTERACTIVE, created_at=time.time(),
            )
            granted += broker.submit(req)["status"] == "granted"
            if pace > 0 and time.monotonic() >= next_step:
                pacer.step()
                next_step = time.monotonic() + pace
            if warm > 0 and time.monotonic() >= next_warm:  # as broker/ops/whywarm.py
                w0 = time.thread_time()
                read = warm_step(broker.state, warm_nodes)
                if ahead:
                    read += make_ahead(broker.state, ahead)
                took = time.thread_time() - w0
                if read:
                    warm_steps, warm_read = warm_steps + 1, warm_read + read
                    warm_cpu, warm_longest = warm_cpu + took, max(warm_longest, took)
                next_warm = time.monotonic() + (warm if read else warm * 10)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        gc.callbacks.remove(on_gc)
        broker.close()
        engine.dispose()
    late = times[100:]
    ranked = sorted(times)
    placed = sorted(t for t, o in zip(times, outcomes, strict=True) if o == "granted")
    unplaced = sorted(t for t, o in zip(times, outcomes, strict=True) if o != "granted")
    return {
        "decisions": len(times),
        "granted": granted,
        "p50": ranked[len(ranked) // 2],
        "p99": ranked[min(len(ranked) - 1, int(len(ranked) * 0.99))],
        "p99_granted": placed[min(len(placed) - 1, int(len(placed) * 0.99))] if placed else 0.0,
        "p99_not_granted": (
            unplaced[min(len(unplaced) - 1, int(len(unplaced) * 0.99))] if unplaced else 0.0
        ),
        "max_after_100": max(late, default=0.0),
        "over_10ms_after_100": sum(1 for t in late if t > 10.0),
        "gc_inside": len(inside),
        "gc_inside_full": sum(1 for g, _ in inside if g == 2),
        "gc_inside_max_ms": max((d for _, d in inside), default=0.0),
        "pacer_steps": pacer.steps,
        "pacer_longest_ms": pacer.longest_s * 1000.0,
        "warm_steps": warm_steps,
        "warm_nodes_read": warm_read,
        "warm_cpu_s": warm_cpu,
        "warm_longest_ms": warm_longest * 1000.0,
        "wall_s": wall,
        "cpu_s": cpu,
        "decision_cpu_s": sum(times) / 1000.0,
    }


def spawn(
    trace: str, seed: int, scale: int, pace: float, warm: float, warm_nodes: int, ahead: int
) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", trace, str(seed), str(scale), str(pace),
         str(warm), str(warm_nodes), str(ahead)],
        check=True, capture_output=True, text=True, cwd=REPO,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", default="default,cpu-heavy")
    ap.add_argument("--seeds", default="42")
    ap.add_argument("--scale", type=int, default=1)
    ap.add_argument("--pace", type=float, default=0.1, help="the pacer's interval (s)")
    ap.add_argument(
        "--warm", type=float, default=0.005,
        help="the refusal tables' warmer interval (s) in the third arm (BrokerApp."
        "why_warm_interval_s); 0: two arms only",
    )
    ap.add_argument(
        "--warm-nodes", type=int, default=250, help="nodes read per warm step (why_warm_nodes)"
    )
    ap.add_argument(
        "--ahead", type=int, default=4000,
        help="node positions read per warm step into the next targets' lists "
        "and rows into the short lists kept up (why_warm_positions; core/packnext.py, "
        "ShortLists.freshen); 0: a new target is taken at once, no list kept up",
    )
    ap.add_argument("--child", nargs=7, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        trace, seed, scale, pace, warm, warm_nodes, ahead = args.child
        print(json.dumps(run(
            trace, int(seed), int(scale), float(pace), float(warm), int(warm_nodes), int(ahead)
        )))
        return 0
    head = (
        f"{'trace':<18}{'seed':>5} {'regime':<16}{'decisions':>10}{'p50 ms':>8}{'p99 ms':>8}"
        f"{'max>100':>9}{'>10ms':>7}{'gc in':>7}{'full':>6}{'gc max':>8}{'steps':>7}"
        f"{'step max':>9}{'cpu s':>7}{'warm':>7}{'warm max':>9}{'warm s':>7}"
    )
    print(f"scale {args.scale}, pacer every {args.pace} s; CPU ms per decision (thread time)")
    print(head)
    for trace in args.traces.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            arms = [("CPython's own", 0.0, 0.0), ("the broker's", args.pace, 0.0)]
            if args.warm > 0:
                arms.append(("broker's + warm", args.pace, args.warm))
            for label, pace, warm in arms:
                r = spawn(trace, seed, args.scale, pace, warm, args.warm_nodes, args.ahead)
                print(
                    f"{trace:<18}{seed:>5} {label:<16}{r['decisions']:>10,}{r['p50']:>8.3f}"
                    f"{r['p99']:>8.3f}{r['max_after_100']:>9.2f}{r['over_10ms_after_100']:>7}"
                    f"{r['gc_inside']:>7}{r['gc_inside_full']:>6}{r['gc_inside_max_ms']:>8.1f}"
                    f"{r['pacer_steps']:>7}{r['pacer_longest_ms']:>9.1f}{r['cpu_s']:>7.1f}"
                    f"{r['warm_steps']:>7}{r['warm_longest_ms']:>9.1f}{r['warm_cpu_s']:>7.1f}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
