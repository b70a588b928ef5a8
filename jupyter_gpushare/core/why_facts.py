"""The figures a refusal's cause is told from (:mod:`.placement_why`), whoever computed them."""

from __future__ import annotations

from dataclasses import dataclass

from .model import Request
from .state import GPUState


def model_ok(gs: GPUState, request: Request) -> bool:
    return not request.gpu_models or gs.gpu.model in request.gpu_models


@dataclass(frozen=True)
class Hosts:
    """The nodes whose GPUs have room for the request, and what they lack besides."""

    count: int  # nodes
    open: int  # of which not cordoned
    cpu_most: tuple[int, str] | None  # among the open ones short of CPU: most free, and where
    mem_most: tuple[int, str] | None  # among those short of RAM: most free (MiB), and where


@dataclass(frozen=True)
class WholeFacts:
    """Whole GPUs (or an exclusive pool): the GPUs of the models asked, on open nodes."""

    total: int
    free: int  # idle
    best: tuple[int, str] | None  # most idle on one node (the first such node), if any
    roomy: Hosts  # the nodes (cordoned too) with as many idle as asked


@dataclass(frozen=True)
class FractionFacts:
    """A fraction: the cards of the models asked, on open nodes."""

    cards: int
    open: int  # not held whole
    need: int | None  # the least memory the ask takes on an open card (MiB)
    roomy: int  # open cards with that memory free
    free_mib: int  # free memory of the open cards, in all
    most_free: tuple[int, int, str] | None  # (MiB, GPU index, node): the open card with most
    compute_most: int | None  # most free compute (milli) on a roomy card
    both: int  # roomy cards with the compute free as well
    hosts: Hosts  # the nodes of those cards


@dataclass(frozen=True)
class PoolFacts:
    nodes: int
    open: int  # nodes not cordoned
    model_cards: int  # cards of the models asked (any model when none is named), any node
    detail: WholeFacts | FractionFacts | Hosts  # Hosts: no GPU asked (every open node)
