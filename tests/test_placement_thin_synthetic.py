"""The synthetic workloads of issue 29 (``benchmarks/packing_synthetic.py``) are what they say."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from packing_sim import NodeSpec, PodSpec  # noqa: E402
from packing_synthetic import synthesize  # noqa: E402

NODES = (
    [NodeSpec(f"g{i}", 96000, 262144, 8, "G2") for i in range(60)]  # 480 GPUs
    + [NodeSpec(f"t{i}", 64000, 262144, 2, "T4") for i in range(40)]  # 80
    + [NodeSpec(f"v{i}", 64000, 262144, 4, "V100") for i in range(5)]  # 20: rare
    + [NodeSpec(f"a{i}", 128000, 262144, 1, "A10") for i in range(4)]  # 4: rare
)
PODS = [PodSpec(f"w{i}", 4000, 8192, 1, 1000, "") for i in range(4000)] + [
    PodSpec(f"f{i}", 2000, 4096, 1, 500, "") for i in range(4000)
]


def test_multigpu_heavier_turns_70_percent_of_one_gpu_pods_into_several() -> None:
    out = synthesize(PODS, NODES, "multigpu-heavier", 7)
    whole = [p for p in out if p.name.startswith("w")]
    counts = Counter(p.num_gpu for p in whole)
    assert set(counts) == {1, 2, 4, 8}
    assert 0.65 < 1 - counts[1] / len(whole) < 0.75
    assert all(p.cpu_milli == 4000 * p.num_gpu for p in whole)  # (under the largest node)
    assert all(p.num_gpu == 1 for p in out if p.name.startswith("f"))  # fractions untouched


def test_rare_model_pinned_asks_the_rare_models_for_about_what_they_hold() -> None:
    out = synthesize(PODS, NODES, "rare-model-pinned", 7)
    pinned = [p for p in out if p.gpu_spec]
    assert {p.gpu_spec for p in pinned} <= {"V100", "A10"}  # fewer GPUs than the median model
    share = 24 / 584  # the rare models' GPUs of all
    assert len(pinned) / len(out) == pytest.approx(share, rel=0.25)
    by_model = Counter(p.gpu_spec for p in pinned)
    assert by_model["V100"] > 3 * by_model["A10"]  # drawn in proportion to their GPUs (20 : 4)


def test_multigpu_pinned_is_both_and_every_transform_is_the_seeds() -> None:
    out = synthesize(PODS, NODES, "multigpu-pinned", 7)
    assert any(p.num_gpu > 1 for p in out)
    pinned = [p for p in out if p.gpu_spec]
    assert 0.15 < len(pinned) / len(out) < 0.25
    assert out == synthesize(PODS, NODES, "multigpu-pinned", 7)
    assert out != synthesize(PODS, NODES, "multigpu-pinned", 8)
