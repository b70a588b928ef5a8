"""The words of jupyter-gpushare as plain data.

Everything here is an immutable dataclass with no behaviour beyond small derived
values. Quantities that must add up exactly are integers:

* GPU *units* are counted in **milli-units** (1000 = one whole physical GPU), so
  quotas and usage never suffer from float rounding;
* GPU memory is in MiB, GPU compute in milli (1000 = all of one GPU's compute);
* CPU in milli-cores (1000 = one core), RAM in MiB.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

UNIT = 1000
"""Milli-units in one GPU unit (one whole physical GPU)."""


def to_milli(units: float) -> int:
    """Convert GPU units (1.0 = one GPU) to integer milli-units, rounding to nearest."""
    return int(round(units * UNIT))


def from_milli(milli: int) -> float:
    """Convert integer milli-units back to GPU units."""
    return milli / UNIT


class SharingMode(str, Enum):
    """How a pool hands out its GPUs."""

    EXCLUSIVE = "exclusive"  # whole GPUs only, one grant per card (training)
    SHARED = "shared"  # fractions packed by memory and compute with headroom
    MIG = "mig"  # hardware partitions; each MIG device is handed out whole
    DEBUG = "debug"  # shared, but never queues: grant now or refuse now


class Kind(str, Enum):
    """What holds a grant: an interactive server or a batch job."""

    INTERACTIVE = "interactive"
    BATCH = "batch"


@dataclass(frozen=True)
class GPU:
    """One schedulable GPU device (a whole card, or one MIG device in a MIG pool)."""

    uuid: str
    model: str
    memory_mib: int
    index: int = 0
    units_milli: int = UNIT  # a MIG device is a fraction of its card (e.g. 1g of 7 = 142)
    simulated: bool = False
    vendor: str = ""  # who makes the card: "nvidia", "amd", "metax", ... ("" = not said)


@dataclass(frozen=True)
class Node:
    """A machine with GPUs; every node belongs to exactly one pool."""

    name: str
    pool: str
    gpus: tuple[GPU, ...]
    cpu_milli: int
    memory_mib: int
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def gpu_models(self) -> frozenset[str]:
        return frozenset(g.model for g in self.gpus)


@dataclass(frozen=True)
class Pool:
    """A set of nodes with one sharing mode."""

    name: str
    mode: SharingMode
    memory_headroom: float = 0.2  # shared/debug: fraction of each GPU's memory kept free
    description: str = ""

    @property
    def shares_gpus(self) -> bool:
        """Whether several grants may sit on one GPU."""
        return self.mode in (SharingMode.SHARED, SharingMode.DEBUG)

    @property
    def queues(self) -> bool:
        """Whether a request that cannot be served now may wait (the debug pool never does)."""
        return self.mode is not SharingMode.DEBUG


@dataclass(frozen=True)
class PriorityClass:
    """How important a request is and whether it may be preempted."""

    name: str
    value: int
    preemptible: bool
    grace_period_s: int = 30
    checkpoint_required_after_s: int | None = None
    description: str = ""


@dataclass(frozen=True)
class PoolQuota:
    """A team's share of one pool, in milli-units."""

    guaranteed_milli: int
    borrow_limit_milli: int = 0  # how far above the guarantee the team may borrow
    gpu_hours_per_month: float | None = None
    per_user_cap_milli: int | None = None
    explicit_requests: bool = False  # members may send an explicit GPU ask (no profile) here


@dataclass(frozen=True)
class Team:
    """A set of JupyterHub groups that share quotas."""

    name: str
    groups: tuple[str, ...]
    quotas: tuple[tuple[str, PoolQuota], ...] = ()
    admins: tuple[str, ...] = ()
    priorities: tuple[str, ...] | None = None  # classes members may use; None: every class

    def may_use_priority(self, name: str) -> bool:
        """Whether the team's members may use priority class ``name`` at all."""
        return self.priorities is None or name in self.priorities

    def quota(self, pool: str) -> PoolQuota | None:
        for name, quota in self.quotas:
            if name == pool:
                return quota
        return None


