"""``GPUMeter``: live bars of GPU memory against the limit and utilisation, in a notebook.

>>> from jupyter_gpushare.widgets import GPUMeter
>>> GPUMeter()  # doctest: +SKIP

The meter samples locally in a background thread (NVML where a GPU is visible,
otherwise simulated GPUs, clearly labelled). In a server with a grant it shows the
grant's GPUs and this server's own memory against the grant's memory limit.
"""

from __future__ import annotations

import os
from typing import Any

import ipywidgets as w

from .telemetry.attribution import attribute, collect_process_tree
from .telemetry.grant import MIB_PER_GIB, GrantInfo
from .telemetry.model import Sample
from .telemetry.sampler import Sampler, make_sampler


def _gib(mib: float) -> str:
    return f"{mib / MIB_PER_GIB:.1f} GiB"


def _style(frac: float) -> str:
    return "danger" if frac > 1.0 else "warning" if frac > 0.9 else "success"


class _GPURow(w.VBox):
    """Title, memory bar and utilisation bar of one GPU."""

    def __init__(self, **kwargs: Any) -> None:
        self.title = w.HTML()
        self.memory = w.FloatProgress(min=0.0, max=1.0, description="Memory")
        self.memory_text = w.Label()
        self.util = w.FloatProgress(min=0.0, max=100.0, description="Compute")
        self.util_text = w.Label()
        super().__init__(
            [
                self.title,
                w.HBox([self.memory, self.memory_text]),
                w.HBox([self.util, self.util_text]),
            ],
            **kwargs,
        )


class GPUMeter(w.VBox):
    """Live GPU meter: one row of bars per GPU of this server's grant."""

    def __init__(
        self,
        interval_s: float = 1.0,
        sampler: Sampler | None = None,
        grant: GrantInfo | None = None,
        autostart: bool = True,
        server_pid: int | None = None,
        **kwargs: Any,
    ) -> None:
        self.grant = grant if grant is not None else GrantInfo.from_env()
        self.server_pid = server_pid or os.getppid()
        self.sampler = sampler or make_sampler(
            "simulated" if self.grant.simulated else "auto",
            interval_s,
            history_s=60.0,
            simulated_uuids=self.grant.gpu_uuids,
        )
        self.header = w.HTML("<b>GPU</b> <i>waiting for the first sample…</i>")
        self.rows: dict[str, _GPURow] = {}
        self.rows_box = w.VBox()
        super().__init__([self.header, self.rows_box], **kwargs)
        if autostart:
            self.start()

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        """Sample in a background thread and update the bars on each sample."""
        self.sampler.add_listener(self.update)
        self.sampler.start()

    def stop(self) -> None:
        self.sampler.remove_listener(self.update)
        self.sampler.stop()

    def close(self) -> None:
        self.stop()
        super().close()

    # -- drawing -------------------------------------------------------------------
    def header_text(self, sample: Sample) -> str:
        g = self.grant
        parts = ["<b>GPU</b>"]
        if sample.simulated:
            parts.append("<b style='color:#b45309'>SIMULATED</b> (no NVIDIA GPU here)")
        if g.has_grant:
            lim = f"limit {_gib(g.memory_limit_mib)} per GPU" if g.memory_limit_mib else "no limit"
            parts.append(f"{g.profile or 'grant'} · {lim}")
        else:
            parts.append("no grant: all visible GPUs, no limits")
        if sample.error:
            parts.append(f"<span style='color:#b91c1c'>{sample.error}</span>")
        return " · ".join(parts)

    def update(self, sample: Sample) -> None:
        """Redraw from one sample (called from the sampler thread)."""
        tree = collect_process_tree(self.server_pid, [])
        att = attribute(sample, self.grant.gpu_uuids, tree)
        self.header.value = self.header_text(sample)
        limit = self.grant.memory_limit_mib
        for og in att.gpus:
            row = self.rows.get(og.uuid)
            if row is None:
                row = self.rows[og.uuid] = _GPURow()
                self.rows_box.children = (*self.rows_box.children, row)
            own = og.own_memory_mib if self.grant.has_grant else og.memory_used_mib
            cap = float(limit) if limit else og.memory_total_mib
            tag = " (simulated)" if sample.simulated else ""
            row.title.value = f"GPU {og.gpu.index} · {og.gpu.name}{tag} · <code>{og.uuid}</code>"
            row.memory.max = max(cap, own, 1.0)
            row.memory.value = own
            row.memory.bar_style = _style(own / cap if cap else 0.0)
            what = "limit" if limit else "total"
            row.memory_text.value = f"{_gib(own)} of {_gib(cap)} {what}"
            util = og.own_util_pct if og.own_util_pct is not None else og.gpu.utilization_pct
            row.util.value = util or 0.0
            row.util.bar_style = "info"
            row.util_text.value = "n/a" if util is None else f"{util:.0f} %"
