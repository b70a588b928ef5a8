"""The YTsaurus batch backend: each attempt of a job is one vanilla operation.

``c.JobManager.backend_class = "jupyter_gpushare.backends.ytsaurus.YTsaurusBackend"`` and
``c.YTsaurusBackend.*`` settings (proxy, token file, Cypress work dir, pools, pool trees,
image). The spec itself is built by the pure :mod:`.ytsaurus_spec`; this module talks to
the cluster through ``ytsaurus-client`` (``yt.wrapper``), from the broker's worker thread:

* :meth:`~YTsaurusBackend.submit` writes the snapshot and the runner's spec under
  ``<work_dir>/<job>/attempt-<n>`` (``write_file``), creates the output table and starts the
  operation (``run_operation(..., sync=False)`` with a mutation id fixed by job and
  attempt). It is idempotent: an attempt whose Cypress node records an operation id, or
  whose alias names an operation, is never started again;
* a later attempt gets the checkpoint folder the latest earlier one left in its output
  table (a file of the new attempt, unpacked in the sandbox before the notebook starts);
* :meth:`~YTsaurusBackend.poll` maps the operation's state; a completed one's status row
  (exit code, cell error, ``terminated``) is the run's result;
* :meth:`~YTsaurusBackend.signal` interrupts the running job (``abort_job`` with an
  interrupt timeout of the grant's grace period: YTsaurus sends ``SIGTERM``),
  :meth:`~YTsaurusBackend.kill` aborts the operation;
* :meth:`~YTsaurusBackend.read_log` is the jobs' stderr (``get_job_stderr``), every attempt
  in order; :meth:`~YTsaurusBackend.fetch_output` reads the executed notebook from the
  output table, and a finished run's notebook is also written to the user's files (and to
  a Cypress folder where one is configured).

The token is read from a file when the client is made and goes nowhere else: not into
the spec, the job's environment, the log or the handle.

Here are the settings, the submit, the poll and the stop; next to this module are the
``yt.wrapper`` helpers (:mod:`.ytsaurus_client`) and the parts the backend holds: a finished
operation's result and output (:mod:`.ytsaurus_result`, ``backend.results``) and the jobs'
log (:mod:`.ytsaurus_logs`, ``backend.logs``).
"""

from __future__ import annotations

import contextlib
import json
import stat
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from traitlets import Bool, Dict, Float, Integer, List, Unicode, observe

from . import ytsaurus_spec as ys
from .base import Capabilities, ConfigurableJobBackend, RunHandle, RunSpec, RunStatus
from .local import _with_cell_ids
from .ytsaurus_client import _is_no_such_operation, offline_client, spec_builder
from .ytsaurus_job import joined
from .ytsaurus_logs import YTsaurusLogs
from .ytsaurus_result import INTERRUPTED_BY_YT, YTsaurusResults

__all__ = [
    "CACHE_SIZE",
    "FINISHED_STATES",
    "INTERRUPTED_BY_YT",
    "RUNNING_STATES",
    "YTsaurusBackend",
    "offline_client",
    "spec_builder",
]

RUNNING_STATES = frozenset(
    {
        "starting",
        "orphaned",
        "waiting_for_agent",
        "initializing",
        "preparing",
        "materializing",
        "reviving",
        "reviving_jobs",
        "pending",
        "running",
        "completing",
        "aborting",
        "failing",
    }
)
"""Operation states in which the job may still run (or is about to)."""
FINISHED_STATES = frozenset({"completed", "failed", "aborted"})
CACHE_SIZE = 512
"""Finished operations whose result and stderr are kept in memory (they no longer change)."""


def _keep(cache: OrderedDict[str, Any], key: str, value: Any) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > CACHE_SIZE:
        cache.popitem(last=False)


