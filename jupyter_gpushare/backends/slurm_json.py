"""Slurm's job and node state read from ``squeue --json`` and ``sinfo --json`` (pure: no I/O).

Slurm has answered ``--json`` on ``squeue`` and ``sinfo`` since 21.08 (the ``openapi/v0.0.3x``
plugins; from 23.02 the ``data_parser`` plugins). Unlike the ``key=value`` text of
``scontrol show job -o`` / ``show node -o``, every value arrives whole: a job name, a comment
or a node's drain reason with spaces (``Reason=disk full State=IDLE``) can neither be cut at
its first space nor pose as another field. The text parser (:mod:`.slurm_state`,
:func:`~.slurm_args.parse_node_gres`) stays as the fallback for a Slurm without ``--json``.

Shapes read (Slurm 22.05, ``openapi/v0.0.38``, checked on the real cluster of the tests):
``job_state`` a string, ``exit_code`` the raw wait status (``768`` = exit 3, ``15`` = killed
by signal 15), times as epoch seconds (0: unknown); a node's ``state`` (``idle``) with
``state_flags`` (``["DRAIN"]``). The shapes of 23.02 and later (``job_state`` and node
``state`` as lists, numbers as ``{"set", "infinite", "number"}``, ``exit_code`` as
``{"return_code", "signal"}``) are read too.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .slurm_args import SlurmNodeInfo, parse_node_gres
from .slurm_state import SlurmJob


class SlurmJsonError(ValueError):
    """Slurm's ``--json`` answer is not what this reader understands (the message says why)."""


class SlurmJsonUnavailable(SlurmJsonError):
    """This Slurm answers no ``--json`` (too old, or its JSON plugins are missing)."""


def _decode(text: str, key: str, command: str) -> list[dict[str, Any]]:
    """The list under ``key`` of a ``--json`` answer, or :class:`SlurmJsonError`."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise SlurmJsonError(
            f"{command} --json printed no JSON ({exc}): {text.strip()[:200]!r}"
        ) from exc
    if not isinstance(doc, dict) or not isinstance(doc.get(key), list):
        raise SlurmJsonError(f"{command} --json printed no {key!r} list")
    items = [item for item in doc[key] if isinstance(item, dict)]
    if len(items) != len(doc[key]):
        raise SlurmJsonError(f"{command} --json: an entry of {key!r} is no object")
    return items


def slurm_release(text: str) -> str:
    """``22.05.8`` from a ``--json`` answer's ``meta.Slurm.release`` (empty if absent)."""
    try:
        doc = json.loads(text)
        release = doc["meta"]["Slurm"]["release"]
    except (ValueError, KeyError, TypeError):
        return ""
    return release if isinstance(release, str) else ""


def _number(value: Any) -> int | None:
    """An integer field: a plain number, or 23.02's ``{"set": true, "number": N}``."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value)


def _epoch(value: Any) -> float | None:
    number = _number(value)
    return float(number) if number else None  # 0: Slurm does not know it


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _words(value: Any) -> list[str]:
    """A state as its words: ``"RUNNING"`` or 23.02's ``["RUNNING", "COMPLETING"]``."""
    if isinstance(value, str):
        return [w for w in value.upper().split("+") if w]
    if isinstance(value, list):
        return [w.upper() for w in value if isinstance(w, str) and w]
    return []


def exit_status(value: Any) -> tuple[int | None, int | None]:
    """(exit code, signal) as ``scontrol`` prints ``ExitCode=a:b``: from 22.05's raw wait
    status (``768`` -> ``(3, 0)``, ``15`` -> ``(0, 15)``) or 23.02's object."""
    if isinstance(value, dict):
        code = _number(value.get("return_code"))
        sig = value.get("signal")
        signal = _number(sig.get("id") if isinstance(sig, dict) else sig)
        return code, signal or 0
    status = _number(value)
    if status is None:
        return None, None
    if status & 0x7F:
        return 0, status & 0x7F
    return (status >> 8) & 0xFF, 0


