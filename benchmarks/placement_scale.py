"""How a packing decision's cost grows with the cluster: gpushare at ``--scale K`` vs a baseline.

    .venv/bin/python benchmarks/placement_scale.py --scale 10 --traces default,gpushare80 \\
        --seeds 42,43 [--baseline REV]

A trace is a pod list of the data folder (``default``, ``gpushare80``...) or a synthetic
workload of :mod:`packing_synthetic` (``cpu-heavy``, ``multigpu-pinned``...: the default trace
rewritten with synthetic seed 7, as ``packing.py --synthetic``).

Each run is the packing benchmark's evaluation (:func:`packing_sim.simulate`, the gpushare
policy) on the Alibaba node and pod lists replicated K times (names suffixed per copy), in
a subprocess of its own. With ``--baseline REV`` the same runs are made, in the same
invocation and one after the other, with the ``jupyter_gpushare`` package of git revision
REV (a ``git archive`` copy in a temporary folder; or REV is such a folder already), so the
figures are ratios measured together on the same (shared) machine.

``--profile N``: each run is made a second time (the decisions are deterministic) with
:mod:`cProfile` on only during the decisions that were the slowest 1 % of the first, and
the ``N`` functions with the most cumulative time in them are printed, with the slow
decisions' request kinds (where the CPU of the tail goes).

Per run it prints the unallocated % at arrived 100 %, whether every decision (node and
GPUs) is the same as the baseline's, and the CPU time per decision (``time.thread_time``):
p50, p99 and the largest decision after the first hundred, *without* the garbage
collector's pauses, which are reported on their own (the longest full collection): they
grow with the number of live objects in the process (here every grant of the run), not
with the placement's work. It asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DATA = REPO.parent / "shared" / "data" / "alibaba-gpu-v2023"


def load(trace: str, scale: int) -> tuple[list, list]:
    """The node and pod lists of ``trace`` (a pod list's name or a synthetic one), K times."""
    import packing_sim as sim
    from packing_synthetic import SYNTHETIC, synthesize

    nodes = sim.load_nodes(str(DATA / "openb_node_list_gpu_node.csv"))
    name = "default" if trace in SYNTHETIC else trace
    pods = sim.load_pods(str(DATA / f"openb_pod_list_{name}.csv"))
    if trace in SYNTHETIC:
        pods = synthesize(pods, nodes, trace, SYNTHETIC_SEED)
    return sim.replicate(nodes, pods, scale)


SYNTHETIC_SEED = 7
"""The synthetic workloads' seed (``packing.py --synthetic-seed``'s default)."""


def child(root: str, trace: str, seed: int, scale: int, profile: int = 0) -> dict:
    """One run with the ``jupyter_gpushare`` found under ``root``."""
    sys.path[:0] = [str(HERE), root]
    import packing_gpushare
    import packing_sim as sim

    import jupyter_gpushare.core.placement as placement

    assert Path(placement.__file__).resolve().is_relative_to(Path(root).resolve())
    nodes, pods = load(trace, scale)
    times: list[float] = []
    gc_in: list[float] = []  # collector time inside each decision
    pauses: list[tuple[int, float]] = []
    start = [0.0]
    inside = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            start[0] = time.thread_time()
        else:
            dt = (time.thread_time() - start[0]) * 1000.0
            inside[0] += dt
            pauses.append((info["generation"], dt))

    digest = hashlib.sha1()
    inner = packing_gpushare.place

    def timed(state, request, **kw):  # type: ignore[no-untyped-def]
        inside[0] = 0.0
        t0 = time.thread_time()
        placement_ = inner(state, request, **kw)
        times.append((time.thread_time() - t0) * 1000.0)
        gc_in.append(inside[0])
        digest.update(repr(placement_).encode())
        return placement_

    packing_gpushare.place = timed
    gc.callbacks.append(on_gc)
    t0 = time.perf_counter()
    res = sim.simulate(nodes, pods, packing_gpushare.GPUSharePolicy, seed, "gpushare")
    wall = time.perf_counter() - t0
    gc.callbacks.remove(on_gc)
    alloc = res.alloc_pct
    at100 = alloc[100] if 100 in alloc else alloc[max(k for k in alloc if k <= 100)]
    work = [t - g for t, g in zip(times, gc_in, strict=True)]
    late = work[100:]
    if profile:
        slow = set(sorted(range(len(work)), key=work.__getitem__)[-max(1, len(work) // 100) :])
        packing_gpushare.place = inner
        profile_slow(nodes, pods, seed, slow, profile)
    return {
        "unalloc100": 100.0 - at100,
        "decisions": len(times),
        "digest": digest.hexdigest(),
        "p50": pct(work, 50),
        "p99": pct(work, 99),
        "max_after_100": max(late, default=0.0),
        "over_10ms_after_100": sum(1 for t in late if t > 10.0),
        "p99_with_gc": pct(times, 99),
        "max_with_gc": max(times),
        "gc_full_max": max((d for g, d in pauses if g == 2), default=0.0),
        "gc_full_count": sum(1 for g, _ in pauses if g == 2),
        "cpu_s": sum(times) / 1000.0,
        "wall_s": wall,
    }


def profile_slow(nodes: list, pods: list, seed: int, slow: set[int], top: int) -> None:
    """Run again with :mod:`cProfile` on during the decisions numbered in ``slow``; print
    (to stderr) the ``top`` functions by cumulative time and the slow requests' kinds."""
    import cProfile
    import pstats
    from collections import Counter

    import packing_gpushare
    import packing_sim as sim

    prof = cProfile.Profile()
    inner = packing_gpushare.place
    count = [0]
    kinds: Counter[str] = Counter()

    def profiled(state, request, **kw):  # type: ignore[no-untyped-def]
        k = count[0]
        count[0] += 1
        if k not in slow:
            return inner(state, request, **kw)
        ask = request.gpu
        kinds[
            "cpu-only" if ask.is_empty else (f"{ask.whole} whole" if ask.whole else "fraction")
        ] += 1
        prof.enable()
        try:
            return inner(state, request, **kw)
        finally:
            prof.disable()

    packing_gpushare.place = profiled
    sim.simulate(nodes, pods, packing_gpushare.GPUSharePolicy, seed, "gpushare")
    packing_gpushare.place = inner
    print(f"slowest {len(slow)} decisions by request: {dict(kinds)}", file=sys.stderr)
    pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(top)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100.0 * len(ordered)))] if ordered else 0.0


def spawn(root: str, trace: str, seed: int, scale: int, profile: int = 0) -> dict:
    cmd = [sys.executable, __file__, "--child", root, trace, str(seed), str(scale), str(profile)]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    if profile:
        print(f"--- profile of the slowest 1 % ({root}, {trace}, seed {seed})")
        print(done.stderr, flush=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--traces", default="default,gpushare80")
    ap.add_argument("--seeds", default="42,43")
    ap.add_argument(
        "--baseline", default="", help="git revision, or a folder with its files, to compare with"
    )
    ap.add_argument(
        "--profile", type=int, default=0, help="print the N costliest functions of the slow 1 %%"
    )
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        root, trace, seed, scale, profile = args.child
        print(json.dumps(child(root, trace, int(seed), int(scale), int(profile))))
        return 0
    seeds = [int(s) for s in args.seeds.split(",") if s]
    with tempfile.TemporaryDirectory(prefix="gpushare-scale-") as tmp:
        roots = {"now": str(REPO)}
        if args.baseline and os.path.isdir(args.baseline):
            roots = {"base": os.path.abspath(args.baseline), **roots}
        elif args.baseline:  # a plain copy of the revision's files (no worktree left behind)
            base = os.path.join(tmp, "base")
            os.mkdir(base)
            files = subprocess.run(
                ["git", "-C", str(REPO), "archive", args.baseline],
                check=True,
                capture_output=True,
            ).stdout
            subprocess.run(["tar", "-x", "-C", base], input=files, check=True)
            roots = {"base": base, **roots}
        report(args, seeds, roots)
    return 0


def report(args: argparse.Namespace, seeds: list[int], roots: dict[str, str]) -> None:
    print(f"scale {args.scale}; CPU ms per decision without GC pauses (thread_time)")
    head = (
        f"{'trace':11}{'seed':>5} {'code':5}{'unalloc@100':>12}{'p50':>8}{'p99':>8}"
        f"{'max>100':>9}{'>10ms':>6}{'p99+gc':>8}{'gc full max':>12}  same decisions"
    )
    print(head)
    for trace in args.traces.split(","):
        for seed in seeds:
            res = {
                name: spawn(root, trace, seed, args.scale, args.profile)
                for name, root in roots.items()
            }
            for name, r in res.items():
                same = (
                    ""
                    if name == "base"
                    else (
                        "yes"
                        if "base" not in res
                        else ("yes" if r["digest"] == res["base"]["digest"] else "NO")
                    )
                )
                print(
                    f"{trace:11}{seed:>5} {name:5}{r['unalloc100']:12.3f}{r['p50']:8.3f}"
                    f"{r['p99']:8.3f}{r['max_after_100']:9.2f}{r['over_10ms_after_100']:6d}"
                    f"{r['p99_with_gc']:8.3f}{r['gc_full_max']:12.1f}  {same}",
                    flush=True,
                )
            if "base" in res:
                b, n = res["base"], res["now"]
                print(
                    f"{'':17}ratio now/base: p99 {n['p99'] / b['p99']:.2f}, max after 100 "
                    f"{n['max_after_100'] / max(b['max_after_100'], 1e-9):.2f}, CPU total "
                    f"{n['cpu_s'] / b['cpu_s']:.2f}; unalloc delta "
                    f"{n['unalloc100'] - b['unalloc100']:+.3f} points",
                    flush=True,
                )


if __name__ == "__main__":
    raise SystemExit(main())