@dataclass(frozen=True)
class GPUAsk:
    """What a request wants from the GPUs.

    Either ``whole`` >= 1 whole GPUs, or a fraction of one GPU (``fraction_milli``
    between 1 and 1000). For a fraction, memory defaults to that share of the GPU's
    memory and compute to the same share, unless ``memory_mib`` (the planned *peak*)
    or ``compute_milli`` say otherwise. ``whole == 0`` and ``fraction_milli == 0``
    means no GPU at all (a CPU-only server).
    """

    whole: int = 0
    fraction_milli: int = 0
    memory_mib: int | None = None
    compute_milli: int | None = None

    @property
    def units_milli(self) -> int:
        """GPU units charged to the team while granted."""
        return self.whole * UNIT if self.whole else self.fraction_milli

    @property
    def is_fraction(self) -> bool:
        return self.whole == 0 and self.fraction_milli > 0

    @property
    def is_empty(self) -> bool:
        return self.whole == 0 and self.fraction_milli == 0

    def memory_on(self, gpu: GPU, shareable_mib: int | None = None) -> int:
        """Memory (MiB) this ask takes on ``gpu``.

        A fraction is a share of the card's *shareable* memory: its total minus the
        pool's headroom (``shareable_mib``; the whole card where there is none). So four
        quarter-GPU grants fill a card of a shared pool and the headroom stays free, and
        a pool of N cards offers N GPU units to fractions as it does to whole GPUs.
        """
        if self.whole:
            return gpu.memory_mib
        if self.memory_mib is not None:
            return self.memory_mib
        base = gpu.memory_mib if shareable_mib is None else shareable_mib
        return base * self.fraction_milli // UNIT  # floor: n shares of 1/n always fit a card

    def compute_on(self) -> int:
        """Compute (milli of one GPU) this ask takes on one GPU."""
        if self.whole:
            return UNIT
        return self.compute_milli if self.compute_milli is not None else self.fraction_milli

    def describe(self) -> str:
        if self.whole:
            return f"{self.whole} GPU" + ("s" if self.whole > 1 else "")
        if self.is_empty:
            return "no GPU"
        text = f"{from_milli(self.fraction_milli):g} GPU"
        if self.memory_mib is not None:
            text += f" ({self.memory_mib} MiB)"
        return text


@dataclass(frozen=True)
class Profile:
    """A server profile a user can pick in the spawn form."""

    slug: str
    display_name: str
    pool: str
    gpu: GPUAsk
    priority: str
    description: str = ""
    cpu_milli: int = 1000
    memory_mib: int = 2048
    image: str | None = None
    max_lifetime_s: int | None = None
    teams: tuple[str, ...] = ()  # empty: every team
    gpu_models: tuple[str, ...] = ()  # empty: any model in the pool
    priorities: tuple[str, ...] = ()  # extra classes a user may choose besides ``priority``
    # (KubeSpawner trait, value) pairs for Kubernetes servers; never compared or hashed
    kubespawner_override: tuple[tuple[str, object], ...] = field(default=(), compare=False)

    @property
    def priority_choices(self) -> tuple[str, ...]:
        """The profile's own priority first, then its extra ones (no repeats)."""
        return (self.priority, *(p for p in self.priorities if p != self.priority))

    def allowed_for(self, teams: frozenset[str] | set[str]) -> bool:
        return not self.teams or bool(set(self.teams) & set(teams))


@dataclass(frozen=True)
class Request:
    """A request for GPU share by a server or a job."""

    id: str
    user: str
    team: str
    pool: str
    gpu: GPUAsk
    priority: str
    kind: Kind = Kind.INTERACTIVE
    holder: str = ""  # server name or job id: whatever the broker must check to reconcile
    profile: str = ""
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_models: tuple[str, ...] = ()
    checkpointing: bool = False
    max_runtime_s: int | None = None
    created_at: float = 0.0


@dataclass(frozen=True)
class GPUSlice:
    """The part of one GPU that a grant holds."""

    gpu_uuid: str
    memory_mib: int
    compute_milli: int


