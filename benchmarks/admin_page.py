"""Admin page benchmark: 500 GPUs and 1,000 grants, loaded in a real browser.

    .venv/bin/python benchmarks/admin_page.py               # real hub + broker + chromium
    .venv/bin/python benchmarks/admin_page.py --grants 1000 --repeat 5

Starts a real JupyterHub (tests/realhub.py) whose broker runs a generated policy of 500
simulated H200s (320 whole GPUs in pool ``train``, 180 shared in ``interactive``), creates
200 users in 10 teams and 1,000 grants through the broker's API (300 whole GPUs, 700
16 GiB shares), logs an admin in through the hub's OAuth in Debian's chromium (Playwright),
then times:

* the admin page from navigation to everything drawn (the page sets ``data-loaded`` after
  its first render), median of ``--repeat`` loads; baseline measured in the same run: the
  hub's own ``/hub/home`` page in the same browser;
* the overview JSON (server side, with a token) and its size;
* liveness: from creating one more grant to its segment showing on the open page.

Target: the page loads in under 1 s and stays live.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from labkit import browser  # noqa: E402
from realhub import free_port, real_hub  # noqa: E402

TEAMS = 10


def policy_yaml() -> str:
    teams = "\n".join(
        f"""  t{i}:
    groups: [t{i}]
    quotas:
      train: {{guaranteed: 32, borrow_limit: 0, per_user_cap: 8}}
      interactive: {{guaranteed: 18, borrow_limit: 0, per_user_cap: 8}}"""
        for i in range(TEAMS)
    )
    return f"""
inventory:
  source: simulated
  simulated:
    - {{name: train, pool: train, nodes: 40, gpus_per_node: 8, model: H200,
       gpu_memory: 141GiB, cpu: 112, memory: 2TiB}}
    - {{name: lab, pool: interactive, nodes: 22, gpus_per_node: 8, model: H200,
       gpu_memory: 141GiB, cpu: 448, memory: 4TiB}}
    - {{name: labx, pool: interactive, nodes: 1, gpus_per_node: 4, model: H200,
       gpu_memory: 141GiB, cpu: 224, memory: 2TiB}}
pools:
  train: {{mode: exclusive}}
  interactive: {{mode: shared, memory_headroom: 20%}}
priority_classes:
  interactive: {{value: 500, preemptible: false, grace_period: 30s}}
teams:
{teams}
profiles:
  - {{slug: lab-small, display_name: Notebook 16 GiB, pool: interactive,
     gpu: {{memory: 16GiB, compute: 10%}}, cpu: 1, memory: 2GiB, priority: interactive}}
  - {{slug: train-1gpu, display_name: Train 1 GPU, pool: train, gpu: {{count: 1}}, cpu: 4,
     memory: 16GiB, priority: interactive}}
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grants", type=int, default=1000)
    ap.add_argument("--users", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmpname:
        tmp = Path(tmpname)
        policy = tmp / "policy.yaml"
        policy.write_text(policy_yaml())
        port = free_port()
        extra = f"""
from jupyter_gpushare.hubsetup import setup_gpushare
setup_gpushare(c, {str(policy)!r}, spawner=None, broker_port={port}, admin_users=["ada"],
               data_dir=HUB_TMP, broker_args=["--BrokerApp.reconcile_interval_s=0",
                                              "--BrokerApp.reconcile_on_start=False"])
c.JupyterHub.log_level = "WARN"
"""
        with real_hub(tmp / "hub", extra) as hub:
            api = hub.url + "/services/gpushare/api/v1"
            deadline = time.monotonic() + 90
            while requests.get(api + "/health", timeout=5).status_code != 200:
                if time.monotonic() > deadline:
                    raise RuntimeError(hub.log_text()[-3000:])
                time.sleep(0.3)
            for i in range(args.users):
                hub.create_user(f"u{i}", [f"t{i % TEAMS}"])
            hub.create_user("ada")
            spawner = json.loads((tmp / "hub" / "gpushare_tokens.json").read_text())["spawner"]
            s = requests.Session()
            s.headers["Authorization"] = f"token {spawner}"
            t0 = time.perf_counter()
            whole = args.grants * 3 // 10
            for k in range(args.grants):
                user = f"u{k % args.users}"
                body = {"user": user, "server": f"s{k}",
                        "profile": "train-1gpu" if k < whole else "lab-small"}
                r = s.post(api + "/requests", json=body, timeout=30)
                assert r.status_code == 201 and r.json()["status"] == "granted", r.text
            made = time.perf_counter() - t0
            ada = hub.token_for("ada")
            head = {"Authorization": f"token {ada}"}
            times, size = [], 0
            for _ in range(args.repeat):
                t1 = time.perf_counter()
                r = requests.get(api + "/admin/overview", headers=head, timeout=30)
                times.append(time.perf_counter() - t1)
                size = len(r.content)
                data = r.json()
            gpus = sum(len(n["gpus"]) for n in data["nodes"])
            print(f"hub + broker: {gpus} GPUs, {data['grants']} grants ({made:.1f} s to create)")
            print(f"overview JSON: {statistics.median(times) * 1000:.0f} ms median, "
                  f"{size / 1024:.0f} KiB")
            with browser() as b:
                page = b.new_page()
                page.goto(hub.url + "/hub/login")
                page.fill('input[name="username"]', "ada")
                page.fill('input[name="password"]', "any")
                page.click("#login_submit")
                page.wait_for_url(lambda url: "/hub/login" not in url)
                page.goto(hub.url + "/services/gpushare/admin/")  # OAuth once
                page.wait_for_selector("#gpushare-admin[data-loaded]", timeout=60000)

                def load(url: str, ready: str) -> float:
                    t = time.perf_counter()
                    page.goto(url)
                    page.wait_for_selector(ready, timeout=60000)
                    return time.perf_counter() - t

                base = statistics.median(
                    load(hub.url + "/hub/home", "body") for _ in range(args.repeat))
                admin = [load(hub.url + "/services/gpushare/admin/",
                              "#gpushare-admin[data-loaded]") for _ in range(args.repeat)]
                segs = page.locator(".seg").count()
                med = statistics.median(admin)
                print(f"hub home page (baseline): {base * 1000:.0f} ms median")
                print(f"admin page drawn: {med * 1000:.0f} ms median "
                      f"(min {min(admin) * 1000:.0f}, max {max(admin) * 1000:.0f}; "
                      f"{segs} segments) = {med / base:.2f} x the hub's home page; "
                      f"target < 1000 ms: {'OK' if med < 1 else 'MISSED'}")
                t2 = time.perf_counter()
                r = s.post(api + "/requests", json={"user": "u0", "server": "live",
                                                    "profile": "lab-small"}, timeout=30)
                gid = r.json()["grant"]["id"]
                page.wait_for_selector(f'.seg[data-grant="{gid}"]', timeout=30000)
                print(f"live: a new grant drawn {time.perf_counter() - t2:.2f} s after it "
                      f"was made (poll every 2 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
