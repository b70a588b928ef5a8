"""Which sampler a server, a widget or a job's watchdog gets: :func:`make_sampler` by kind,
and :class:`AutoSampler`, which picks NVML, else AMD SMI, else mx-smi, else simulated GPUs.

The vendor samplers build on :mod:`.sampler` (the base class and its ring buffer); this module
builds on them, so the base never imports a vendor module. Importing any of them opens no
driver: each opens its library in :meth:`~.sampler.Sampler.setup`, in the sampler's thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from .amd import AMDSMISampler
from .metax import MetaXSMISampler
from .model import Sample
from .nvml import NVMLSampler
from .sampler import DEFAULT_HISTORY_S, DEFAULT_INTERVAL_S, Sampler
from .simulated import SimulatedSampler


class AutoSampler(Sampler):
    """NVML where it finds a GPU, else AMD SMI or mx-smi, else simulated (in the thread)."""

    source = "auto"

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        history_s: float = DEFAULT_HISTORY_S,
        simulated_uuids: Sequence[str] = (),
        simulated_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(interval_s, history_s)
        self._sim_uuids = tuple(simulated_uuids)
        self._sim_options = dict(simulated_options or {})
        self.delegate: Sampler | None = None
        self.fallback_reason: str | None = None

    @property
    def simulated(self) -> bool:
        return self.delegate is not None and self.delegate.simulated

    def setup(self) -> None:
        nvml = NVMLSampler(self.interval_s, self.history_s)
        try:
            nvml.setup()
            self.delegate = nvml
            self.source = "nvml"
        except Exception as exc:
            other = _other_vendor(self.interval_s, self.history_s)
            if other is not None:
                self.delegate, self.source = other, other.source
                return
            self.fallback_reason = f"NVML found no GPU ({exc}); using simulated GPUs"
            self.delegate = SimulatedSampler(
                self.interval_s, self.history_s, uuids=self._sim_uuids, **self._sim_options
            )
            self.delegate.setup()
            self.source = "simulated"

    def collect(self) -> Sample:
        if self.delegate is None:
            raise RuntimeError("sampler not set up")
        sample = self.delegate.collect()
        if self.fallback_reason:
            sample = replace(sample, notes=(*sample.notes, self.fallback_reason))
        return sample

    def teardown(self) -> None:
        if self.delegate is not None:
            self.delegate.teardown()

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["fallback_reason"] = self.fallback_reason
        return d


def _other_vendor(interval_s: float, history_s: float) -> Sampler | None:
    """An AMD (amdsmi) or MetaX (mx-smi) sampler whose setup succeeded, or None."""
    for cls in (AMDSMISampler, MetaXSMISampler):
        sampler = cls(interval_s, history_s)
        try:
            sampler.setup()
        except Exception:  # not installed / no GPU of this vendor: try the next
            continue
        return sampler
    return None


def make_sampler(
    kind: str = "auto",
    interval_s: float = DEFAULT_INTERVAL_S,
    history_s: float = DEFAULT_HISTORY_S,
    simulated_uuids: Sequence[str] = (),
    simulated_options: dict[str, Any] | None = None,
) -> Sampler:
    """Build a sampler: ``auto`` (NVML, else AMD SMI, else mx-smi, else simulated),
    ``nvml``, ``amd`` (``amdsmi``), ``metax`` (``mx-smi``) or ``simulated``.

    Nothing here touches NVML; that happens in the sampler thread.
    """
    if kind == "simulated":
        return SimulatedSampler(
            interval_s, history_s, uuids=simulated_uuids, **(simulated_options or {})
        )
    if kind == "nvml":
        return NVMLSampler(interval_s, history_s)
    if kind == "amd":
        return AMDSMISampler(interval_s, history_s)
    if kind == "metax":
        return MetaXSMISampler(interval_s, history_s)
    if kind == "auto":
        return AutoSampler(interval_s, history_s, simulated_uuids, simulated_options)
    raise ValueError(f"unknown sampler kind {kind!r} (auto, nvml, amd, metax or simulated)")


def underlying(sampler: Sampler) -> Sampler:
    """The sampler that really collects (the delegate of an AutoSampler)."""
    if isinstance(sampler, AutoSampler) and sampler.delegate is not None:
        return sampler.delegate
    return sampler