@dataclass(frozen=True)
class Placement:
    """Where a request lands: one node and one slice per GPU used."""

    node: str
    slices: tuple[GPUSlice, ...] = ()


@dataclass(frozen=True)
class Grant:
    """An admitted, placed request."""

    id: str
    request: Request
    placement: Placement
    units_milli: int
    borrowed: bool
    priority_value: int
    preemptible: bool  # borrowed grants are always preemptible (the owner may reclaim)
    granted_at: float
    grace_period_s: int = 30

    @property
    def team(self) -> str:
        return self.request.team

    @property
    def pool(self) -> str:
        return self.request.pool

    @property
    def user(self) -> str:
        return self.request.user


@dataclass(frozen=True)
class SlurmOptions:
    """The policy's ``slurm:`` section: how grants become Slurm GRES.

    A fraction of a GPU is asked as ``shard:K`` with K = fraction x ``shards_per_gpu``
    (at least 1); the Slurm export writes the same count into ``gres.conf``."""

    shards_per_gpu: int = 8
    partition: str | None = None  # where batch jobs and servers go (None: Slurm's default)


@dataclass(frozen=True)
class Policy:
    """Everything an admin declares: inventory, pools, priorities, teams, profiles."""

    nodes: tuple[Node, ...]
    pools: tuple[Pool, ...]
    priority_classes: tuple[PriorityClass, ...]
    teams: tuple[Team, ...]
    profiles: tuple[Profile, ...] = ()
    default_team: str | None = None  # team for users in no team's groups
    inventory_source: str = "static"  # static | nvml | kubernetes | simulated
    slurm: SlurmOptions = field(default_factory=SlurmOptions)
    _index: dict[str, dict[str, object]] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )

    def _lookup(self, kind: str, items: tuple, key: str) -> object | None:
        table = self._index.get(kind)
        if table is None:
            table = {getattr(item, "slug", None) or item.name: item for item in items}
            self._index[kind] = table
        return table.get(key)

    def pool(self, name: str) -> Pool | None:
        return self._lookup("pool", self.pools, name)  # type: ignore[return-value]

    def team(self, name: str) -> Team | None:
        return self._lookup("team", self.teams, name)  # type: ignore[return-value]

    def priority(self, name: str) -> PriorityClass | None:
        return self._lookup("priority", self.priority_classes, name)  # type: ignore[return-value]

    def profile(self, slug: str) -> Profile | None:
        return self._lookup("profile", self.profiles, slug)  # type: ignore[return-value]

    def teams_of(self, groups: set[str] | frozenset[str]) -> tuple[str, ...]:
        """Names of the teams whose JupyterHub groups intersect ``groups``."""
        found = tuple(t.name for t in self.teams if set(t.groups) & set(groups))
        if not found and self.default_team:
            return (self.default_team,)
        return found

    def allowed_priorities(self, team: str, profile: Profile | None) -> tuple[str, ...]:
        """Priority classes a member of ``team`` may use with ``profile``, the default first.

        With a profile: its own priority and its extra ``priorities``; without one (an
        explicit GPU ask): every class. Either way only those the team may use at all.
        A team the policy does not know has no classes.
        """
        known = self.team(team)
        if known is None:
            return ()
        names = (profile.priority_choices if profile is not None
                 else tuple(c.name for c in self.priority_classes))
        return tuple(n for n in names if known.may_use_priority(n))

    def offers(self, profile: Profile, team: str) -> bool:
        """Whether ``profile`` is offered to ``team``: the team is on the profile's list
        (or the list is open) and may use the profile's own priority class."""
        if not profile.allowed_for({team}):
            return False
        known = self.team(team)
        return known is None or known.may_use_priority(profile.priority)

    def profiles_for(self, teams: set[str] | frozenset[str]) -> tuple[Profile, ...]:
        """Profiles offered to at least one of ``teams`` (see :meth:`offers`)."""
        return tuple(p for p in self.profiles if any(self.offers(p, t) for t in teams)
                     or (not teams and not p.teams))

    def nodes_in(self, pool: str) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.pool == pool)
