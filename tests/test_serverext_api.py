"""The server extension's REST and WebSocket API, in a real jupyter_server."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import pytest_asyncio
from pytest_jupyter.jupyter_server import *  # noqa: F403 (fixtures)
from telemetry_fakes import (
    EXT_CONFIG,
    TOKEN,
    FakeBroker,
    clear_gpushare_env,
    free_port,
    wait_until,
)
from telemetry_fakes import grant_env as set_grant_env
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

from jupyter_gpushare.serverextension import GPUShareServerApp, _jupyter_server_extension_points
from jupyter_gpushare.serverextension.handlers import handlers
from jupyter_gpushare.serverextension.jobs import job_handlers
from jupyter_gpushare.serverextension.switch import switch_handlers


@pytest_asyncio.fixture
async def jp_asyncio_loop():
    """Serve on pytest-asyncio's loop, the one the tests run in."""
    yield asyncio.get_running_loop()


@pytest_asyncio.fixture
async def broker():
    b = FakeBroker()
    b.start()
    b.state.grants["g-1"] = {"id": "g-1", "profile": "inference-dev", "borrowed": True}
    b.state.teams["vision"] = {"team": "vision", "pools": {"shared": {"used_units": 1.25}}}
    b.state.notices.append(
        {"grant_id": "g-1", "reason": "team nlp needs its guarantee back",
         "deadline": "2099-01-01T00:00:00+00:00", "kind": "preemption"}
    )
    yield b
    b.stop()


@pytest.fixture
def grant_mode(request: Any, monkeypatch: Any, broker: FakeBroker) -> str:
    mode = getattr(request, "param", "grant")
    if mode == "none":
        clear_gpushare_env(monkeypatch)
    elif mode == "unreachable":
        set_grant_env(monkeypatch, f"http://127.0.0.1:{free_port()}/api/v1")
    else:
        set_grant_env(monkeypatch, broker.url)
    return str(mode)


@pytest.fixture
def jp_server_config(grant_mode: str) -> dict[str, Any]:
    return {
        **EXT_CONFIG,
        "GPUShareServerApp": {
            "sample_interval_s": 0.1,
            "heartbeat_interval_s": 0.2,
            "broker_timeout_s": 2.0,
        },
    }


def route_patterns(router: Any) -> list[str]:
    """Every path pattern served by a tornado application, nested routers included."""
    out: list[str] = []
    for attr in ("default_router", "wildcard_router"):
        sub = getattr(router, attr, None)
        if sub is not None and sub is not router:
            out += route_patterns(sub)
    for rule in getattr(router, "rules", []):
        regex = getattr(rule.matcher, "regex", None)
        if regex is not None:
            out.append(regex.pattern)
        if hasattr(rule.target, "rules"):
            out += route_patterns(rule.target)
    return out


async def get_json(jp_fetch: Any, *parts: str, **kw: Any) -> dict[str, Any]:
    r = await jp_fetch("gpushare", "api", *parts, **kw)
    assert r.code == 200
    return json.loads(r.body)  # type: ignore[no-any-return]


def test_extension_point_and_config_file() -> None:
    (point,) = _jupyter_server_extension_points()
    assert point == {"module": "jupyter_gpushare.serverextension", "app": GPUShareServerApp}
    with open("jupyter-config/jupyter_server_config.d/jupyter_gpushare.json") as f:
        cfg = json.load(f)
    assert cfg["ServerApp"]["jpserver_extensions"]["jupyter_gpushare.serverextension"] is True


def test_every_trait_has_help() -> None:
    own = set(GPUShareServerApp.class_own_traits(config=True))
    assert {"sampler", "sample_interval_s", "history_s", "watchdog_action",
            "low_util_threshold_pct", "low_util_window_s"} <= own
    for name, trait in GPUShareServerApp.class_own_traits(config=True).items():
        assert trait.help, name


@pytest.mark.parametrize("grant_mode", ["none"], indirect=True)
async def test_no_grant_still_works(jp_fetch: Any) -> None:
    m = await get_json(jp_fetch, "metrics")
    assert m["simulated"] is True and m["source"] == "simulated"
    assert m["grant"] == {"has_grant": False, "status": "no grant"}
    assert m["limits"]["memory_mib"] is None
    assert [g["name"] for g in m["gpus"]] == ["H200-sim", "H200-sim"]
    assert all(g["memory_total_mib"] == 143771 for g in m["gpus"])
    assert m["watchdog"]["active"] is False
    g = await get_json(jp_fetch, "grant")
    assert g["grant"]["status"] == "no grant" and g["simulated"] is True
    t = await get_json(jp_fetch, "team")
    assert t["team"] is None and "no grant" in t["error"]


async def test_metrics_with_grant_limits_and_only_granted_gpus(jp_fetch: Any) -> None:
    m = await get_json(jp_fetch, "metrics")
    assert m["simulated"] is True
    assert [g["uuid"] for g in m["gpus"]] == ["GPU-sim-node0-0"]
    (gpu,) = m["gpus"]
    assert gpu["memory_limit_mib"] == 10240 and gpu["memory_total_mib"] == 143771
    assert m["limits"] == {"memory_mib": 10240, "compute_pct": 25.0, "enforcement": "env",
                           "memory_hard_limited": False}
    assert m["grant"]["profile"] == "inference-dev" and m["grant"]["borrowed"] is True
    assert m["watchdog"]["active"] is True and m["watchdog"]["action"] == "restart"
    assert m["attribution"]["mode"] == "processes"


