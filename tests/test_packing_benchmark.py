"""The packing benchmark's harness on tiny hand-made traces with hand-computed answers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import packing  # noqa: E402
import packing_sim as ps  # noqa: E402
from packing_synthetic import synthesize  # noqa: E402

NODES_CSV = """sn,cpu_milli,memory_mib,gpu,model
n-a,8000,16000,2,A
n-b,4000,8000,1,B
"""

PODS_CSV = (
    (
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,"
        "qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
    )
    + """p0,1000,1000,1,500,,LS,Running,0,10,0
p1,2000,1000,1,1000,,LS,Running,0,10,0
p2,1000,1000,0,0,,LS,Running,0,10,0
p3,2000,2000,1,300,B,LS,Running,0,10,0
"""
)


def pod(name: str, num: int, milli: int, cpu: int = 1000, spec: str = "") -> ps.PodSpec:
    return ps.PodSpec(name, cpu, 1000, num, milli, spec)


@pytest.fixture()
def csvs(tmp_path: Path) -> tuple[str, str]:
    nodes = tmp_path / "nodes.csv"
    pods = tmp_path / "pods.csv"
    nodes.write_text(NODES_CSV)
    pods.write_text(PODS_CSV)
    return str(nodes), str(pods)


def test_loading(csvs: tuple[str, str]) -> None:
    nodes = ps.load_nodes(csvs[0])
    pods = ps.load_pods(csvs[1])
    assert ps.gpu_capacity_milli(nodes) == 3000
    assert [p.gpu_request for p in pods] == [500, 1000, 0, 300]
    assert pods[3].gpu_spec == "B"


def test_inflation_appends_until_the_next_pod_would_pass_130_percent() -> None:
    # capacity 3000 milli -> target 3900; two 1-GPU pods (2000) grow to 3000, then
    # 3000 + 1000 > 3900 stops the draw: three pods.
    pods = [pod("a", 1, 1000), pod("b", 1, 1000)]
    out = ps.inflate(pods, seed=42, capacity_milli=3000)
    assert len(out) == 3
    assert sorted(p.name for p in out[:2]) == ["a", "b"]


def test_inflation_checks_the_next_pods_per_gpu_milli() -> None:
    # one 2-GPU pod (2000); the check adds the next pod's per-GPU milli (1000):
    # 2000 + 1000 <= 3900 appends (total 4000), 4000 + 1000 > 3900 stops.
    out = ps.inflate([pod("a", 2, 1000)], seed=1, capacity_milli=3000)
    assert len(out) == 2


def test_inflation_removes_pods_above_the_target() -> None:
    pods = [pod(f"p{i}", 1, 1000) for i in range(5)]  # 5000 > 3900: remove down to 3000
    out = ps.inflate(pods, seed=3, capacity_milli=3000)
    assert len(out) == 3


def test_typical_shapes_cover_95_percent_and_renormalise() -> None:
    pods = [pod(f"a{i}", 1, 500) for i in range(60)]
    pods += [pod(f"b{i}", 0, 0) for i in range(38)]
    pods += [pod("c", 1, 300), pod("d", 1, 200)]
    shapes = ps.typical_shapes(pods)
    # 60 + 38 = 98 >= 95 of 100 pods: the two rare shapes are left out
    assert [s for s, _ in shapes] == [(1000, 500, 1, ""), (1000, 0, 0, "")]
    assert [round(p, 4) for _, p in shapes] == [round(60 / 98, 4), round(38 / 98, 4)]


def test_fragmentation_by_hand() -> None:
    shapes = [((1000, 500, 1, ""), 0.5), ((1000, 0, 0, ""), 0.5)]
    fm = ps.FragMeasure(shapes)
    # GPUs free [1000, 300]: the 500m shape fits; only the 300m GPU is fragmented for it;
    # the CPU-only shape makes all 1300m count: 0.5 * 300 + 0.5 * 1300 = 800
    assert fm.node("A", 8000, [1000, 300]) == pytest.approx(800.0)
    # not enough CPU for the GPU shape: everything counts for both shapes
    assert fm.node("A", 500, [1000, 300]) == pytest.approx(1300.0)
    # a GPU shape restricted to model B cannot run on an A node
    fm_b = ps.FragMeasure([((1000, 500, 1, "B"), 1.0)])
    assert fm_b.node("A", 8000, [1000]) == pytest.approx(1000.0)
    assert fm_b.node("B", 8000, [1000]) == pytest.approx(0.0)


def test_binning_rounds_to_the_nearest_integer() -> None:
    assert [ps.bin_of(x) for x in (0.0, 0.49, 0.5, 99.6, 100.4, 129.9)] == [0, 0, 1, 100, 100, 130]
    b = ps.Binner()
    b.add(99.7, 90.0)
    b.add(100.2, 92.0)
    b.add(101.0, 95.0)
    assert b.mean(0) == {100: 91.0, 101: 95.0}


def test_node_ranks_are_a_seeded_permutation() -> None:
    nodes = [ps.NodeSpec(f"n{i}", 1000, 1000, 1, "A") for i in range(6)]
    r1 = ps.node_ranks(nodes, 42)
    assert sorted(r1) == list(range(6))
    assert r1 == ps.node_ranks(nodes, 42)


@pytest.mark.parametrize("policy", ["random", "bestfit", "fgd", "gpushare"])
def test_simulate_tiny_trace(csvs: tuple[str, str], policy: str) -> None:
    nodes = ps.load_nodes(csvs[0])
    pods = ps.load_pods(csvs[1])
    r = ps.simulate(nodes, pods, packing.FACTORIES[policy], 42, policy)
    assert r.pods == len(ps.inflate(pods, 42, 3000))
    assert len(r.decision_ms) == r.pods
    assert all(0.0 <= v <= 100.0 for v in r.alloc_pct.values())
    assert all(0.0 <= v <= 100.0 for v in r.frag_ratio_pct.values())
    assert max(r.alloc_pct) <= 131


def test_fgd_prefers_the_placement_that_fragments_less() -> None:
    nodes = [ps.NodeSpec("x", 8000, 8000, 1, "A"), ps.NodeSpec("y", 8000, 8000, 1, "A")]
    cluster = ps.SimCluster(nodes)
    cluster.gpus[1][0] = 500  # y already half used
    frag = ps.FragMeasure([((1000, 500, 1, ""), 1.0)])
    fgd = ps.FGDPolicy(cluster, [0, 1], 0, frag)
    # a 500m pod on y fills it exactly (frag 0 -> 0); on x it leaves 500 (still usable)
    # both keep frag at 0, so the score ties and the lower rank (x) wins
    assert fgd.choose(pod("q", 1, 500))[0] == 0
    # a 600m pod: on x it leaves 400 (< 500: fragmented); y cannot host it
    assert fgd.choose(pod("r", 1, 600)) == (0, (0,))


def test_cli_writes_json_and_plot(csvs: tuple[str, str], tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    png = tmp_path / "out.png"
    rc = packing.main(
        [
            "--nodes", csvs[0], "--pods", csvs[1], "--seeds", "42-43",
            "--policies", "random,bestfit,fgd,gpushare", "--json", str(out), "--plot", str(png),
        ]
    )  # fmt: skip
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["tie_rule"].startswith("fixed random node order per seed")
    assert data["seeds"] == [42, 43]
    for name in ("random", "bestfit", "fgd", "gpushare"):
        pol = data["policies"][name]
        for field in (
            "unallocated_pct_at_arrived_100_mean",
            "alloc_pct_at_arrived_130_mean",
            "frag_ratio_pct_at_arrived_90_median",
            "decision_ms_p50",
            "decision_ms_p99",
        ):
            assert field in pol
        assert set(pol["per_seed"]) == {"42", "43"}
    assert png.stat().st_size > 0


def test_seeds_parse() -> None:
    assert packing.parse_seeds("42-44,50") == [42, 43, 44, 50]


@pytest.mark.parametrize("name", ["multigpu-heavy", "gpumodel-constrained", "cpu-heavy"])
def test_synthetic_transforms_are_deterministic(name: str) -> None:
    nodes = [ps.NodeSpec("n", 96000, 1 << 20, 8, "A"), ps.NodeSpec("m", 64000, 1 << 19, 2, "B")]
    pods = [pod(f"p{i}", 1, 1000) for i in range(40)] + [pod(f"c{i}", 0, 0) for i in range(5)]
    a = synthesize(pods, nodes, name, 7)
    b = synthesize(pods, nodes, name, 7)
    assert a == b
    if name == "gpumodel-constrained":
        specs = {p.gpu_spec for p in a if p.gpu_spec}
        assert specs and all(set(s.split("|")) <= {"A", "B"} for s in specs)
