"""NVML sampler (nvidia-ml-py, imported as ``pynvml``).

``pynvml`` is imported and NVML opened only in :meth:`NVMLSampler.setup`, which runs in
the sampler's background thread: never at import time, never on the event loop.
Figures a driver or GPU does not offer (utilisation under MIG, per-process samples on
some drivers, power on some boards) come back as ``None``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .model import GPUSample, MIGSample, ProcessSample, Sample
from .sampler import DEFAULT_HISTORY_S, DEFAULT_INTERVAL_S, Sampler

MIB = 1024 * 1024


class NVMLUnavailable(RuntimeError):
    """NVML could not be opened or sees no GPU."""


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def probe_nvml() -> tuple[bool, str]:
    """Open NVML and count GPUs (blocking; call off the event loop).

    Returns ``(True, "<n> GPU(s), driver <v>")`` or ``(False, reason)``.
    """
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:
        return False, f"nvmlInit failed: {exc}"
    try:
        n = pynvml.nvmlDeviceGetCount()
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        if n == 0:
            return False, "NVML sees no GPU"
        return True, f"{n} GPU(s), driver {driver}"
    finally:
        pynvml.nvmlShutdown()


class NVMLSampler(Sampler):
    """Reads every visible GPU through NVML once per interval."""

    source = "nvml"

    def __init__(
        self, interval_s: float = DEFAULT_INTERVAL_S, history_s: float = DEFAULT_HISTORY_S
    ) -> None:
        super().__init__(interval_s, history_s)
        self._nvml: Any = None
        self._handles: list[Any] = []
        self._static: list[dict[str, Any]] = []
        self._last_proc_ts: dict[int, int] = {}
        self.driver_version = ""

    def _safe(self, fn: Callable[[], Any], default: Any) -> Any:
        try:
            return fn()
        except self._nvml.NVMLError:
            return default

    def _try(self, fn: Callable[..., Any], *args: Any, default: Any = None) -> Any:
        try:
            return fn(*args)
        except self._nvml.NVMLError:
            return default

    def setup(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as exc:
            raise NVMLUnavailable(f"nvmlInit failed: {exc}") from exc
        self._nvml = pynvml
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            pynvml.nvmlShutdown()
            raise NVMLUnavailable("NVML sees no GPU")
        self.driver_version = _text(pynvml.nvmlSystemGetDriverVersion())
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self._static = []
        for h in self._handles:
            limit_mw = self._try(pynvml.nvmlDeviceGetEnforcedPowerLimit, h)
            limit = None if limit_mw is None else limit_mw / 1000
            self._static.append(
                {
                    "uuid": _text(pynvml.nvmlDeviceGetUUID(h)),
                    "name": _text(pynvml.nvmlDeviceGetName(h)),
                    "power_limit_w": limit,
                }
            )

    def teardown(self) -> None:
        if self._nvml is not None:
            self._safe(self._nvml.nvmlShutdown, None)
            self._nvml = None

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["driver_version"] = self.driver_version
        return d

    # -- one GPU -------------------------------------------------------------------
    def _mig_devices(self, h: Any) -> tuple[bool, list[tuple[MIGSample, Any]]]:
        nv = self._nvml
        mode = self._safe(lambda: nv.nvmlDeviceGetMigMode(h), None)
        if not mode or mode[0] != nv.NVML_DEVICE_MIG_ENABLE:
            return False, []
        out: list[tuple[MIGSample, Any]] = []
        n = self._safe(lambda: nv.nvmlDeviceGetMaxMigDeviceCount(h), 0)
        for i in range(n):
            mh = self._try(nv.nvmlDeviceGetMigDeviceHandleByIndex, h, i)
            if mh is None:
                continue
            mem = nv.nvmlDeviceGetMemoryInfo(mh)
            out.append(
                (
                    MIGSample(
                        uuid=_text(nv.nvmlDeviceGetUUID(mh)),
                        index=i,
                        memory_used_mib=mem.used / MIB,
                        memory_total_mib=mem.total / MIB,
                        name=_text(self._try(nv.nvmlDeviceGetName, mh, default="")),
                    ),
                    mh,
                )
            )
        return True, out

    def _processes(self, h: Any, uuid: str) -> list[ProcessSample]:
        nv = self._nvml
        out = []
        for kind, fn in (
            ("compute", nv.nvmlDeviceGetComputeRunningProcesses),
            ("graphics", nv.nvmlDeviceGetGraphicsRunningProcesses),
        ):
            for p in self._try(fn, h, default=[]):
                used = getattr(p, "usedGpuMemory", None)
                out.append(
                    ProcessSample(
                        pid=int(p.pid),
                        gpu_uuid=uuid,
                        memory_used_mib=None if used is None else used / MIB,
                        kind=kind,
                    )
                )
        return out

    def _process_utilization(self, index: int, h: Any) -> dict[int, tuple[float, float]] | None:
        """pid -> (sm %, memory %) from the driver's recent samples, or None if unsupported."""
        nv = self._nvml
        last = self._last_proc_ts.get(index, 0)
        try:
            samples = nv.nvmlDeviceGetProcessUtilization(h, last)
        except nv.NVMLError_NotFound:  # no process ran since `last`
            return {}
        except nv.NVMLError:
            return None
        out: dict[int, tuple[float, float]] = {}
        for s in samples:
            out[int(s.pid)] = (float(s.smUtil), float(s.memUtil))
            last = max(last, int(s.timeStamp))
        self._last_proc_ts[index] = last
        return out

    def _gpu(self, index: int, h: Any) -> tuple[GPUSample, list[ProcessSample], bool]:
        nv = self._nvml
        static = self._static[index]
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        util = self._safe(lambda: nv.nvmlDeviceGetUtilizationRates(h), None)
        mig_mode, migs = self._mig_devices(h)
        procs: list[ProcessSample] = []
        if mig_mode:
            for m, mh in migs:
                procs.extend(self._processes(mh, m.uuid))
        else:
            procs.extend(self._processes(h, static["uuid"]))
        putil = None if mig_mode else self._process_utilization(index, h)
        if putil:
            procs = [
                ProcessSample(
                    p.pid, p.gpu_uuid, p.memory_used_mib, *putil.get(p.pid, (0.0, 0.0)), p.kind
                )
                for p in procs
            ]
        power = self._safe(lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000, None)
        gpu = GPUSample(
            index=index,
            uuid=static["uuid"],
            name=static["name"],
            memory_used_mib=mem.used / MIB,
            memory_total_mib=mem.total / MIB,
            utilization_pct=None if util is None else float(util.gpu),
            memory_bandwidth_pct=None if util is None else float(util.memory),
            temperature_c=self._safe(
                lambda: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)), None
            ),
            power_w=power,
            power_limit_w=static["power_limit_w"],
            mig_mode=mig_mode,
            mig_devices=tuple(m for m, _ in migs),
            vendor="NVIDIA",
        )
        return gpu, procs, putil is not None

    def collect(self) -> Sample:
        if self._nvml is None:
            raise NVMLUnavailable("NVML not open (setup has not run in the sampler thread)")
        gpus, procs, any_putil = [], [], False
        for i, h in enumerate(self._handles):
            g, p, pu = self._gpu(i, h)
            gpus.append(g)
            procs.extend(p)
            any_putil = any_putil or pu
        return Sample(
            ts=time.time(),
            gpus=tuple(gpus),
            processes=tuple(procs),
            simulated=False,
            source=self.source,
            process_utilization=any_putil,
        )
