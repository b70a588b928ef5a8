"""The limit watchdog for a job: the same rule and message as for a server's kernels.

Where nothing else holds a grant's memory (local ``env`` enforcement, no MPS), the
runner of a job watches its own process tree with the telemetry sampler (NVML on a real
GPU, the simulated sampler for a simulated grant) and the server's
:class:`~jupyter_gpushare.telemetry.watchdog.LimitWatchdog`. When the job's kernel stays
over the grant's memory limit it is stopped (SIGTERM, SIGKILL after a short grace) and the
job fails with the watchdog's message (``GPU memory limit 10.0 GiB exceeded: kernel of
train.ipynb used 11.2 GiB``), exactly what a kernel in JupyterLab would be told.

``GPUSHARE_SIMULATED_JOB_MEMORY_MIB`` makes the kernel of a job on a simulated grant "use"
that much memory (tests and demos, as the server extension's
``simulated_kernel_memory_mib``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Mapping

import psutil

from ..telemetry.attribution import KernelInfo, attribute, collect_process_tree
from ..telemetry.factory import make_sampler
from ..telemetry.grant import GrantInfo
from ..telemetry.sampler import Sampler
from ..telemetry.simulated import SimulatedSampler
from ..telemetry.watchdog import LimitWatchdog, watchdog_applies

KILL_GRACE_S = 5.0


class JobWatchdog:
    """Watches one job's processes in a thread; ``message`` is set once it acted."""

    def __init__(
        self, env: Mapping[str, str], label: str, interval_s: float = 1.0,
        runner_pid: int | None = None,
    ) -> None:
        self.grant = GrantInfo.from_env(env)
        self.applies, self.why = watchdog_applies(self.grant)
        if not self.grant.gpu_uuids:
            self.applies, self.why = False, "no GPU in the grant"
        self.label = label
        self.interval_s = interval_s
        self.runner_pid = runner_pid or os.getpid()
        self.sim_mib = float(env.get("GPUSHARE_SIMULATED_JOB_MEMORY_MIB") or 0)
        self.message: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sampler: Sampler | None = None

    def start(self) -> bool:
        if not self.applies:
            return False
        kind = "simulated" if self.grant.simulated else "auto"
        self.sampler = make_sampler(kind, self.interval_s, 60.0,
                                    simulated_uuids=self.grant.gpu_uuids)
        self._thread = threading.Thread(target=self._run, daemon=True, name="job-watchdog")
        self._thread.start()
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _kernels(self) -> list[KernelInfo]:
        try:
            children = psutil.Process(self.runner_pid).children()
        except psutil.Error:
            return []
        return [KernelInfo(f"job-kernel-{c.pid}", c.pid, self.label) for c in children]

    def _run(self) -> None:
        assert self.sampler is not None and self.grant.memory_limit_mib is not None
        sampler = self.sampler
        with contextlib.suppress(Exception):
            sampler.setup()
        dog = LimitWatchdog(limit_mib=self.grant.memory_limit_mib, server_pid=self.runner_pid)
        try:
            while not self._stop.wait(self.interval_s):
                kernels = self._kernels()
                if isinstance(sampler, SimulatedSampler) and self.sim_mib > 0:
                    for k in kernels:
                        if k.pid is not None and k.pid not in sampler.process_memory():
                            sampler.set_process_memory(k.pid, self.sim_mib)
                sample = sampler.tick()
                tree = collect_process_tree(self.runner_pid, kernels)
                att = attribute(sample, self.grant.gpu_uuids, tree, kernels)
                for violation in dog.check(att, time.time()):
                    self.message = violation.message
                    print(f"--- gpushare watchdog: {violation.message} ---", flush=True)
                    self._stop_process(violation.pid or _pid_of(violation.kernel_id))
                    return
        finally:
            with contextlib.suppress(Exception):
                sampler.teardown()

    @staticmethod
    def _stop_process(pid: int | None) -> None:
        if pid is None:
            return
        with contextlib.suppress(psutil.Error, OSError):
            proc = psutil.Process(pid)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(KILL_GRACE_S)
            except psutil.TimeoutExpired:
                proc.kill()


def _pid_of(kernel_id: str | None) -> int | None:
    if kernel_id and kernel_id.startswith("job-kernel-"):
        return int(kernel_id.rsplit("-", 1)[1])
    return None
