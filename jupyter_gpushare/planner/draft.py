"""The draft policy file a plan implies (text; ``check-policy`` accepts it).

Pools ``train`` (exclusive), ``inference`` (shared) and ``debug`` (no queue) exist where
there is such work; the inventory is static, one node per server of the plan; every team
is guaranteed what its peak needs and may borrow the rest of the pool; every kind of work
becomes a profile its team may start. CPU and RAM of nodes and profiles are placeholders
(the plan does not size them) and say so in the file.
"""

from __future__ import annotations

import json
import re

from .model import POOL_OF_KIND
from .packing import MIB, UNIT
from .plan import Plan, Scenario, TaskNeed

_SLUG_BAD = re.compile(r"[^a-z0-9-]+")

NODE_CPU_PER_GPU = 16
NODE_RAM_GIB_PER_GPU = 128
PACKED_PROFILE_CPU = 4
PACKED_PROFILE_RAM_GIB = 16
TRAIN_CPU_PER_GPU = 8
TRAIN_RAM_GIB_PER_GPU = 64

PRIORITY_OF_KIND = {"training": "training", "fine-tuning": "training",
                    "inference": "interactive", "debugging": "interactive"}


def _q(text: str) -> str:
    """A YAML-safe scalar (JSON strings are YAML)."""
    return json.dumps(text)


def _units(milli: int) -> str:
    return f"{milli / UNIT:g}" if milli % UNIT == 0 else f"{milli / UNIT:.3f}".rstrip("0")


def slug(text: str) -> str:
    """A profile slug: lower-case letters, digits and '-', 1-63 characters."""
    value = _SLUG_BAD.sub("-", text.lower()).strip("-")[:63].strip("-")
    return value or "work"


def _inventory(plan: Plan, s: Scenario) -> list[str]:
    racks = plan.input.racks
    lines = ["inventory:", "  source: static",
             f"  # one node per server of the plan ({racks.gpus_per_server} cards per server);",
             "  # CPU and RAM are placeholders: put in your servers' figures", "  nodes:"]
    for p in s.pools:
        left = p.cards
        index = 0
        while left > 0:
            n = min(left, racks.gpus_per_server)
            memory = f"{p.card.memory_bytes // MIB}MiB"
            lines += [
                f"    - name: {p.name}-{index}",
                f"      pool: {p.name}",
                f"      cpu: {racks.gpus_per_server * NODE_CPU_PER_GPU}",
                f"      memory: {racks.gpus_per_server * NODE_RAM_GIB_PER_GPU}GiB",
                "      gpus:",
                f"        - {{model: {_q(p.card.model)}, vendor: {p.card.vendor}, memory: "
                f"{memory}, count: {n}}}",
            ]
            left -= n
            index += 1
    return lines


def _pools(s: Scenario, headroom: float) -> list[str]:
    lines = ["pools:"]
    what = {"train": "Whole cards for training and fine-tuning, one job per card",
            "inference": "Inference services packed with headroom, apart from training",
            "debug": "Small, no queue: granted now or refused now"}
    for p in s.pools:
        lines.append(f"  {p.name}:")
        lines.append(f"    mode: {p.mode}")
        if p.mode != "exclusive":
            lines.append(f"    memory_headroom: {headroom * 100:g}%")
        lines.append(f"    description: {_q(what[p.name] + f' ({p.card.name})')}")
    return lines


PRIORITIES = """\
priority_classes:
  training:
    value: 1000
    preemptible: false
    grace_period: 5m
    description: Planned training and fine-tuning
  interactive:
    value: 500
    preemptible: false
    description: Notebooks, services and debugging (the default for profiles)
  research:
    value: 100
    preemptible: true
    checkpoint_required_after: 2h
    grace_period: 2m
    description: Exploratory batch runs, preempted and retried"""


def _teams(plan: Plan, s: Scenario) -> list[str]:
    capacity = {p.name: p.cards * UNIT for p in s.pools}
    need: dict[str, dict[str, int]] = {}
    for p in s.pools:
        for t in p.tasks:
            if t.problem:
                continue
            need.setdefault(t.workload.team, {}).setdefault(p.name, 0)
            need[t.workload.team][p.name] += t.units_milli
    lines = ["teams:", "  # guaranteed: what the team's peak needs; borrow_limit: the rest of "
             "the pool"]
    for team in plan.input.teams:
        quotas = need.get(team.name, {})
        lines.append(f"  {team.name}:")
        lines.append(f"    groups: [{_q(team.name)}]")
        if not quotas:
            lines.append("    quotas: {}")
            continue
        lines.append("    quotas:")
        for pool in (p.name for p in s.pools):
            if pool not in quotas:
                continue
            g = quotas[pool]
            borrow = max(capacity[pool] - g, 0)
            lines.append(f"      {pool}: {{guaranteed: {_units(g)}, borrow_limit: "
                         f"{_units(borrow)}}}")
    return lines


def _profile(t: TaskNeed, slug_text: str) -> list[str]:
    w = t.workload
    pool = POOL_OF_KIND[w.kind]
    model = w.model.name if w.model else "measured peak"
    lines = [f"  - slug: {slug_text}",
             f"    display_name: {_q(f'{w.team}: {w.name} ({w.kind})')}",
             f"    description: {_q(f'{model}, peak {t.memory_mib} MiB per card')}",
             f"    pool: {pool}"]
    if t.whole_cards:
        lines.append(f"    gpu: {{count: {t.whole_cards}}}")
        lines.append(f"    cpu: {TRAIN_CPU_PER_GPU * t.whole_cards}")
        lines.append(f"    memory: {TRAIN_RAM_GIB_PER_GPU * t.whole_cards}GiB")
    else:
        compute = f", compute: {w.compute_share * 100:g}%" if w.compute_share else ""
        lines.append(f"    gpu: {{memory: {t.memory_mib}MiB{compute}}}")
        lines.append(f"    cpu: {PACKED_PROFILE_CPU}")
        lines.append(f"    memory: {PACKED_PROFILE_RAM_GIB}GiB")
    lines.append(f"    priority: {PRIORITY_OF_KIND[w.kind]}")
    lines.append(f"    teams: [{_q(w.team)}]")
    return lines


def draft_policy(plan: Plan, scenario: Scenario | None = None) -> str:
    """The policy text for ``scenario`` (default: after growth, what is to be bought)."""
    s = scenario or plan.grown
    inp = plan.input
    head = [
        f"# Draft policy for {inp.organisation}, written by `jupyter-gpushare plan "
        f"{inp.filename}`",
        f"# for the plan {s.label}: {s.cards} cards "
        + ", ".join(f"{p.name} {p.cards} x {p.card.name}" for p in s.pools) + ".",
        "# Check it with: jupyter-gpushare check-policy <this file>",
        "# Review CPU and RAM figures (placeholders) and the team groups before use.",
        "",
    ]
    body = _inventory(plan, s) + [""] + _pools(s, inp.settings.headroom) + [""]
    body += PRIORITIES.splitlines() + [""] + _teams(plan, s) + ["", "profiles:"]
    seen: set[str] = set()
    count = 0
    for p in s.pools:
        for t in p.tasks:
            if t.problem or t.whole_cards > inp.racks.gpus_per_server:
                continue
            base = slug(f"{t.workload.team}-{t.workload.name}")
            text, k = base, 2
            while text in seen:
                text = f"{base[:59]}-{k}"
                k += 1
            seen.add(text)
            body += _profile(t, text)
            count += 1
    if not count:
        body.append("  []")
    return "\n".join(head + body) + "\n"
