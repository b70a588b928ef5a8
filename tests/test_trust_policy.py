"""Issue 23, findings 11-14 (policy side): every number has a range, the YAML reader is
bounded, names have a pattern and every export quotes what it writes, errors are
``FILE:LINE`` lines (never a traceback) in check-policy, the exports and the broker's reload,
the spawner keeps the last good policy, and user-supplied values are clipped in its logs.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import re
import shlex
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from jupyterhub.spawner import SpawnException

from jupyter_gpushare import cli
from jupyter_gpushare.broker.client import BrokerError
from jupyter_gpushare.broker.ops.reload import _read_and_parse
from jupyter_gpushare.core.model import Policy
from jupyter_gpushare.export import kueue, ytsaurus
from jupyter_gpushare.export.slurm import export_slurm
from jupyter_gpushare.policy import PolicyError, check_policy, load_policy
from jupyter_gpushare.policy.loader import read_policy_text
from jupyter_gpushare.policy.yamlread import MAX_CHARS, MAX_DEPTH
from jupyter_gpushare.spawner import form as formlib
from jupyter_gpushare.spawner import profile_choice
from jupyter_gpushare.spawner.local import SimpleLocalGPUShareSpawner

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "hub_config" / "gpushare.yaml"
BASE = EXAMPLE.read_text()
TARGETS = ("kueue", "slurm", "ytsaurus")


def variant(old: str, new: str, text: str = BASE) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def line_of(text: str, needle: str) -> int:
    return text[: text.index(needle)].count("\n") + 1


def write(tmp_path: Path, text: str | bytes, name: str = "p.yaml") -> str:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return str(path)


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def issue_lines(err: str) -> list[str]:
    return [line[2:] for line in err.splitlines() if line.startswith("  ")]


def assert_file_line_errors(path: str, err: str) -> list[str]:
    """Every issue line of ``err`` starts with ``PATH:LINE:`` (LINE >= 1); no traceback."""
    assert "Traceback" not in err and "internal error" not in err, err[-2000:]
    lines = issue_lines(err)
    assert lines, err
    pattern = re.compile(re.escape(path) + r":[1-9]\d*: ")
    assert [line for line in lines if not pattern.match(line)] == []
    return lines


# ------------------------------------------------------------ the issue's own cases

LIFETIME = "    max_lifetime: 100000000000000000"


def test_a_max_lifetime_of_10_17_is_out_of_range_in_check_policy_and_reload(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = variant("    max_lifetime: 2h", LIFETIME)
    path = write(tmp_path, text)
    line = line_of(text, LIFETIME)
    code, out, err = run_cli(["check-policy", path], capsys)
    assert code == cli.POLICY_ERRORS
    slug_index = [m.start() for m in re.finditer(r"\n  - slug:", text)]
    index = sum(1 for at in slug_index if at < text.index(LIFETIME)) - 1
    expected = (f"{path}:{line}: profiles[{index}].max_lifetime: 100000000000000000 is out "
                "of range 1..31536000 (seconds)")
    assert assert_file_line_errors(path, err) == [expected]
    with pytest.raises(PolicyError) as exc:
        _read_and_parse(path)  # what the broker's reload runs: the last good policy stays
    assert [str(e) for e in exc.value.errors] == [expected]


QUOTA_1E400 = '{guaranteed: "1e400",'
DEEP = "zz: " + "[" * 5000 + "]" * 5000 + "\n"


@pytest.mark.parametrize("case", ["quota-1e400", "5000-deep"])
def test_1e400_and_5000_deep_nesting_give_file_line_errors_everywhere(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if case == "quota-1e400":
        text = variant("{guaranteed: 4,", QUOTA_1E400)
        line = line_of(text, QUOTA_1E400)
        message = "teams.vision.quotas.train.guaranteed: 1.000e+400 is out of range " \
                  "0..1000000 (GPU units)"
    else:
        text = BASE + DEEP
        line = BASE.count("\n") + 1
        message = f"nested more than {MAX_DEPTH} levels deep"
    path = write(tmp_path, text)
    for argv in (["check-policy", path], *(["export", t, path] for t in TARGETS)):
        code, out, err = run_cli(argv, capsys)
        assert code == cli.POLICY_ERRORS, (argv, err)
        lines = assert_file_line_errors(path, err)
        assert any(m.startswith(f"{path}:{line}: {message}") for m in lines), (argv, lines)
        assert out == ""  # nothing half-written
    with pytest.raises(PolicyError) as exc:
        _read_and_parse(path)
    assert [e.line for e in exc.value.errors] == [line]


EVIL = "vision\nsacctmgr -i delete account root"


def _evil_policy() -> Policy:
    """The example with a team name (and its admins) that no loader would pass: what an
    export does if one slips through anyway (another reader, a future loader bug)."""
    policy = load_policy(EXAMPLE)
    teams = tuple(dataclasses.replace(
        t, name=EVIL if t.name == "vision" else t.name,
        admins=tuple(f"{a}\n; rm -rf / #$(id)" for a in t.admins)) for t in policy.teams)
    return dataclasses.replace(policy, teams=teams)


def test_a_team_name_with_a_newline_is_refused_by_check_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = variant("  vision:\n    groups: [vision]",
                   '  "vision\\nsacctmgr -i delete account root":\n    groups: [vision]')
    path = write(tmp_path, text)
    code, out, err = run_cli(["check-policy", path], capsys)
    assert code == cli.POLICY_ERRORS
    lines = assert_file_line_errors(path, err)
    line = line_of(text, '  "vision\\n')
    assert any(m.startswith(f"{path}:{line}: teams.'vision\\nsacctmgr -i delete account root':"
                            " got name") and "letters, digits, '-' or '_'" in m for m in lines)
    assert "\nsacctmgr" not in err  # the name is quoted in the message, not written raw
    for target in TARGETS:
        code, out, err = run_cli(["export", target, path], capsys)
        assert code == cli.POLICY_ERRORS and out == ""


@pytest.mark.parametrize("fmt", ["sacctmgr", "conf", "all"])
def test_a_name_that_slipped_through_adds_no_line_to_the_slurm_export(fmt: str) -> None:
    clean = export_slurm(load_policy(EXAMPLE)).render(fmt)
    evil = export_slurm(_evil_policy()).render(fmt)
    assert evil.count("\n") == clean.count("\n")  # the issue: 28 (sacctmgr) and 2 (conf) more
    lines = evil.splitlines()
    assert not any(line.startswith("sacctmgr -i delete") for line in lines)
    assert not any(line.startswith("; rm") for line in lines)
    if fmt == "sacctmgr":
        commands = [line for line in lines if line and not line.startswith("#")]
        assert all(line.startswith("sacctmgr -i ") for line in commands)
        for line in commands:  # every word quoted: the shell sees exactly these words
            words = shlex.split(line)
            assert words[:2] == ["sacctmgr", "-i"] and not any("\n" in w for w in words)
            assert "$(id)" not in line or "'" in line


def test_every_word_of_a_sacctmgr_line_is_quoted() -> None:
    from jupyter_gpushare.export.slurm import sh

    words = ["sacctmgr", "-i", "add", "account", "a b;c", "$(id)", "x\ny", "'", "Description=`id`"]
    line = sh(*words)
    assert shlex.split(line) == words and "\n" not in line.replace("'x\ny'", "")


def test_the_kueue_header_stays_comments_whatever_the_source_path() -> None:
    text = kueue.render(load_policy(EXAMPLE), source="p.yaml\nkind: Evil\n---\nx: 1")
    head = text.split("\n---\n", 1)[0]
    assert all(line.startswith("#") for line in head.splitlines()), head


def test_a_name_that_slipped_through_adds_no_line_to_kueue_and_ytsaurus() -> None:
    import yaml

    evil = _evil_policy()
    text = kueue.render(evil)
    head = text.split("\n---\n", 1)[0]
    assert all(line.startswith("#") for line in head.splitlines())
    docs = list(yaml.safe_load_all(text))  # the serializer quoted every name
    assert len(docs) == len(list(yaml.safe_load_all(kueue.render(load_policy(EXAMPLE)))))
    with pytest.raises(ValueError, match="not a YTsaurus pool name"):
        ytsaurus.export_ytsaurus(evil)
    # a budget comment that names the team stays one comment line
    pools = ytsaurus.export_ytsaurus(load_policy(EXAMPLE))
    rendered = ytsaurus.render(evil, pools, "gpu")
    assert all(line == "" or line.startswith(("#", "yt ", "set -e")) for line in
               rendered.splitlines())


# ------------------------------------------------------------ ranges at their bounds


@pytest.mark.parametrize(("old", "inside", "outside", "message"), [
    ("    max_lifetime: 2h", "    max_lifetime: 365d", "    max_lifetime: 31536001",
     "31536001 is out of range 1..31536000 (seconds)"),
    ("    grace_period: 5m", "    grace_period: 7d", "    grace_period: 604801",
     "604801 is out of range 0..604800 (seconds)"),
    ("    checkpoint_required_after: 2h", "    checkpoint_required_after: 365d",
     "    checkpoint_required_after: 52w2d", "31622400 is out of range 0..31536000 (seconds)"),
    ("{guaranteed: 4,", "{guaranteed: 1000000,", "{guaranteed: 1000000.001,",
     "1000000.001 is out of range 0..1000000 (GPU units)"),
    ("borrow_limit: 2,", "borrow_limit: 1000000,", "borrow_limit: 1000001,",
     "1000001 is out of range 0..1000000 (GPU units)"),
    ("gpu_hours_per_month: 2000", "gpu_hours_per_month: 1000000000",
     "gpu_hours_per_month: 1000000000.5",
     "1000000000.5 is out of range 0..1000000000 (GPU-hours)"),
    ("    value: 1000", "    value: 1000000", "    value: 1000001",
     "1000001 is out of range 0..1000000 (priority value)"),
    ("      cpu: 112             # per node", "      cpu: 65535", "      cpu: 65535.001",
     "65535.001 is out of range 0.001..65535 (CPU cores)"),
    ("      memory: 2TiB         # node RAM", "      memory: 1073741824",
     "      memory: 1073741825", "1073741825 is out of range 1..1073741824 (MiB)"),
])
def test_every_range_takes_its_bound_and_refuses_one_past_it(
    old: str, inside: str, outside: str, message: str
) -> None:
    assert check_policy(variant(old, inside)).policy is not None, inside
    text = variant(old, outside)
    errors = check_policy(text, "f.yaml").errors
    at = [e for e in errors if e.line == line_of(text, outside.strip())]
    assert len(at) == 1 and str(at[0]).endswith(message), errors


@pytest.mark.parametrize(("key", "top", "unit"), [
    ("shards_per_gpu", 1024, "shards per GPU"),
])
def test_slurm_section_ranges(key: str, top: int, unit: str) -> None:
    assert check_policy(BASE + f"slurm:\n  {key}: {top}\n").policy is not None
    errors = check_policy(BASE + f"slurm:\n  {key}: {top + 1}\n").errors
    assert [str(e).split(": ", 2)[-1] for e in errors] == [
        f"{top + 1} is out of range 1..{top} ({unit})"]


TRAIN_GROUP = "      nodes: 2\n      gpus_per_node: 4\n"


def _sim(nodes: int, per_node: int) -> list[str]:
    text = variant(TRAIN_GROUP, f"      nodes: {nodes}\n      gpus_per_node: {per_node}\n")
    return [e.message for e in check_policy(text).errors]


SMALL = """inventory:
  source: simulated
  simulated:
    - {pool: p, nodes: 100, gpus_per_node: 1000}
    - {pool: p, nodes: 1, gpus_per_node: EXTRA, name: extra}
