"""What a grant means to Slurm: pure functions from a grant to ``sbatch`` options, and from
``squeue`` output back to what the spawn page says. Nothing here runs a command.

* :func:`slurm_request` turns a grant into :class:`SlurmRequest`: ``--gres=gpu:N`` for whole
  GPUs, ``--gres=shard:K`` for a fraction (``K`` = fraction x shards per GPU, rounded up),
  ``--account`` (the team's account), ``--qos`` (the priority class), ``--nodelist`` (the node the
  broker placed it on), ``--partition``, ``--time`` (the profile's max lifetime) and
  ``--no-requeue`` (a server's job is never rerun by Slurm). A grant
  Slurm could never satisfy (more shards than one GPU has) raises :class:`SlurmRequestError`
  before anything is submitted.
* :func:`add_directives` puts those options into a batch script as ``#SBATCH`` lines, after
  the shebang, leaving out any option the script already sets (a site's own template wins
  where it names the option itself, e.g. through ``{{gres}}``).
* :func:`parse_job_status`, :func:`queue_position` and :func:`queue_message` read
  ``squeue`` for the spawn progress: the state, Slurm's reason (``%r``: Resources,
  Priority, ...) and the job's place among the pending jobs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from jupyter_gpushare.broker.client import GrantInfo
from jupyter_gpushare.export.slurm import slurm_name

__all__ = [
    "DEFAULT_SHARDS_PER_GPU",
    "JobQueueStatus",
    "SlurmRequest",
    "SlurmRequestError",
    "add_directives",
    "parse_job_status",
    "queue_message",
    "queue_position",
    "shards_for",
    "slurm_request",
    "slurm_time",
]

DEFAULT_SHARDS_PER_GPU = 8
"""Shards per GPU when neither the policy nor the spawner says (``gres.conf`` ``Count``)."""

_SAFE = re.compile(r"^[A-Za-z0-9_.,:\[\]=+-]+$")
"""What a value put into an ``#SBATCH`` line may contain (no spaces, quotes or newlines)."""


