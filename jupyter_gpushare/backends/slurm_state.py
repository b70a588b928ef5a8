"""What Slurm says about a job, read into a :class:`~.base.RunStatus` (pure: no I/O).

The state comes from ``squeue --json`` (:mod:`.slurm_json`, where the installed Slurm answers
``--json``) or, as the fallback for an older Slurm, from the text of ``scontrol show job -o``
(both kept by slurmctld for ``MinJobAge`` after the end); the runner's ``status.json`` in
the attempt folder, when there, is the result (exit code, failing cell), since it knows what
happened inside the notebook. Slurm's
own end states without a ``status.json`` (the runner never got to write it: node failure,
out of memory, time limit, cancelled before start) become an error whose summary names the
Slurm state and reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..spawner.slurm_options import REASONS
from .base import RunStatus
from .slurm_args import SlurmNodeInfo, parse_node_gres

ALIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "REQUEUED",
                   "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT",
                   "RESV_DEL_HOLD", "STOPPED"})
ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                   "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED"})
NODE_LOST = frozenset({"NODE_FAIL", "BOOT_FAIL"})
WHY = {
    "COMPLETED": "the batch script ended",
    "FAILED": "the batch script failed",
    "CANCELLED": "the job was cancelled in Slurm",
    "TIMEOUT": "it ran past its Slurm time limit",
    "NODE_FAIL": "its node failed",
    "PREEMPTED": "Slurm preempted it",
    "OUT_OF_MEMORY": "it ran out of memory (Slurm's limit)",
    "BOOT_FAIL": "its node failed to boot",
    "DEADLINE": "it missed its deadline",
}


@dataclass(frozen=True)
class SlurmJob:
    """One job as ``scontrol show job -o`` prints it."""

    job_id: str
    name: str
    state: str
    reason: str
    exit_code: int | None
    signal: int | None
    nodes: str
    start: float | None
    end: float | None
    restarts: int = 0
    req_nodes: str = ""  # ReqNodeList: the node the job was asked to run on

    @property
    def alive(self) -> bool:
        return self.state in ALIVE or self.state == "COMPLETING"

    @property
    def queued(self) -> bool:
        return self.state in ("PENDING", "CONFIGURING", "REQUEUED")


def _time(text: str) -> float | None:
    if not text or text in ("Unknown", "None", "N/A"):
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def parse_scontrol_job(line: str) -> SlurmJob | None:
    """A job from one line of ``scontrol show job -o`` (None: not a job line). The fallback
    for a Slurm without ``--json``: a value with spaces (a job name, a path) is cut at its
    first space, and a later field is only safe from a value that looks like it because the
    first key wins (``JobName=x JobState=COMPLETED`` still fools it: name comes first)."""
    fields = _first_fields(line)
    if "JobId" not in fields:
        return None
    state = fields.get("JobState", "").split("+")[0]
    code: int | None = None
    sig: int | None = None
    exit_text = fields.get("ExitCode", "")
    if ":" in exit_text:
        a, _, b = exit_text.partition(":")
        if a.isdigit() and b.isdigit():
            code, sig = int(a), int(b)
    return SlurmJob(
        job_id=fields["JobId"], name=fields.get("JobName", ""), state=state,
        reason=fields.get("Reason", "None"), exit_code=code, signal=sig,
        nodes=fields.get("NodeList", ""), start=_time(fields.get("StartTime", "")),
        end=_time(fields.get("EndTime", "")),
        restarts=int(fields["Restarts"]) if fields.get("Restarts", "").isdigit() else 0,
        req_nodes="" if fields.get("ReqNodeList") in (None, "(null)") else fields["ReqNodeList"],
    )


def _first_fields(line: str) -> dict[str, str]:
    """``key=value`` words of one text line; the first of a key wins."""
    fields: dict[str, str] = {}
    for word in line.split():
        key, sep, value = word.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


def parse_scontrol_nodes(text: str) -> dict[str, SlurmNodeInfo]:
    """The nodes of ``scontrol show node -o`` (the fallback for a Slurm without ``--json``).
    The first key wins, so a drain reason written after ``State=`` (``Reason=disk full
    State=IDLE``) cannot pose as the node's state."""
    out: dict[str, SlurmNodeInfo] = {}
    for line in text.splitlines():
        fields = _first_fields(line)
        name = fields.get("NodeName")
        if not name:
            continue
        gpus, shards = parse_node_gres(fields.get("Gres", ""))
        parts = tuple(p for p in fields.get("Partitions", "").split(",") if p)
        out[name] = SlurmNodeInfo(name, gpus, shards, fields.get("State", ""), parts)
    return out


DEAD_NODE_WORDS = ("DOWN", "NOT_RESPONDING", "FAIL", "DRAIN", "POWERED_DOWN", "FUTURE")


