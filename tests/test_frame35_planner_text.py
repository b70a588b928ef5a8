"""The planning input's texts are read by the policy's own text converter: one line, bounded.

The organisation's name is written into the draft policy's first comment line; a name that
spans lines broke out of that comment into the policy itself (an extra top-level key the
admin never wrote). Such a text is now refused, with the file, line and field, as the policy
refuses it.
"""

from __future__ import annotations

import pytest

from jupyter_gpushare.planner import PlanError, draft_policy, make_plan, parse_plan_input
from jupyter_gpushare.policy import check_policy

INPUT = """\
organisation: {organisation}
cards: {{default: H100-SXM}}
racks: {{power: 17kW}}
teams:
  a:
    work:
      - {{kind: inference, model: llama-2-7b, concurrent: 1}}
"""


def _errors(text: str) -> list[str]:
    with pytest.raises(PlanError) as info:
        parse_plan_input(text, "teams.yaml")
    return [str(e) for e in info.value.errors]


def test_an_organisation_on_two_lines_is_refused_with_its_line() -> None:
    errors = _errors(INPUT.format(organisation='"Acme\\nbogus_section: 1"'))
    assert len(errors) == 1, errors
    assert errors[0].startswith("teams.yaml:1: organisation:"), errors
    assert "one line" in errors[0], errors


def test_an_overlong_organisation_is_refused() -> None:
    errors = _errors(INPUT.format(organisation="x" * 300))
    assert len(errors) == 1 and errors[0].startswith("teams.yaml:1: organisation:"), errors
    assert "at most 256 characters" in errors[0], errors


def test_a_one_line_organisation_heads_a_clean_draft_policy() -> None:
    plan = make_plan(parse_plan_input(INPUT.format(organisation="Acme Research"), "t.yaml"))
    text = draft_policy(plan)
    assert text.startswith("# Draft policy for Acme Research, written by")
    assert check_policy(text, "draft.yaml").errors == []


def test_a_work_that_is_no_list_is_refused_with_its_line() -> None:
    text = INPUT.format(organisation="Acme").replace(
        "    work:\n      - {kind: inference, model: llama-2-7b, concurrent: 1}\n", "    work: 5\n"
    )
    assert _errors(text) == ["teams.yaml:6: teams.a.work: got 5 (expected a list)"]
