"""Demand from the Alibaba GPU trace (cluster-trace-gpu-v2023, ``openb_pod_list_*.csv``), for
sites without history: a documented mapping of its pods onto a policy's teams and pools.

Pure: :func:`pods_to_demands` takes the CSV's rows as dictionaries (read them with
:func:`read_pods`). The mapping (also in ``docs/whatif.md``):

* **time**: ``creation_time`` is seconds since the trace began (about five months, most
  pods late in it); arrivals are compressed onto the window, in their order:
  ``start + creation_time x window / (last creation_time)`` (a trace shorter than the
  window is not stretched); durations are not scaled;
* **work**: ``deletion_time - scheduled_time`` (a pod never scheduled: ``- creation_time``),
  at least one minute;
* **ask**: ``gpu_milli`` of 1000 is ``num_gpu`` whole GPUs, in the policy's first exclusive
  pool (else its first shared one); less is that fraction of one GPU in the first pool that
  shares GPUs; pods without a GPU are left out; CPU, RAM and ``gpu_spec`` are not carried
  (the policy's nodes are not the trace's);
* **team**: the policy's teams in name order, picked by a stable hash (CRC-32) of the pod's
  name, so a pod always lands in the same team;
* **kind**: ``qos`` BE (best effort) is a batch job at the policy's lowest preemptible
  priority class, declaring checkpoints; LS, Burstable and Guaranteed are interactive
  servers at the class named ``interactive`` if there is one, else the lowest class that
  is not preemptible;
* nobody in the trace retries or gives up: a refused pod is lost demand.
"""

from __future__ import annotations

import csv
import zlib
from collections.abc import Iterable
from pathlib import Path

from ..core.model import GPUAsk, Kind, Policy, Pool, PriorityClass, Request, SharingMode
from .demand import Demand


class TraceError(ValueError):
    """The trace cannot be mapped onto the policy (names what is missing)."""


def read_pods(path: str | Path) -> list[dict[str, str]]:
    """The rows of an ``openb_pod_list_*.csv`` file."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    need = {"name", "num_gpu", "gpu_milli", "qos", "creation_time", "deletion_time"}
    if rows and not need <= set(rows[0]):
        raise TraceError(f"{path}: not an Alibaba pod list (columns {sorted(need)} expected)")
    return rows


def _pool(policy: Policy, shares: bool) -> Pool | None:
    for pool in policy.pools:
        if pool.shares_gpus == shares and pool.mode is not SharingMode.DEBUG:
            return pool
    return None


def _classes(policy: Policy) -> tuple[PriorityClass, PriorityClass]:
    ordered = sorted(policy.priority_classes, key=lambda c: c.value)
    batch = next((c for c in ordered if c.preemptible), None)
    steady = policy.priority("interactive") or next((c for c in ordered if not c.preemptible),
                                                    None)
    if batch is None or steady is None:
        raise TraceError("the policy needs a preemptible and a non-preemptible priority class "
                         "to map the trace's best-effort and other pods")
    return batch, steady


def pods_to_demands(rows: Iterable[dict[str, str]], policy: Policy, start: float,
                    window: float) -> list[Demand]:
    """The trace's pods as demands arriving in ``[start, start + window)`` (see module)."""
    rows = list(rows)
    teams = sorted(t.name for t in policy.teams)
    whole_pool = _pool(policy, False) or _pool(policy, True)
    shared_pool = _pool(policy, True)
    if not teams or whole_pool is None:
        raise TraceError("the policy needs at least one team and one pool")
    batch, steady = _classes(policy)
    span = max([float(r["creation_time"] or 0) for r in rows] + [1.0])
    scale = min(1.0, (window - 1.0) / span) if span > 0 else 1.0
    out = []
    for row in rows:
        num, milli = int(row["num_gpu"] or 0), int(row["gpu_milli"] or 0)
        created = float(row["creation_time"] or 0)
        if num <= 0 or milli <= 0:
            continue
        fraction = milli < 1000
        pool = shared_pool if fraction else whole_pool
        if pool is None:
            continue
        ask = GPUAsk(fraction_milli=milli) if fraction else GPUAsk(whole=num)
        began = float(row.get("scheduled_time") or created)
        work = max(60.0, float(row["deletion_time"] or began) - began)
        name = row["name"]
        team = teams[zlib.crc32(name.encode()) % len(teams)]
        best_effort = row.get("qos", "") == "BE"
        cls = batch if best_effort else steady
        kind = Kind.BATCH if best_effort else Kind.INTERACTIVE
        req = Request(name, f"{team}-{name}", team, pool.name, ask, cls.name, kind,
                      holder=name, checkpointing=best_effort, created_at=start + created * scale)
        out.append(Demand(name, (req,), work))
    return out
