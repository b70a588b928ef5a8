"""BrokerLink against a tiny tornado app playing the broker, and against no broker."""

from __future__ import annotations

import time
from pathlib import Path

import jsonschema
import pytest
import yaml
from telemetry_fakes import TOKEN, FakeBroker, free_port

from jupyter_gpushare.telemetry.attribution import ProcessTree, attribute
from jupyter_gpushare.telemetry.broker_link import (
    NOT_CONFIGURED,
    UNREACHABLE,
    BrokerLink,
    heartbeat_body,
)
from jupyter_gpushare.telemetry.simulated import SimulatedSampler

OPENAPI = Path(__file__).resolve().parents[1] / "jupyter_gpushare/broker/api/openapi.yaml"


@pytest.fixture
async def broker():
    b = FakeBroker()
    b.start()
    b.state.grants["g-1"] = {"id": "g-1", "profile": "debug", "borrowed": True}
    b.state.teams["vision"] = {"team": "vision", "used_units": 1.5, "guaranteed_units": 4}
    b.state.notices.append(
        {"grant_id": "g-1", "reason": "owner needs it", "deadline": "2030-01-01T00:00:00Z",
         "kind": "preemption"}
    )
    yield b
    b.stop()


async def test_get_grant_team_notices(broker: FakeBroker) -> None:
    link = BrokerLink(broker.url, TOKEN)
    g = await link.grant("g-1")
    assert g.ok and g.data["borrowed"] is True
    t = await link.team_usage("vision")
    assert t.ok and t.data["used_units"] == 1.5
    n = await link.notices("g-1")
    assert n.ok and n.data["notices"][0]["reason"] == "owner needs it"
    assert set(broker.state.auth_headers) == {f"token {TOKEN}"}


async def test_http_errors_are_answers_not_exceptions(broker: FakeBroker) -> None:
    missing = await BrokerLink(broker.url, TOKEN).grant("nope")
    assert not missing.ok and missing.status == 404 and "404" in (missing.error or "")
    forbidden = await BrokerLink(broker.url, "wrong").team_usage("vision")
    assert not forbidden.ok and forbidden.status == 403


async def test_heartbeat_body_and_post(broker: FakeBroker) -> None:
    sim = SimulatedSampler(uuids=["GPU-sim-node0-0", "GPU-sim-node0-1"], background_load=False)
    sim.set_process_memory(4242, 2048, "GPU-sim-node0-1", sm_util_pct=55)
    sample = sim.collect()
    att = attribute(sample, ["GPU-sim-node0-1"], ProcessTree(1, {4242: None}),
                    pid_exists=lambda pid: True)
    body = heartbeat_body("g-1", att, simulated=True)
    ans = await BrokerLink(broker.url, TOKEN).heartbeat(body)
    assert ans.ok, ans.error
    (hb,) = broker.state.heartbeats
    assert hb["grant_id"] == "g-1" and hb["simulated"] is True
    card = sample.gpu("GPU-sim-node0-1")
    assert card is not None and card.power_w is not None
    assert hb["gpus"] == [
        {"uuid": "GPU-sim-node0-1", "memory_used_mib": 2048.0, "utilization_pct": 55.0,
         "power_w": round(card.power_w, 1)}  # the card's power, for the monthly report
    ]
    # the broker's contract: ts is a number of seconds since the epoch (not an ISO string)
    assert isinstance(hb["ts"], (int, float)) and abs(hb["ts"] - time.time()) < 60
    schema = yaml.safe_load(OPENAPI.read_text())["components"]["schemas"]["Heartbeat"]
    jsonschema.validate(body, schema)


async def test_unreachable_broker_says_so() -> None:
    link = BrokerLink(f"http://127.0.0.1:{free_port()}/api", TOKEN, timeout_s=2)
    for ans in (await link.grant("g"), await link.team_usage("t"), await link.notices("g"),
                await link.heartbeat({"grant_id": "g"})):
        assert not ans.ok
        assert ans.error is not None and ans.error.startswith(UNREACHABLE)


async def test_no_broker_configured() -> None:
    ans = await BrokerLink(None, None).grant("g")
    assert not ans.ok and ans.error == NOT_CONFIGURED
