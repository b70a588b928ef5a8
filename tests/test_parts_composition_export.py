"""The Slurm export's builder and the what-if replay hold their parts.

``export slurm``'s builder (:class:`~jupyter_gpushare.export.slurm._Builder`) and the what-if
:class:`~jupyter_gpushare.whatif.replay.Replay` were split into modules as mixins once
(:class:`SacctmgrPart`, :class:`ReplayFacts`); the style is collaborators the class holds
(as for the backends: tests/test_parts_composition.py, whose AST readers this file uses). So:

* neither owner has a base class of the project (they had none before the split);
* no part inherits from a class of the project, and no part reaches into its owner: every
  ``self.<name>`` a part reads is its own (set in its ``__init__`` or defined in its class),
  none keeps its owner as an attribute, and each one is built and used here on its own;
* what the owner is given for a part reaches it, and a part that reads the owner's state
  reads the owner's own objects (not copies).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from corefactory import policy as small_policy
from corefactory import request
from test_parts_composition import (
    assert_reads_only_what_it_is_handed,
    project_classes,
)

from jupyter_gpushare.core.admission import Outcome
from jupyter_gpushare.core.model import GPUAsk, Kind, Policy, Request
from jupyter_gpushare.core.state import ClusterState
from jupyter_gpushare.export.slurm import _Builder, export_slurm
from jupyter_gpushare.export.slurm_sacctmgr import SacctmgrPart
from jupyter_gpushare.policy.loader import load_policy
from jupyter_gpushare.whatif.demand import Demand
from jupyter_gpushare.whatif.queue import ReplayQueue
from jupyter_gpushare.whatif.replay import Replay, replay
from jupyter_gpushare.whatif.replay_facts import ReplayFacts
from jupyter_gpushare.whatif.replay_ledger import _Ledger
from jupyter_gpushare.whatif.replay_records import QueueLimits, _Pending

EXAMPLE = Path(__file__).resolve().parents[1] / "hub_config" / "gpushare.yaml"

# owner -> its parts by attribute (neither owner had a base class of the project)
OWNERS: dict[type, dict[str, type]] = {
    _Builder: {"sacctmgr": SacctmgrPart},
    Replay: {"admission": ReplayFacts},
}
PARTS = [part for parts in OWNERS.values() for part in parts.values()]


def tiny() -> Policy:
    """One pool of 4 GPUs: team a is guaranteed 2 (with a budget), team b borrows up to 4."""
    return small_policy({"a": {"train": (2, 0)}, "b": {"train": (0, 4)}}, budgets={"a": 10.0})


# -- no mixins -----------------------------------------------------------------------------


@pytest.mark.parametrize("owner", list(OWNERS), ids=lambda c: c.__name__)
def test_neither_owner_is_built_on_a_class_of_the_project(owner: type) -> None:
    gained = project_classes(owner.__mro__[1:])
    assert not gained, f"{owner.__name__} is built on mixins again: {gained}"


@pytest.mark.parametrize("part", PARTS, ids=lambda c: c.__name__)
def test_no_part_inherits_from_a_class_of_the_project(part: type) -> None:
    assert project_classes(part.__mro__[1:]) == set(), part.__mro__


@pytest.mark.parametrize("part", PARTS, ids=lambda c: c.__name__)
def test_no_part_reaches_into_its_owner(part: type) -> None:
    owners = {o.__name__ for o, parts in OWNERS.items() if part in parts.values()}
    assert_reads_only_what_it_is_handed(part, owners)


# -- the owners hold their parts -----------------------------------------------------------


def test_each_owner_holds_its_parts_and_no_part_holds_its_owner() -> None:
    owners = [_Builder(tiny(), 8, "/dev/nvidia{index}"), Replay(tiny(), [])]
    for owner in owners:
        for name, kind in OWNERS[type(owner)].items():
            part = getattr(owner, name)
            assert isinstance(part, kind), (type(owner).__name__, name)
            kept = [k for k, v in vars(part).items() if v is owner]
            assert not kept, f"{kind.__name__} keeps its owner as {kept}"


def test_what_the_owner_is_given_reaches_its_part() -> None:
    builder = _Builder(tiny(), 3, "/dev/nvidia{index}")
    assert (builder.sacctmgr.policy, builder.sacctmgr.shards) == (builder.policy, 3)
    limits = QueueLimits(per_user=1, per_team=2)
    sim = Replay(tiny(), [], limits=limits, budgets=False)
    assert sim.admission.limits == limits and sim.admission.budgets is False
    assert Replay(tiny(), []).admission.budgets is True  # team a has a monthly budget
    # the facts read the replay's own state, queue, ledger and preempting requests
    facts = sim.admission
    assert facts.state is sim.state and facts.queue is sim.queue and facts.ledger is sim.ledger
    assert facts.pending is sim.pending


def test_the_export_holds_a_copy_of_the_parts_lines_not_the_parts_list() -> None:
    policy = load_policy(EXAMPLE)
    builder = _Builder(policy, 8, "/dev/nvidia{index}")
    builder.sacctmgr_commands()
    lines = builder.sacctmgr.lines
    assert builder.out.sacctmgr == lines and builder.out.sacctmgr is not lines
    assert export_slurm(policy, shards_per_gpu=8).sacctmgr == SacctmgrPart(policy, 8).build()


# -- each part alone -----------------------------------------------------------------------


def test_the_sacctmgr_part_writes_qos_accounts_and_users_alone() -> None:
    policy = load_policy(EXAMPLE)
    part = SacctmgrPart(policy, 8)
    lines = part.build()
    assert lines is part.lines and lines[0].startswith("# ---- QOS: one per priority class")
    sections = [line.split(" ")[2].rstrip(":") for line in lines if line.startswith("# ---- ")]
    assert sections == ["QOS", "accounts", "users"]
    assert any(line.startswith("sacctmgr -i add account gpushare ") for line in lines)
    # the shards it was handed count: a shared pool's quota is capped in shards of 1/S GPU
    shards = {s: [line for line in SacctmgrPart(policy, s).build() if "gres/shard=" in line]
              for s in (3, 8)}  # fmt: skip
    assert shards[3] != shards[8]


def alone() -> tuple[ReplayFacts, ClusterState, ReplayQueue, dict[str, _Pending]]:
    policy = tiny()
    state, pending = ClusterState(policy), {}
    queue = ReplayQueue(lambda name: {"training": 1000, "interactive": 500}.get(name, 0))
    limits = QueueLimits(per_user=1, per_team=0)
    facts = ReplayFacts(policy, state, queue, _Ledger(), pending, limits=limits)
    return facts, state, queue, pending


def test_the_admission_facts_tell_the_core_alone() -> None:
    facts, _, queue, _ = alone()
    inside = request("a", "train", whole=1, user="a-u")
    told = facts.facts(5.0, inside)
    assert told.now == 5.0 and told.retry is False
    assert told.gpu_hours_used == {("a", "train"): 0.0}  # budgets: a has one
    assert told.waiting_within_guarantee == frozenset()
    queue.add(inside)  # a waits inside its guarantee: b borrowing is told so
    borrow = request("b", "train", whole=1, user="b-u")
    assert facts.facts(6.0, borrow, retry=True).waiting_within_guarantee == {("a", "train")}
    refused = facts.queue_limit(request("a", "train", whole=1, user="a-u"))
    assert refused is not None and refused.outcome is Outcome.REFUSED
    assert (refused.reason, refused.code) == ("queue limit per user", "queue_limit")
    assert facts.queue_limit(request("a", "train", whole=1, user="a-v")) is None


def test_the_waiting_teams_are_read_again_only_when_told_the_preempting_requests_changed() -> None:
    facts, _, _, pending = alone()
    borrow = request("b", "train", whole=1, user="b-u")
    assert facts.facts(1.0, borrow).waiting_within_guarantee == frozenset()
    claim = request("a", "train", whole=2, user="a-u")
    pending[claim.id] = _Pending(claim, set(), 31.0, "preempting")
    assert facts.facts(2.0, borrow).waiting_within_guarantee == frozenset()  # kept
    facts.pending_changed()
    assert facts.facts(3.0, borrow).waiting_within_guarantee == {("a", "train")}


# -- the replay tells its facts part what changed -------------------------------------------


def demand(
    rid: str, team: str, at: float, work: float, whole: int, patience_s: float | None = None
) -> Demand:
    kind = Kind.BATCH if team == "a" else Kind.INTERACTIVE
    priority = "training" if team == "a" else "interactive"
    req = Request(rid, f"{team}-u", team, "train", GPUAsk(whole=whole), priority, kind,
                  holder=f"h-{rid}", created_at=at)  # fmt: skip
    return Demand(rid, (req,), work, patience_s=patience_s)


def three_teams() -> Policy:
    """4 GPUs: a is guaranteed 2, b borrows up to 4, c may use none (refused, told the facts)."""
    return small_policy({"a": {"train": (2, 0)}, "b": {"train": (0, 4)}, "c": {"train": (0, 0)}})


def outcome_of(demands: list[Demand], rid: str) -> str:
    return {o.demand_id: o.status for o in replay(three_teams(), demands).outcomes}[rid]


def test_a_borrower_waits_once_the_replay_starts_a_preemption_for_a_guarantee() -> None:
    """b borrows 3 GPUs; c's refusal at 50 has the waiting teams read (none); at 100 a claims
    its 2 guaranteed GPUs (b's borrowed one is reclaimed, 30 s grace); b asking for the one
    free GPU at 110 is refused, as the GPUs are held for a: the replay told its facts that a
    preempting request came."""
    demands = [
        demand("b1", "b", 0.0, 1000.0, 3),
        demand("c0", "c", 50.0, 10.0, 1),
        demand("a1", "a", 100.0, 50.0, 2),
        demand("b2", "b", 110.0, 10.0, 1),
    ]
    assert outcome_of(demands, "c0") == "refused"
    assert outcome_of(demands, "b2") == "refused"


def test_a_borrower_is_served_once_the_preempting_request_gives_up() -> None:
    """As above, but a gives up at 105 (after c's refusal at 102 read a as waiting): b's ask
    at 110 is granted, as nobody waits any more: the replay told its facts the preempting
    request went."""
    demands = [
        demand("b1", "b", 0.0, 1000.0, 3),
        demand("a1", "a", 100.0, 50.0, 2, patience_s=5.0),
        demand("c0", "c", 102.0, 10.0, 1),
        demand("b2", "b", 110.0, 10.0, 1),
    ]
    assert outcome_of(demands, "a1") == "gave_up"
    assert outcome_of(demands, "b2") == "served"
