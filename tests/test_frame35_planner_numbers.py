"""A planning input's numbers are finite: an infinite or overflowing one is an error naming
its file, line and field, never a crash of the planner (``params: inf`` raised
OverflowError from the memory arithmetic) nor an infinite rack or card."""

from __future__ import annotations

import pytest

from jupyter_gpushare.planner import PlanError, make_plan, parse_plan_input
from jupyter_gpushare.planner.reader import parse_catalogue

INPUT = """\
cards: {{default: H100-SXM}}
racks: {{power: {power}}}
models:
  big: {{params: {params}, layers: 32, hidden: 4096, heads: 32}}
teams:
  a:
    work:
      - {{kind: inference, model: big, concurrent: 1}}
"""
GOOD = {"params": "7B", "power": "17kW"}
CARDS = """\
cards:
  mine: {{vendor: nvidia, model: H100, memory: 80GiB, bf16_tflops: {tflops}, power_w: 700W}}
"""


def _first_error(**bad: object) -> str:
    with pytest.raises(PlanError) as info:
        parse_plan_input(INPUT.format(**dict(GOOD, **bad)), "teams.yaml")
    return str(info.value.errors[0])


def test_the_good_input_plans() -> None:
    plan = make_plan(parse_plan_input(INPUT.format(**GOOD), "teams.yaml"))
    assert plan.now.cards == 1


@pytest.mark.parametrize("params", ["inf", ".inf", "1e400", "9" * 400, "nan"])
def test_an_infinite_parameter_count_is_refused(params: str) -> None:
    error = _first_error(params=params)
    assert error.startswith("teams.yaml:4: models.big.params: got "), error
    assert "expected a parameter count" in error


@pytest.mark.parametrize("power", [".inf", "1e400"])
def test_an_infinite_rack_power_is_refused(power: str) -> None:
    error = _first_error(power=power)
    assert error.startswith("teams.yaml:2: racks.power: got "), error


@pytest.mark.parametrize("tflops", [".inf", "9" * 400])
def test_infinite_card_tflops_are_refused(tflops: str) -> None:
    assert parse_catalogue(CARDS.format(tflops=989), "cards.yaml", {}, {}) == []
    issues = parse_catalogue(CARDS.format(tflops=tflops), "cards.yaml", {}, {})
    assert len(issues) == 1, issues
    assert str(issues[0]).startswith("cards.yaml:2: cards.mine.bf16_tflops: got "), issues
    assert "finite number greater than 0" in str(issues[0])
