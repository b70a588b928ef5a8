"""Nothing on the server extension's start-up path waits for the broker or for NVML.

The figure (how long it takes) is in ``benchmarks/telemetry.py --startup``; here the
property: with a broker that never answers and an NVML that never returns, the
extension's start hook still completes, and the server answers its API meanwhile.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import pytest_asyncio
from pytest_jupyter.jupyter_server import *  # noqa: F403 (fixtures)
from telemetry_fakes import EXT_CONFIG, grant_env

from jupyter_gpushare.serverextension.service import ServiceConfig, TelemetryService
from jupyter_gpushare.telemetry import nvml
from jupyter_gpushare.telemetry.broker_link import BrokerLink

HANG = threading.Event()


@pytest_asyncio.fixture
async def jp_asyncio_loop():
    yield asyncio.get_running_loop()


@pytest.fixture
def hanging(monkeypatch: Any) -> None:
    """A broker whose every call hangs, and an NVML whose init hangs (until released)."""

    async def never(self: Any, *a: Any, **kw: Any) -> Any:
        await asyncio.Event().wait()

    def stuck(self: Any) -> None:
        HANG.wait(60)
        raise RuntimeError("NVML released by the test")

    monkeypatch.setattr(BrokerLink, "_call", never)
    monkeypatch.setattr(nvml.NVMLSampler, "setup", stuck)
    HANG.clear()
    yield
    HANG.set()


@pytest.fixture
def jp_server_config(monkeypatch: Any, hanging: None) -> dict[str, Any]:
    grant_env(monkeypatch, "http://127.0.0.1:9/api/v1", GPUSHARE_SIMULATED="0",
              GPUSHARE_GPU_UUIDS="GPU-real-0")
    return {**EXT_CONFIG, "GPUShareServerApp": {"sampler": "nvml", "sample_interval_s": 0.2,
                                                "heartbeat_interval_s": 0.2,
                                                "notices_interval_s": 0.2}}


async def test_start_hook_does_not_wait_for_broker_or_nvml(hanging: None, monkeypatch) -> None:
    grant_env(monkeypatch, "http://127.0.0.1:9/api/v1", GPUSHARE_SIMULATED="0",
              GPUSHARE_GPU_UUIDS="GPU-real-0")
    svc = TelemetryService(ServiceConfig(sampler="nvml", interval_s=0.2,
                                         heartbeat_interval_s=0.2, notices_interval_s=0.2))
    await asyncio.wait_for(svc.start(), 10)  # would hang if it awaited either
    assert svc._started
    HANG.set()
    await asyncio.wait_for(svc.stop(), 30)


async def test_server_answers_while_broker_and_nvml_hang(jp_fetch: Any, jp_serverapp: Any) -> None:
    r = await asyncio.wait_for(jp_fetch("api", "status"), 20)
    assert r.code == 200
    svc: TelemetryService = jp_serverapp.web_app.settings["gpushare_service"]
    await asyncio.wait_for(svc.start(), 10)
    HANG.set()