pools: {p: {mode: exclusive}}
priority_classes: {interactive: {value: 1}}
teams: {t: {quotas: {p: {guaranteed: 1}}}}
profiles: []
"""


def test_gpu_counts_and_simulated_inventories_are_bounded() -> None:
    def total(extra: int) -> list[str]:
        return [e.message for e in check_policy(SMALL.replace("EXTRA", str(extra))).errors]

    assert total(0) == []  # 100,000 GPUs: the most, over every group
    assert total(1) == ["100,001 GPUs is out of range 0..100,000 (GPUs)"]
    group = _sim(101, 1000)  # refused before a node is built
    assert group == ["101 nodes x 1000 GPUs = 101,000 GPUs is out of range 0..100,000 (GPUs)"]
    assert any("10001 is out of range 1..10000 (nodes)" in m for m in _sim(10_001, 0))
    assert any("1025 is out of range 0..1024 (GPUs)" in m for m in _sim(1, 1025))
    whole = variant("    gpu: {count: 4}", "    gpu: 1025")
    assert any("1025 is out of range 1..1024 (GPUs)" in e.message
               for e in check_policy(whole).errors)


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", "1.0e+400", '"1e400"'])
def test_non_finite_numbers_are_errors(value: str) -> None:
    for old in ("gpu_hours_per_month: 2000", "{guaranteed: 4,"):
        new = (f"gpu_hours_per_month: {value}" if "hours" in old else
               f"{{guaranteed: {value},")
        errors = check_policy(variant(old, new), "f.yaml").errors
        assert len(errors) == 1 and errors[0].line > 0, (value, errors)


# ------------------------------------------------------------------ the reader's bounds


def test_nesting_is_read_up_to_its_bound() -> None:
    def nested(levels: int) -> str:  # the top mapping is one level
        return "zz: " + "[" * (levels - 1) + "]" * (levels - 1) + "\n"

    ok = check_policy(BASE + nested(MAX_DEPTH)).errors
    assert [e.message for e in ok] == ["unknown key (expected one of inventory, pools, "
                                       "priority_classes, teams, default_team, profiles, slurm)"]
    deep = check_policy(BASE + nested(MAX_DEPTH + 1)).errors
    assert [e.message for e in deep] == [f"nested more than {MAX_DEPTH} levels deep (a policy "
                                         "needs about 6)"]


def test_alias_bombs_are_refused_and_plain_anchors_still_work() -> None:
    bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]\n" for i in range(1, 10))
    errors = check_policy(bomb + BASE, "f.yaml").errors
    assert len(errors) == 1 and "expands to more than 1,000,000 values" in errors[0].message
    assert 1 <= errors[0].line <= 10
    # an anchor and a merge key, as an admin writes them, are read as before
    anchored = variant("      train:       {guaranteed: 4,",
                       "      train:       &train4 {guaranteed: 4,")
    anchored = variant("      train:       {guaranteed: 3,",
                       "      train:       {<<: *train4, guaranteed: 3,", anchored)
    assert check_policy(anchored).policy is not None


def test_size_encoding_and_unbuildable_values_name_their_line(tmp_path: Path) -> None:
    huge = check_policy("a: " + "x" * MAX_CHARS, "f.yaml").errors
    assert [(e.line, "characters long" in e.message) for e in huge] == [(1, True)]
    path = write(tmp_path, b"x" * (MAX_CHARS + 1), "big.yaml")
    with pytest.raises(PolicyError) as exc:
        read_policy_text(path)
    assert exc.value.errors[0].line == 1 and "longer than" in exc.value.errors[0].message
    raw = BASE.encode()
    at = raw.index(b"pools:")
    path = write(tmp_path, raw[:at] + b"\xff" + raw[at:], "latin.yaml")
    with pytest.raises(PolicyError) as exc:
        read_policy_text(path)
    assert exc.value.errors[0].line == line_of(BASE, "pools:")
    digits = variant("    value: 1000", "    value: " + "9" * 5000)
    errors = check_policy(digits, "f.yaml").errors
    assert [e.line for e in errors] == [line_of(digits, "    value: 999")]
    month13 = variant("    value: 1000", "    value: 2020-13-45")
    assert [e.line for e in check_policy(month13).errors] == [line_of(month13, "2020-13-45")]
    nul = variant("    value: 1000", "    value: 1\x00")
    assert [e.line for e in check_policy(nul).errors] == [line_of(nul, "1\x00")]


def test_an_issue_is_one_line_whatever_the_file_holds() -> None:
    text = variant("    groups: [vision]", '    groups: ["a\\nb"]')
    errors = check_policy(text, "f.yaml").errors
    assert errors and all("\n" not in str(e) for e in errors)
    def failing(spec: Any) -> list[Any]:
        raise RuntimeError("no NVML\nsacctmgr -i delete account root")

    nvml = variant("  source: simulated\n", "  source: nvml\n")
    nvml = nvml[: nvml.index("  simulated:")] + nvml[nvml.index("\n# ---", nvml.index(
        "  simulated:")):]
    errors = check_policy(nvml, "f.yaml", failing).errors
    assert any("discovery from nvml failed" in str(e) for e in errors), errors
    assert all("\n" not in str(e) for e in errors)
    long_key = variant("pools:\n", "pools:\n  " + "k" * 100_000 + ": {mode: shared}\n")
    errors = check_policy(long_key, "f.yaml").errors
    assert errors and all(len(str(e)) < 600 for e in errors), [len(str(e)) for e in errors]


def test_names_follow_the_pattern_and_may_not_differ_only_in_case() -> None:
    for bad in ("a b", "-a", "a-", "a.b", "x" * 64, "Ωmega", "$(id)", "a;b"):
        text = variant("  inference:\n    mode: shared", f'  "{bad}":\n    mode: shared')
        errors = check_policy(text).errors
        assert any("got name" in e.message for e in errors), (bad, errors)
    ok = variant("  inference:\n    mode: shared", "  Infer_2-x:\n    mode: shared")
    assert not any("got name" in e.message for e in check_policy(ok).errors)
    for first, second in (("Research", "research"), ("research", "RESEARCH")):
        twin = variant("  research:\n    groups: [research]",
                       f"  {first}:\n    groups: [x]\n  {second}:\n    groups: [research]")
        errors = check_policy(twin).errors
        assert any(f"differs from '{first}' only in case" in e.message for e in errors)


# --------------------------------------------------------- the spawner's hold on the policy


def _spawner(path: str) -> Any:
    return profile_choice.ProfileChoiceMixin(policy_file=path)


def test_the_spawner_keeps_the_last_good_policy_and_warns_once_per_change(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, BASE)
    spawner = _spawner(path)
    log = logging.getLogger("test.spawner")
    spawner.log = log
    good = spawner.gpushare_policy()
    assert good is not None and good.profile("debug-eighth") is not None
    bad = variant("{guaranteed: 4,", QUOTA_1E400)
    Path(path).write_text(bad)
    caplog.set_level(logging.WARNING, logger="test.spawner")
    for _ in range(5):  # five page views
        assert spawner.gpushare_policy() is good
    warned = [r.getMessage() for r in caplog.records if "has errors" in r.getMessage()]
    assert len(warned) == 1, warned
    assert f"{path}:{line_of(bad, QUOTA_1E400)}: teams.vision.quotas.train.guaranteed: " \
           "1.000e+400 is out of range" in warned[0]
    assert "last good policy stays in force" in warned[0] and "Traceback" not in warned[0]
    # the form is built from the policy kept: the profiles are still offered
    assert [c.slug for c in formlib.choices_for(spawner.gpushare_policy(), ["vision"])]
    Path(path).write_text(BASE + DEEP)  # worse: still the last good one, one more warning
    assert spawner.gpushare_policy() is good and spawner.gpushare_policy() is good
    warned = [r.getMessage() for r in caplog.records if "has errors" in r.getMessage()]
    assert len(warned) == 2 and "nested more than" in warned[1]
    Path(path).write_text(BASE.replace("max_lifetime: 2h", "max_lifetime: 3h", 1))
    fixed = spawner.gpushare_policy()
    assert fixed is not None and fixed is not good
    assert any("good again" in r.getMessage() for r in caplog.records)
    Path(path).unlink()  # gone: still the last good one
    assert spawner.gpushare_policy() is fixed


def test_a_hub_that_never_read_a_good_file_falls_back_to_the_brokers_list(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, BASE + DEEP, "never.yaml")
    spawner = _spawner(path)
    spawner.log = logging.getLogger("test.spawner2")
    caplog.set_level(logging.WARNING, logger="test.spawner2")
    assert spawner.gpushare_policy() is None and spawner.gpushare_policy() is None
    warned = [r.getMessage() for r in caplog.records if "has errors" in r.getMessage()]
    assert len(warned) == 1 and "broker's profiles" in warned[0]


# --------------------------------------------------- user-supplied values in the hub's logs


def test_a_1mb_profile_name_is_clipped_in_the_options_error() -> None:
    slug = "x" * 1_000_000
    with pytest.raises(formlib.OptionsError) as exc:
        formlib.validate_options({"profile": slug}, ["a"], ["a"])
    assert len(exc.value.message) < 300 and "(1,000,002 characters)" in exc.value.message
    with pytest.raises(formlib.OptionsError) as exc:
        formlib.validate_options({slug: 1}, ["a"], ["a"])
    assert len(exc.value.message) < 300


class _EchoBroker:
    """A broker that refuses with a 400 echoing the profile name (as an old broker did)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    async def request(self, **kwargs: Any) -> Any:
        raise BrokerError(400, f"unknown profile {kwargs['profile']!r}", "profile")


