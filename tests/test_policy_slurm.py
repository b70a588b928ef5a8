"""The policy's optional ``slurm:`` section (shards per GPU, partition): defaults, values,
line-numbered errors, and the JSON Schema agreeing with the loader."""

from __future__ import annotations

import jsonschema
import pytest
import yaml
from test_policy import BASE, issues, only

from jupyter_gpushare.core.model import SlurmOptions
from jupyter_gpushare.policy import json_schema, parse_policy

VALIDATOR = jsonschema.Draft202012Validator(json_schema())
LINE = BASE.count("\n") + 1  # the line of "slurm:" when appended to BASE


def test_absent_section_gives_the_defaults() -> None:
    policy = parse_policy(BASE)
    assert policy.slurm == SlurmOptions(shards_per_gpu=8, partition=None)
    assert policy.slurm.shards_per_gpu == 8


def test_values_are_read_onto_the_policy() -> None:
    policy = parse_policy(BASE + "slurm:\n  shards_per_gpu: 4\n  partition: gpu-a\n")
    assert policy.slurm == SlurmOptions(shards_per_gpu=4, partition="gpu-a")
    with pytest.raises(AttributeError):
        policy.slurm.shards_per_gpu = 2  # type: ignore[misc]  # frozen
    assert parse_policy(BASE + "slurm:\n  partition: p1\n").slurm.shards_per_gpu == 8
    assert parse_policy(BASE + "slurm:\n").slurm == SlurmOptions()


@pytest.mark.parametrize(("body", "path", "line", "words"), [
    ("  shards_per_gpu: 0\n", "slurm.shards_per_gpu", LINE + 1, "greater than 0"),
    ("  shards_per_gpu: -3\n", "slurm.shards_per_gpu", LINE + 1, "greater than 0"),
    ("  shards_per_gpu: 2.5\n", "slurm.shards_per_gpu", LINE + 1, "a whole number"),
    ("  shards_per_gpu: eight\n", "slurm.shards_per_gpu", LINE + 1, "a whole number"),
    ("  shards_per_gpu: 4\n  partition: 'a b'\n", "slurm.partition", LINE + 2, "Slurm name"),
    ("  shard_per_gpu: 4\n", "slurm.shard_per_gpu", LINE + 1, "did you mean 'shards_per_gpu'"),
])
def test_bad_values_name_the_field_and_line(body: str, path: str, line: int,
                                            words: str) -> None:
    text = BASE + "slurm:\n" + body
    issue = only(issues(text), path)
    assert issue.line == line and words in issue.message, str(issue)
    assert not VALIDATOR.is_valid(yaml.safe_load(text))  # the schema refuses it too


def test_not_a_mapping_is_an_error() -> None:
    issue = only(issues(BASE + "slurm: 8\n"), "slurm")
    assert issue.line == LINE and "mapping" in issue.message


def test_the_schema_accepts_what_the_loader_accepts() -> None:
    for text in (BASE, BASE + "slurm:\n  shards_per_gpu: 16\n  partition: gpu\n"):
        parse_policy(text)
        assert VALIDATOR.is_valid(yaml.safe_load(text))
    props = json_schema()["properties"]["slurm"]["anyOf"][0]["properties"]
    inner = props["shards_per_gpu"]["anyOf"][0]
    assert (inner["type"], inner["minimum"], inner["default"]) == ("integer", 1, 8)