async def test_grant_team_and_notices_from_broker(jp_fetch: Any, broker: FakeBroker) -> None:
    g = await get_json(jp_fetch, "grant")
    assert g["grant"]["grant_id"] == "g-1" and g["grant"]["team"] == "vision"
    assert g["grant"]["borrowed"] is True and g["broker"]["ok"] is True
    assert g["broker_grant"] == {"id": "g-1", "profile": "inference-dev", "borrowed": True}
    pre = g["preemption"]
    assert pre["reason"] == "team nlp needs its guarantee back"
    assert pre["deadline"] == "2099-01-01T00:00:00+00:00" and pre["seconds_left"] > 0
    t = await get_json(jp_fetch, "team")
    assert t["team"] == "vision" and t["usage"]["pools"]["shared"]["used_units"] == 1.25
    assert t["error"] is None


async def test_heartbeats_reach_the_broker(jp_fetch: Any, broker: FakeBroker) -> None:
    await get_json(jp_fetch, "metrics")
    await wait_until(lambda: broker.state.heartbeats, what="a heartbeat")
    hb = broker.state.heartbeats[-1]
    assert hb["grant_id"] == "g-1" and hb["simulated"] is True
    assert [g["uuid"] for g in hb["gpus"]] == ["GPU-sim-node0-0"]
    assert set(hb["gpus"][0]) == {"uuid", "memory_used_mib", "utilization_pct", "power_w"}
    assert f"token {TOKEN}" in broker.state.auth_headers


@pytest.mark.parametrize("grant_mode", ["unreachable"], indirect=True)
async def test_unreachable_broker_is_said_not_crashed(jp_fetch: Any) -> None:
    g = await get_json(jp_fetch, "grant")
    assert g["broker"]["ok"] is False and g["broker"]["error"].startswith("broker unreachable")
    assert g["grant"]["profile"] == "inference-dev"  # the env still tells the grant
    t = await get_json(jp_fetch, "team")
    assert t["usage"] is None and t["error"].startswith("broker unreachable")
    m = await get_json(jp_fetch, "metrics")
    assert m["gpus"]


async def test_history_grows_and_filters(jp_fetch: Any) -> None:
    await get_json(jp_fetch, "metrics")

    async def enough() -> Any:
        h = await get_json(jp_fetch, "metrics", "history")
        return h if len(h["samples"]) >= 4 else None

    h = await wait_until(enough, what="4 samples of history")
    assert h["simulated"] is True and h["interval_s"] == 0.1 and h["history_s"] == 900
    ts = [s["ts"] for s in h["samples"]]
    assert ts == sorted(ts)
    newer = await get_json(jp_fetch, "metrics", "history", params={"since": str(ts[1])})
    assert newer["samples"] and all(s["ts"] > ts[1] for s in newer["samples"])
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("gpushare", "api", "metrics", "history", params={"since": "yesterday"})
    assert e.value.code == 400


async def test_stream_sends_samples(jp_ws_fetch: Any) -> None:
    ws = await jp_ws_fetch("gpushare", "api", "metrics", "stream")
    msgs, notices = [], []
    while len(msgs) < 3 or not notices:
        raw = await asyncio.wait_for(ws.read_message(), 60)
        assert raw is not None
        m = json.loads(raw)
        (msgs if m["type"] == "sample" else notices).append(m)
    ws.close()
    assert notices[0]["type"] == "notice"
    assert notices[0]["notice"]["reason"] == "team nlp needs its guarantee back"
    assert all(m["type"] == "sample" and m["simulated"] is True for m in msgs)
    assert [m["ts"] for m in msgs] == sorted(m["ts"] for m in msgs)
    assert msgs[-1]["limits"]["memory_mib"] == 10240


async def test_every_route_requires_authentication(
    jp_serverapp: Any, http_server_client: Any, jp_base_url: str, jp_http_port: int,
    jp_auth_header: dict[str, str],
) -> None:
    routes = {
        p.rstrip("$") for p in route_patterns(jp_serverapp.web_app) if "gpushare" in p
    }
    assert len(routes) == len(handlers()) + len(job_handlers()) + len(switch_handlers()) == 12
    for pattern in sorted(routes):
        path = pattern.replace("\\", "").replace("([^/]+)", "job-x")
        relayed = "/jobs" in path  # answered by the (fake) broker once authenticated
        ws = path.endswith("/stream")
        for headers in ({}, {"Authorization": "token wrong"}):
            if ws:
                req = HTTPRequest(f"ws://127.0.0.1:{jp_http_port}{path}", headers=headers)
                with pytest.raises(HTTPClientError) as e:
                    await websocket_connect(req)
                assert e.value.code == 403, path
            else:
                r = await http_server_client.fetch(path, headers=headers, raise_error=False)
                assert r.code == 403, (path, headers, r.code)
        # and the same route works with the token
        if ws:
            req = HTTPRequest(f"ws://127.0.0.1:{jp_http_port}{path}", headers=jp_auth_header)
            conn = await websocket_connect(req)
            conn.close()
        else:
            r = await http_server_client.fetch(path, headers=jp_auth_header, raise_error=False)
            assert r.code != 403 if relayed else r.code == 200, (path, r.code)
    assert jp_base_url.rstrip("/") in next(iter(routes))
