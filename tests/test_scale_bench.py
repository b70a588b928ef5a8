"""``--scale K`` of the packing benchmarks: the node and pod lists K times over."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import packing  # noqa: E402
import packing_sim as ps  # noqa: E402

NODES = [ps.NodeSpec("n-a", 8000, 16000, 2, "A"), ps.NodeSpec("n-b", 4000, 8000, 1, "B")]
PODS = [ps.PodSpec("p0", 1000, 1000, 1, 500, ""), ps.PodSpec("p1", 2000, 1000, 1, 1000, "B")]


def test_replicate_copies_every_node_and_pod_with_a_suffix_per_copy() -> None:
    nodes, pods = ps.replicate(NODES, PODS, 3)
    assert [n.name for n in nodes] == ["n-a#0", "n-b#0", "n-a#1", "n-b#1", "n-a#2", "n-b#2"]
    assert [p.name for p in pods] == ["p0#0", "p1#0", "p0#1", "p1#1", "p0#2", "p1#2"]
    # everything but the name is the original's
    assert [(n.cpu_milli, n.gpus, n.model) for n in nodes[2:4]] == [(8000, 2, "A"), (4000, 1, "B")]
    assert pods[3].gpu_spec == "B" and pods[3].gpu_milli == 1000
    assert ps.gpu_capacity_milli(nodes) == 3 * ps.gpu_capacity_milli(NODES)


def test_scale_one_leaves_the_lists_alone() -> None:
    nodes, pods = ps.replicate(NODES, PODS, 1)
    assert nodes == NODES and pods == PODS


def test_cli_scale_runs_the_bigger_cluster(tmp_path: Path) -> None:
    nodes_csv = tmp_path / "nodes.csv"
    pods_csv = tmp_path / "pods.csv"
    nodes_csv.write_text("sn,cpu_milli,memory_mib,gpu,model\nn-a,8000,16000,2,A\n")
    pods_csv.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np0,1000,1000,1,500,\n"
        "p1,1000,1000,1,250,\n"
    )
    out = tmp_path / "out.json"
    args = ["--nodes", str(nodes_csv), "--pods", str(pods_csv), "--seeds", "42"]
    assert packing.main([*args, "--policies", "gpushare", "--json", str(out), "--scale", "4"]) == 0
    data = json.loads(out.read_text())
    assert data["scale"] == 4
    # 4 nodes of 2 GPUs: inflated to 130 % of 8000 milli, about 10400 milli of pods
    pods = data["policies"]["gpushare"]["per_seed"]["42"]["pods"]
    one = ps.inflate(ps.load_pods(str(pods_csv)), 42, 2000)
    assert pods > 3 * len(one)
    assert "decision_ms_max_after_100" in data["policies"]["gpushare"]