async def test_a_1mb_profile_name_is_clipped_in_every_hub_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    user = SimpleNamespace(name="alice", id=1, url="/user/alice/", groups=[])
    hub = SimpleNamespace(public_host="hub", url="http://hub:8081/hub/", base_url="/hub/",
                          api_url="http://hub:8081/hub/api")
    sp = SimpleLocalGPUShareSpawner(user=user, hub=hub)  # no policy file: the broker decides
    sp.log = logging.getLogger("test.hublog")
    sp._gpushare_client = _EchoBroker(sp.broker_url.rstrip("/"))
    sp.user_options = {"profile": "y" * 1_000_000}
    caplog.set_level(logging.INFO, logger="test.hublog")
    with pytest.raises(SpawnException) as exc:
        await sp.start()
    message = exc.value.jupyterhub_message  # what the hub logs and shows
    assert len(message) < 1000 and "(1,000,000 characters)" in message
    logged = [r.getMessage() for r in caplog.records]
    assert logged and all(len(m) < 1000 for m in logged), [len(m) for m in logged]


# --------------------------------------------------------------- generated hostile files


def _benchmark() -> Any:
    spec = importlib.util.spec_from_file_location(
        "hostile_policies", REPO / "benchmarks" / "hostile_policies.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["hostile_policies"] = module
    spec.loader.exec_module(module)
    return module


def test_100_generated_hostile_files_give_no_traceback_and_only_file_line_errors(
    tmp_path: Path,
) -> None:
    tally = _benchmark().run(100, seed=2023, keep=tmp_path / "files")
    assert tally.files == 100
    assert tally.tracebacks == []
    assert tally.no_line == []
    assert tally.injected == []
    refused = tally.exits["check-policy:2"]
    assert refused > 50 and tally.loaded > 0 and refused + tally.loaded == 100
    assert {"name", "number", "deep", "laughs", "type"} <= set(tally.kinds)


def test_a_checker_bug_is_one_line_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import jupyter_gpushare.policy as policy_module

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RecursionError("maximum recursion depth exceeded\nin somewhere")

    path = write(tmp_path, BASE)
    monkeypatch.setattr(policy_module, "check_policy_file", broken)
    monkeypatch.setattr(policy_module, "load_policy", broken)
    for argv in (["check-policy", path], ["export", "slurm", path]):
        code, out, err = run_cli(argv, capsys)
        assert code == cli.POLICY_ERRORS and out == ""
        assert err.splitlines() == [f"{path}:1: internal error while reading the policy "
                                    "(RecursionError: maximum recursion depth exceeded\\nin "
                                    "somewhere); please report it"]


def test_a_discovered_inventory_is_bounded_too() -> None:
    from jupyter_gpushare.policy import simulated_nodes

    nvml = variant("  source: simulated\n", "  source: nvml\n")
    nvml = nvml[: nvml.index("  simulated:")] + nvml[nvml.index("\n# ---", nvml.index(
        "  simulated:")):]

    def found(count: int) -> Any:
        return lambda spec: simulated_nodes("train", count, 0)

    assert not any("out of range" in e.message for e in check_policy(nvml, "f", found(10_000))
                   .errors)
    errors = check_policy(nvml, "f", found(10_001)).errors
    assert [e.message for e in errors if "out of range" in e.message] == [
        "10,001 nodes is out of range 0..10,000 (nodes)"]
