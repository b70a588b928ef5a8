"""SlurmGPUShareSpawner: single-user servers as Slurm jobs holding a gpushare grant.

Built on batchspawner's ``SlurmSpawner`` (the maintained JupyterHub project for batch
systems): it submits the job with ``sbatch``, follows it with ``squeue``, learns the
server's port through batchspawner's hub API handler (``/hub/api/batchspawner``,
registered when ``batchspawner`` is imported, which importing this module does) and
cancels it with ``scancel``. What gpushare adds:

* the grant becomes the job's resources (:func:`.slurm_options.slurm_request`):
  ``--gres=gpu:N`` or ``--gres=shard:K``, ``--account`` (team), ``--qos`` (priority
  class), ``--nodelist`` (the broker's node), ``--time`` (the profile's max lifetime), the
  profile's CPUs and memory; the ``GPUSHARE_*`` environment and framework memory caps
  (:func:`.enforcement.slurm_env`) reach the server through ``--export``;
* the spawn page shows the job's place in the Slurm queue and Slurm's reason
  (``squeue %r``: Resources, Priority...), after the broker's own queue position;
* spawner state holds the Slurm job id (batchspawner's ``job_id``) and the grant id, so
  after a hub restart ``poll`` finds both; a job that ended releases its grant at once.

:class:`SlurmQueueSpawner` is the Slurm part alone (queue reasons, node addresses), a
``SlurmSpawner`` without gpushare.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from batchspawner import SlurmSpawner, format_template
from traitlets import Bool, Dict, Float, Integer, Unicode, default

from jupyter_gpushare.broker.client import GrantInfo
from jupyter_gpushare.core.model import Profile
from jupyter_gpushare.export.slurm import slurm_name
from jupyter_gpushare.spawner import enforcement
from jupyter_gpushare.spawner.mixin import GPUShareSpawner, spawn_error
from jupyter_gpushare.spawner.slurm_options import (
    DEFAULT_SHARDS_PER_GPU,
    SlurmRequest,
    SlurmRequestError,
    add_directives,
    parse_job_status,
    queue_message,
    queue_position,
    slurm_request,
)

__all__ = ["SlurmGPUShareSpawner", "SlurmQueueSpawner"]

PENDING_STATES = ("PENDING", "CONFIGURING", "REQUEUED", "RESIZING", "SUSPENDED")
RUNNING_STATES = ("RUNNING", "COMPLETING")


class SlurmQueueSpawner(SlurmSpawner):
    """batchspawner's SlurmSpawner that tells why its job waits and where its node is."""

    batch_query_cmd = Unicode(
        "squeue -h -j {job_id} -o '%T %r %B'",
        config=True,
        help="""Query one job: its state, Slurm's reason and its batch host, in this order
        (the state first and the host last are what batchspawner's regexes read).""",
    )
    queue_query_cmd = Unicode(
        "squeue -h -t PENDING --sort=-p,i -o %i{partition_opt}",
        config=True,
        help="""Pending job ids in the order Slurm considers them, for the queue position
        on the spawn page. {partition_opt} is ' -p <partition>' when one is set; the
        req_* values are available as for batch_query_cmd. Empty: no position shown.""",
    )
    node_addresses = Dict(
        key_trait=Unicode(),
        value_trait=Unicode(),
        config=True,
        help="""Slurm NodeName -> the address the hub and the proxy reach a server on that
        node at, where node names do not resolve from the hub (e.g. {'gpu01': '10.0.0.11'}).
        Names not listed are used as they are.""",
    )
    slurm_progress_interval = Float(
        2.0,
        config=True,
        help="Seconds between queue-position queries while the job is pending.",
    )

    wait_for_port = Float(
        60.0,
        config=True,
        help="""Once the job has reported its port, wait up to this many seconds until the
        server accepts connections before start() returns, so the hub's HTTP check (whose
        back-off grows to 5 s between tries) finds it up at once. 0: return at once, as
        batchspawner does.""",
    )

    async def start(self) -> Any:  # type: ignore[override]
        ip, port = await super().start()
        if self.wait_for_port > 0 and ip and port:
            await self._wait_listening(str(ip), int(port), self.wait_for_port)
        return ip, port

    async def _wait_listening(self, ip: str, port: int, limit: float) -> bool:
        """Until ``ip:port`` accepts a TCP connection (False after ``limit`` seconds)."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), 2.0)
            except (OSError, asyncio.TimeoutError):
                await asyncio.sleep(0.1)
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return True
        self.log.warning("Slurm job %s: nothing listens at %s:%s after %.0f s",
                         self.job_id, ip, port, limit)
        return False

    def state_gethost(self) -> str:
        host = super().state_gethost()
        return self.node_addresses.get(host, host) if host else host

    async def slurm_queue_position(self) -> int | None:
        """The job's place among pending jobs (None when not known)."""
        if not self.queue_query_cmd or not self.job_id:
            return None
        subvars = self.get_req_subvars()
        part = subvars.get("partition") or ""
        subvars["partition_opt"] = f" -p {part}" if part else ""
        subvars["job_id"] = self.job_id
        cmd = " ".join(
            (
                format_template(self.exec_prefix, **subvars),
                format_template(self.queue_query_cmd, **subvars),
            )
        )
        try:
            out = await self.run_command(cmd)
        except Exception as exc:  # a failed query only costs the position
            self.log.debug("squeue for the queue position failed: %s", exc)
            return None
        return queue_position(self.job_id, out)

    async def progress(self) -> AsyncIterator[dict[str, Any]]:  # type: ignore[override]
        """The Slurm job's state on the spawn page: pending with position and reason,
        then running on its node."""
        last = ""
        position: int | None = None
        next_query = 0.0
        while True:
            status = parse_job_status(self.job_status) if self.job_id else None
            if status is not None and status.state in RUNNING_STATES:
                yield {
                    "progress": 70,
                    "message": f"Slurm job {self.job_id} running on {status.host}: "
                    "waiting for the server to start",
                    "gpushare": {"slurm_job_id": self.job_id, "slurm_state": status.state},
                }
                return
            if status is not None and status.state in PENDING_STATES:
                if time.monotonic() >= next_query:
                    position = await self.slurm_queue_position()
                    next_query = time.monotonic() + self.slurm_progress_interval
                message = queue_message(self.job_id, status, position)
                if message != last:
                    last = message
                    yield {
                        "progress": 40,
                        "message": message,
                        "gpushare": {
                            "slurm_job_id": self.job_id,
                            "slurm_state": status.state,
                            "slurm_reason": status.reason,
                            "queue_position": position,
                        },
                    }
            if not getattr(self, "_spawn_pending", True):
                return
            await asyncio.sleep(min(0.5, self.startup_poll_interval or 0.5))


