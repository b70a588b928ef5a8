"""The GPUs a preemption frees go to the request it was made for, not to the queue.

Found by the soak (seed 111): nlp1's batch job, inside team nlp's guarantee of one GPU,
preempted vision1's borrowed job; nlp2's job of the same team came a second later and was
queued. When the victim's run ended, the job watcher released its grant and drained the
queue at once, while the preemptor's own retry was only scheduled (``retry_soon``): nlp2
got the GPU, and nlp1, who came first and paid for the preemption, waited 21.5 s for
nlp2's job to end.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from brokerpolicies import FAST
from corefactory import policy
from corefactory import request as ask

from jupyter_gpushare.broker.service.broker import Broker
from jupyter_gpushare.broker.store.db import make_engine
from jupyter_gpushare.core.model import Kind


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    """One 2-GPU node; team nlp is guaranteed 1 GPU, team vision 1 and may borrow 1."""
    pol = policy({"nlp": {"train": (1, 0)}, "vision": {"train": (1, 1)}}, gpus=2)
    engine = make_engine(f"sqlite:///{tmp_path}/b.sqlite")
    b = Broker(dataclasses.replace(pol, priority_classes=FAST), engine)
    b.load()
    yield b
    b.close()
    engine.dispose()


def job(team: str, user: str) -> object:
    return ask(team, "train", whole=1, priority="research", kind=Kind.BATCH, user=user,
               checkpointing=True)


def _setup(b: Broker) -> tuple[str, str, str]:
    """vision holds both GPUs (one borrowed); nlp1 preempts the borrowed one; nlp2 queues.
    Returns (the victim grant, nlp1's request, nlp2's request)."""
    assert b.submit(ask("vision", "train", whole=1, user="vision2"))["status"] == "granted"
    borrowed = b.submit(job("vision", "vision1"))
    assert borrowed["status"] == "granted" and borrowed["grant"]["borrowed"], borrowed
    first = b.submit(job("nlp", "nlp1"))
    assert first["status"] == "preempting", first
    assert first["victims"] == [borrowed["grant"]["id"]]
    second = b.submit(job("nlp", "nlp2"))
    assert second["status"] == "queued", second
    return borrowed["grant"]["id"], first["request_id"], second["request_id"]


def _status(b: Broker, request_id: str) -> str:
    found = b.get_request(request_id)
    assert found is not None
    return str(found["status"])


def test_a_release_that_drains_serves_the_preemptor_first(broker: Broker) -> None:
    victim, first, second = _setup(broker)
    assert broker.release(victim, "job preempted")  # drains the pool's queue
    assert _status(broker, first) == "granted"
    assert _status(broker, second) == "queued"


def test_the_job_watchers_release_then_drain_serves_the_preemptor_first(broker: Broker) -> None:
    """The job watcher's order: release without a drain, then one drain for the pool."""
    victim, first, second = _setup(broker)
    assert broker.release(victim, "job preempted", drain=False)
    assert _status(broker, first) == "preempting"  # (its retry is for the event loop)
    assert broker.drain_queue("debug") == []  # another pool's drain leaves it alone
    assert _status(broker, first) == "preempting"
    changed = broker.drain_queue("train")
    assert (first, "granted") in changed
    assert _status(broker, first) == "granted"
    assert _status(broker, second) == "queued"


def test_a_preemptor_whose_victims_remain_is_not_decided_early(broker: Broker) -> None:
    victim, first, second = _setup(broker)
    assert broker.drain_queue("train") == []
    assert _status(broker, first) == "preempting"
    assert victim in broker.state.grants
    assert broker.drain_queue("other-pool") == []
