"""What jupyter-scheduler's form holds, as a broker job submission, and the broker's job
state as jupyter-scheduler's status (pure: no I/O).

The form's fields map so:

* environment -> ``profile`` (the environment list is the user's profiles);
* compute type -> ``priority`` (each profile lists the priorities its teams may use);
* parameter ``gpushare_max_runtime`` -> ``max_runtime`` (seconds, or a number with s, m, h
  or d: ``90m``, ``2h``); ``gpushare_checkpoint`` -> ``checkpoint`` (true/false, yes/no, 1/0);
* every other parameter -> a papermill parameter (a JSON value where it reads as one,
  ``3`` -> 3, ``[1, 2]`` -> a list; otherwise the text as typed).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jupyter_scheduler.models import Status

MAX_RUNTIME_PARAM = "gpushare_max_runtime"
CHECKPOINT_PARAM = "gpushare_checkpoint"
RESERVED = (MAX_RUNTIME_PARAM, CHECKPOINT_PARAM)

_UNITS = {"": 1, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d)?\s*$", re.IGNORECASE)
_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off", ""}


class FormError(ValueError):
    """A form value the broker would not read; names the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def parse_duration(field: str, text: str) -> int:
    """Seconds from ``3600``, ``90m``, ``2h``, ``1d`` (at least one second)."""
    found = _DURATION.match(text or "")
    if not found:
        raise FormError(
            field,
            f"{text!r} is not a duration (seconds, or a number with s, m, h or d, e.g. 90m or 2h)",
        )
    seconds = float(found.group(1)) * _UNITS[(found.group(2) or "").lower()]
    if seconds < 1:
        raise FormError(field, f"{text!r} is under one second")
    return int(round(seconds))


def parse_flag(field: str, text: str) -> bool:
    value = (text or "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise FormError(field, f"{text!r} is not true or false")


def papermill_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


@dataclass(frozen=True)
class Submission:
    """The broker fields a jupyter-scheduler job asks for (besides the notebook)."""

    profile: str
    priority: str | None
    max_runtime: int | None
    checkpoint: bool | None
    parameters: dict[str, Any]

    def to_broker(self, notebook: dict[str, Any], name: str, path: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "notebook": notebook,
            "name": name,
            "profile": self.profile,
            "parameters": self.parameters,
        }
        if path:
            body["path"] = path
        if self.priority:
            body["priority"] = self.priority
        if self.max_runtime is not None:
            body["max_runtime"] = self.max_runtime
        if self.checkpoint is not None:
            body["checkpoint"] = self.checkpoint
        return body


def submission_of(
    environment: str, compute_type: str | None, parameters: dict[str, str] | None
) -> Submission:
    """The broker fields of a job from its form (raises :class:`FormError`)."""
    if not environment:
        raise FormError("environment", "choose a gpushare profile")
    given = dict(parameters or {})
    runtime = given.pop(MAX_RUNTIME_PARAM, None)
    checkpoint = given.pop(CHECKPOINT_PARAM, None)
    return Submission(
        profile=environment,
        priority=compute_type or None,
        max_runtime=None if runtime is None else parse_duration(MAX_RUNTIME_PARAM, runtime),
        checkpoint=None if checkpoint is None else parse_flag(CHECKPOINT_PARAM, checkpoint),
        parameters={k: papermill_value(v) for k, v in given.items()},
    )


_STATUS = {
    "queued": Status.QUEUED,
    "admitted": Status.QUEUED,
    "preempted": Status.QUEUED,
    "running": Status.IN_PROGRESS,
    "succeeded": Status.COMPLETED,
    "failed": Status.FAILED,
    "lost": Status.FAILED,
    "cancelled": Status.STOPPED,
}
FINISHED = frozenset({"succeeded", "failed", "lost", "cancelled"})


def status_of(job: dict[str, Any]) -> Status:
    """jupyter-scheduler's status of a broker job (an unknown state reads as queued)."""
    return _STATUS.get(str(job.get("state")), Status.QUEUED)


def message_of(job: dict[str, Any]) -> str:
    """The broker's words on the job: its reason, where it queues, a failure's summary."""
    parts = [f"gpushare {job.get('state')}: {job.get('reason') or ''}".strip()]
    if job.get("state") == "queued" and job.get("position") is not None:
        parts.append(f"position {job['position']} in the {job.get('pool')} queue")
    error = job.get("error") or {}
    if error.get("summary") and error["summary"] not in parts[0]:
        parts.append(str(error["summary"]))
    preemption = job.get("preemption") or {}
    if preemption.get("reason"):
        parts.append(f"preemption notice: {preemption['reason']}")
    return "; ".join(parts)[:1000]


def epoch_ms(iso: str | None) -> int | None:
    """jupyter-scheduler's times (milliseconds since the epoch) from the broker's ISO times."""
    if not iso:
        return None
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def refusal_message(status: int, answer: Any) -> str:
    """The broker's refusal in words: its reason and the field it names."""
    data = answer if isinstance(answer, dict) else {}
    reason = data.get("reason") or data.get("error") or data.get("message") or str(answer)
    field = data.get("field")
    where = f" (field {field})" if field else ""
    return f"gpushare broker refused the job ({status}): {reason}{where}"
