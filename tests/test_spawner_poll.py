"""The spawner's poll: the grant check after a hub restart is retried until the broker
answers, and a server found dead gives its grant back at once (pure: a stand-in broker)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from jupyterhub.spawner import Spawner

from jupyter_gpushare.broker.client import BrokerError, GrantInfo
from jupyter_gpushare.spawner.mixin import GPUShareSpawner


class _Process(Spawner):
    status: int | None = None

    async def start(self) -> Any:
        return ("127.0.0.1", 1)

    async def stop(self, now: bool = False) -> None:
        return None

    async def poll(self) -> Any:
        return self.status


class Spawn(GPUShareSpawner, _Process):
    pass


class Broker:
    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.asked = 0
        self.released: list[str] = []
        self.base_url = "http://broker"

    async def get_grant(self, gid: str, retry_window_s: float | None = None) -> GrantInfo:
        self.asked += 1
        if self.failures:
            self.failures -= 1
            raise BrokerError(503, "gpushare broker unreachable")
        return GrantInfo(id=gid, user="alice")

    async def release_grant(self, gid: str) -> None:
        self.released.append(gid)


def spawner(broker: Broker) -> Spawn:
    s = Spawn(user=SimpleNamespace(name="alice", groups=[]), _log_name="alice")
    s.load_state({"gpushare_grant_id": "g-1", "gpushare_profile": "half"})
    s._gpushare_client = broker
    s.broker_url = broker.base_url
    return s


async def test_grant_check_is_retried_until_the_broker_answers() -> None:
    b = Broker(failures=2)
    s = spawner(b)
    s.grant_check_retry_s = 0.0
    for _ in range(5):
        assert await s.poll() is None
    assert b.asked == 3  # two failures, then it knew, then never again
    assert s.gpushare_grant is not None and s.gpushare_grant.id == "g-1"


async def test_retry_waits_between_tries(monkeypatch) -> None:
    b = Broker(failures=1)
    s = spawner(b)
    await s.poll()
    await s.poll()  # within CHECK_RETRY_S: not asked again yet
    assert b.asked == 1


async def test_a_dead_server_gives_its_grant_back_at_once() -> None:
    b = Broker(failures=0)
    s = spawner(b)
    s.status = -9
    assert await s.poll() == -9
    assert b.released == ["g-1"] and s.grant_id is None
    assert s.gpushare_last_stop and s.gpushare_last_stop["kind"] == "died"
    assert "stopped by itself" in s.gpushare_stop_message


def test_a_server_with_a_grant_is_polled_fast() -> None:
    s = spawner(Broker(0))
    assert s.poll_interval == pytest.approx(2.0)
    plain = Spawn(user=SimpleNamespace(name="bob", groups=[]), _log_name="bob")
    plain.load_state({})
    assert plain.poll_interval == 30
