"""``jupyter-gpushare export ytsaurus``: the teams' whole-GPU quotas as YTsaurus pools.

Pure tests (no YTsaurus cluster can run here, so the commands are not fed to one): the
``yt`` commands are parsed back (shell words, then YSON with ``ytsaurus-client``'s own
parser) and every figure is compared with one computed here from the policy's fields.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
import yt.yson

from jupyter_gpushare import cli
from jupyter_gpushare.core.model import UNIT, Policy, SharingMode
from jupyter_gpushare.export.ytsaurus import export_ytsaurus, render
from jupyter_gpushare.policy import parse_policy

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "hub_config" / "gpushare.yaml"
POLICIES = [EXAMPLE, ROOT / "tests" / "data" / "jobs_policy.yaml",
            ROOT / "tests" / "data" / "lab_policy.yaml"]


def load(path: Path) -> Policy:
    return parse_policy(path.read_text(), str(path))


def parsed(text: str) -> dict[str, dict[str, Any]]:
    """pool path -> {"create": attributes, attribute: value} from the script."""
    out: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        if not line.startswith("yt "):
            continue
        words = shlex.split(line)
        if words[1] == "create":
            assert words[2] == "scheduler_pool" and "--ignore-existing" in words
            attrs = yt.yson.loads(words[-1].encode())
            parts = [attrs.get("parent_name"), attrs["name"]]
            path = f"//sys/pool_trees/{attrs['pool_tree']}/" + "/".join(p for p in parts if p)
            out.setdefault(path, {})["create"] = attrs
        else:
            assert words[1] == "set"
            path, attr = words[2].split("/@")
            assert path in out, f"{path} set before it is created"
            out[path][attr] = yt.yson.loads(words[3].encode())
    return out


@pytest.mark.parametrize("path", POLICIES, ids=lambda p: p.name)
def test_every_team_pool_carries_its_guarantee_and_borrow_limit_in_gpus(path: Path) -> None:
    policy = load(path)
    exclusive = {p.name for p in policy.pools if p.mode is SharingMode.EXCLUSIVE}
    capacity = sum(1 for n in policy.nodes if n.pool in exclusive for g in n.gpus)
    pools = parsed(render(policy, export_ytsaurus(policy), "gpu_h200"))
    parent = pools.pop("//sys/pool_trees/gpu_h200/gpushare")
    assert parent["strong_guarantee_resources"] == {"gpu": capacity}
    assert parent["resource_limits"] == {"gpu": capacity}
    expected = {}
    for team in policy.teams:
        g = sum(q.guaranteed_milli for n, q in team.quotas if n in exclusive)
        b = sum(q.borrow_limit_milli for n, q in team.quotas if n in exclusive)
        if g or b:
            expected[f"//sys/pool_trees/gpu_h200/gpushare/{team.name}"] = (
                g // UNIT, max(g // UNIT, min(capacity, (g + b) // UNIT)))
    assert {p: (v["strong_guarantee_resources"]["gpu"], v["resource_limits"]["gpu"])
            for p, v in pools.items()} == expected
    assert sum(g for g, _ in expected.values()) <= capacity


def test_the_example_policys_figures() -> None:
    pools = {p.team or p.name: p for p in export_ytsaurus(load(EXAMPLE))}
    assert (pools["gpushare"].guarantee_gpu, pools["gpushare"].limit_gpu) == (8, 8)
    assert (pools["vision"].guarantee_gpu, pools["vision"].limit_gpu) == (4, 6)


def test_team_pools_can_be_renamed_and_the_backend_settings_match() -> None:
    policy = load(EXAMPLE)
    text = render(policy, export_ytsaurus(policy, team_pools={"vision": "cv-gpu"},
                                          parent="ml"), "gpu")
    assert "//sys/pool_trees/gpu/ml/cv-gpu" in parsed(text)
    assert "c.YTsaurusBackend.pools = {'vision': 'cv-gpu'" in text
    assert "c.YTsaurusBackend.pool_trees = ['gpu']" in text
    assert "team vision pool train: 2000 GPU-hours a month" in text  # named, not exported
    assert "pool interactive" not in text  # a pool YTsaurus does not get


def test_a_shared_pool_cannot_be_exported() -> None:
    with pytest.raises(ValueError, match="whole GPUs only"):
        export_ytsaurus(load(EXAMPLE), pools=["interactive"])
    with pytest.raises(ValueError, match="no pool"):
        export_ytsaurus(load(EXAMPLE), pools=["nope"])


def test_a_fractional_guarantee_is_rounded_down_and_said() -> None:
    policy = load(ROOT / "tests" / "data" / "jobs_policy.yaml")
    text = render(policy, export_ytsaurus(policy), "gpu")
    assert "rounded down" not in text  # whole guarantees here
    edited = (ROOT / "tests" / "data" / "jobs_policy.yaml").read_text().replace(
        "train: {guaranteed: 1, borrow_limit: 1}", "train: {guaranteed: 3/2, borrow_limit: 1/2}", 1)
    policy = parse_policy(edited, "edited.yaml")
    vision = next(p for p in export_ytsaurus(policy) if p.team == "vision")
    assert (vision.guarantee_gpu, vision.limit_gpu) == (1, 2)
    assert "rounded down to 1" in vision.note


def test_a_borrow_limit_beyond_the_pools_gpus_is_capped_at_them() -> None:
    edited = (ROOT / "tests" / "data" / "jobs_policy.yaml").read_text().replace(
        "train: {guaranteed: 1, borrow_limit: 1}", "train: {guaranteed: 1, borrow_limit: 5}", 1)
    vision = next(p for p in export_ytsaurus(parse_policy(edited, "e.yaml")) if p.team == "vision")
    assert (vision.guarantee_gpu, vision.limit_gpu) == (1, 2)  # the train pool has 2 GPUs


def test_the_command_writes_the_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "pools.sh"
    assert cli.main(["export", "ytsaurus", str(EXAMPLE), "--pool-tree", "gpu_h200",
                     "--team-pool", "nlp=text", "-o", str(out)]) == 0
    assert "//sys/pool_trees/gpu_h200/gpushare/text" in parsed(out.read_text())
    with pytest.raises(SystemExit, match="whole GPUs only"):
        cli.main(["export", "ytsaurus", str(EXAMPLE), "--pool", "debug"])
