"""``GPUMeter``: this server's own GPU use against its limit, in a notebook.

>>> from jupyter_gpushare.widgets import GPUMeter
>>> GPUMeter()  # doctest: +SKIP

The meter samples locally in a background thread (NVML where a GPU is visible,
otherwise simulated GPUs, clearly labelled). In a server with a grant each GPU row shows
**your** memory against the grant's memory limit and **your** compute against the grant's
compute share; the card's totals (everyone on it) are shown beside them, labelled as such.
A preemption notice for the grant (from the broker, as the server extension sees it) is
shown with its deadline and a countdown, updated every sample.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

import ipywidgets as w

from .telemetry.attribution import attribute, collect_process_tree
from .telemetry.factory import make_sampler
from .telemetry.grant import MIB_PER_GIB, GrantInfo
from .telemetry.model import Sample
from .telemetry.sampler import Sampler

Notices = Callable[[], list[dict[str, Any]]]


def _gib(mib: float) -> str:
    return f"{mib / MIB_PER_GIB:.1f} GiB"


def _style(frac: float) -> str:
    return "danger" if frac > 1.0 else "warning" if frac > 0.9 else "success"


def broker_notices(grant: GrantInfo, token: str | None = None, timeout: float = 5.0) -> Notices:
    """A function that asks the broker for this grant's notices (``[]`` when it cannot)."""
    token = token if token is not None else os.environ.get("JUPYTERHUB_API_TOKEN", "")

    def fetch() -> list[dict[str, Any]]:
        if not grant.broker_url or not grant.grant_id:
            return []
        url = grant.broker_url + "/notices?" + urllib.parse.urlencode({"grant_id": grant.grant_id})
        req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                data = json.loads(resp.read() or b"{}")
        except (OSError, ValueError):
            return []
        return [n for n in (data.get("notices") or []) if isinstance(n, dict)]

    return fetch


def deadline_of(notice: dict[str, Any]) -> float | None:
    ts = notice.get("deadline_ts")
    if isinstance(ts, (int, float)):
        return float(ts)
    try:
        d = dt.datetime.fromisoformat(str(notice.get("deadline")).replace("Z", "+00:00"))
    except ValueError:
        return None
    return (d if d.tzinfo else d.replace(tzinfo=dt.timezone.utc)).timestamp()


def countdown_text(notice: dict[str, Any], now: float | None = None) -> str:
    """``Preemption: ... stopped at 10:03:12 UTC (in 25 s)``."""
    now = time.time() if now is None else now
    deadline = deadline_of(notice)
    why = notice.get("reason") or "the owning team needs its GPU share back"
    if deadline is None:
        return f"Preemption: this borrowed GPU share is being reclaimed ({why})."
    left = max(0, round(deadline - now))
    clock = dt.datetime.fromtimestamp(deadline, dt.timezone.utc).strftime("%H:%M:%S UTC")
    return (
        f"Preemption: this borrowed GPU share is being reclaimed ({why}). "
        f"The server will be stopped at {clock} (in {left} s): save your work."
    )


class _GPURow(w.VBox):
    """Title, own memory and own compute bars, and the card's totals, of one GPU."""

    def __init__(self, **kwargs: Any) -> None:
        self.title = w.HTML()
        whole = {"description_width": "initial"}  # the label in full, not "Your mem…"
        self.memory = w.FloatProgress(min=0.0, max=1.0, description="Your memory", style=whole)
        self.memory_text = w.Label()
        self.util = w.FloatProgress(min=0.0, max=100.0, description="Your compute", style=whole)
        self.util_text = w.Label()
        self.card_text = w.HTML()
        super().__init__(
            [
                self.title,
                w.HBox([self.memory, self.memory_text]),
                w.HBox([self.util, self.util_text]),
                self.card_text,
            ],
            **kwargs,
        )


