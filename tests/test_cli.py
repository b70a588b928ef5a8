"""The jupyter-gpushare command: check-policy exit codes and output, and the registry."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_gpushare import cli

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "hub_config" / "gpushare.yaml"
BAD = """\
pools:
  train: {mode: exclusive}
priority_classes:
  interactive: {value: 500}
inventory:
  nodes:
    - {name: n1, pool: trian, cpu: 8, memory: 64GiB, gpus: [{model: A100, memory: 80GiB}]}
teams: {}
profiles:
  - {slug: t1, pool: train, gpu: {fraction: 2}}
"""


def test_check_policy_prints_summary_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check-policy", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "OK" in out and "Pools (capacity)" in out and "Guarantees per pool" in out
    assert "Profiles per team" in out


def test_check_policy_prints_every_error_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    assert cli.main(["check-policy", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:7: inventory.nodes[0].pool: unknown pool 'trian'" in err
    assert f"{bad}:10: profiles[0].gpu" in err


def test_check_policy_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check-policy", "/nonexistent/policy.yaml"]) == 2
    assert "cannot read the file" in capsys.readouterr().err


def test_no_subcommand_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "check-policy" in capsys.readouterr().out


def test_registry_accepts_new_subcommands(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "COMMANDS", dict(cli.COMMANDS))

    def add(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("name")

    def run(args: argparse.Namespace) -> int:
        print(f"hello {args.name}")
        return 3

    cli.register(cli.Command("hello", "Say hello", add, run))
    assert cli.main(["hello", "world"]) == 3
    assert "hello world" in capsys.readouterr().out


def test_broken_command_module_is_skipped(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "COMMAND_MODULES", ["jupyter_gpushare.no_such_module"])
    assert cli.main(["check-policy", "-q", str(EXAMPLE)]) == 0
    assert "skipping commands of jupyter_gpushare.no_such_module" in capsys.readouterr().err


def _script(name: str) -> str:
    found = Path(sys.executable).parent / name
    if found.exists():
        return str(found)
    which = shutil.which(name)
    if which is None:
        pytest.skip(f"{name} is not installed (pip install -e .)")
    return which


def test_console_script_as_a_real_process(tmp_path: Path) -> None:
    script = _script("jupyter-gpushare")
    good = subprocess.run([script, "check-policy", str(EXAMPLE)], capture_output=True,
                          text=True, timeout=60)
    assert good.returncode == 0, good.stderr
    assert "Guarantees per pool" in good.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    result = subprocess.run([script, "check-policy", str(bad)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2
    assert "unknown pool 'trian'" in result.stderr


def test_jupyter_gpushare_via_jupyter() -> None:
    jupyter = _script("jupyter")
    _script("jupyter-gpushare")
    result = subprocess.run([jupyter, "gpushare", "check-policy", "-q", str(EXAMPLE)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_check_policy_reports_a_typo_and_an_unknown_team_in_one_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # issue 8 item 18: both show in the first run, not the second after fixing the typo
    text = EXAMPLE.read_text()
    text = text.replace("    memory_headroom: 20%\n    description: Fractions",
                        "    memory_headrom: 20%\n    description: Fractions", 1)
    text = text.replace("    teams: [vision, nlp]\n", "    teams: [vision, nlpp]\n", 1)
    path = tmp_path / "p.yaml"
    path.write_text(text)
    assert cli.main(["check-policy", str(path)]) == 2
    err = capsys.readouterr().err
    assert "pools.interactive.memory_headrom: unknown key (did you mean 'memory_headroom'?)" in err
    assert "teams[1]: unknown team 'nlpp'" in err and "did you mean 'nlp'?" in err
    assert "2 errors" in err


def test_policy_schema_command_writes_the_schema(tmp_path: Path) -> None:
    import json

    from jupyter_gpushare.policy import json_schema

    out = tmp_path / "schema.json"
    assert cli.main(["policy-schema", "-o", str(out)]) == 0
    assert json.loads(out.read_text()) == json_schema()


def test_python_m_cli_lists_the_registered_subcommands() -> None:
    """``python -m jupyter_gpushare.cli`` runs the module as ``__main__``; the subcommands
    that command modules register into ``jupyter_gpushare.cli`` are there all the same."""
    result = subprocess.run([sys.executable, "-m", "jupyter_gpushare.cli", "--help"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for name in ("check-policy", "policy-schema", "report", "plan", "job"):
        assert re.search(rf"^ +{name}\b", result.stdout, re.M), (name, result.stdout)
