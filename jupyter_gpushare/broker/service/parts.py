"""What the :class:`~.broker.Broker` holds, and which part owns which state.

:class:`BrokerParts` is the interface the lifecycle (:mod:`.lifecycle`) and a policy change
(:mod:`.policy_change`) work on; the broker is the one class that has it. The state of the
service is split between its parts, each the only writer of its own:

* ``state``, ``policy``, ``gpus``, ``policy_version``: the in-memory ``ClusterState`` and
  the policy in force (the lifecycle and a policy change replace them);
* ``pending`` (requests waiting for preemption victims), ``preempt_info`` (victim grant ->
  (reason, deadline)), ``culling`` (grant -> the idle culler's reason while it stops it):
  the lifecycle's, with the queue;
* ``queue`` (:class:`~.waiting.WaitQueue`), ``holders`` (:class:`~.holders.Holders`);
* ``ledger`` (:class:`~.ledger.Ledger`: the month's GPU-hours), ``heartbeats``
  (:class:`~.heartbeats.Heartbeats`: last heartbeats, measured use, bounds), ``writes``
  (:class:`~.writes.Writes`: the database handles and the group commits);
* ``views`` (:class:`~.views.Views`: the JSON answers, no state of its own);
* ``policy_notices`` and ``cull_notices``: the notices a policy change and the idle culler
  gave live grants.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ...core.model import Policy
from ...core.state import ClusterState
from .effects import Effects, Observer
from .heartbeats import Heartbeats
from .holders import Holders
from .ledger import Ledger
from .limits import BrokerLimits
from .views import Views
from .waiting import Pending, WaitQueue
from .writes import Writes


class BrokerParts(Protocol):
    """The broker's state and collaborators, as the lifecycle reads and changes them."""

    policy: Policy
    state: ClusterState
    gpus: dict[str, Any]  # the policy's GPUs by uuid
    policy_version: str
    clock: Callable[[], float]
    limits: BrokerLimits
    effects: Effects
    observer: Observer
    drain_skips_same_shape: bool
    queue: WaitQueue
    pending: dict[str, Pending]
    preempt_info: dict[str, tuple[str, float]]
    culling: dict[str, str]
    policy_notices: dict[str, dict[str, Any]]
    holders: Holders
    ledger: Ledger
    heartbeats: Heartbeats
    writes: Writes
    views: Views
