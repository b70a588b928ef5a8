"""The planning input and the card catalogue as plain data (no I/O, no behaviour).

Sizes are bytes (``int``), power is watts, shares are fractions (0.2 = 20 %). The
reader (:mod:`.reader`) builds these from YAML with line-precise errors; the estimator
(:mod:`.memory`) and the planner (:mod:`.plan`) only read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GIB = 1024**3
GB = 1000**3

KINDS = ("training", "fine-tuning", "inference", "debugging")
"""Kinds of work: the first two get whole cards, the last two are packed with headroom."""

POOL_OF_KIND = {
    "training": "train",
    "fine-tuning": "train",
    "inference": "inference",
    "debugging": "debug",
}
"""Which pool of the draft policy each kind of work lands in."""

PRECISIONS = ("mixed", "bf16", "fp32")
"""Training precision: mixed (16-bit compute, fp32 master weights), pure bf16, or fp32."""

OPTIMIZERS = ("adamw", "adam", "adam-8bit", "sgd")
METHODS = ("full", "lora", "qlora")
DTYPES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
"""Bytes per value of each storage type."""

SCHEDULERS = ("none", "local", "slurm", "kubernetes", "kubernetes-hami", "kubernetes-kai")


@dataclass(frozen=True)
class Card:
    """One accelerator model of the catalogue."""

    name: str  # catalogue key, e.g. H100-SXM
    vendor: str  # nvidia | amd | metax | ...
    model: str  # what the SMI tool reports, e.g. "NVIDIA H100 80GB HBM3"
    memory_bytes: int
    bf16_tflops: float
    power_w: float
    form: str = "pcie"
    source: str = ""
    verified: bool = True

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB


@dataclass(frozen=True)
class ModelShape:
    """A transformer's shape: enough to count weights, activations and KV cache."""

    name: str
    params: float  # number of parameters
    layers: int
    hidden: int
    heads: int
    kv_heads: int  # = heads for multi-head attention; fewer with GQA/MQA
    source: str = ""

    @property
    def head_dim(self) -> float:
        return self.hidden / self.heads


@dataclass(frozen=True)
class Workload:
    """One kind of task of one team: what it runs and how many run at peak."""

    team: str
    name: str  # unique within the team
    kind: str  # one of KINDS
    model: ModelShape | None
    concurrent: int  # tasks of this kind running at the same time at peak
    line: int = 0  # where it is declared (for messages)
    # training / fine-tuning
    method: str = "full"
    precision: str = "mixed"
    optimizer: str = "adamw"
    micro_batch: int = 1
    sequence_length: int = 2048
    activation_checkpointing: bool = False
    lora_rank: int = 16
    lora_targets: int = 4  # adapted projection matrices per layer (q, k, v, o)
    # inference / debugging
    weights_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    concurrent_requests: int = 1
    # both
    memory_override_bytes: int | None = None  # measured peak, replaces the estimate
    compute_share: float | None = None  # share of one card's compute (packing), if known
    growth: float | None = None  # overrides the team's / organisation's growth


@dataclass(frozen=True)
class TeamSpec:
    """A team and its kinds of work."""

    name: str
    workloads: tuple[Workload, ...]
    growth: float | None = None
    line: int = 0


@dataclass(frozen=True)
class Racks:
    """The room the cards go into: racks with a power feed and a cooling capacity each."""

    count: int = 1
    power_w: float = 17_000.0  # electrical feed per rack
    cooling_w: float = 17_000.0  # heat the rack's cooling removes
    gpus_per_server: int = 8
    server_overhead_w: float = 1_000.0  # CPUs, memory, fans, NICs of one server at peak
    max_servers: int | None = None  # rack space, in servers (None: power decides)


@dataclass(frozen=True)
class CardChoice:
    """Which catalogue card each pool gets, and the smaller card it is compared with."""

    train: str
    inference: str
    debug: str
    smaller: str | None = None  # None: pick the vendor's card closest to half the memory


@dataclass(frozen=True)
class Settings:
    """Planning constants an admin may change; each is printed in the report."""

    headroom: float = 0.2  # kept free on shared/debug cards (memory planned by peak)
    runtime_reserve_bytes: int = GIB  # CUDA/ROCm context, allocator slack, per task per card
    growth: float = 0.0  # growth of concurrent tasks over the horizon
    horizon_months: int = 12


@dataclass(frozen=True)
class PlanInput:
    """Everything one ``TEAMS.yaml`` says."""

    organisation: str
    teams: tuple[TeamSpec, ...]
    cards: CardChoice
    racks: Racks
    settings: Settings
    scheduler: str = "none"
    filename: str = "<string>"
    catalogue: dict[str, Card] = field(default_factory=dict)