def job_from_json(item: dict[str, Any]) -> SlurmJob | None:
    """One job of ``squeue --json`` (None: an entry without a job id)."""
    job_id = _number(item.get("job_id"))
    if job_id is None:
        return None
    states = _words(item.get("job_state"))
    code, signal = exit_status(item.get("exit_code"))
    reason = _text(item.get("state_reason")) or "None"
    return SlurmJob(
        job_id=str(job_id),
        name=_text(item.get("name")),
        state=states[0] if states else "",
        reason=reason,
        exit_code=code,
        signal=signal,
        nodes=_text(item.get("nodes")),
        start=_epoch(item.get("start_time")),
        end=_epoch(item.get("end_time")),
        restarts=_number(item.get("restart_cnt")) or 0,
        req_nodes=_text(item.get("required_nodes")),
    )


def user_of(item: dict[str, Any]) -> str:
    return _text(item.get("user_name"))


def parse_squeue_json(text: str) -> list[tuple[SlurmJob, str]]:
    """Every job of ``squeue --json``, each with its user's name."""
    out = []
    for item in _decode(text, "jobs", "squeue"):
        job = job_from_json(item)
        if job is not None:
            out.append((job, user_of(item)))
    return out


def node_state(state: Any, flags: Iterable[Any] = ()) -> str:
    """A node's state as ``scontrol`` writes it (``IDLE+DRAIN``), so that
    :func:`~.slurm_state.node_dead` and :func:`~.slurm_state.node_in_service` read both."""
    words = _words(state)
    words += [w.upper() for w in flags if isinstance(w, str) and w.upper() not in words]
    return "+".join(words)


def node_from_json(item: dict[str, Any]) -> SlurmNodeInfo | None:
    """One node of ``sinfo --json`` (None: an entry without a name)."""
    name = _text(item.get("name"))
    if not name:
        return None
    gpus, shards = parse_node_gres(_text(item.get("gres")))
    flags = item.get("state_flags")
    parts = item.get("partitions")
    return SlurmNodeInfo(
        name,
        gpus,
        shards,
        node_state(item.get("state"), flags if isinstance(flags, list) else ()),
        tuple(p for p in parts if isinstance(p, str) and p) if isinstance(parts, list) else (),
    )


def parse_sinfo_json(text: str) -> dict[str, SlurmNodeInfo]:
    """Every node of ``sinfo --json`` by name."""
    out: dict[str, SlurmNodeInfo] = {}
    for item in _decode(text, "nodes", "sinfo"):
        node = node_from_json(item)
        if node is not None:
            out[node.name] = node
    return out


OLD_SLURM_WORDS = ("unrecognized option", "invalid option", "unknown option")
PLUGIN_WORDS = ("data_parser", "serializer", "openapi")


def refuses_json(stderr: str) -> bool:
    """Whether a command's error says it cannot answer ``--json``: no such option (Slurm
    before 21.08) or a JSON plugin missing (``data_parser``, ``serializer``, ``openapi``)."""
    low = stderr.lower()
    return ("json" in low and any(w in low for w in OLD_SLURM_WORDS)) or any(
        w in low for w in PLUGIN_WORDS
    )


@dataclass
class JsonSupport:
    """Whether the installed Slurm's ``--json`` is read: found out from the first answer,
    then kept. ``setting``: ``auto``, ``json`` (never fall back) or ``text`` (never try)."""

    setting: str = "auto"
    answers: bool | None = None  # None: not known yet

    @property
    def reader(self) -> str:
        """``json`` or ``text``: how state is read now (``auto`` before the first read)."""
        if self.setting != "auto":
            return self.setting
        return {None: "auto", True: "json", False: "text"}[self.answers]

    def wanted(self) -> bool:
        return self.setting == "json" or (self.setting == "auto" and self.answers is not False)

    def take(self, returncode: int, stdout: str, stderr: str, parse: Callable[[str], Any]) -> Any:
        """``parse(stdout)`` of a ``--json`` command that ended with ``returncode``.
        :class:`SlurmJsonUnavailable`: read the text instead (kept from now on, unless the
        setting is ``json``); :class:`SlurmJsonError`: the command failed otherwise."""
        if returncode != 0:
            if refuses_json(stderr):
                self._unavailable(stderr.strip())
            lines = (stderr or stdout).strip().splitlines()
            raise SlurmJsonError(lines[-1] if lines else f"exit code {returncode}")
        try:
            parsed = parse(stdout)
        except SlurmJsonError as exc:
            if self.answers:  # it answered before: this one answer is broken
                raise
            self._unavailable(str(exc))
        self.answers = True
        return parsed

    def _unavailable(self, why: str) -> None:
        if self.setting != "json":
            self.answers = False
        raise SlurmJsonUnavailable(why)
