"""Issue 23, finding 12 in a real JupyterHub: the policy file turns bad (a quota of "1e400")
while the hub runs; the spawn page still answers 200 with the last good policy's profiles,
and the hub's log says so once, with the file and line, not on every page view."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from realhub import free_port, proxy_available, real_hub
from test_spawner_userside_hub import Browser

pytestmark = [pytest.mark.hub, pytest.mark.slow]

if not proxy_available():
    pytest.skip("configurable-http-proxy is not installed (npm install in hub_config/proxy)",
                allow_module_level=True)

POLICY = """
inventory:
  source: simulated
  simulated:
    - {name: dbg, pool: debug, nodes: 1, gpus_per_node: 1, model: H200, gpu_memory: 80GiB,
       cpu: 16, memory: 64GiB}
pools:
  debug: {mode: debug}
priority_classes:
  interactive: {value: 500, preemptible: false, grace_period: 3s}
teams:
  alpha:
    groups: [alpha]
    quotas:
      debug: {guaranteed: 1/4}
profiles:
  - {slug: debug-eighth, display_name: Debug 1/8 GPU, pool: debug, gpu: {fraction: 1/8},
     cpu: 1, memory: 1GiB}
"""
BAD = POLICY.replace("{guaranteed: 1/4}", '{guaranteed: "1e400"}')


def test_the_spawn_page_keeps_the_last_good_policy_when_the_file_turns_bad(
    tmp_path: Path,
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    broker_port = free_port()
    extra = f"""
from jupyter_gpushare.hubsetup import setup_gpushare
setup_gpushare(c, {str(policy)!r}, spawner="simple", broker_port={broker_port},
               data_dir=HUB_TMP)
c.GPUShareSpawner.policy_file = {str(policy)!r}
"""
    with real_hub(tmp_path / "hub", extra_config=extra) as hub:
        hub.create_user("alice", groups=["alpha"])
        browser = Browser(hub, "alice")
        status, page = browser.get("/hub/spawn")
        assert status == 200 and 'data-slug="debug-eighth"' in page, page[-2000:]
        policy.write_text(BAD)
        for _ in range(3):  # three page views of the bad file
            status, page = browser.get("/hub/spawn")
            assert status == 200, page[-2000:]
            assert 'data-slug="debug-eighth"' in page
        log = hub.log_text()
        warned = [line for line in log.splitlines() if "has errors" in line]
        assert len(warned) == 1, warned
        line = BAD[: BAD.index('"1e400"')].count("\n") + 1
        assert re.search(re.escape(f"{policy}:{line}: teams.alpha.quotas.debug.guaranteed: "
                                   "1.000e+400 is out of range 0..1000000 (GPU units)"), log)
        assert "Traceback" not in log[log.index(warned[0]):]