class GPUMeter(w.VBox):
    """Live GPU meter: one row per GPU of this server's grant, own use against own limit."""

    def __init__(
        self,
        interval_s: float = 1.0,
        sampler: Sampler | None = None,
        grant: GrantInfo | None = None,
        autostart: bool = True,
        server_pid: int | None = None,
        notices: Notices | None = None,
        notices_interval_s: float = 5.0,
        **kwargs: Any,
    ) -> None:
        self.grant = grant if grant is not None else GrantInfo.from_env()
        self.server_pid = server_pid or os.getppid()
        self.sampler = sampler or make_sampler(
            "simulated" if self.grant.simulated else "auto",
            interval_s,
            history_s=60.0,
            simulated_uuids=self.grant.gpu_uuids,
            simulated_options={
                # this kernel's own use: it computes as hard as it uses the CPU
                "own_pids": lambda: [os.getpid()],
                "own_compute_pct": self.grant.compute_pct,
                **(
                    {"memory_total_mib": self.grant.gpu_memory_mib}
                    if self.grant.gpu_memory_mib
                    else {}
                ),
            },
        )
        self.notices_fn: Notices = notices or broker_notices(self.grant)
        self.notices_interval_s = notices_interval_s
        self.notices: list[dict[str, Any]] = []
        self._notices_lock = threading.Lock()
        self._stop_notices = threading.Event()
        self._notice_thread: threading.Thread | None = None
        self.header = w.HTML("<b>GPU</b> <i>waiting for the first sample…</i>")
        self.notice = w.HTML("")
        self.rows: dict[str, _GPURow] = {}
        self.rows_box = w.VBox()
        super().__init__([self.header, self.notice, self.rows_box], **kwargs)
        if autostart:
            self.start()

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        """Sample in a background thread and update the bars on each sample; ask for
        notices in another (a slow broker never holds the samples up)."""
        self.sampler.add_listener(self.update)
        self.sampler.start()
        if self.grant.has_grant:
            self._stop_notices.clear()
            self._notice_thread = threading.Thread(
                target=self._notices_loop, name="gpushare-meter-notices", daemon=True
            )
            self._notice_thread.start()

    def stop(self) -> None:
        self.sampler.remove_listener(self.update)
        self.sampler.stop()
        self._stop_notices.set()

    def _notices_loop(self) -> None:
        while not self._stop_notices.is_set():
            with contextlib.suppress(Exception):  # never let the meter die over a notice
                self.refresh_notices()
            self._stop_notices.wait(self.notices_interval_s)

    def close(self) -> None:
        self.stop()
        super().close()

    # -- notices -------------------------------------------------------------------
    def refresh_notices(self) -> list[dict[str, Any]]:
        """Ask for this grant's preemption notices (its own thread, never the kernel's)."""
        if self.grant.has_grant:
            found = [n for n in self.notices_fn() if n.get("kind", "preemption") == "preemption"]
            with self._notices_lock:
                self.notices = found
        return self.notices

    def notice_html(self, now: float | None = None) -> str:
        if not self.notices:
            return ""
        first = min(self.notices, key=lambda n: deadline_of(n) or float("inf"))
        import html

        return (
            "<div class='gpushare-preemption' style='color:#b91c1c;font-weight:bold'>"
            f"{html.escape(countdown_text(first, now))}</div>"
        )

    # -- drawing -------------------------------------------------------------------
    def header_text(self, sample: Sample) -> str:
        g = self.grant
        parts = ["<b>GPU</b>"]
        if sample.simulated:
            parts.append("<b style='color:#b45309'>SIMULATED</b> (no NVIDIA GPU here)")
        if g.has_grant:
            lim = f"limit {_gib(g.memory_limit_mib)} per GPU" if g.memory_limit_mib else "no limit"
            share = f", {g.compute_pct:g} % compute" if g.compute_pct else ""
            parts.append(f"{g.profile or 'grant'} · your {lim}{share}")
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
        self.notice.value = self.notice_html()  # the countdown moves with every sample
        g = self.grant
        limit = g.memory_limit_mib
        for og in att.gpus:
            row = self.rows.get(og.uuid)
            if row is None:
                row = self.rows[og.uuid] = _GPURow()
                self.rows_box.children = (*self.rows_box.children, row)
            own = og.own_memory_mib if g.has_grant else og.memory_used_mib
            cap = float(limit) if limit else og.memory_total_mib
            tag = " (simulated)" if sample.simulated else ""
            row.title.value = f"GPU {og.gpu.index} · {og.gpu.name}{tag} · <code>{og.uuid}</code>"
            row.memory.max = max(cap, own, 1.0)
            row.memory.value = own
            row.memory.bar_style = _style(own / cap if cap else 0.0)
            what = "your limit" if limit else "card total"
            row.memory_text.value = f"{_gib(own)} of {_gib(cap)} {what}"
            card_util = og.gpu.utilization_pct
            if g.has_grant:
                mine = og.own_util_pct if og.own_util_pct is not None else None
                share = g.compute_pct or 100.0
                row.util.max = max(share, mine or 0.0, 1.0)
                row.util.value = mine or 0.0
                row.util.bar_style = _style((mine or 0.0) / share if share else 0.0)
                row.util_text.value = (
                    "n/a (the driver does not report per-process use)"
                    if mine is None
                    else f"{mine:.0f} % of your {share:g} % share"
                )
            else:
                row.util.max = 100.0
                row.util.value = card_util or 0.0
                row.util.bar_style = "info"
                row.util_text.value = "n/a" if card_util is None else f"{card_util:.0f} % (card)"
            row.card_text.value = (
                "<span class='gpushare-card' style='color:#555'>Whole card (all users): "
                f"memory {_gib(og.memory_used_mib)} of {_gib(og.memory_total_mib)}, compute "
                + ("n/a" if card_util is None else f"{card_util:.0f} %")
                + "</span>"
            )
