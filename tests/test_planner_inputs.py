"""Bad planning inputs get every error with file and line; admins' own card files."""

from __future__ import annotations

from pathlib import Path

import pytest

from jupyter_gpushare import cli
from jupyter_gpushare.planner import PlanError, make_plan, parse_plan_input, read_plan_file

GOOD = """\
cards: {default: H100-SXM}
racks: {power: 17kW}
teams:
  a:
    work:
      - {kind: inference, model: llama-2-7b, concurrent: 1}
"""


def _errors(text: str, filename: str = "teams.yaml") -> list[str]:
    with pytest.raises(PlanError) as info:
        parse_plan_input(text, filename)
    return [str(e) for e in info.value.errors]


def test_good_minimal_input_plans() -> None:
    plan = make_plan(parse_plan_input(GOOD, "teams.yaml"))
    assert plan.now.cards == 1


def test_every_error_has_file_line_and_field() -> None:
    text = """\
organisation: Bad
cards:
  default: H100-SXN
racks:
  power: lots
teams:
  a:
    work:
      - kind: trianing
        model: llama-2-7b
        concurrent: 1
      - kind: inference
        model: llama-2-7c
        concurrent: 0
      - kind: training
        model: llama-2-7b
        concurrent: 1
        requests: 4
  b:
    wrok: []
"""
    errors = _errors(text)
    assert "teams.yaml:3: cards.default: unknown card 'H100-SXN'" in errors[0]
    assert "did you mean 'H100-SXM'?" in errors[0]
    assert any(e.startswith("teams.yaml:5: racks.power: got 'lots' (expected a power") for e in
               errors)
    assert any(e.startswith("teams.yaml:9: teams.a.work[0].kind: got 'trianing'") and
               "did you mean 'training'?" in e for e in errors)
    assert any(e.startswith("teams.yaml:13: teams.a.work[1].model: unknown model 'llama-2-7c'")
               for e in errors)
    assert any(e.startswith("teams.yaml:14: teams.a.work[1].concurrent") for e in errors)
    assert any(e.startswith("teams.yaml:18: teams.a.work[2].requests: only used by inference")
               for e in errors)
    assert any(e.startswith("teams.yaml:20: teams.b.wrok: unknown key (did you mean 'work'?)")
               for e in errors)
    # sorted by line, all at once
    lines = [int(e.split(":")[1]) for e in errors]
    assert lines == sorted(lines) and len(errors) >= 7


def test_malformed_yaml_and_duplicate_keys_name_the_line() -> None:
    assert _errors("teams:\n  a: [\n")[0].startswith("teams.yaml:3: malformed YAML")
    dup = GOOD + "racks: {power: 1kW}\n"
    assert any(e.startswith("teams.yaml:7: racks: duplicate key") for e in _errors(dup))


def test_missing_sections_and_card_for_a_used_pool() -> None:
    errors = _errors("teams:\n  a:\n    work:\n      - {kind: debugging, memory: 4GiB, "
                     "concurrent: 2}\ncards: {train: H100-SXM}\nracks: {power: 10kW}\n")
    assert any("teams.yaml:5: cards: no card for pool(s) debug" in e for e in errors)
    errors = _errors("organisation: x\n")
    assert any(e.endswith("teams: required field is missing") for e in errors)
    assert any(e.endswith("cards: required field is missing") for e in errors)


def test_lora_is_not_a_training_method_and_kv_heads_must_divide() -> None:
    text = GOOD + """\
  b:
    work:
      - {kind: training, method: lora, model: llama-2-7b, concurrent: 1}
models:
  odd: {params: 1B, layers: 4, hidden: 256, heads: 8, kv_heads: 3}
"""
    errors = _errors(text)
    assert any("teams.yaml:9: teams.b.work[0].method: got 'lora'" in e for e in errors)
    assert any("teams.yaml:11: models.odd.kv_heads: got 3" in e for e in errors)


def test_admins_card_file_adds_and_overrides_cards(tmp_path: Path) -> None:
    extra = tmp_path / "my-cards.yaml"
    extra.write_text("""\
cards:
  X1:
    vendor: acme
    model: Acme X1
    memory: 32GiB
    bf16_tflops: 100
    power_w: 300W
    source: https://acme.example/x1
""")
    teams = tmp_path / "teams.yaml"
    teams.write_text(GOOD.replace("H100-SXM", "X1") + "catalogues: [my-cards.yaml]\n")
    plan = make_plan(read_plan_file(teams))
    assert plan.now.pools[0].card.model == "Acme X1"
    assert plan.now.pools[0].card.vendor == "acme"


def test_bad_card_file_names_its_own_file_and_line(tmp_path: Path) -> None:
    extra = tmp_path / "my-cards.yaml"
    extra.write_text("cards:\n  X1:\n    vendor: acme\n    model: Acme X1\n    memory: big\n"
                     "    bf16_tflops: 100\n    power_w: 300\n")
    teams = tmp_path / "teams.yaml"
    teams.write_text(GOOD)
    with pytest.raises(PlanError) as info:
        read_plan_file(teams, (extra,))
    assert str(info.value.errors[0]).startswith(f"{extra}:5: cards.X1.memory: got 'big'")


def test_cli_plan_reports_errors_and_exits_1(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "teams.yaml"
    bad.write_text(GOOD.replace("concurrent: 1", "concurrent: many"))
    assert cli.main(["plan", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:6: teams.a.work[0].concurrent: got 'many' (expected a whole number" in err
    assert cli.main(["plan", str(tmp_path / "missing.yaml")]) == 1
    assert "cannot read the file" in capsys.readouterr().err