def node_dead(state: str) -> bool:
    """Whether a node ``State=`` (``DOWN*``, ``IDLE+DRAIN``...) can start no job now."""
    words = state.upper().replace("*", "+NOT_RESPONDING").split("+")
    return any(w.startswith(DEAD_NODE_WORDS) for w in words)


IN_SERVICE_WORDS = ("IDLE", "MIXED", "ALLOCATED", "COMPLETING")


def node_in_service(state: str) -> bool:
    """Whether a node ``State=`` says Slurm has it back in service: ``IDLE``, ``MIXED`` or
    ``ALLOCATED`` (``COMPLETING``), without ``DOWN``, ``DRAIN``, ``FAIL`` or
    ``NOT_RESPONDING`` (``*``)."""
    words = state.upper().replace("*", "+NOT_RESPONDING").split("+")
    return words[0] in IN_SERVICE_WORDS and not node_dead(state)


def stuck_on(job: SlurmJob, node_states: dict[str, str]) -> str | None:
    """The node a pending job waits for in vain (it is down or drained), or None.

    The broker asked for one node (``--nodelist``); Slurm keeps such a job pending with
    ``ReqNodeNotAvail`` until the node returns, while its grant would be held for ever."""
    if not job.queued or not job.reason.startswith("ReqNodeNotAvail"):
        return None
    node = job.req_nodes
    if node and "," not in node and node_dead(node_states.get(node, "")):
        return node
    return None


def slurm_summary(job: SlurmJob) -> str:
    """``Slurm job 12 NODE_FAIL on node1: its node failed (reason: ...)``."""
    where = f" on {job.nodes}" if job.nodes and job.nodes != "(null)" else ""
    text = f"Slurm job {job.job_id} {job.state}{where}"
    why = WHY.get(job.state)
    if why:
        text += f": {why}"
    if job.reason and job.reason not in ("None", "(null)"):
        text += f" (reason: {job.reason})"
    if job.signal:
        text += f", signal {job.signal}"
    return text


def pending_text(job: SlurmJob) -> str:
    """What a job that Slurm still holds in its queue says, e.g. ``queued in Slurm: job 12
    pending (reason: Resources, waiting for GPUs or CPUs on the node to free up)``. No queue
    position: the broker records an event per new text, and a position changes often."""
    reason = (job.reason or "None").strip("()") or "None"
    if reason == "null":
        reason = "None"
    why = REASONS.get(reason.split(",", 1)[0])
    text = f"queued in Slurm: job {job.job_id} {job.state.lower()} (reason: {reason}"
    return text + (f", {why})" if why else ")")


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def result_status(result: dict[str, Any]) -> RunStatus:
    """The finished run that the runner's ``status.json`` describes. The file is in the
    job's own folder, so nothing in it is believed as typed: an exit code that is no
    integer is 1, an error that is no object becomes its text (cut), times that are no
    numbers are dropped."""
    code = result.get("exit_code", 1)
    exit_code = code if isinstance(code, int) and not isinstance(code, bool) else 1
    error = result.get("error")
    if error is not None and not isinstance(error, dict):
        error = {"summary": str(error)[:500]}
    out = result.get("output_path")
    return RunStatus(
        alive=False, finished=True, exit_code=exit_code, error=error,
        output_path=out if isinstance(out, str) else None,
        started_at=_number(result.get("started_at")), ended_at=_number(result.get("ended_at")),
        terminated=result.get("terminated") is True,
    )


def status_from(job: SlurmJob | None, result: dict[str, Any] | None,
                launched: bool) -> RunStatus:
    """The run's status from Slurm's view (``job``, None when slurmctld no longer knows
    it) and the runner's ``status.json`` (``result``). A job Slurm still holds (PENDING,
    CONFIGURING, REQUEUED) is alive and ``queued``, with Slurm's reason: the broker's
    runtime clock waits for it."""
    if job is None and result is None and not launched:
        return RunStatus(alive=False, started=False)
    if job is not None and job.state in ALIVE:  # pending counts as alive: it holds its grant
        if job.queued:
            return RunStatus(alive=True, queued=True, reason=pending_text(job))
        why = job.reason if job.reason not in ("None", "(null)") else ""
        return RunStatus(alive=True, reason=why, started_at=job.start)
    if job is not None and job.state == "COMPLETING" and result is None:
        return RunStatus(alive=True)  # the batch step is ending; the result comes next
    if result is not None:
        return result_status(result)
    if job is None:
        return RunStatus(alive=False, exit_code=None, error={
            "summary": "the Slurm job is gone (slurmctld no longer knows it) without a result"})
    summary = slurm_summary(job)
    lost = job.state in NODE_LOST and job.nodes not in ("", "(null)")
    return RunStatus(
        alive=False, finished=False, exit_code=job.exit_code,
        error={"summary": summary, "slurm_state": job.state, "slurm_reason": job.reason,
               "slurm_job_id": job.job_id},
        started_at=job.start, ended_at=job.end,
        node_failed=job.nodes if lost else None,
    )
