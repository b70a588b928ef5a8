"""The batch backend interface: where an admitted job's notebook runs.

The broker owns admission, grants and the job's states; a backend only runs one
*attempt* of a job and reports on it. Every method is synchronous and quick (the
broker calls them from a worker thread, never on its event loop):

* :meth:`JobBackend.submit` starts an attempt (idempotent: a second call for the same
  job and attempt returns the first run's handle, so a job never runs twice at once);
* :meth:`JobBackend.poll` says whether it still runs and, once it ended, its result;
* :meth:`JobBackend.signal` sends the preemption notice (SIGTERM on the local
  backend), :meth:`JobBackend.kill` ends it for good (SIGKILL);
* :meth:`JobBackend.read_log` and :meth:`JobBackend.fetch_output` give the log and
  the executed notebook.

Each backend declares in :meth:`JobBackend.capabilities` what it enforces, so the
admin (and the docs) can see what a grant means there. Backends import nothing from
the broker's HTTP layer.
"""

from __future__ import annotations

import io
from abc import ABC, ABCMeta, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from traitlets.config import LoggingConfigurable
from traitlets.traitlets import MetaHasTraits


@dataclass(frozen=True)
class Capabilities:
    """What a backend enforces and promises."""

    name: str
    enforces: tuple[str, ...]  # e.g. "CUDA_VISIBLE_DEVICES", "MPS memory limit"
    memory_isolation: str  # how a memory limit holds: "hard", "framework caps", "none"
    runs_as_user: bool  # jobs run as the job's own system user
    survives_broker_restart: bool  # runs go on while the broker is down
    own_process_group: bool = True
    notes: str = ""
    output_in_user_files_only: bool = False
    """The executed notebook is only in the user's own files (e.g. the user's volume on
    Kubernetes, which the broker does not mount): :meth:`JobBackend.fetch_output` gives
    nothing, and the user's server, which has those files, serves it."""
    user_files_mount: str = ""
    """Where the job sees the user's files (e.g. ``/home/jovyan``): the output is at
    ``<user_files_mount>/<output_path>``, a path the user's server sees the same way."""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "enforces": list(self.enforces),
            "memory_isolation": self.memory_isolation,
            "runs_as_user": self.runs_as_user,
            "survives_broker_restart": self.survives_broker_restart,
            "own_process_group": self.own_process_group,
            "notes": self.notes,
            "output_in_user_files_only": self.output_in_user_files_only,
            "user_files_mount": self.user_files_mount,
        }


@dataclass(frozen=True)
class RunSpec:
    """Everything one attempt of a job needs; built by the broker from the job and grant."""

    job_id: str
    attempt: int
    user: str
    notebook: dict[str, Any]  # the snapshot taken at submit time
    parameters: dict[str, Any]
    output_path: str  # absolute path of the executed notebook in the user's files
    cwd: str  # where the notebook runs (the output's folder)
    env: dict[str, str]  # grant enforcement, GPUSHARE_* (checkpoint dir added by the backend)
    max_runtime_s: int
    kernel_name: str = ""
    name: str = ""  # the notebook's name, as the user knows it (messages)
    output_root: str = ""
    """The user's files (``JobManager.user_root_template``): ``output_path`` is inside it,
    and is written by walking down from it without following a link."""
    max_output_bytes: int = 0
    """The largest executed notebook copied into the user's files (0: no bound)."""
    grant: dict[str, Any] = field(default_factory=dict)
    """The grant's JSON view (``Broker.grant_view``): team, pool, priority, node, gpus with
    their shares. Cluster backends translate it (account, QOS, GRES, node, Kueue queue)."""


@dataclass(frozen=True)
class RunHandle:
    """How the broker finds a run again (stored with the job; survives restarts)."""

    backend: str
    job_id: str
    attempt: int
    ref: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend, "job_id": self.job_id, "attempt": self.attempt,
            "ref": self.ref,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunHandle:
        return cls(
            str(data["backend"]), str(data["job_id"]), int(data["attempt"]),
            dict(data.get("ref") or {}),
        )


@dataclass(frozen=True)
class RunStatus:
    """What a backend knows about one run."""

    alive: bool | None  # None: the backend cannot tell
    started: bool = True  # False: no record that this attempt was ever started
    finished: bool = False  # a final result exists
    exit_code: int | None = None
    error: dict[str, Any] | None = None  # a CellError's JSON, or {"summary": ...}
    output_path: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    terminated: bool = False  # the run saw SIGTERM (preemption or cancel)
    preempted: bool = False  # the engine itself took the GPUs back (e.g. Kueue evicted it)
    queued: bool = False  # alive, but the engine still holds it in its queue
    reason: str = ""  # what the engine says about the run (why it waits, why it ended)
    node_failed: str | None = None  # the node was lost under the run (e.g. Slurm NODE_FAIL)


