"""Small notebooks for the batch-job tests and benchmark (nbformat 4 JSON dicts)."""

from __future__ import annotations

from typing import Any


def _cell(source: str, tags: list[str] | None = None) -> dict[str, Any]:
    return {
        "cell_type": "code",
        "execution_count": None,
        "metadata": {"tags": tags or []},
        "outputs": [],
        "source": source,
    }


def notebook(*cells: dict[str, Any]) -> dict[str, Any]:
    return {
        "cells": list(cells),
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def simple(greeting: str = "hello") -> dict[str, Any]:
    """Prints a parameter, the job's id and the GPUs it may see; writes a marker file."""
    return notebook(
        _cell(f"greeting = {greeting!r}\nrepeat = 1", ["parameters"]),
        _cell(
            "import os\n"
            "print(greeting * repeat, os.environ['GPUSHARE_JOB_ID'])\n"
            "print('CUDA_VISIBLE_DEVICES=' + repr(os.environ.get('CUDA_VISIBLE_DEVICES')))\n"
            "open('marker-' + os.environ['GPUSHARE_JOB_ID'], 'w').write(greeting)"
        ),
    )


def raising() -> dict[str, Any]:
    """Fails in its third cell with a ValueError."""
    return notebook(
        _cell("x = 1", ["parameters"]),
        _cell("print('before the error')"),
        _cell("raise ValueError(f'bad value {x}')"),
        _cell("print('never runs')"),
    )


def sleeping(seconds: float = 60) -> dict[str, Any]:
    return notebook(_cell(f"seconds = {seconds}", ["parameters"]),
                    _cell("import time\nprint('sleeping', flush=True)\ntime.sleep(seconds)"))


def counting(steps: int = 20, delay: float = 0.5) -> dict[str, Any]:
    """Counts ``steps`` steps into a checkpoint file and resumes from it; each attempt
    appends "<attempt> <start>" to attempts.txt in the checkpoint dir, and a SIGTERM that
    reaches the kernel appends the attempt to ``sigterm`` there and stops the cell."""
    return notebook(
        _cell(f"steps = {steps}\ndelay = {delay}", ["parameters"]),
        _cell(
            "import json, os, signal, time\n"
            "d = os.environ['GPUSHARE_CHECKPOINT_DIR']\n"
            "def _term(*_):\n"
            "    with open(os.path.join(d, 'sigterm'), 'a') as f:\n"
            "        f.write(os.environ['GPUSHARE_JOB_ATTEMPT'] + '\\n')\n"
            "    raise SystemExit(143)\n"
            "signal.signal(signal.SIGTERM, _term)\n"
            "ck = os.path.join(d, 'count.json')\n"
            "done = json.load(open(ck))['done'] if os.path.exists(ck) else 0\n"
            "start = done\n"
            "with open(os.path.join(d, 'attempts.txt'), 'a') as f:\n"
            "    f.write(os.environ['GPUSHARE_JOB_ATTEMPT'] + ' ' + str(done) + '\\n')\n"
            "while done < steps:\n"
            "    time.sleep(delay)\n"
            "    done += 1\n"
            "    json.dump({'done': done}, open(ck + '.tmp', 'w'))\n"
            "    os.replace(ck + '.tmp', ck)\n"
            "    print('step', done, flush=True)\n"
            "print('resumed from', start, 'finished', done)"
        ),
    )


def stubborn(seconds: float = 120) -> dict[str, Any]:
    """Ignores SIGTERM (a job that does not stop when told): only SIGKILL ends it."""
    return notebook(
        _cell(f"seconds = {seconds}", ["parameters"]),
        _cell("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "print('ignoring SIGTERM', flush=True)\ntime.sleep(seconds)"),
    )
