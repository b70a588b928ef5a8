"""The policy file loader: units, the example file, and every class of error with its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from jupyter_gpushare.core.model import GPU, GPUAsk, Node, SharingMode
from jupyter_gpushare.policy import (
    DiscoverySpec,
    PolicyError,
    PolicyIssue,
    check_policy,
    load_policy,
    parse_policy,
    simulated_nodes,
    summarize,
)
from jupyter_gpushare.policy_units import (
    UnitError,
    parse_cpu_milli,
    parse_duration_s,
    parse_fraction_milli,
    parse_memory_mib,
    parse_units_milli,
)

EXAMPLE = Path(__file__).resolve().parent.parent / "hub_config" / "gpushare.yaml"

# line numbers matter: tests below edit this text and assert on lines
BASE = """\
inventory:
  source: static
  nodes:
    - name: n1
      pool: train
      cpu: 32
      memory: 256GiB
      gpus:
        - {model: A100, memory: 80GiB, count: 4}
    - name: n2
      pool: shared
      cpu: 32
      memory: 256GiB
      gpus:
        - {model: A100, memory: 40GiB, count: 2}
pools:
  train: {mode: exclusive}
  shared: {mode: shared, memory_headroom: 20%}
priority_classes:
  interactive: {value: 500}
  research: {value: 100, preemptible: true, checkpoint_required_after: 2h}
teams:
  vision:
    quotas:
      train: {guaranteed: 2, borrow_limit: 1}
      shared: {guaranteed: 1}
profiles:
  - slug: t1
    pool: train
    gpu: {count: 1}
  - slug: s1
    pool: shared
    gpu: {fraction: 1/4}