class YTsaurusBackend(ConfigurableJobBackend):
    """Runs each attempt of a job as a YTsaurus vanilla operation (see the module)."""

    name = "ytsaurus"

    proxy = Unicode(
        "",
        config=True,
        help="The cluster's HTTP proxy, e.g. 'https://yt.example.com' (as YT_PROXY).",
    )
    token_path = Unicode(
        "",
        config=True,
        help="File holding the YTsaurus token of the broker's robot user (mode 0600; read "
        "when the client is made, never logged, never passed to jobs). Empty: the "
        "client's own discovery (YT_TOKEN, ~/.yt/token).",
    )
    work_dir = Unicode(
        "//tmp/gpushare",
        config=True,
        help="Cypress folder for the jobs' snapshots and output tables "
        "(<work_dir>/<job id>/attempt-<n>/{input.ipynb,spec.json,output}).",
    )
    pools = Dict(
        config=True,
        help="Team name -> YTsaurus pool its jobs run in; a team not listed uses a pool "
        "of its own name.",
    )
    pool_trees = List(
        Unicode(),
        config=True,
        help="YTsaurus pool trees the operations run in, e.g. ['gpu_h200'] (empty: the "
        "cluster's default tree).",
    )
    scheduling_tag_filters = Dict(
        config=True,
        help="gpushare pool -> YTsaurus scheduling_tag_filter for its jobs, e.g. "
        "{'train': 'h200'}, so a job runs on the GPU model its pool stands for.",
    )
    docker_image = Unicode(
        "",
        config=True,
        help="Docker image of the jobs' root file system; it must hold Python with "
        "jupyter-gpushare, papermill and the notebooks' kernels.",
    )
    layer_paths = List(
        Unicode(),
        config=True,
        help="Porto layers in Cypress (top first), instead of or beside docker_image.",
    )
    python = Unicode(
        "python3", config=True, help="The Python in the job's image that runs the notebook."
    )
    cpu_limit = Float(1.0, config=True, help="Cores per job where the grant names none.")
    memory_limit_mib = Integer(
        4096,
        config=True,
        help="Host memory per job (MiB) where the grant names none; YTsaurus kills a job "
        "above its memory_limit.",
    )
    time_limit_margin_s = Integer(
        300,
        config=True,
        help="Seconds added to a job's runtime limit (and grace period) for the "
        "operation's time_limit: the broker stops an overrunning job first, with its "
        "reason; YTsaurus's limit holds while the broker is down.",
    )
    fail_on_job_restart = Bool(
        True,
        config=True,
        help="Fail the operation if its job would be restarted (node lost, aborted by "
        "YTsaurus): the broker, not YTsaurus, decides about another attempt.",
    )
    owners_include_user = Bool(
        True,
        config=True,
        help="Make the job's user an owner of its operation (they may read its stderr, "
        "abort it, open a job shell).",
    )
    instance = Unicode(
        "gpushare",
        config=True,
        help="Names this broker in operation aliases (*<instance>-<job>-<attempt>); give "
        "each broker sharing a cluster its own.",
    )
    max_checkpoint_bytes = Integer(
        256 * 1024 * 1024,
        config=True,
        help="Largest checkpoint folder (bytes, gzipped tar) carried from one attempt to the "
        "next through the attempt's output table (0: none; an attempt then starts afresh).",
    )
    deliver_output = Bool(
        True,
        config=True,
        help="Write a finished run's executed notebook into the user's files "
        "(the job's output_path) from the broker's machine.",
    )
    output_cypress_dir = Unicode(
        "",
        config=True,
        help="Also copy each executed notebook to this Cypress folder, e.g. "
        "'//home/{username}/gpushare' (empty: only the attempt's output table).",
    )

    def __init__(self, client: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._client = client
        self._lock = threading.Lock()
        self._finished: OrderedDict[str, RunStatus] = OrderedDict()  # op id -> final status
        self._signalled: OrderedDict[str, None] = OrderedDict()  # ops interrupted by us
        self.results = YTsaurusResults(
            lambda: self.client,
            deliver_output=self.deliver_output,
            output_cypress_dir=self.output_cypress_dir,
            signalled=lambda op_id: op_id in self._signalled,
            log=self.log,
        )
        self.logs = YTsaurusLogs(
            lambda: self.client,
            lambda: self.settings,
            self._recorded_operation,
            lambda op_id: op_id in self._finished,
            _keep,
            self.log,
        )

    @observe("deliver_output", "output_cypress_dir")
    def _hand_setting_to_parts(self, change: Any) -> None:
        """A setting changed once the parts were built: the results get it."""
        results = getattr(self, "results", None)
        if results is not None:
            setattr(results, change["name"], change["new"])

    # -- settings ---------------------------------------------------------------------------

    @property
    def settings(self) -> ys.YtSettings:
        return ys.YtSettings(
            work_dir=self.work_dir,
            pools={str(k): str(v) for k, v in self.pools.items()},
            pool_trees=tuple(self.pool_trees),
            docker_image=self.docker_image,
            layer_paths=tuple(self.layer_paths),
            python=self.python,
            cpu_limit=self.cpu_limit,
            memory_limit_mib=self.memory_limit_mib,
            time_limit_margin_s=self.time_limit_margin_s,
            fail_on_job_restart=self.fail_on_job_restart,
            scheduling_tag_filters={str(k): str(v) for k, v in self.scheduling_tag_filters.items()},
            instance=self.instance,
            owners_include_user=self.owners_include_user,
            max_checkpoint_bytes=self.max_checkpoint_bytes,
        )

    @property
    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = self.make_client()
            return self._client

    def make_client(self) -> Any:
        """The ``yt.wrapper.YtClient`` for the configured proxy and token file."""
        import yt.wrapper as yt

        token = None
        if self.token_path:
            path = Path(self.token_path)
            mode = path.stat().st_mode
            if mode & (stat.S_IRWXG | stat.S_IRWXO):
                self.log.warning("YTsaurus token file %s is readable by others: chmod 600 it", path)
            token = path.read_text().strip()
        return yt.YtClient(proxy=self.proxy or None, token=token)

    def capabilities(self) -> Capabilities:
        return Capabilities(
            name=self.name,
            enforces=(
                "gpu_limit (whole GPUs, allocated and isolated by YTsaurus)",
                "cpu_limit and memory_limit of the job's container",
                "the team's YTsaurus pool (its strong guarantee and fair share)",
                "time_limit (the job's runtime limit plus a margin)",
            ),
            memory_isolation="hard (whole GPUs; host memory_limit)",
            runs_as_user=False,
            survives_broker_restart=True,
            notes="whole GPUs only (a fractional grant is refused); runs as the broker's "
            "YTsaurus user, the job's user is an owner of the operation; the checkpoint "
            "folder is carried to the next attempt through the output table "
            "(max_checkpoint_bytes)",
        )

    def refusal(self, spec: RunSpec) -> str | None:
        return ys.refusal(spec, self.settings)

    # -- submit -----------------------------------------------------------------------------

    def _recorded_operation(self, paths: ys.AttemptPaths) -> str | None:
        client = self.client
        try:
            if client.exists(paths.dir + "/@operation_id"):
                return str(client.get(paths.dir + "/@operation_id"))
        except Exception as exc:  # noqa: BLE001 - not recorded (or not readable): look further
            if not _is_no_such_operation(exc):
                raise
        return None

    def _operation_by_alias(self, alias: str) -> str | None:
        try:
            found = self.client.get_operation(operation_alias=alias, attributes=["id"])
        except Exception as exc:  # noqa: BLE001
            if _is_no_such_operation(exc):
                return None
            raise
        return str(found["id"]) if found and found.get("id") else None

    def _handle(self, spec: RunSpec, op_id: str, paths: ys.AttemptPaths) -> RunHandle:
        grant = spec.grant or {}
        return RunHandle(
            self.name,
            spec.job_id,
            spec.attempt,
            {
                "operation_id": op_id,
                "dir": paths.dir,
                "output_table": paths.output,
                "output_path": spec.output_path,
                "user": spec.user,
                "name": spec.name,
                "grace_period_s": int(grant.get("grace_period_s") or 0),
            },
        )

    def submit(self, spec: RunSpec) -> RunHandle:
        reason = self.refusal(spec)
        if reason:
            raise ValueError(reason)
        settings = self.settings
        paths = ys.attempt_paths(settings, spec.job_id, spec.attempt)
        alias = ys.operation_alias(settings, spec.job_id, spec.attempt)
        client = self.client
        op_id = self._recorded_operation(paths) or self._operation_by_alias(alias)
        if op_id:  # this attempt was started already: never a second run
            self._record(paths, op_id)
            return self._handle(spec, op_id, paths)
        client.create("map_node", paths.dir, recursive=True, ignore_existing=True)
        client.write_file(paths.notebook, json.dumps(_with_cell_ids(spec.notebook)).encode())
        client.write_file(paths.runner_spec, json.dumps(ys.runner_spec(spec)).encode())
        client.create("table", paths.output, ignore_existing=True)
        resume = self._carry_checkpoint(spec, paths)
        operation = ys.operation_spec(spec, settings, resume=resume)
        op = client.run_operation(
            spec_builder(operation),
            sync=False,
            run_operation_mutation_id=ys.mutation_id(settings, spec.job_id, spec.attempt),
        )
        op_id = str(op.id)
        self._record(paths, op_id)
        self.log.info(
            "job %s attempt %s: YTsaurus operation %s in pool %s",
            spec.job_id,
            spec.attempt,
            op_id,
            operation["pool"],
        )
        return self._handle(spec, op_id, paths)

    def _carry_checkpoint(self, spec: RunSpec, paths: ys.AttemptPaths) -> bool:
        """Give this attempt the checkpoint folder the latest earlier attempt left."""
        if self.max_checkpoint_bytes <= 0:
            return False
        for attempt in range(int(spec.attempt) - 1, 0, -1):
            table = ys.attempt_paths(self.settings, spec.job_id, attempt).output
            try:
                data = joined(list(self.client.read_table(table, format="json")), "checkpoint")
            except Exception:  # noqa: BLE001 - that attempt left no table
                continue
            if data is not None:
                self.client.write_file(paths.checkpoint, data)
                return True
        return False

    def _record(self, paths: ys.AttemptPaths, op_id: str) -> None:
        with contextlib.suppress(Exception):
            self.client.set(paths.dir + "/@operation_id", op_id)

    # -- state ------------------------------------------------------------------------------

    def poll(self, handle: RunHandle) -> RunStatus:
        op_id = str(handle.ref.get("operation_id") or "")
        if not op_id:
            paths = ys.attempt_paths(self.settings, handle.job_id, handle.attempt)
            op_id = self._recorded_operation(paths) or ""
            if not op_id:
                return RunStatus(alive=False, started=False)
        cached = self._finished.get(op_id)
        if cached is not None:
            return cached
        try:
            info = self.client.get_operation(
                op_id, attributes=["state", "result", "start_time", "finish_time"]
            )
        except Exception as exc:  # noqa: BLE001
            if _is_no_such_operation(exc):
                return RunStatus(
                    alive=False, error={"summary": f"YTsaurus has no operation {op_id} any more"}
                )
            self.log.warning("YTsaurus: cannot read operation %s: %s", op_id, exc)
            return RunStatus(alive=None)  # cannot tell now; asked again next pass
        state = str(info.get("state") or "")
        if state in FINISHED_STATES:
            status = self.results.final(handle, op_id, state, info)
            _keep(self._finished, op_id, status)
            return status
        if state in RUNNING_STATES:
            return RunStatus(alive=True)
        return RunStatus(alive=None)  # a state this client does not know: keep watching

    def fetch_output(self, handle: RunHandle) -> bytes | None:
        return self.results.fetch_output(handle)

    def read_log(self, job_id: str, offset: int = 0, max_bytes: int = 65536) -> tuple[bytes, int]:
        return self.logs.read_log(job_id, offset, max_bytes)

    def log_size(self, job_id: str) -> int:
        return self.logs.log_size(job_id)

    # -- stopping ---------------------------------------------------------------------------

    def _running_jobs(self, op_id: str) -> list[str]:
        found = self.client.list_jobs(op_id, job_state="running")
        jobs = found.get("jobs") if isinstance(found, dict) else found
        return [str(j["id"]) for j in jobs or [] if j.get("id")]

    def signal(self, handle: RunHandle) -> None:
        """The preemption notice: YTsaurus interrupts the job (``SIGTERM``, its
        ``interruption_signal``) and aborts it after the grant's grace period; an operation
        whose job has not started yet is aborted at once (nothing to save)."""
        op_id = str(handle.ref.get("operation_id") or "")
        if not op_id:
            return
        _keep(self._signalled, op_id, None)
        grace_ms = max(1, int(handle.ref.get("grace_period_s") or 0)) * 1000
        try:
            jobs = self._running_jobs(op_id)
            for job in jobs:
                self.client.abort_job(job, interrupt_timeout=grace_ms)
            if not jobs:
                self._abort(op_id, "preempted before its job started")
        except Exception as exc:  # noqa: BLE001 - the broker kills at the deadline anyway
            self.log.warning("YTsaurus: cannot interrupt operation %s: %s", op_id, exc)

    def kill(self, handle: RunHandle) -> None:
        op_id = str(handle.ref.get("operation_id") or "")
        if op_id:
            self._abort(op_id, "stopped by jupyter-gpushare")

    def _abort(self, op_id: str, reason: str) -> None:
        try:
            self.client.abort_operation(op_id, reason=reason)
        except Exception as exc:  # noqa: BLE001 - finished already, or gone
            if not _is_no_such_operation(exc):
                self.log.info("YTsaurus: abort of %s: %s", op_id, exc)

    def forget(self, job_id: str) -> None:
        for op_id in self.logs.operations(job_id):
            for cache in (self._finished, self._signalled):
                cache.pop(op_id, None)
            self.logs.forget(op_id)
        with contextlib.suppress(Exception):
            self.client.remove(ys.job_dir(self.settings, job_id), recursive=True, force=True)
