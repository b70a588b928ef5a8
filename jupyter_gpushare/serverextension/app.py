"""``GPUShareServerApp``: the jupyter_server extension serving live GPU telemetry."""

from __future__ import annotations

from typing import Any

from jupyter_server.extension.application import ExtensionApp
from traitlets import Bool, CaselessStrEnum, Float, Int, Unicode

from .handlers import handlers
from .hostuse import resource_usage_loaded
from .jobs import job_handlers
from .service import ServiceConfig, TelemetryService
from .switch import switch_handlers


class _LazyTerminals:
    """The server's terminal manager (jupyter_server_terminals), looked up when needed: that
    extension may load after this one."""

    def __init__(self, serverapp: Any) -> None:
        self.serverapp = serverapp

    @property
    def terminals(self) -> dict[str, Any]:
        web_app = getattr(self.serverapp, "web_app", None)
        settings = getattr(web_app, "settings", {}) or {}
        tm = settings.get("terminal_manager")
        terms = getattr(tm, "terminals", None)
        return terms if isinstance(terms, dict) else {}


class GPUShareServerApp(ExtensionApp):
    """Live GPU telemetry, limit watchdog and grant information for JupyterLab."""

    name = "jupyter_gpushare.serverextension"
    load_other_extensions = True

    sampler = CaselessStrEnum(
        ["auto", "nvml", "amd", "metax", "simulated"],
        default_value="auto",
        config=True,
        help="""Where samples come from: "nvml" (a real NVIDIA GPU), "amd" (AMD SMI's amdsmi
        library), "metax" (the mx-smi command), "simulated", or "auto" (NVML, else AMD SMI,
        else mx-smi where they find a GPU, otherwise simulated; a grant of simulated GPUs is
        always sampled by the simulator). Simulated answers say "simulated": true.""",
    )
    sample_interval_s = Float(
        1.0, config=True, help="Seconds between samples (the sampler runs in its own thread)."
    )
    history_s = Float(
        900.0, config=True, help="Seconds of sample history kept in memory (default 15 min)."
    )
    watchdog_enabled = Bool(
        True,
        config=True,
        help="""Stop a kernel whose GPU memory goes over the grant's limit, where no hardware
        or MPS limit holds memory (local "env" enforcement).""",
    )
    watchdog_action = CaselessStrEnum(
        ["interrupt", "restart", "shutdown"],
        default_value="restart",
        config=True,
        help="""What the watchdog does to a kernel over its GPU memory limit. "restart"
        (default) frees the memory; "interrupt" only stops the running cell (memory held
        by variables stays held); "shutdown" stops the kernel for good.""",
    )
    watchdog_grace_samples = Int(
        2, config=True, help="Consecutive over-limit samples needed before the watchdog acts."
    )
    watchdog_cooldown_s = Float(
        10.0, config=True, help="Seconds the watchdog leaves a kernel alone after acting on it."
    )
    watchdog_kill_grace_s = Float(
        5.0,
        config=True,
        help="""A process of the server that is not a kernel (e.g. `python train.py` in a
        terminal) and goes over the limit gets SIGTERM, then SIGKILL after this many seconds.""",
    )
    low_util_threshold_pct = Float(
        20.0, config=True, help="Compute utilisation (%) under which held memory is flagged."
    )
    low_util_window_s = Float(
        300.0, config=True, help="Seconds of sustained low utilisation before the hint shows."
    )
    low_util_min_memory_mib = Float(
        1024.0, config=True, help="Memory (MiB) the server must hold for the hint to apply."
    )
    heartbeat_interval_s = Float(
        60.0, config=True, help="Seconds between usage heartbeats to the broker (GPU-hours)."
    )
    notices_interval_s = Float(
        5.0,
        config=True,
        help="""Seconds between polls of the broker for preemption notices (a borrowed
        server's grace period is often 30-60 s: keep this well below it).""",
    )
    notices_to_kernels = Bool(
        True,
        config=True,
        help="""Write a preemption notice with its deadline into every kernel's output (and
        once more shortly before the deadline), not only onto the stream.""",
    )
    broker_timeout_s = Float(5.0, config=True, help="Timeout (s) of each broker request.")
    broker_retry_window_s = Float(
        10.0, config=True,
        help="""How long a jobs call from the lab keeps trying a broker that is restarting
        (seconds; 0: never). A call is sent again when the connection was refused (the broker
        received nothing) and, for GET and DELETE, when the broker answered 502/503/504 or could
        not be reached; a POST that reached the broker is never sent twice.""",
    )
    max_output_bytes = Int(
        256 * 1024 * 1024, config=True,
        help="""Largest executed notebook that GET /gpushare/api/jobs/<id>/output serves from
        the user's own files (where the batch backend writes it only there, e.g. the user's
        volume on Kubernetes); a bigger one answers 413 and is opened in JupyterLab instead.""",
    )
    simulated_gpu_count = Int(
        2, config=True, help="Simulated GPUs when there is no grant to take UUIDs from."
    )
    simulated_gpu_model = Unicode(
        "H200-sim", config=True, help="Model name of simulated GPUs."
    )
    simulated_gpu_memory_mib = Int(
        143771,
        config=True,
        help=(
            "Memory (MiB) of each simulated GPU where the grant does not say (the spawner "
            "sets GPUSHARE_GPU_MEMORY_MIB from the policy)."
        ),
    )
    simulated_kernel_memory_mib = Int(
        0,
        config=True,
        help="""With the simulated sampler, make every kernel of this server "use" this many
        MiB on its first GPU (demos and tests of the watchdog); 0 = off.""",
    )
    simulated_background_load = Bool(
        True,
        config=True,
        help="Simulated GPUs show a plausible varying load from other users (device totals).",
    )

    service: TelemetryService | None = None

    def service_config(self) -> ServiceConfig:
        return ServiceConfig(
            sampler=self.sampler.lower(),
            interval_s=self.sample_interval_s,
            history_s=self.history_s,
            watchdog_action=self.watchdog_action.lower(),
            watchdog_enabled=self.watchdog_enabled,
            watchdog_grace_samples=self.watchdog_grace_samples,
            watchdog_cooldown_s=self.watchdog_cooldown_s,
            watchdog_kill_grace_s=self.watchdog_kill_grace_s,
            low_util_threshold_pct=self.low_util_threshold_pct,
            low_util_window_s=self.low_util_window_s,
            low_util_min_memory_mib=self.low_util_min_memory_mib,
            heartbeat_interval_s=self.heartbeat_interval_s,
            notices_interval_s=self.notices_interval_s,
            notices_to_kernels=self.notices_to_kernels,
            broker_timeout_s=self.broker_timeout_s,
            simulated_gpu_count=self.simulated_gpu_count,
            simulated_gpu_model=self.simulated_gpu_model,
            simulated_gpu_memory_mib=self.simulated_gpu_memory_mib,
            simulated_kernel_memory_mib=self.simulated_kernel_memory_mib,
            simulated_background_load=self.simulated_background_load,
        )

    def initialize_settings(self) -> None:
        sa: Any = self.serverapp
        self.service = TelemetryService(
            self.service_config(),
            kernel_manager=getattr(sa, "kernel_manager", None),
            session_manager=getattr(sa, "session_manager", None),
            terminal_manager=_LazyTerminals(sa),
        )
        self.settings["gpushare_service"] = self.service
        web_settings: dict[str, Any] = getattr(getattr(sa, "web_app", None), "settings", {})
        self.service.host_elsewhere = lambda: resource_usage_loaded(web_settings)
        self.settings["gpushare_max_output_bytes"] = int(self.max_output_bytes)
        self.settings["gpushare_broker_retry_window_s"] = float(self.broker_retry_window_s)

    def initialize_handlers(self) -> None:
        self.handlers.extend(handlers() + job_handlers() + switch_handlers())

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        if self.service is not None:
            await self.service.start()

    async def stop_extension(self) -> None:
        if self.service is not None:
            await self.service.stop()