class JobBackend(ABC):
    """Base class of batch backends (local here; Slurm, Kueue, YTsaurus elsewhere).

    The broker builds its backend with :meth:`create`, given the job settings
    (``c.JobManager.*``): a backend that is a traitlets ``Configurable`` takes its own
    settings from the same config (``c.SlurmBackend.partition = ...``).
    """

    name = "base"

    @classmethod
    def create(cls, settings: Any) -> JobBackend:
        """Build the backend for a :class:`~jupyter_gpushare.broker.jobs.settings.JobSettings`
        (the default passes it as traitlets ``parent``; override for other constructors)."""
        return cls(parent=settings)  # type: ignore[call-arg]

    @abstractmethod
    def capabilities(self) -> Capabilities: ...

    @abstractmethod
    def submit(self, spec: RunSpec) -> RunHandle: ...

    @abstractmethod
    def poll(self, handle: RunHandle) -> RunStatus: ...

    @abstractmethod
    def signal(self, handle: RunHandle) -> None:
        """The preemption notice (or a cancel's first step): ask the run to stop cleanly."""

    @abstractmethod
    def kill(self, handle: RunHandle) -> None:
        """End the run and everything it started, now."""

    @abstractmethod
    def read_log(self, job_id: str, offset: int = 0, max_bytes: int = 65536) -> tuple[bytes, int]:
        """Bytes of the job's log (every attempt) from ``offset``; returns (data, next offset)."""

    @abstractmethod
    def log_size(self, job_id: str) -> int: ...

    @abstractmethod
    def fetch_output(self, handle: RunHandle) -> bytes | None:
        """The executed notebook of a run (also while it runs, as far as it got); None when
        there is none yet, or when the backend writes it only into the user's own files
        (``Capabilities.output_in_user_files_only``: the user's server serves it then)."""

    def open_output(self, handle: RunHandle) -> IO[bytes] | None:
        """The executed notebook as an open file, read in chunks by the output download
        (the default wraps :meth:`fetch_output`; a folder backend opens the file itself,
        never through a link)."""
        data = self.fetch_output(handle)
        return None if data is None else io.BytesIO(data)

    sizes_are_cheap: bool = False
    """Whether :meth:`log_size` and :meth:`output_size` are a ``stat`` of a file the broker
    sees (the job folder): the broker then checks ``max_log_bytes`` and ``max_output_bytes``
    on every poll. Cluster backends that fetch the log from the engine's API leave it False
    (their logs are bounded by the engine; the runner still bounds the copied notebook)."""

    def output_size(self, handle: RunHandle) -> int | None:
        """The executed notebook's size so far (None: unknown; the broker's
        ``max_output_bytes`` is then enforced only where the runner copies it)."""
        return None

    def refusal(self, spec: RunSpec) -> str | None:
        """Why this backend can never run ``spec`` as granted (None: it can).

        The broker asks before :meth:`submit`; a reason fails the job at once with it (its
        grant released) instead of starting a run the engine would reject or misrepresent,
        e.g. a fractional grant on an engine that allocates whole GPUs only, or more GPUs than
        the node has in Slurm. Called in the broker's worker thread like the other backend
        calls, so it may ask the engine (the Slurm backend reads the cluster's nodes); keep
        it quick."""
        return None

    node_return_interval_s: float = 30.0
    """How often the broker asks :meth:`nodes_in_service` while nodes it drained wait."""

    def nodes_in_service(self, nodes: Sequence[str]) -> set[str]:
        """Of ``nodes``, which the broker drained because a run was lost with them
        (:attr:`RunStatus.node_failed`), those the engine has back in service: the broker
        resumes them (never a node an admin drained or touched since). The default knows
        none: an admin resumes them. Called in the broker's worker thread, at most every
        :attr:`node_return_interval_s`."""
        return set()

    def checkpoint_dir(self, job_id: str) -> str | None:
        """Where the job keeps its checkpoints across attempts (None: not supported)."""
        return None

    def forget(self, job_id: str) -> None:  # noqa: B027 - optional
        """Remove what is kept of a finished job (log retention)."""

    def close(self) -> None:  # noqa: B027 - optional
        """Stop watching (runs go on where the backend allows it)."""


class _ConfigurableBackendMeta(MetaHasTraits, ABCMeta):
    """JobBackend is an ABC, LoggingConfigurable a HasTraits: one metaclass for both."""


class ConfigurableJobBackend(JobBackend, LoggingConfigurable, metaclass=_ConfigurableBackendMeta):
    """A backend whose settings are traitlets (``c.<ClassName>.<setting>``), built by
    :meth:`JobBackend.create` with the job settings as its ``parent``: the base of the
    cluster backends (Slurm, Kubernetes, YTsaurus)."""
