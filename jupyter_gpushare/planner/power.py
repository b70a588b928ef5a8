"""Power at peak against the racks' power feed and cooling (pure).

Cards go into servers of ``gpus_per_server`` (a pool's cards never share a server with
another pool's, as every node belongs to one pool). A server at peak draws its cards' board
power plus ``server_overhead_w``; all of it becomes heat, so cooling is compared with the
same watts. Servers are placed into racks first-fit decreasing by watts, each rack holding
at most ``min(power, cooling)`` watts and ``max_servers`` servers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .model import Card, Racks


@dataclass(frozen=True)
class Server:
    """One server of a pool at peak."""

    pool: str
    card: str
    cards: int
    watts: float


@dataclass(frozen=True)
class PowerPlan:
    """Servers, their peak power and the racks they need."""

    servers: tuple[Server, ...]
    racks: tuple[tuple[int, ...], ...]  # server indexes per rack
    rack_limit_w: float
    limited_by: str  # "power", "cooling" or "power and cooling"
    available_racks: int
    too_big: tuple[int, ...]  # servers that no rack can hold

    @property
    def peak_w(self) -> float:
        return sum(s.watts for s in self.servers)

    @property
    def racks_needed(self) -> int:
        return len(self.racks) + len(self.too_big)

    @property
    def fits(self) -> bool:
        return not self.too_big and self.racks_needed <= self.available_racks

    def rack_watts(self, rack: int) -> float:
        return sum(self.servers[i].watts for i in self.racks[rack])


def servers_for(pool: str, card: Card, cards: int, racks: Racks) -> list[Server]:
    """The servers that hold ``cards`` cards of one pool (the last one may be partly full)."""
    out = []
    per = racks.gpus_per_server
    for i in range(math.ceil(cards / per)):
        n = min(per, cards - i * per)
        out.append(Server(pool, card.name, n, n * card.power_w + racks.server_overhead_w))
    return out


def place(servers: list[Server], racks: Racks) -> PowerPlan:
    """Pack servers into racks by peak watts (first-fit decreasing)."""
    limit = min(racks.power_w, racks.cooling_w)
    if racks.power_w == racks.cooling_w:
        limited_by = "power and cooling"
    else:
        limited_by = "power" if racks.power_w < racks.cooling_w else "cooling"
    order = sorted(range(len(servers)), key=lambda i: -servers[i].watts)
    loads: list[float] = []
    members: list[list[int]] = []
    too_big: list[int] = []
    cap = racks.max_servers
    for i in order:
        watts = servers[i].watts
        if watts > limit:
            too_big.append(i)
            continue
        for r, load in enumerate(loads):
            if load + watts <= limit + 1e-9 and (cap is None or len(members[r]) < cap):
                loads[r] += watts
                members[r].append(i)
                break
        else:
            loads.append(watts)
            members.append([i])
    return PowerPlan(tuple(servers), tuple(tuple(m) for m in members), limit, limited_by,
                     racks.count, tuple(too_big))
