"""Issue 23, finding 10: heartbeat figures are bounded by what the card can do, and the first
heartbeat of a server goes out within seconds of its start.

Through the broker's real HTTP handler (an in-process broker, ``brokerkit``): a figure out of
range is a 400 naming the field, and nothing of that heartbeat is stored (no detail row, no
node power, no measured use). The server extension's side is driven as ``TelemetryService``
against a tiny broker stand-in (``telemetry_fakes``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from brokerkit import BASE, call, start_broker, static_tokens
from brokerpolicies import small
from sqlalchemy import func, select
from telemetry_fakes import TOKEN, FakeBroker
from traitlets.config import Config

from jupyter_gpushare.broker.service.heartbeats import HeartbeatBounds
from jupyter_gpushare.broker.store.db import heartbeats_table, node_power_table
from jupyter_gpushare.serverextension.service import ServiceConfig, TelemetryService
from jupyter_gpushare.telemetry.broker_link import BrokerLink
from jupyter_gpushare.telemetry.grant import GrantInfo

USERS = {"alice": ["a"], "bob": ["b"]}
LIMIT_W = 700.0  # the test policy's cards are model "H100"; their limit is configured here


@pytest.fixture
async def broker(tmp_path: Any) -> Any:
    cfg = Config()
    cfg.HeartbeatBounds.power_limit_w = {"H100": LIMIT_W}
    app = await start_broker(
        small(), f"sqlite:///{tmp_path}/b.sqlite", static_tokens(USERS), config=cfg
    )
    # one heartbeat per grant per 5 s would hide the second accepted one: none here
    app.broker.limits.heartbeat_min_interval_s = 0
    yield app
    await app.stop_async()


async def a_grant(app: Any, user: str = "alice") -> tuple[str, str, int]:
    status, ans = await call(
        app, "POST", "/requests", f"tok-{user}", {"pool": "shared", "gpu": {"fraction": 0.125}}
    )
    assert status in (200, 201), ans
    grant = ans["grant"]
    uuid = grant["gpus"][0]["uuid"]
    return grant["id"], uuid, app.broker.gpus[uuid].memory_mib


def stored(app: Any) -> tuple[int, float | None]:
    """(heartbeat detail rows, the highest node power stored)."""
    with app.broker.engine.connect() as conn:
        rows = conn.execute(select(func.count()).select_from(heartbeats_table)).scalar()
        peak = conn.execute(select(func.max(node_power_table.c.watts_max))).scalar()
    return int(rows or 0), peak


async def beat(app: Any, grant_id: str, gpu: dict[str, Any]) -> tuple[int, Any]:
    return await call(
        app, "POST", "/heartbeats", "tok-alice", {"grant_id": grant_id, "gpus": [gpu]}
    )


async def test_power_beyond_the_card_is_refused_naming_the_field(broker: Any) -> None:
    gid, uuid, _ = await a_grant(broker)
    top = LIMIT_W * HeartbeatBounds().power_tolerance
    for watts in (99999, top + 0.5, -1):
        status, err = await beat(broker, gid, {"uuid": uuid, "power_w": watts})
        assert status == 400 and err["field"] == "gpus[0].power_w", (watts, err)
    assert stored(broker) == (0, None)  # nothing of a refused heartbeat is kept
    status, _ = await beat(broker, gid, {"uuid": uuid, "power_w": top})
    assert status == 204  # the exact bound is a reading the card can give
    assert stored(broker) == (1, pytest.approx(top))


async def test_the_node_peak_is_not_driven_by_one_grants_claim(broker: Any) -> None:
    gid, uuid, _ = await a_grant(broker)
    assert (await beat(broker, gid, {"uuid": uuid, "power_w": 350.0}))[0] == 204
    status, err = await beat(broker, gid, {"uuid": uuid, "power_w": 99999})
    assert status == 400 and "700 W" in str(err), err
    assert stored(broker) == (1, pytest.approx(350.0))
    assert broker.broker.last_heartbeat[gid]["gpus"][0]["power_w"] == 350.0


@pytest.mark.parametrize(
    ("figure", "field"),
    [
        ({"utilization_pct": 100.5}, "gpus[0].utilization_pct"),
        ({"utilization_pct": -0.1}, "gpus[0].utilization_pct"),
        ({"memory_used_mib": -1}, "gpus[0].memory_used_mib"),
        ({"memory_used_mib": "card+1"}, "gpus[0].memory_used_mib"),
    ],
)
async def test_utilisation_and_memory_are_bounded(
    broker: Any, figure: dict[str, Any], field: str
) -> None:
    gid, uuid, card_mib = await a_grant(broker)
    if figure.get("memory_used_mib") == "card+1":
        figure = {"memory_used_mib": card_mib + 1}
    status, err = await beat(broker, gid, {"uuid": uuid, **figure})
    assert status == 400 and err["field"] == field, err
    assert stored(broker) == (0, None)
    edge = {"utilization_pct": 100} if "utilization_pct" in figure else {
        "memory_used_mib": card_mib}
    assert (await beat(broker, gid, {"uuid": uuid, **edge}))[0] == 204


async def test_only_the_grants_own_gpus(broker: Any) -> None:
    gid, uuid, _ = await a_grant(broker)
    other = next(u for u in broker.broker.gpus if u != uuid)
    status, err = await beat(broker, gid, {"uuid": other, "power_w": 10})
    assert status == 400 and err["field"] == "gpus[0].uuid", err
    assert stored(broker) == (0, None)


def test_power_limit_comes_from_the_catalogue_or_a_ceiling() -> None:
    bounds = HeartbeatBounds()
    assert bounds.card_power_w("NVIDIA H100 80GB HBM3") == 700.0  # planner/cards.yaml
    assert bounds.card_power_w("nvidia h100 pcie") == 350.0  # case of the SMI tool's name
    assert bounds.card_power_w("Some Future Card") == bounds.default_power_limit_w
    assert HeartbeatBounds(power_limit_w={"Some Future Card": 900}).card_power_w(
        "Some Future Card") == 900.0


async def test_first_heartbeat_goes_out_within_seconds_of_start() -> None:
    fake = FakeBroker()
    fake.start()
    uuid = "GPU-sim-node0-0"
    grant = GrantInfo(grant_id="g-1", gpu_uuids=(uuid,), simulated=True,
                      broker_url=fake.url, gpu_memory_mib=81920)
    svc = TelemetryService(
        ServiceConfig(sampler="simulated", interval_s=0.5, heartbeat_interval_s=60,
                      notices_interval_s=60, api_token=TOKEN, simulated_gpu_count=1,
                      simulated_background_load=False),
        grant=grant,
    )
    started = time.monotonic()
    await svc.start()
    try:
        while not fake.state.heartbeats and time.monotonic() - started < 10:
            await asyncio.sleep(0.05)
        took = time.monotonic() - started
        assert fake.state.heartbeats, "no heartbeat within 10 s of start"
        assert took <= 5.0, f"first heartbeat after {took:.1f} s"
        (hb,) = fake.state.heartbeats
        assert hb["grant_id"] == "g-1" and [g["uuid"] for g in hb["gpus"]] == [uuid]
    finally:
        await svc.stop()
        fake.stop()


async def test_the_server_sends_its_use_again_without_a_refused_power_figure(broker: Any) -> None:
    gid, uuid, _ = await a_grant(broker)
    link = BrokerLink(f"http://127.0.0.1:{broker.port}{BASE}", "tok-alice")
    body = {"grant_id": gid, "ts": time.time(), "simulated": True,
            "gpus": [{"uuid": uuid, "memory_used_mib": 100.0, "utilization_pct": 40.0,
                      "power_w": 99999.0}]}
    ans = await link.heartbeat(body)
    assert ans.ok and ans.error is not None and "power_w" in ans.error, ans
    rows, peak = stored(broker)
    assert rows == 1 and peak is None  # the use counts, the impossible power does not
    assert broker.broker.last_heartbeat[gid]["gpus"] == [
        {"uuid": uuid, "memory_used_mib": 100.0, "utilization_pct": 40.0, "power_w": None}]
