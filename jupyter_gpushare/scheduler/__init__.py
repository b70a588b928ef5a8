"""jupyter-scheduler's "Create Job" submitting through the gpushare broker.

Set in the single-user server's configuration::

    c.SchedulerApp.scheduler_class = "jupyter_gpushare.scheduler.GPUShareScheduler"
    c.SchedulerApp.environment_manager_class = (
        "jupyter_gpushare.scheduler.GPUShareEnvironmentManager")

The "environment" of a job is a gpushare profile (those the user's teams may use, from the
broker), the "compute type" its priority, and the parameters ``gpushare_max_runtime`` and
``gpushare_checkpoint`` its runtime and checkpointing; every job (and every run of a job
definition) is a broker job, so it shows in the gpushare jobs panel too. Like the server
extension, this package talks to the broker over HTTP only.
"""

from __future__ import annotations

from .environments import GPUShareEnvironmentManager
from .scheduler import GPUShareScheduler
from .task_runner import GPUShareTaskRunner

__all__ = ["GPUShareEnvironmentManager", "GPUShareScheduler", "GPUShareTaskRunner"]
