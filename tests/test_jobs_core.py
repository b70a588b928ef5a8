"""The pure job rules: states and transitions, validation, failures, restart verdicts."""

from __future__ import annotations

import itertools

import pytest

from jupyter_gpushare.core.jobs import (
    TERMINAL,
    TRANSITIONS,
    JobLimits,
    JobState,
    RuntimeRules,
    TransitionError,
    Verdict,
    cell_error,
    check_transition,
    effective_runtime,
    final_state,
    may_requeue,
    parse_cli_parameter,
    restart_verdict,
    strip_ansi,
    validate_notebook,
    validate_parameters,
    validate_runtime,
)

LIMITS = JobLimits()
NB = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
    {"cell_type": "code", "source": "x = 1", "metadata": {}, "outputs": []}]}


def test_terminal_states_are_never_left_and_every_state_is_reachable() -> None:
    for state in TERMINAL:
        assert TRANSITIONS[state] == frozenset()
        for other in JobState:
            with pytest.raises(TransitionError):
                check_transition(state, other)
    reached = {JobState.QUEUED}
    frontier = [JobState.QUEUED]
    while frontier:
        for nxt in TRANSITIONS[frontier.pop()]:
            if nxt not in reached:
                reached.add(nxt)
                frontier.append(nxt)
    assert reached == set(JobState)


def test_preempted_goes_back_to_queued_and_nothing_skips_running() -> None:
    check_transition(JobState.RUNNING, JobState.PREEMPTED)
    check_transition(JobState.PREEMPTED, JobState.QUEUED)
    for old, new in itertools.product(JobState, JobState):
        if new is JobState.SUCCEEDED:
            assert (new in TRANSITIONS[old]) == (old is JobState.RUNNING), old
    with pytest.raises(TransitionError):
        check_transition(JobState.QUEUED, JobState.RUNNING)


def test_notebook_validation_names_the_field() -> None:
    assert validate_notebook(NB, 100, LIMITS) is None
    for bad in ({"cells": []}, [], {"nbformat": 3, "cells": []},
                {"nbformat": 4, "cells": [{"cell_type": "python"}]}):
        err = validate_notebook(bad, 10, LIMITS)
        assert err is not None and err.field == "notebook" and err.status == 400
    big = validate_notebook(NB, LIMITS.max_notebook_bytes + 1, LIMITS)
    assert big is not None and big.status == 413


def test_parameters_validation() -> None:
    assert validate_parameters({"lr": 0.1, "name": "x", "layers": [1, 2]}, LIMITS) is None
    assert validate_parameters(None, LIMITS) is None
    assert validate_parameters([1], LIMITS).field == "parameters"  # type: ignore[union-attr]
    assert validate_parameters({"not valid": 1}, LIMITS).field.startswith("parameters.")  # type: ignore[union-attr]
    assert validate_parameters({"x": float("nan")}, LIMITS) is not None
    deep: object = 1
    for _ in range(20):
        deep = [deep]
    assert validate_parameters({"x": deep}, LIMITS).field == "parameters.x"  # type: ignore[union-attr]
    huge = {"x": "a" * (LIMITS.max_parameters_bytes + 1)}
    assert "bytes" in validate_parameters(huge, LIMITS).message  # type: ignore[union-attr]
    assert parse_cli_parameter("3") == 3 and parse_cli_parameter("abc") == "abc"
    assert parse_cli_parameter('[1, "a"]') == [1, "a"]


def test_runtime_limits_and_checkpoint_rule() -> None:
    research = RuntimeRules(3600, True, 600, 30)
    assert effective_runtime(None, research, LIMITS) == 3600  # the profile's max lifetime
    err = validate_runtime(None, False, research, LIMITS)
    assert err is not None and err.field == "checkpoint"
    assert validate_runtime(None, True, research, LIMITS) is None
    assert validate_runtime(300, False, research, LIMITS) is None  # short: no checkpoint needed
    over = validate_runtime(7200, True, research, LIMITS)
    assert over is not None and over.field == "max_runtime"
    training = RuntimeRules(None, False, None, 30)
    assert validate_runtime(86400, False, training, LIMITS) is None
    assert validate_runtime(LIMITS.max_runtime_s + 1, False, training, LIMITS) is not None
    assert validate_runtime(0, False, training, LIMITS).field == "max_runtime"  # type: ignore[union-attr]


def test_cell_error_strips_ansi_and_keeps_one_line() -> None:
    tb = ["\x1b[0;31m---------\x1b[0m", "\x1b[0;31mValueError\x1b[0m: bad\x1b[1;32m value\x1b[0m"]
    err = cell_error(2, 3, "ValueError", "bad value\nsecond line", tb, "raise ValueError()")
    assert "\x1b" not in err.traceback and "ValueError: bad value" in err.traceback
    assert err.evalue == "bad value"
    assert err.summary == "cell 3 failed: ValueError: bad value"
    assert strip_ansi("\x1b[38;5;28mok\x1b[39m") == "ok"


def test_restart_verdicts_never_start_twice() -> None:
    r = restart_verdict
    assert r(JobState.ADMITTED, False, False, False, False, 1, 5) is Verdict.START
    # anything that may have started is never started again
    for state in (JobState.ADMITTED, JobState.RUNNING):
        assert r(state, True, True, False, False, 1, 5) is Verdict.REATTACH
        assert r(state, True, None, False, False, 1, 5) is Verdict.REATTACH
        assert r(state, True, False, True, False, 1, 5) is Verdict.FINISH
        assert r(state, True, False, False, True, 1, 5) is Verdict.REQUEUE
        assert r(state, True, False, False, True, 5, 5) is Verdict.FAIL
        assert r(state, True, False, False, False, 1, 5) is Verdict.FAIL


def test_final_state_and_requeue_bound() -> None:
    assert final_state(0, False, False) is JobState.SUCCEEDED
    assert final_state(0, True, False) is JobState.SUCCEEDED  # it finished before the kill
    assert final_state(143, True, False) is JobState.PREEMPTED
    assert final_state(None, True, False) is JobState.PREEMPTED
    assert final_state(1, False, False) is JobState.FAILED
    assert final_state(0, False, True) is JobState.CANCELLED
    assert may_requeue(1, 2) and not may_requeue(2, 2)