class SlurmRequestError(ValueError):
    """A grant that cannot become a Slurm job (the message says why, and which field)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class SlurmRequest:
    """The ``sbatch`` options that make one grant a Slurm job (empty string: not passed)."""

    gres: str
    account: str = ""
    qos: str = ""
    nodelist: str = ""
    partition: str = ""
    time: str = ""
    requeue: bool = False
    """A server's job is never requeued by Slurm: after a node failure its server, port and
    grant are gone, and a requeued job would start a second server the hub does not know."""

    def options(self) -> dict[str, str]:
        """``{"--gres": "shard:2", ..., "--no-requeue": ""}`` in a fixed order, without the
        empty ones (a flag's value is ``""``)."""
        pairs = [
            ("--gres", self.gres),
            ("--account", self.account),
            ("--qos", self.qos),
            ("--nodelist", self.nodelist),
            ("--partition", self.partition),
            ("--time", self.time),
        ]
        out = {k: v for k, v in pairs if v}
        out["--requeue" if self.requeue else "--no-requeue"] = ""
        return out

    def args(self) -> list[str]:
        """The options as ``sbatch`` arguments (``--gres=shard:2``...)."""
        return [f"{k}={v}" if v else k for k, v in self.options().items()]


def _checked(field: str, value: str) -> str:
    if value and not _SAFE.match(value):
        raise SlurmRequestError(
            field, f"{value!r} cannot be passed to sbatch (letters, digits and _.,:[]=+- only)"
        )
    return value


def shards_for(units: float, shards_per_gpu: int) -> int:
    """Shards for a fraction of one GPU: ``units`` x ``shards_per_gpu``, rounded up, >= 1."""
    if shards_per_gpu < 1:
        raise SlurmRequestError("shards_per_gpu", f"got {shards_per_gpu} (expected >= 1)")
    return max(1, math.ceil(units * shards_per_gpu - 1e-9))


def slurm_time(seconds: float) -> str:
    """A Slurm ``--time`` value (``D-HH:MM:SS``, or ``HH:MM:SS`` under a day), rounded up to
    whole minutes so a job never gets less time than asked."""
    minutes = max(1, math.ceil(seconds / 60 - 1e-9))
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    text = f"{hours:02d}:{mins:02d}:00"
    return f"{days}-{text}" if days else text


def slurm_request(
    grant: GrantInfo,
    *,
    shards_per_gpu: int = DEFAULT_SHARDS_PER_GPU,
    account_template: str = "{team}_{pool}",
    qos_template: str = "{priority}",
    partition: str = "",
    max_lifetime_s: float | None = None,
    pin_node: bool = True,
    node_names: Mapping[str, str] | None = None,
) -> SlurmRequest:
    """The Slurm options that enforce ``grant`` (see the module docstring).

    ``account_template`` / ``qos_template`` expand ``{team}``, ``{pool}``, ``{priority}``
    and ``{user}``, each written as ``jupyter-gpushare export slurm`` names them (lower
    case, other characters than letters, digits, ``-`` and ``_`` as ``_``), so the
    defaults are the export's account ``<team>_<pool>`` and QOS ``<class>``; an empty
    template passes no ``--account`` / ``--qos``. ``node_names`` maps a broker node name
    to its Slurm NodeName where the two differ.
    """
    if not grant.gpus:
        raise SlurmRequestError("gpus", f"grant {grant.id} holds no GPU (no GRES to ask for)")
    units = float(grant.units)
    whole = units >= 1.0 - 1e-9 and abs(units - round(units)) < 1e-6
    if whole:
        gres = f"gpu:{max(len(grant.gpus), int(round(units)))}"
    else:
        if len(grant.gpus) != 1 or units <= 0:
            raise SlurmRequestError(
                "units",
                f"grant {grant.id}: {units:g} GPU over {len(grant.gpus)} GPUs is neither whole "
                "GPUs nor a fraction of one GPU",
            )
        shards = shards_for(units, shards_per_gpu)
        if shards > shards_per_gpu:
            raise SlurmRequestError(
                "shards",
                f"grant {grant.id} needs {shards} shards but one GPU has {shards_per_gpu}; "
                "Slurm would keep such a job pending forever",
            )
        gres = f"shard:{shards}"
    fields = {
        "team": slurm_name(grant.team),
        "pool": slurm_name(grant.pool),
        "priority": "" if grant.priority is None else slurm_name(str(grant.priority)),
        "user": grant.user,
    }
    try:
        account = account_template.format(**fields) if account_template else ""
        qos = qos_template.format(**fields) if qos_template else ""
    except (KeyError, IndexError, ValueError) as exc:
        raise SlurmRequestError(
            "account_template/qos_template",
            f"unknown field {exc} (expected {{team}}, {{pool}}, {{priority}} or {{user}})",
        ) from None
    node = ""
    if pin_node and grant.node:
        node = (node_names or {}).get(grant.node, grant.node)
    runtime = slurm_time(max_lifetime_s) if max_lifetime_s and max_lifetime_s > 0 else ""
    return SlurmRequest(
        gres=gres,
        account=_checked("account", account),
        qos=_checked("qos", qos),
        nodelist=_checked("nodelist", node),
        partition=_checked("partition", partition),
        time=runtime,
    )


_DIRECTIVE = re.compile(r"^#SBATCH\s+(.*)$")


def _options_set(script: str) -> set[str]:
    """Long option names the script's ``#SBATCH`` lines set (``--gres``, ``--time``...)."""
    short = {"-A": "--account", "-q": "--qos", "-w": "--nodelist", "-p": "--partition",
             "-t": "--time"}
    found: set[str] = set()
    for line in script.splitlines():
        m = _DIRECTIVE.match(line.strip())
        if not m:
            continue
        for word in m.group(1).split():
            name = word.split("=", 1)[0]
            if name.startswith("--"):
                found.add(name)
            elif name[:2] in short:
                found.add(short[name[:2]])
    return found


def add_directives(script: str, request: SlurmRequest) -> str:
    """``script`` with an ``#SBATCH`` line per option of ``request`` that it does not set
    already, right after its first line (the shebang; ``sbatch`` reads directives only
    before the first command)."""
    have = _options_set(script)
    if have & {"--requeue", "--no-requeue"}:
        have |= {"--requeue", "--no-requeue"}
    lines = [f"#SBATCH {k}={v}" if v else f"#SBATCH {k}"
             for k, v in request.options().items() if k not in have]
    if not lines:
        return script
    head, sep, rest = script.partition("\n")
    if not head.startswith("#!"):
        return "\n".join(["#!/bin/bash", *lines, script])
    return head + "\n" + "\n".join(lines) + "\n" + rest if sep else head + "\n" + "\n".join(lines)


@dataclass(frozen=True)
class JobQueueStatus:
    """One job as ``squeue -o '%T %r %B'`` shows it."""

    state: str  # PENDING, RUNNING, ...
    reason: str  # Slurm's reason (Resources, Priority, None...)
    host: str  # the batch host (n/a while pending)


def parse_job_status(text: str) -> JobQueueStatus | None:
    """Read ``squeue -h -j ID -o '%T %r %B'`` output (None: no such job in the queue)."""
    line = next((ln.strip() for ln in (text or "").splitlines() if ln.strip()), "")
    words = line.split()
    if len(words) < 2 or not words[0].isupper():
        return None
    state, host = words[0], words[-1] if len(words) >= 3 else ""
    reason = " ".join(words[1:-1]) if len(words) >= 3 else words[1]
    return JobQueueStatus(state, reason, host)


def queue_position(job_id: str, pending_ids: str) -> int | None:
    """1-based place of ``job_id`` among pending jobs, one id per line in the order Slurm
    will consider them (``squeue -h -t PENDING --sort=-p,i -o %i``); None if absent."""
    ids = [w.split("_", 1)[0] for w in pending_ids.split()]
    try:
        return ids.index(str(job_id)) + 1
    except ValueError:
        return None


REASONS = {
    "Resources": "waiting for GPUs or CPUs on the node to free up",
    "Priority": "jobs with higher priority are ahead of it",
    "ReqNodeNotAvail": "the node it was placed on is not available",
    "QOSMaxGRESPerUser": "your QOS's GPU limit is reached",
    "AssocGrpGRES": "your team's GPU limit is reached",
    "None": "being scheduled",
}


def queue_message(job_id: str, status: JobQueueStatus, position: int | None) -> str:
    """What the spawn page says while the Slurm job waits."""
    reason = status.reason.strip("()") or "None"
    key = reason.split(",", 1)[0]
    why = REASONS.get(key)
    where = f"position {position} in the Slurm queue" if position else "in the Slurm queue"
    text = f"Slurm job {job_id} {status.state.lower()}: {where} (reason: {reason}"
    return text + (f", {why})" if why else ")")
