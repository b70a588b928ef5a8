"""The GPUSHARE_* environment contract."""

from __future__ import annotations

from jupyter_gpushare.telemetry.grant import GrantInfo
from jupyter_gpushare.telemetry.watchdog import watchdog_applies

ENV = {
    "GPUSHARE_GRANT_ID": "g-42",
    "GPUSHARE_GPU_UUIDS": "GPU-aaa, GPU-bbb",
    "GPUSHARE_MEMORY_LIMIT_MIB": "10240",
    "GPUSHARE_COMPUTE_PCT": "25",
    "GPUSHARE_UNITS": "0.25",
    "GPUSHARE_PROFILE": "inference-dev",
    "GPUSHARE_TEAM": "vision",
    "GPUSHARE_POOL": "shared",
    "GPUSHARE_BORROWED": "true",
    "GPUSHARE_ENFORCEMENT": "env",
    "GPUSHARE_SIMULATED": "0",
    "GPUSHARE_BROKER_URL": "http://hub.example:18000/services/gpushare/api/v1/",
    "JUPYTERHUB_USER": "ada",
}


def test_full_grant() -> None:
    g = GrantInfo.from_env(ENV)
    assert g.has_grant and g.grant_id == "g-42"
    assert g.gpu_uuids == ("GPU-aaa", "GPU-bbb")
    assert g.memory_limit_mib == 10240 and g.memory_limit_gib == 10.0
    assert (g.compute_pct, g.units, g.profile, g.team, g.pool) == (
        25.0, 0.25, "inference-dev", "vision", "shared",
    )
    assert g.borrowed and not g.simulated
    assert g.broker_url == "http://hub.example:18000/services/gpushare/api/v1"
    assert watchdog_applies(g)[0]
    assert "broker_url" not in g.to_dict()


def test_no_env_is_no_grant() -> None:
    g = GrantInfo.from_env({})
    assert not g.has_grant and g.to_dict()["status"] == "no grant"
    assert g.limits()["memory_mib"] is None
    applies, why = watchdog_applies(g)
    assert not applies and "no memory limit" in why


def test_simulated_by_flag_or_uuid_and_hard_enforcement() -> None:
    assert GrantInfo.from_env({"GPUSHARE_SIMULATED": "1"}).simulated
    assert GrantInfo.from_env({"GPUSHARE_GPU_UUIDS": "GPU-sim-node0-0"}).simulated
    for mode in ("mps", "MIG", "hami"):
        g = GrantInfo.from_env({**ENV, "GPUSHARE_ENFORCEMENT": mode})
        applies, why = watchdog_applies(g)
        assert g.memory_is_hard_limited and not applies and mode.lower() in why


def test_garbage_numbers_are_absent_not_crashes() -> None:
    g = GrantInfo.from_env({"GPUSHARE_MEMORY_LIMIT_MIB": "lots", "GPUSHARE_UNITS": ""})
    assert g.memory_limit_mib is None and g.units is None


def test_card_memory_from_the_spawner_scales_the_simulated_gpus() -> None:
    from jupyter_gpushare.telemetry.factory import make_sampler

    g = GrantInfo.from_env({**ENV, "GPUSHARE_GPU_MEMORY_MIB": "144384",
                            "GPUSHARE_GPU_UUIDS": "GPU-sim-a-0"})
    assert g.gpu_memory_mib == 144384 and g.simulated
    sampler = make_sampler("simulated", simulated_uuids=g.gpu_uuids,
                           simulated_options={"memory_total_mib": g.gpu_memory_mib})
    sample = sampler.collect()
    assert sample.gpus[0].memory_total_mib == 144384
