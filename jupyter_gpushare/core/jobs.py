"""Batch jobs as pure rules: states, transitions, validation and restart verdicts.

A job is a notebook snapshot run by papermill under a grant. Its life is a small state
machine; every change of state is checked here (:func:`check_transition`) before the
broker writes it, so the history of a job read back from the database is always a
path through :data:`TRANSITIONS`::

    queued ──► admitted ──► running ──► succeeded | failed | cancelled | lost
      ▲   │        │           │
      │   └─► cancelled / failed└─► preempted ──► queued (attempt + 1)

``lost`` is only for a backend that truly cannot say what became of a job. Standard
library only, no I/O.
"""

from __future__ import annotations

import json
import keyword
import math
import re
import unicodedata
from dataclasses import dataclass
from enum import Enum
from typing import Any


class JobState(str, Enum):
    """Where a job is in its life."""

    QUEUED = "queued"
    ADMITTED = "admitted"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    LOST = "lost"


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.LOST})
"""States a job never leaves."""

ACTIVE = frozenset({JobState.ADMITTED, JobState.RUNNING})
"""States in which a job holds a grant."""

TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.ADMITTED, JobState.CANCELLED, JobState.FAILED}),
    JobState.ADMITTED: frozenset(
        {JobState.RUNNING, JobState.CANCELLED, JobState.FAILED, JobState.QUEUED,
         JobState.PREEMPTED}
    ),
    JobState.RUNNING: frozenset(
        {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.PREEMPTED,
         JobState.LOST, JobState.QUEUED}
    ),
    JobState.PREEMPTED: frozenset({JobState.QUEUED, JobState.CANCELLED, JobState.FAILED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
    JobState.LOST: frozenset(),
}


class TransitionError(ValueError):
    """A change of state the job model does not allow."""


def check_transition(old: JobState, new: JobState) -> None:
    """Raise :class:`TransitionError` unless ``old -> new`` is allowed."""
    if new not in TRANSITIONS[old]:
        raise TransitionError(f"a {old.value} job cannot become {new.value}")


# -- validation -------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobLimits:
    """What a client may make the broker store for one job (all configurable)."""

    max_notebook_bytes: int = 5 * 1024 * 1024
    max_parameters_bytes: int = 16 * 1024
    max_parameters: int = 64
    max_queued_per_user: int = 50
    default_max_runtime_s: int = 4 * 3600
    max_runtime_s: int = 7 * 24 * 3600


@dataclass(frozen=True)
class FieldError:
    """A refusal that names the offending field (the HTTP layer makes it a 4xx)."""

    field: str
    message: str
    status: int = 400


MAX_PARAMETER_NAME = 100
"""Longest parameter name accepted (characters)."""


def parameter_name_error(name: Any) -> str | None:
    """Why ``name`` cannot be a papermill parameter (it becomes ``name = value`` in the
    injected cell), or ``None``: it must be a Python identifier, unchanged by the NFKC
    normalisation Python applies to identifiers, and no keyword (``class``, ``None``,
    ``True`` would make the injected cell a ``SyntaxError``). Soft keywords (``match``,
    ``case``, ``type``, ``_``) are ordinary names when assigned, so they are accepted."""
    if not isinstance(name, str) or not name:
        return "a parameter name must be a non-empty string"
    if len(name) > MAX_PARAMETER_NAME:
        return f"a parameter name has at most {MAX_PARAMETER_NAME} characters"
    if not name.isidentifier() or unicodedata.normalize("NFKC", name) != name:
        return "a parameter name must be a Python identifier (letters, digits, _)"
    if keyword.iskeyword(name):
        return f"a parameter name cannot be the Python keyword {name!r}"
    return None


def _shown(name: Any) -> str:
    text = str(name)
    return text if len(text) <= 40 else text[:40] + "…"


def _json_depth(value: Any, depth: int = 0) -> int:
    if depth > 16:
        return depth
    if isinstance(value, dict):
        return max((_json_depth(v, depth + 1) for v in value.values()), default=depth + 1)
    if isinstance(value, list):
        return max((_json_depth(v, depth + 1) for v in value), default=depth + 1)
    return depth


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


def validate_parameters(params: Any, limits: JobLimits) -> FieldError | None:
    """Papermill parameters: a JSON object of identifier -> JSON value, bounded in size."""
    if params is None:
        return None
    if not isinstance(params, dict):
        return FieldError("parameters", "parameters must be an object {name: value}")
    if len(params) > limits.max_parameters:
        return FieldError("parameters", f"at most {limits.max_parameters} parameters")
    for name, value in params.items():
        why = parameter_name_error(name)
        if why is not None:
            return FieldError(f"parameters.{_shown(name)}", why)
        if _json_depth(value) > 8 or not _finite(value):
            return FieldError(
                f"parameters.{name}", "a parameter value must be plain JSON, at most 8 deep"
            )
    try:
        size = len(json.dumps(params, allow_nan=False))
    except (TypeError, ValueError):
        return FieldError("parameters", "parameters must be plain JSON values")
    if size > limits.max_parameters_bytes:
        return FieldError(
            "parameters", f"parameters take {size} bytes, at most {limits.max_parameters_bytes}"
        )
    return None


def parse_cli_parameter(value: str) -> Any:
    """``-p key value`` on the command line: JSON where it parses, else the plain string."""
    try:
        return json.loads(value)
    except ValueError:
        return value


def validate_notebook(nb: Any, size_bytes: int, limits: JobLimits) -> FieldError | None:
    """The snapshot must be a Jupyter notebook (nbformat 4) within the size limit."""
    if size_bytes > limits.max_notebook_bytes:
        return FieldError(
            "notebook",
            f"the notebook takes {size_bytes} bytes, at most {limits.max_notebook_bytes}",
            413,
        )
    if not isinstance(nb, dict):
        return FieldError("notebook", "the notebook must be a JSON object (an .ipynb file)")
    if nb.get("nbformat") != 4 or not isinstance(nb.get("cells"), list):
        return FieldError("notebook", "not a notebook: nbformat 4 with a list of cells expected")
    if not isinstance(nb.get("metadata", {}), dict):
        return FieldError("notebook", "not a notebook: metadata must be an object")
    for i, cell in enumerate(nb["cells"]):
        if not isinstance(cell, dict) or cell.get("cell_type") not in ("code", "markdown", "raw"):
            return FieldError("notebook", f"not a notebook: cell {i} has no valid cell_type")
    return None


MAX_KERNEL_NAME = 255


def kernel_name_of(nb: dict[str, Any]) -> str | FieldError:
    """The kernel a notebook names in ``metadata.kernelspec.name`` (papermill starts that
    one), or the :class:`FieldError` saying why it names none: a notebook without one would
    be admitted, hold its GPU share while the runner starts, then fail."""
    where = "notebook.metadata.kernelspec"
    metadata = nb.get("metadata")
    spec = metadata.get("kernelspec") if isinstance(metadata, dict) else None
    if spec is None:
        return FieldError(
            where, "the notebook has no metadata.kernelspec: open it in JupyterLab, "
            "choose a kernel and save it (papermill needs to know which kernel runs it)",
        )
    if not isinstance(spec, dict):
        return FieldError(where, "metadata.kernelspec must be an object with a name")
    name = spec.get("name")
    if not isinstance(name, str) or not name.strip():
        return FieldError(f"{where}.name", "metadata.kernelspec.name must name a kernel")
    if len(name) > MAX_KERNEL_NAME or "/" in name or "\\" in name or not name.isprintable():
        return FieldError(f"{where}.name", "metadata.kernelspec.name is not a kernel name")
    return name


@dataclass(frozen=True)
class RuntimeRules:
    """What the policy says about a job's runtime and checkpointing."""

    profile_max_s: int | None  # the profile's max lifetime
    priority_preemptible: bool
    checkpoint_required_after_s: int | None
    grace_period_s: int


def effective_runtime(asked: int | None, rules: RuntimeRules, limits: JobLimits) -> int:
    """The runtime limit a job runs under: what it asked, else the profile's or the default."""
    if asked is not None:
        return asked
    default = limits.default_max_runtime_s
    return min(default, rules.profile_max_s) if rules.profile_max_s else default


def validate_runtime(
    asked: int | None, checkpoint: bool, rules: RuntimeRules, limits: JobLimits
) -> FieldError | None:
    """A runtime above the profile's limit, or a long preemptible job without checkpoints."""
    if asked is not None and asked <= 0:
        return FieldError("max_runtime", "max_runtime must be a positive number of seconds")
    runtime = effective_runtime(asked, rules, limits)
    cap = min(limits.max_runtime_s, rules.profile_max_s or limits.max_runtime_s)
    if runtime > cap:
        return FieldError(
            "max_runtime",
            f"max_runtime {runtime}s is above the limit of {cap}s for this profile",
        )
    after = rules.checkpoint_required_after_s
    if rules.priority_preemptible and after is not None and runtime > after and not checkpoint:
        return FieldError(
            "checkpoint",
            f"a preemptible job running longer than {after}s must declare checkpointing "
            f"(checkpoint: true) and save its state in $GPUSHARE_CHECKPOINT_DIR; "
            f"asked {runtime}s",
        )
    return None


# -- failures ---------------------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\x1b[@-Z\\-_]")


def strip_ansi(text: str) -> str:
    """Remove terminal colour and cursor codes (IPython tracebacks are full of them)."""
    return _ANSI.sub("", text)


@dataclass(frozen=True)
class CellError:
    """Where and why a notebook failed, readable without a terminal."""

    cell_index: int | None  # index among all cells (0-based); None: not in a cell
    execution_count: int | None
    ename: str
    evalue: str
    traceback: str
    source: str = ""  # the first lines of the failing cell

    @property
    def summary(self) -> str:
        where = f"cell {self.cell_index + 1}" if self.cell_index is not None else "the notebook"
        line = f"{self.ename}: {self.evalue}" if self.evalue else self.ename
        return f"{where} failed: {line}"

    def to_json(self) -> dict[str, Any]:
        return {
            "cell_index": self.cell_index,
            "execution_count": self.execution_count,
            "ename": self.ename,
            "evalue": self.evalue,
            "traceback": self.traceback,
            "source": self.source,
            "summary": self.summary,
        }


def cell_error(
    cell_index: int | None, execution_count: int | None, ename: str, evalue: str,
    traceback: list[str] | str, source: str = "",
) -> CellError:
    """A :class:`CellError` with ANSI codes stripped and the evalue cut to one line."""
    tb = traceback if isinstance(traceback, str) else "\n".join(traceback)
    value = strip_ansi(evalue or "").strip().splitlines()
    return CellError(
        cell_index,
        execution_count,
        strip_ansi(ename or "Error").strip()[:200],
        (value[0] if value else "")[:500],
        strip_ansi(tb)[-20000:],
        "\n".join(source.splitlines()[:5])[:1000],
    )


# -- after a stop -----------------------------------------------------------------------------


class Verdict(str, Enum):
    """What the broker does with an unfinished job it finds on start."""

    REATTACH = "reattach"  # its runner still runs: watch it again
    FINISH = "finish"  # it ended meanwhile: record its true final state
    REQUEUE = "requeue"  # it died without a result and may run again
    FAIL = "fail"  # it died without a result and must not run again
    START = "start"  # admitted, never started: start it now


def restart_verdict(
    state: JobState, started: bool, alive: bool | None, has_result: bool, checkpoint: bool,
    attempt: int, max_attempts: int,
) -> Verdict:
    """Decide about an admitted or running job after the broker restarted.

    ``started``: the backend has a record of starting this attempt; ``alive``: its runner
    still runs (``None``: the backend cannot tell); ``has_result``: it wrote a final status.
    A job is never started twice: anything that may have started is reattached or settled.
    """
    if state is JobState.ADMITTED and not started:
        return Verdict.START
    if has_result:
        return Verdict.FINISH
    if alive or alive is None:
        return Verdict.REATTACH
    if checkpoint and attempt < max_attempts:
        return Verdict.REQUEUE
    return Verdict.FAIL


def final_state(exit_code: int | None, preempt_signalled: bool, cancelled: bool) -> JobState:
    """The state a finished runner leaves its job in."""
    if cancelled:
        return JobState.CANCELLED
    if exit_code == 0:
        return JobState.SUCCEEDED
    if preempt_signalled:
        return JobState.PREEMPTED
    return JobState.FAILED


def may_requeue(attempt: int, max_attempts: int) -> bool:
    """Whether a preempted job gets another attempt (bounded, so a job cannot loop forever)."""
    return attempt < max_attempts
