"""The policy's quotas as Slurm TRES limits: a (team, pool) quota's ``GrpTRES`` and
``GrpTRESMins`` (GPUs or shards, with the comments that say which policy field each number
came from), a team's sums, and the ``gres/gpu=N,gres/shard=M`` text. Pure (no I/O)."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.model import UNIT, Pool, PoolQuota, Team


def _shards(milli: int, shards_per_gpu: int) -> int:
    """Shards for ``milli`` GPU units, rounded up (a fraction's ask is rounded up too)."""
    return -(-milli * shards_per_gpu // UNIT)


def _units(milli: int) -> str:
    return f"{milli / UNIT:g}"


@dataclass(frozen=True)
class _TeamPoolLimit:
    """One (team, pool) account's numbers and the comments that say where they came from."""

    tres: tuple[tuple[str, int], ...]
    tres_mins: tuple[tuple[str, int], ...]
    notes: tuple[str, ...]


def _limit(team: Team, pool: Pool, quota: PoolQuota, shards: int) -> _TeamPoolLimit:
    field_path = f"teams.{team.name}.quotas.{pool.name}"
    limit = quota.guaranteed_milli + quota.borrow_limit_milli
    total = (
        f"{field_path}.guaranteed ({_units(quota.guaranteed_milli)}) + "
        f"borrow_limit ({_units(quota.borrow_limit_milli)}) = {_units(limit)} GPU"
    )
    notes = [f"# GrpTRES: {total}"]
    hours = quota.gpu_hours_per_month
    whole = limit // UNIT
    if pool.shares_gpus:
        shard_count = _shards(limit, shards)
        notes.append(
            f"#   pool {pool.name} shares GPUs ({pool.mode.value}): fractions are "
            f"gres/shard, {_units(limit)} x {shards} shards per GPU = {shard_count}"
            + ("" if limit * shards % UNIT == 0 else " (rounded up, as a fraction's ask is)")
        )
        notes.append(
            f"#   whole GPUs in this pool: gres/gpu = {whole} (capped apart from the shards)"
        )
        tres: list[tuple[str, int]] = [("gres/gpu", whole), ("gres/shard", shard_count)]
        mins: list[tuple[str, int]] = []
        if hours is not None:
            mins = [("gres/gpu", round(hours * 60)), ("gres/shard", round(hours * 60 * shards))]
            notes.append(
                f"# GrpTRESMins: {field_path}.gpu_hours_per_month ({hours:g}) x 60 "
                f"= {round(hours * 60)} GPU-minutes = {round(hours * 60 * shards)} "
                f"shard-minutes (x {shards})"
            )
    else:
        if limit % UNIT:
            notes.append(
                f"#   pool {pool.name} hands out whole GPUs: {_units(limit)} "
                f"rounded down to {whole}"
            )
        notes.append(f"#   pool {pool.name} is {pool.mode.value}: whole GPUs only, gres/shard = 0")
        tres = [("gres/gpu", whole), ("gres/shard", 0)]
        mins = []
        if hours is not None:
            mins = [("gres/gpu", round(hours * 60))]
            notes.append(
                f"# GrpTRESMins: {field_path}.gpu_hours_per_month ({hours:g}) x 60 "
                f"= {round(hours * 60)} GPU-minutes"
            )
    if hours is None:
        notes.append(f"# GrpTRESMins: none ({field_path}.gpu_hours_per_month is not set)")
    return _TeamPoolLimit(tuple(tres), tuple(mins), tuple(notes))


def _team_total(
    limits: list[_TeamPoolLimit],
) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]:
    """A team account's GrpTRES and GrpTRESMins: the sums of its pools' figures; a
    TRES-minutes sum only where every pool that has the TRES has a budget for it."""
    total: dict[str, int] = {}
    mins: dict[str, int] = {}
    unbounded: set[str] = set()
    for lim in limits:
        for name, value in lim.tres:
            total[name] = total.get(name, 0) + value
        given = dict(lim.tres_mins)
        for name, value in lim.tres:
            if value == 0:
                continue
            if name in given:
                mins[name] = mins.get(name, 0) + given[name]
            else:
                unbounded.add(name)
    return (tuple(total.items()), tuple((k, v) for k, v in mins.items() if k not in unbounded))


def _tres(items: tuple[tuple[str, int], ...], clear: tuple[str, ...]) -> str:
    """``gres/gpu=6,gres/shard=0``; TRES in ``clear`` but not in ``items`` get ``-1``
    (sacctmgr's "no limit"), so a second run removes a limit the policy dropped."""
    values = dict(items)
    return ",".join(f"{name}={values.get(name, -1)}" for name in clear)
