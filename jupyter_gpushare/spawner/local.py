"""Local spawners: single-user servers as processes on the hub's machine.

``LocalGPUShareSpawner`` runs servers as the users' system accounts (JupyterHub's
``LocalProcessSpawner``); ``SimpleLocalGPUShareSpawner`` needs no system users (demo,
tests). Enforcement is the environment from :func:`.enforcement.local_env`: the granted
GPU UUIDs, MPS limits where an MPS control daemon runs, framework memory caps and the
``GPUSHARE_*`` variables.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from jupyterhub.spawner import LocalProcessSpawner, SimpleLocalProcessSpawner
from traitlets import CaselessStrEnum, Unicode

from jupyter_gpushare.broker.client import GrantInfo
from jupyter_gpushare.core.model import Profile
from jupyter_gpushare.spawner import enforcement
from jupyter_gpushare.spawner.mixin import GPUShareSpawner

__all__ = ["LocalGPUShareSpawner", "SimpleLocalGPUShareSpawner", "real_gpus_present"]


@functools.lru_cache(maxsize=1)
def real_gpus_present() -> bool:
    """Whether NVML finds at least one real GPU on this machine."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount()) > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return False


class _LocalEnforcement(GPUShareSpawner):
    mps = CaselessStrEnum(
        ["auto", "on", "off"],
        "auto",
        config=True,
        help="""Use MPS memory and thread limits: 'auto' when an MPS control daemon's pipe
        exists in mps_pipe_directory, 'on' always, 'off' never.""",
    )
    mps_pipe_directory = Unicode(
        "",
        config=True,
        help="CUDA_MPS_PIPE_DIRECTORY of the MPS control daemon (default /tmp/nvidia-mps).",
    )

    def apply_grant(self, grant: GrantInfo, profile: Profile | None) -> None:
        self.gpushare_grant = grant  # get_env turns it into the environment

    def mps_active(self) -> bool:
        if self.mps == "on":
            return True
        if self.mps == "off":
            return False
        return enforcement.mps_daemon_running(self.mps_pipe_directory or None)

    def get_env(self) -> dict[str, Any]:
        env = super().get_env()
        grant = self.gpushare_grant
        if self.gpushare_cpu_only and not self.grant_id:
            env.update(enforcement.no_gpu_env(self.gpushare_profile or ""))
        elif grant is not None and self.grant_id:
            env.update(
                enforcement.local_env(
                    grant,
                    mps=self.mps_active(),
                    real_gpus_present=real_gpus_present(),
                    broker_url=self.singleuser_broker_url(),
                    gpu_total_mib=self.gpu_memory_map(),
                    mps_pipe_dir=self.mps_pipe_directory or None,
                    inherited_pythonpath=env.get("PYTHONPATH", "")
                    or os.environ.get("PYTHONPATH", ""),
                )
            )
        return env


class LocalGPUShareSpawner(_LocalEnforcement, LocalProcessSpawner):
    """GPU shares for servers run as local system users (the embedded default)."""


class SimpleLocalGPUShareSpawner(_LocalEnforcement, SimpleLocalProcessSpawner):
    """Like LocalGPUShareSpawner, without system users: for demos and tests only."""
