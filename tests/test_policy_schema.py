"""The JSON Schema of the policy file agrees with the loader it is generated from.

* the published copies (package, hub_config/) are what the loader's definitions generate;
* the schema accepts the example and the test policies;
* for every mapping of the example: an unknown key, a missing required key and a value of
  the wrong kind at each key are rejected by both the loader and the schema;
* every unit text (memory, CPU, duration, fraction) is accepted by the schema's pattern
  exactly when the loader's parser accepts it (property test).

Not in the schema (the loader alone checks them): references between sections (unknown
pool, team, priority class), fit on the hardware, rules across keys of one mapping
(``count`` with ``fraction``; ``pool`` required with a GPU), and ranges of values written
as text (a headroom of "95%" is refused by the loader; 0.95 by both).
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from test_policy import BASE
from test_rules import POLICY as RULES_POLICY

from jupyter_gpushare.policy import check_policy, json_schema
from jupyter_gpushare.policy import schema as S
from jupyter_gpushare.policy_units import (
    UnitError,
    parse_cpu_milli,
    parse_duration_s,
    parse_memory_mib,
    parse_ratio,
)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "hub_config" / "gpushare.yaml"
VALIDATOR = jsonschema.Draft202012Validator(json_schema())


def schema_ok(doc: object) -> bool:
    return VALIDATOR.is_valid(doc)


def loader_ok(doc: object) -> bool:
    return check_policy(yaml.safe_dump(doc, sort_keys=False), "m.yaml").policy is not None


def test_the_schema_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(json_schema())


@pytest.mark.parametrize("path", ["jupyter_gpushare/policy/policy.schema.json",
                                  "hub_config/gpushare.schema.json"])
def test_published_schemas_are_generated_from_the_loader(path: str) -> None:
    published = json.loads((ROOT / path).read_text())
    assert published == json_schema(), (
        f"{path} is stale: run jupyter-gpushare policy-schema -o {path}")


def test_the_example_names_its_schema() -> None:
    first = EXAMPLE.read_text().splitlines()[0]
    assert first == "# yaml-language-server: $schema=./gpushare.schema.json"


def test_the_cli_prints_the_schema() -> None:
    out = subprocess.run([sys.executable, "-m", "jupyter_gpushare.cli", "policy-schema"],
                         check=True, capture_output=True, text=True).stdout
    assert json.loads(out) == json_schema()


@pytest.mark.parametrize("text", [EXAMPLE.read_text(), BASE, RULES_POLICY],
                         ids=["example", "test_policy", "test_rules"])
def test_the_schema_accepts_what_the_loader_accepts(text: str) -> None:
    assert check_policy(text).policy is not None
    errors = [e.message for e in VALIDATOR.iter_errors(yaml.safe_load(text))]
    assert errors == []


# ------------------------------------------- mutations of every mapping of the example


def _sections(node: object, shape: S.Shape, where: tuple[Any, ...]
              ) -> Iterator[tuple[tuple[Any, ...], S.Section]]:
    """Every mapping of ``node`` with the section that describes it."""
    if isinstance(shape, S.Section) and isinstance(node, dict):
        yield where, shape
        for key in shape.keys:
            if key.name in node:
                yield from _sections(node[key.name], key.shape, (*where, key.name))
    elif isinstance(shape, S.MapOf) and isinstance(node, dict):
        for name, item in node.items():
            yield from _sections(item, shape.item, (*where, name))
    elif isinstance(shape, S.ListOf) and isinstance(node, list):
        for i, item in enumerate(node):
            yield from _sections(item, shape.item, (*where, i))
    elif isinstance(shape, S.Either):
        for option in shape.options:
            yield from _sections(node, option, where)


def _at(doc: Any, where: tuple[Any, ...]) -> Any:
    for step in where:
        doc = doc[step]
    return doc


def _mutations() -> Iterator[tuple[str, Any]]:
    base = yaml.safe_load(EXAMPLE.read_text())
    for where, section in _sections(base, S.POLICY, ()):
        label = ".".join(str(w) for w in where) or "<top>"
        doc = copy.deepcopy(base)
        _at(doc, where)["zz_typo"] = 1
        yield f"{label}: unknown key", doc
        for key in section.keys:
            if key.required:
                doc = copy.deepcopy(base)
                del _at(doc, where)[key.name]
                yield f"{label}: without {key.name}", doc
            if isinstance(key.shape, S.Value) and key.name in _at(base, where):
                doc = copy.deepcopy(base)
                _at(doc, where)[key.name] = [[1]]  # a value no field accepts
                yield f"{label}.{key.name}: wrong kind", doc


MUTATIONS = list(_mutations())


def test_mutations_cover_every_section() -> None:
    labels = " ".join(label for label, _ in MUTATIONS)
    for part in ("inventory.simulated.0.gpu_memory", "pools.train.mode", "priority_classes",
                 "teams.vision.quotas.train.explicit_requests", "teams.vision.admins",
                 "profiles.3.priorities", "profiles.0.gpu.fraction"):
        assert part in labels, part
    assert len(MUTATIONS) > 150


@pytest.mark.parametrize(("label", "doc"), MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_what_the_loader_rejects_the_schema_rejects(label: str, doc: Any) -> None:
    assert not loader_ok(doc), f"the loader accepted {label}"
    assert not schema_ok(doc), f"the schema accepted {label}"


@pytest.mark.parametrize("text", [
    "pools: {}",                                            # required sections missing
    BASE.replace("{mode: exclusive}", "{mode: exclusiv}"),   # not one of the modes
    BASE.replace("memory_headroom: 20%", "memory_headroom: 0.95"),
    BASE.replace("count: 4}", "count: 0}"),
    BASE.replace("{value: 500}", "{value: high}"),
    BASE.replace("borrow_limit: 1}", "borrow_limit: -1}"),
    BASE.replace("slug: t1", "slug: T_1"),
    BASE.replace("memory: 80GiB", "memory: 80 gigs"),
    BASE.replace("checkpoint_required_after: 2h", "checkpoint_required_after: soon"),
    BASE.replace("gpu: {fraction: 1/4}", "gpu: {fraction: 1/0}"),
    BASE.replace("gpu: {fraction: 1/4}", "gpu: quarter"),
    BASE.replace("shared: {guaranteed: 1}", "shared: {guaranteed: 1, explicit_requests: 1}"),
])
def test_hand_picked_errors_are_rejected_by_both(text: str) -> None:
    doc = yaml.safe_load(text)
    assert check_policy(text).policy is None
    assert not schema_ok(doc)


# ----------------------------------------------------------------------- unit texts


def _accepts(parse: Any, text: str) -> bool:
    try:
        parse(text)
    except UnitError:
        return False
    return True


UNIT_TEXTS = st.text(alphabet="0123456789 ./%_+-eEkKmMgGtTiIbBhdsw\t", max_size=12)


@pytest.mark.parametrize(("parse", "pattern"), [
    (parse_memory_mib, S.MEMORY_PATTERN),
    (parse_cpu_milli, S.CPU_PATTERN),
    (parse_duration_s, S.DURATION_PATTERN),
    (parse_ratio, S.RATIO_PATTERN),
], ids=["memory", "cpu", "duration", "ratio"])
@settings(max_examples=1000, deadline=None)
@given(text=UNIT_TEXTS)
def test_unit_patterns_match_the_parsers(parse: Any, pattern: str, text: str) -> None:
    # jsonschema matches with re.search, as here; the parsers' positive checks (memory
    # > 0) live in the converters and in the number branches, not in the text pattern
    assert (re.search(pattern, text) is not None) == _accepts(parse, text), repr(text)


@pytest.mark.parametrize(("pattern", "good", "bad"), [
    (S.MEMORY_PATTERN, ["80GiB", "512Mi", "1.5Ti", "16G", " 4 kb "], ["80 gigs", "1PiB", "-1G"]),
    (S.DURATION_PATTERN, ["8h", "1h30m", "1 h 30 m", "90s", "2W"], ["soon", "8", "h", "1h-"]),
    (S.RATIO_PATTERN, ["1/4", "25%", "0.25", ".5", "1e-3", "+1/2", "25 %"],
     ["1/0", "1 / 4", "-1/4", "a/b", "%"]),
])
def test_unit_patterns_by_example(pattern: str, good: list[str], bad: list[str]) -> None:
    assert [g for g in good if not re.search(pattern, g)] == []
    assert [b for b in bad if re.search(pattern, b)] == []


# ------------------------------------------------------------ the loader never crashes


_LEAVES = (st.none() | st.booleans() | st.integers(-10**30, 10**30)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8)
           | st.sampled_from(["1/0", "1e999", "9" * 400 + "G", "-1", "0", "none", "25%", "8h"]))
_VALUES = st.recursive(_LEAVES, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
_PLACES = [where for where, _ in _sections(yaml.safe_load(EXAMPLE.read_text()), S.POLICY, ())]


@settings(max_examples=150, deadline=None)
@given(where=st.sampled_from(_PLACES), key=st.text(max_size=12) | st.sampled_from(
    sorted({k.name for _, sec in _sections(yaml.safe_load(EXAMPLE.read_text()), S.POLICY, ())
            for k in sec.keys})), value=_VALUES)
def test_any_value_anywhere_gives_issues_not_a_crash(where: tuple[Any, ...], key: str,
                                                     value: Any) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    _at(doc, where)[key] = value
    check = check_policy(yaml.safe_dump(doc), "f.yaml")  # must not raise
    assert check.policy is not None or check.errors
    for issue in check.errors:
        assert issue.message and issue.file == "f.yaml"