"""


NVML = "inventory:\n  source: nvml\n  discovery: {pool: shared}\n"


def issues(text: str, severity: str = "error") -> list[PolicyIssue]:
    return [i for i in check_policy(text, "p.yaml").issues if i.severity == severity]


def edit(old: str, new: str, text: str = BASE) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def only(found: list[PolicyIssue], path: str) -> PolicyIssue:
    matching = [i for i in found if i.path == path]
    assert matching, f"no issue at {path}: {[str(i) for i in found]}"
    return matching[0]


# ------------------------------------------------------------------------ units


@pytest.mark.parametrize(("raw", "mib"), [
    (512, 512), ("512Mi", 512), ("81920MiB", 81920), ("80GiB", 81920), ("1.5Gi", 1536),
    ("2TiB", 2 * 1024 * 1024), ("1G", 954), ("141 GiB", 141 * 1024),
])
def test_memory_units(raw: object, mib: int) -> None:
    assert parse_memory_mib(raw) == mib


@pytest.mark.parametrize(("raw", "milli"), [(4, 4000), (0.5, 500), ("500m", 500), ("2.5", 2500)])
def test_cpu_units(raw: object, milli: int) -> None:
    assert parse_cpu_milli(raw) == milli


@pytest.mark.parametrize(("raw", "seconds"), [
    (90, 90), ("90s", 90), ("30m", 1800), ("8h", 28800), ("1h30m", 5400), ("1d", 86400),
])
def test_duration_units(raw: object, seconds: int) -> None:
    assert parse_duration_s(raw) == seconds


@pytest.mark.parametrize(("raw", "milli"), [
    (0.25, 250), ("1/4", 250), ("25%", 250), (1, 1000), ("1/3", 333), ("1/8", 125),
])
def test_fraction_units(raw: object, milli: int) -> None:
    assert parse_fraction_milli(raw) == milli


@pytest.mark.parametrize("bad", ["lots", "12XB", True, None, [1], "-1GiB"])
def test_bad_memory(bad: object) -> None:
    with pytest.raises(UnitError, match="memory size"):
        parse_memory_mib(bad)


@pytest.mark.parametrize("bad", ["soon", "5x", "", False])
def test_bad_duration(bad: object) -> None:
    with pytest.raises(UnitError, match="duration"):
        parse_duration_s(bad)


def test_units_reject_negative() -> None:
    assert parse_units_milli("1/2") == 500
    with pytest.raises(UnitError, match="not negative"):
        parse_units_milli(-1)


# ------------------------------------------------------------------ good files


def test_example_file_loads_without_errors() -> None:
    check = check_policy(EXAMPLE.read_text(), str(EXAMPLE))
    assert check.errors == []
    policy = load_policy(EXAMPLE)
    assert {p.name: p.mode for p in policy.pools}["train"] is SharingMode.EXCLUSIVE
    slugs = {p.slug for p in policy.profiles}
    assert {"debug-eighth", "inference-quarter", "train-1gpu", "train-4gpu", "cpu-only"} <= slugs
    assert all(g.simulated for n in policy.nodes for g in n.gpus)
    assert {t.name for t in policy.teams} == {"vision", "nlp", "research"}
    assert policy.profile("debug-eighth").gpu == GPUAsk(fraction_milli=125)  # type: ignore
    assert policy.profile("cpu-only").gpu.is_empty  # type: ignore[union-attr]
    pc = policy.priority("research")
    assert pc is not None and pc.preemptible and pc.checkpoint_required_after_s == 7200


def test_base_parses_into_model() -> None:
    policy = parse_policy(BASE)
    n1 = policy.nodes[0]
    assert n1 == Node("n1", "train", tuple(GPU(f"GPU-n1-{i}", "A100", 81920, i)
                                           for i in range(4)), 32000, 262144)
    shared = policy.pool("shared")
    assert shared is not None and shared.memory_headroom == pytest.approx(0.2)
    team = policy.team("vision")
    assert team is not None and team.groups == ("vision",)
    quota = team.quota("train")
    assert quota is not None and (quota.guaranteed_milli, quota.borrow_limit_milli) == (2000, 1000)
    assert policy.profile("s1").priority == "interactive"  # type: ignore[union-attr]
    assert policy.inventory_source == "static"


def test_memory_and_compute_profile_is_charged_by_the_larger_share() -> None:
    text = BASE + "  - slug: m1\n    pool: shared\n    gpu: {memory: 20GiB, compute: 10%}\n"
    ask = parse_policy(text).profile("m1").gpu  # type: ignore[union-attr]
    assert ask.fraction_milli == 625  # 20 GiB of the 32 GiB shareable on the smallest 40 GiB GPU
    assert ask.memory_mib == 20480 and ask.compute_milli == 100
    text = BASE + "  - slug: m2\n    pool: shared\n    gpu: {memory: 4GiB, compute: 1/2}\n"
    assert parse_policy(text).profile("m2").gpu.fraction_milli == 500  # type: ignore


def test_shorthand_gpu_values() -> None:
    text = edit("gpu: {count: 1}", "gpu: 2")
    text = edit("gpu: {fraction: 1/4}", "gpu: 25%", text)
    policy = parse_policy(text)
    assert policy.profile("t1").gpu == GPUAsk(whole=2)  # type: ignore[union-attr]
    assert policy.profile("s1").gpu == GPUAsk(fraction_milli=250)  # type: ignore[union-attr]


def test_simulated_nodes_helper() -> None:
    nodes = simulated_nodes("debug", 2, 3, "H200", 144384)
    assert [n.name for n in nodes] == ["sim-debug-0", "sim-debug-1"]
    assert nodes[1].gpus[2].uuid == "GPU-sim-sim-debug-1-2"
    assert all(g.simulated for n in nodes for g in n.gpus)


def test_discovered_inventory_without_hook_warns_and_loads() -> None:
    text = edit(BASE.split("pools:")[0], NVML)
    check = check_policy(text, "p.yaml")
    assert check.errors == []
    assert any("discovered" in i.message for i in check.warnings)
    assert check.policy is not None and check.policy.nodes == ()


def test_discovered_inventory_with_hook() -> None:
    text = edit(BASE.split("pools:")[0], NVML)
    seen: list[DiscoverySpec] = []

    def discover(spec: DiscoverySpec) -> list[Node]:
        seen.append(spec)
        return list(simulated_nodes("train", 1, 4)) + list(
            simulated_nodes(spec.options["pool"], 1, 2))

    policy = parse_policy(text, "p.yaml", discover=discover)
    assert seen[0].source == "nvml" and seen[0].line == 2
    assert policy.inventory_source == "nvml" and len(policy.nodes) == 2


# ---------------------------------------------------------------------- errors


def test_malformed_yaml_reports_yaml_line() -> None:
    found = issues("pools:\n  train: {mode: exclusive\nteams: {}\n")
    assert len(found) == 1
    assert found[0].line == 3 and "malformed YAML" in found[0].message
    assert str(found[0]).startswith("p.yaml:3: ")


def test_empty_and_non_mapping_files() -> None:
    assert "empty" in issues("")[0].message
    assert "expected a mapping" in issues("- a\n- b\n")[0].message


def test_unknown_key_with_hint() -> None:
    found = issues(edit("{mode: exclusive}", "{mode: exclusive, memory_hedroom: 1}"))
    issue = only(found, "pools.train.memory_hedroom")
    assert issue.line == 17 and "did you mean 'memory_headroom'" in issue.message
    issue = only(issues(BASE + "profile_list: []\n"), "profile_list")
    assert issue.line == 34 and "did you mean 'profiles'" in issue.message


def test_missing_required_field() -> None:
    first_cpu = "      pool: train\n      cpu: 32\n"
    issue = only(issues(edit(first_cpu, "      pool: train\n")), "inventory.nodes[0].cpu")
    assert issue.line == 4 and "required" in issue.message


def test_wrong_types() -> None:
    found = issues(edit("interactive: {value: 500}", "interactive: {value: high}"))
    issue = only(found, "priority_classes.interactive.value")
    assert issue.line == 20 and "whole number" in issue.message
    found = issues(edit("memory: 256GiB", "memory: plenty"))
    assert only(found, "inventory.nodes[0].memory").line == 7
    found = issues(edit("  - slug: t1\n", "  - slug: t1\n    max_lifetime: forever\n"))
    assert only(found, "profiles[0].max_lifetime").line == 29


def test_unknown_references() -> None:
    text = edit("      pool: shared\n", "      pool: shraed\n")
    issue = only(issues(text), "inventory.nodes[1].pool")
    assert issue.line == 11 and "did you mean 'shared'" in issue.message
    text = edit("    pool: train\n    gpu: {count: 1}", "    pool: trian\n    gpu: {count: 1}")
    assert only(issues(text), "profiles[0].pool").line == 29
    text = edit("  - slug: s1\n", "  - slug: s1\n    priority: urgent\n    teams: [vision, nlpp]\n")
    found = issues(text)
    assert only(found, "profiles[1].priority").line == 32
    assert only(found, "profiles[1].teams[1]").line == 33
    text = edit("      shared: {guaranteed: 1}", "      gpu: {guaranteed: 1}")
    issue = only(issues(text), "teams.vision.quotas.gpu")
    assert issue.line == 26 and "unknown pool" in issue.message
    issue = only(issues(BASE + "default_team: nobody\n"), "default_team")
    assert issue.line == 34


def test_duplicates() -> None:
    found = issues(edit("    - name: n2", "    - name: n1"))
    issue = only(found, "inventory.nodes[1].name")
    assert issue.line == 10 and "duplicate node name 'n1'" in issue.message
    found = issues(edit("  - slug: s1", "  - slug: t1"))
    issue = only(found, "profiles[1].slug")
    assert issue.line == 31 and "first at line 28" in issue.message
    found = issues(BASE.replace("profiles:", "  vision:\n    groups: [x]\nprofiles:"))
    assert only(found, "vision").line == 27  # duplicate YAML key = duplicate team name


def test_fractions_in_exclusive_pools_and_above_one() -> None:
    found = issues(edit("gpu: {count: 1}", "gpu: {fraction: 1/2}"))
    issue = only(found, "profiles[0].gpu")
    assert issue.line == 30 and "whole devices only" in issue.message
    found = issues(edit("gpu: {fraction: 1/4}", "gpu: {fraction: 3/2}"))
    issue = only(found, "profiles[1].gpu")
    assert issue.line == 33 and "more than one GPU" in issue.message


def test_count_larger_than_any_node() -> None:
    issue = only(issues(edit("gpu: {count: 1}", "gpu: {count: 8}")), "profiles[0].gpu")
    assert issue.line == 30 and "no node of pool train has more than 4" in issue.message


def test_fraction_that_fits_no_gpu_with_headroom() -> None:
    # 35 GiB of a 40 GiB GPU: only 32 GiB are left after 20 % headroom
    issue = only(issues(edit("gpu: {fraction: 1/4}", "gpu: {fraction: 1/4, memory: 35GiB}")),
                 "profiles[1].gpu")
    assert issue.line == 33 and "fits no GPU" in issue.message and "20% headroom" in issue.message
    assert issues(edit("gpu: {fraction: 1/4}", "gpu: {fraction: 1/4, memory: 32GiB}")) == []


def test_cpu_or_ram_larger_than_any_node() -> None:
    issue = only(issues(edit("    gpu: {count: 1}\n", "    gpu: {count: 1}\n    cpu: 64\n")),
                 "profiles[0]")
    assert issue.line == 28 and "64 CPU" in issue.message


def test_gpu_models_not_in_pool() -> None:
    text = edit("    gpu: {count: 1}\n", "    gpu: {count: 1}\n    gpu_models: [H100]\n")
    issue = only(issues(text), "profiles[0].gpu_models[0]")
    assert issue.line == 31 and "A100" in issue.message


def test_negative_quotas_and_unknown_quota_keys() -> None:
    text = edit("{guaranteed: 2, borrow_limit: 1}", "{guaranteed: -2, borrow_limit: -1}")
    found = issues(text)
    assert only(found, "teams.vision.quotas.train.guaranteed").line == 25
    assert "not negative" in only(found, "teams.vision.quotas.train.borrow_limit").message


def test_headroom_out_of_range() -> None:
    issue = only(issues(edit("memory_headroom: 20%", "memory_headroom: 95%")),
                 "pools.shared.memory_headroom")
    assert issue.line == 18 and "between 0 and 0.9" in issue.message


def test_bad_slug_and_mode() -> None:
    found = issues(edit("slug: t1", "slug: Train One"))
    assert only(found, "profiles[0].slug").line == 28
    found = issues(edit("{mode: exclusive}", "{mode: exclusiv}"))
    assert "did you mean 'exclusive'" in only(found, "pools.train.mode").message


def test_all_errors_are_collected() -> None:
    text = edit("interactive: {value: 500}", "interactive: {value: high}")
    text = edit("      pool: shared\n", "      pool: nowhere\n", text)
    text = edit("gpu: {fraction: 1/4}", "gpu: {fraction: 2}", text)
    text = edit("borrow_limit: 1", "borrow_limit: -1", text)
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, "p.yaml")
    paths = {e.path for e in caught.value.errors}
    assert {"priority_classes.interactive.value", "inventory.nodes[1].pool",
            "profiles[1].gpu", "teams.vision.quotas.train.borrow_limit"} <= paths
    assert "p.yaml:11: inventory.nodes[1].pool" in str(caught.value)
    lines = [e.line for e in caught.value.errors]
    assert lines == sorted(lines)


# --------------------------------------------------------------------- warnings


def test_pool_without_nodes_is_a_warning() -> None:
    text = edit("  shared: {mode: shared, memory_headroom: 20%}",
                "  shared: {mode: shared, memory_headroom: 20%}\n  debug: {mode: debug}")
    check = check_policy(text, "p.yaml")
    assert check.errors == [] and check.policy is not None
    assert only(check.warnings, "pools.debug").line == 19


def test_oversubscription_is_a_warning_and_in_the_summary() -> None:
    text = edit("{guaranteed: 2, borrow_limit: 1}", "{guaranteed: 6, borrow_limit: 1}")
    check = check_policy(text, "p.yaml")
    assert check.policy is not None
    issue = only(check.warnings, "pools.train")
    assert issue.line == 17 and "oversubscribe" in issue.message and "50%" in issue.message
    assert "OVERSUBSCRIBED by 50%" in summarize(check.policy)


def test_summary_lists_capacity_guarantees_and_profiles() -> None:
    text = summarize(load_policy(EXAMPLE))
    assert "train" in text and "8 GPUs =" in text and "8000 milli" in text
    assert "Guarantees per pool" in text and "vision" in text
    assert "Train 4 GPU" in text


# ------------------------------------------------------- every error in one pass


def test_a_typo_and_an_unknown_team_are_reported_in_one_pass() -> None:
    # issue 8 item 18: the unknown team used to show only after the typo was fixed
    text = edit("train: {guaranteed: 2, borrow_limit: 1}", "train: {guaranted: 2}")
    text = edit("    pool: shared\n    gpu: {fraction: 1/4}\n",
                "    pool: shared\n    gpu: {fraction: 1/4}\n    teams: [visoin]\n", text)
    text = edit("research: {value: 100,", "research: {valeu: 100,", text)
    text += "default_team: nobody\n"
    found = issues(text)
    assert "did you mean 'guaranteed'" in only(found, "teams.vision.quotas.train.guaranted"
                                               ).message
    assert "unknown team 'visoin'" in only(found, "profiles[1].teams[0]").message
    assert "did you mean 'value'" in only(found, "priority_classes.research.valeu").message
    assert "unknown team 'nobody'" in only(found, "default_team").message


def test_a_broken_entry_is_reported_once_not_at_every_reference() -> None:
    # pool train has a bad mode: the nodes, quotas and profiles that name it are not
    # reported as naming an unknown pool
    found = issues(edit("{mode: exclusive}", "{mode: exclusiv}"))
    assert [i.path for i in found] == ["pools.train.mode"]
    found = issues(edit("interactive: {value: 500}", "interactive: {value: high}"))
    assert [i.path for i in found] == ["priority_classes.interactive.value"]
