"""AMD Instinct / Radeon sampler through AMD SMI's Python library (``amdsmi``).

``amdsmi`` ships with ROCm (``/opt/rocm/share/amd_smi``, or ``pip install amdsmi`` matching
the installed ROCm). It is imported, and the library opened, only in
:meth:`AMDSMISampler.setup`, which runs in the sampler's own thread: never at import time,
never on the event loop. Figures the library or the board does not offer ("N/A", or an
``AmdSmiException``) come back as ``None``.

Units follow AMD SMI's documentation (ROCm 6.x): ``amdsmi_get_gpu_vram_usage`` gives
``vram_total`` / ``vram_used`` in MB (MiB), ``amdsmi_get_power_info`` watts
(``current_socket_power``, else ``average_socket_power``; ``power_limit``),
``amdsmi_get_temp_metric`` degrees Celsius, ``amdsmi_get_gpu_activity`` percent
(``gfx_activity`` is the compute engine, ``umc_activity`` the memory controller), and
``amdsmi_get_gpu_process_list`` one entry per process with ``pid`` and
``memory_usage.vram_mem`` in bytes.

Not run on AMD hardware here: it is tested against recorded answers written from that
documentation (``tests/data/vendors/amdsmi-mi300x.json``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .model import GPUSample, ProcessSample, Sample
from .sampler import DEFAULT_HISTORY_S, DEFAULT_INTERVAL_S, Sampler

MIB = 1024 * 1024
VENDOR = "AMD"


class AMDSMIUnavailable(RuntimeError):
    """AMD SMI is not installed, cannot be opened, or sees no GPU."""


def _number(value: Any) -> float | None:
    """A figure, or None for "N/A" / missing / not a number."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, dict) and "value" in value:  # some versions wrap {value, unit}
        return _number(value["value"])
    try:
        return float(str(value).split()[0])
    except (ValueError, IndexError):
        return None


class AMDSMISampler(Sampler):
    """Reads every AMD GPU that AMD SMI sees, once per interval."""

    source = "amdsmi"

    def __init__(
        self, interval_s: float = DEFAULT_INTERVAL_S, history_s: float = DEFAULT_HISTORY_S
    ) -> None:
        super().__init__(interval_s, history_s)
        self._lib: Any = None
        self._handles: list[Any] = []
        self._static: list[dict[str, Any]] = []

    # -- library -------------------------------------------------------------------
    def _try(self, fn: Callable[..., Any], *args: Any, default: Any = None) -> Any:
        try:
            return fn(*args)
        except Exception:  # AmdSmiException and friends: the figure is unavailable
            return default

    def setup(self) -> None:
        try:
            import amdsmi
        except Exception as exc:
            raise AMDSMIUnavailable(f"amdsmi is not installed: {exc}") from exc
        try:
            flags = getattr(getattr(amdsmi, "AmdSmiInitFlags", None), "INIT_AMD_GPUS", None)
            if flags is not None:
                amdsmi.amdsmi_init(flags)
            else:
                amdsmi.amdsmi_init()
        except Exception as exc:
            raise AMDSMIUnavailable(f"amdsmi_init failed: {exc}") from exc
        self._lib = amdsmi
        handles = list(self._try(amdsmi.amdsmi_get_processor_handles, default=[]) or [])
        if not handles:
            self._try(amdsmi.amdsmi_shut_down)
            self._lib = None
            raise AMDSMIUnavailable("AMD SMI sees no GPU")
        self._handles = handles
        self._static = [self._describe(i, h) for i, h in enumerate(handles)]

    def _describe(self, index: int, h: Any) -> dict[str, Any]:
        lib = self._lib
        asic = self._try(lib.amdsmi_get_gpu_asic_info, h, default={}) or {}
        uuid = self._try(lib.amdsmi_get_gpu_device_uuid, h) or f"AMD-GPU-{index}"
        name = str(asic.get("market_name") or asic.get("asic_name") or "AMD GPU").strip()
        if not name.upper().startswith("AMD"):
            name = f"AMD {name}"
        total = None
        vram = self._try(lib.amdsmi_get_gpu_vram_usage, h, default={}) or {}
        if "vram_total" in vram:
            total = _number(vram["vram_total"])
        return {"uuid": str(uuid), "name": name, "total_mib": total}

    def teardown(self) -> None:
        if self._lib is not None:
            self._try(self._lib.amdsmi_shut_down)
            self._lib = None

    # -- one GPU -------------------------------------------------------------------
    def _processes(self, h: Any, uuid: str) -> list[ProcessSample]:
        lib = self._lib
        out = []
        for p in self._try(lib.amdsmi_get_gpu_process_list, h, default=[]) or []:
            info = p if isinstance(p, dict) else self._try(lib.amdsmi_get_gpu_process_info,
                                                           h, p, default={}) or {}
            pid = info.get("pid")
            if pid is None:
                continue
            usage = info.get("memory_usage") or {}
            vram = _number(usage.get("vram_mem")) if isinstance(usage, dict) else None
            if vram is None:
                vram = _number(info.get("mem"))
            out.append(ProcessSample(int(pid), uuid, None if vram is None else vram / MIB))
        return out

    def _gpu(self, index: int, h: Any) -> tuple[GPUSample, list[ProcessSample]]:
        lib = self._lib
        static = self._static[index]
        vram = self._try(lib.amdsmi_get_gpu_vram_usage, h, default={}) or {}
        used = _number(vram.get("vram_used")) or 0.0
        total = _number(vram.get("vram_total")) or static["total_mib"] or 0.0
        activity = self._try(lib.amdsmi_get_gpu_activity, h, default={}) or {}
        power = self._try(lib.amdsmi_get_power_info, h, default={}) or {}
        watts = _number(power.get("current_socket_power"))
        if watts is None:
            watts = _number(power.get("average_socket_power"))
        temp = None
        types = getattr(lib, "AmdSmiTemperatureType", None)
        metrics = getattr(lib, "AmdSmiTemperatureMetric", None)
        if types is not None and metrics is not None:
            for sensor in ("HOTSPOT", "EDGE"):
                kind = getattr(types, sensor, None)
                if kind is not None:
                    temp = _number(self._try(lib.amdsmi_get_temp_metric, h, kind,
                                             metrics.CURRENT))
                    if temp is not None:
                        break
        gpu = GPUSample(
            index=index,
            uuid=static["uuid"],
            name=static["name"],
            memory_used_mib=used,
            memory_total_mib=total,
            utilization_pct=_number(activity.get("gfx_activity")),
            memory_bandwidth_pct=_number(activity.get("umc_activity")),
            temperature_c=temp,
            power_w=watts,
            power_limit_w=_number(power.get("power_limit")),
            vendor=VENDOR,
        )
        return gpu, self._processes(h, static["uuid"])

    def collect(self) -> Sample:
        if self._lib is None:
            raise AMDSMIUnavailable("AMD SMI not open (setup has not run in the sampler thread)")
        gpus, procs = [], []
        for i, h in enumerate(self._handles):
            g, p = self._gpu(i, h)
            gpus.append(g)
            procs.extend(p)
        return Sample(ts=time.time(), gpus=tuple(gpus), processes=tuple(procs),
                      simulated=False, source=self.source)