class SlurmGPUShareSpawner(GPUShareSpawner, SlurmQueueSpawner):
    """batchspawner's SlurmSpawner whose jobs get exactly the GPU share the broker granted."""

    shards_per_gpu = Integer(
        DEFAULT_SHARDS_PER_GPU,
        config=True,
        help="""GRES shards per GPU (gres.conf Count= of each GPU's shard line) where the
        hub reads no policy file; with one, the policy's slurm.shards_per_gpu counts (the
        Slurm export writes the same number into gres.conf). A fraction f asks for
        ceil(f x shards) shards.""",
    )
    account_template = Unicode(
        None,
        allow_none=True,
        config=True,
        help="""--account of the job; {team}, {pool}, {priority}, {user} expand (as the
        Slurm export writes names: lower case, '_' for other characters). Default: the
        export's accounts, '{team}_{pool}' in the pool's partition, '{team}' in a
        partition set by req_partition or the policy's slurm.partition. '' passes none.""",
    )
    qos_template = Unicode(
        "{priority}",
        config=True,
        help="""--qos of the job; {priority} is the grant's priority class (also {team},
        {pool}, {user}), the QOS the Slurm export writes per class. '' passes none.""",
    )
    partition_per_pool = Bool(
        True,
        config=True,
        help="""Without req_partition or the policy's slurm.partition, submit to the
        partition named after the grant's pool (one per pool, as the Slurm export writes
        them). False: no --partition (Slurm's default partition).""",
    )
    pin_to_node = Bool(
        True,
        config=True,
        help="Pass --nodelist=<the node the broker placed the grant on>.",
    )
    node_names = Dict(
        key_trait=Unicode(),
        value_trait=Unicode(),
        config=True,
        help="Broker node name -> Slurm NodeName, where the policy names nodes differently.",
    )
    set_resources_from_profile = Bool(
        True,
        config=True,
        help="Set req_nprocs and req_memory (--cpus-per-task, --mem) from the profile.",
    )

    gpushare_slurm: SlurmRequest | None = None

    @default("gpu_poll_interval")
    def _default_gpu_poll_interval(self) -> float:
        # each poll is an squeue call to slurmctld: every 10 s per server, not 2 s
        return 10.0

    # ------------------------------------------------------------------ grant -> job

    def effective_shards_per_gpu(self) -> int:
        policy = self.gpushare_policy()
        if policy is not None:
            return int(policy.slurm.shards_per_gpu)
        return int(self.shards_per_gpu)

    def partition_and_account(self, grant: GrantInfo) -> tuple[str, str]:
        """The job's partition and account template (see ``account_template``)."""
        policy = self.gpushare_policy()
        named = self.req_partition or (policy.slurm.partition if policy is not None else "")
        if named:
            partition, account = named, "{team}"
        elif self.partition_per_pool:
            partition, account = slurm_name(grant.pool), "{team}_{pool}"
        else:
            partition, account = "", "{team}_{pool}"
        if self.account_template is not None:
            account = self.account_template
        return partition, account

    def apply_profile(self, profile: Profile) -> None:
        super().apply_profile(profile)
        if self.set_resources_from_profile:
            if profile.cpu_milli:
                self.req_nprocs = str(max(1, math.ceil(profile.cpu_milli / 1000)))
            if profile.memory_mib:
                self.req_memory = f"{profile.memory_mib}M"

    def slurm_request_for(self, grant: GrantInfo, profile: Profile | None) -> SlurmRequest:
        """The sbatch options for ``grant`` (SpawnException 409 if Slurm could not run it)."""
        lifetime = profile.max_lifetime_s if profile is not None else None
        if lifetime is None and isinstance(grant.raw.get("max_lifetime_s"), (int, float)):
            lifetime = int(grant.raw["max_lifetime_s"])
        partition, account = self.partition_and_account(grant)
        try:
            return slurm_request(
                grant,
                shards_per_gpu=self.effective_shards_per_gpu(),
                account_template=account,
                qos_template=self.qos_template,
                partition=partition,
                max_lifetime_s=lifetime,
                pin_node=self.pin_to_node,
                node_names=self.node_names,
            )
        except SlurmRequestError as exc:
            raise spawn_error(
                f"Cannot run this GPU share as a Slurm job ({exc.field}): {exc.message}",
                reason="gpushare-slurm-request",
                status_code=409,
            ) from None

    def apply_grant(self, grant: GrantInfo, profile: Profile | None) -> None:
        self.gpushare_grant = grant
        self.gpushare_slurm = self.slurm_request_for(grant, profile)
        req = self.gpushare_slurm
        self._event(
            35,
            f"Submitting the Slurm job: {' '.join(req.args())}",
            gpushare={"slurm": req.options()},
        )

    def apply_no_gpu(self, profile: Profile) -> None:
        self.gpushare_slurm = None

    def get_req_subvars(self) -> dict[str, Any]:
        subvars: dict[str, Any] = super().get_req_subvars()
        req = self.gpushare_slurm if self.grant_id else None
        if req is not None:
            subvars["gres"] = req.gres
            if req.partition:
                subvars["partition"] = req.partition
            if req.time:
                subvars["runtime"] = req.time
            if req.qos:
                subvars["qos"] = req.qos
            if req.account:
                subvars["account"] = req.account
        return subvars

    async def _get_batch_script(self, **subvars: Any) -> str:
        # batchspawner lays user_options over the template's variables; only the grant and
        # the admin's req_* settings may fill them (the form offers 'profile' alone)
        subvars.update(self.get_req_subvars())
        # the variables passed with --export are this spawn's (a grant adds some; batchspawner
        # computes req_keepvars once per spawner object)
        names = [n for n in str(subvars.get("keepvars") or "").split(",") if n]
        for key in self.get_env():
            if key not in names:
                names.append(key)
        subvars["keepvars"] = ",".join(names)
        script: str = await super()._get_batch_script(**subvars)
        req = self.gpushare_slurm if self.grant_id else None
        return add_directives(script, req) if req is not None else script

    def get_env(self) -> dict[str, Any]:
        env: dict[str, Any] = super().get_env()
        grant, req = self.gpushare_grant, self.gpushare_slurm
        if self.gpushare_cpu_only and not self.grant_id:
            env.update(enforcement.no_gpu_env(self.gpushare_profile or ""))
        elif grant is not None and self.grant_id and req is not None:
            env.update(
                enforcement.slurm_env(
                    grant,
                    gres=req.gres,
                    broker_url=self.singleuser_broker_url(),
                    gpu_total_mib=self.gpu_memory_map(),
                    inherited_pythonpath=env.get("PYTHONPATH", "")
                    or os.environ.get("PYTHONPATH", ""),
                )
            )
        return env

    # ------------------------------------------------------------------ state

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = super().get_state()
        if self.grant_id and self.gpushare_slurm is not None:
            state["gpushare_slurm"] = self.gpushare_slurm.options()
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        raw = state.get("gpushare_slurm")
        if isinstance(raw, dict) and raw.get("--gres"):
            self.gpushare_slurm = SlurmRequest(
                requeue="--requeue" in raw,
                gres=str(raw["--gres"]),
                account=str(raw.get("--account") or ""),
                qos=str(raw.get("--qos") or ""),
                nodelist=str(raw.get("--nodelist") or ""),
                partition=str(raw.get("--partition") or ""),
                time=str(raw.get("--time") or ""),
            )

    def clear_state(self) -> None:
        super().clear_state()
        self.gpushare_slurm = None
