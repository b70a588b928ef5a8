"""Spawn benchmark: what the gpushare spawner costs, and that concurrency keeps the rules.

1. Spawn-to-ready latency, measured in the same run against two real hubs (real proxy, real
   ``jupyterhub-singleuser`` servers): JupyterHub's plain ``SimpleLocalProcessSpawner`` and
   ``SimpleLocalGPUShareSpawner`` with the broker service. Spawns alternate between the hubs
   so both see the same machine load. Target: the median at most 5 % slower.
2. 50 concurrent spawns across 5 teams on the gpushare hub (a debug pool: granted or refused
   at once). Afterwards: no GPU holds more memory or compute than it has, no team holds more
   than guarantee + borrow limit, and every running server holds exactly one live grant.

    .venv/bin/python benchmarks/spawn.py [--rounds 15] [--concurrent 50] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import textwrap
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from realhub import RealHub, free_port, start_hub  # noqa: E402

TEAMS = [f"team{i}" for i in range(5)]
POLICY = textwrap.dedent(
    """
    inventory:
      source: simulated
      simulated:
        - {name: dbg, pool: debug, nodes: 2, gpus_per_node: 4, model: H200,
           gpu_memory: 141GiB, cpu: 512, memory: 4TiB}
    pools:
      debug: {mode: debug}
    priority_classes:
      interactive: {value: 500, preemptible: false, grace_period: 5s}
    teams:
    """
) + "".join(
    f"  {t}:\n    groups: [{t}]\n    quotas:\n      debug: {{guaranteed: 1, borrow_limit: 1/2}}\n"
    for t in TEAMS
) + textwrap.dedent(
    """
    profiles:
      - {slug: quarter, display_name: Quarter GPU, pool: debug, gpu: {fraction: 1/4},
         cpu: 1, memory: 1GiB}
    """
)

# a tiny stand-in for jupyterhub-singleuser in the concurrency run (50 real Jupyter servers
# would measure this machine's RAM, not the spawner): answers HTTP on the assigned port
TINY_SERVER = textwrap.dedent(
    """
    import os, http.server, urllib.parse
    url = urllib.parse.urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a): pass
    http.server.ThreadingHTTPServer((url.hostname, url.port), H).serve_forever()
    """
)


def gpushare_config(policy: Path, broker_port: int, cmd: list[str] | None = None) -> str:
    extra = f"""
from jupyter_gpushare.hubsetup import setup_gpushare
setup_gpushare(c, {str(policy)!r}, spawner="simple", broker_port={broker_port}, data_dir=HUB_TMP)
c.GPUShareSpawner.policy_file = {str(policy)!r}
c.JupyterHub.log_level = "WARN"
c.SimpleLocalProcessSpawner.home_dir_template = HUB_TMP + "/home/{{username}}"
c.JupyterHub.concurrent_spawn_limit = 0
"""
    if cmd:
        extra += f"c.Spawner.cmd = {cmd!r}\nc.Spawner.args = []\n"
    return extra


PLAIN_CONFIG = """
c.JupyterHub.log_level = "WARN"
c.SimpleLocalProcessSpawner.home_dir_template = HUB_TMP + "/home/{username}"
"""


def wait_ready(hub: RealHub, user: str, timeout: float = 120) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, model = hub.api("GET", f"/users/{user}")
        srv = (model or {}).get("servers", {}).get("")
        if srv and srv.get("ready"):
            return True
        if status == 200 and not srv and not model.get("pending"):
            return False  # failed or refused
        time.sleep(0.02)
    return False


def wait_gone(hub: RealHub, user: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, model = hub.api("GET", f"/users/{user}")
        if "" not in (model or {}).get("servers", {}):
            return
        time.sleep(0.05)


def spawn_time(hub: RealHub, user: str, body: dict | None) -> float:
    t0 = time.perf_counter()
    status, answer = hub.api("POST", f"/users/{user}/server", body)
    if status not in (201, 202):
        raise RuntimeError(f"spawn of {user} failed: {status} {answer}")
    if not wait_ready(hub, user):
        raise RuntimeError(f"{user} never became ready:\n{hub.log_text()[-3000:]}")
    return time.perf_counter() - t0


def latency(plain: RealHub, share: RealHub, rounds: int) -> dict:
    for hub, groups in ((plain, []), (share, ["team0"])):
        for i in range(rounds + 1):
            hub.create_user(f"u{i}", groups=groups)
    times: dict[str, list[float]] = {"plain": [], "gpushare": []}
    for i in range(rounds + 1):  # round 0 warms both up and is not counted
        order = [("plain", plain, None), ("gpushare", share, {"profile": "quarter"})]
        if i % 2:
            order.reverse()
        for name, hub, body in order:
            t = spawn_time(hub, f"u{i}", body)
            hub.api("DELETE", f"/users/u{i}/server")
            wait_gone(hub, f"u{i}")
            if i:
                times[name].append(t)
    med_plain = statistics.median(times["plain"])
    med_share = statistics.median(times["gpushare"])
    return {
        "rounds": rounds,
        "plain_median_s": round(med_plain, 4),
        "gpushare_median_s": round(med_share, 4),
        "slowdown_pct": round(100 * (med_share / med_plain - 1), 2),
        "plain_s": [round(t, 4) for t in times["plain"]],
        "gpushare_s": [round(t, 4) for t in times["gpushare"]],
    }


def broker_get(hub: RealHub, broker_port: int, path: str) -> dict:
    token = json.loads((hub.tmp / "gpushare_tokens.json").read_text())["spawner"]
    req = urllib.request.Request(
        f"http://127.0.0.1:{broker_port}/services/gpushare/api/v1{path}",
        headers={"Authorization": f"token {token}"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def concurrent(hub: RealHub, broker_port: int, policy_file: Path, n: int) -> dict:
    from jupyter_gpushare.policy import load_policy

    policy = load_policy(policy_file)
    users = [(f"c{i}", TEAMS[i % len(TEAMS)]) for i in range(n)]
    for user, team in users:
        hub.create_user(user, groups=[team])
    results: dict[str, tuple[int, object]] = {}

    def go(user: str) -> None:
        body = {"profile": "quarter"}
        results[user] = hub.api("POST", f"/users/{user}/server", body, timeout=120)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=go, args=(u,)) for u, _ in users]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ready = {u for u, _ in users if results[u][0] in (201, 202) and wait_ready(hub, u)}
    elapsed = time.perf_counter() - t0
    refused = {u: results[u] for u, _ in users if results[u][0] >= 400}
    grants = [g for g in broker_get(hub, broker_port, "/grants")["grants"]
              if not g.get("released_at")]

    memory = {g.uuid: g.memory_mib for node in policy.nodes for g in node.gpus}
    used_mem: dict[str, int] = defaultdict(int)
    used_pct: dict[str, float] = defaultdict(float)
    team_units: dict[tuple[str, str], float] = defaultdict(float)
    for g in grants:
        team_units[(g["team"], g["pool"])] += g["units"]
        for s in g["gpus"]:
            used_mem[s["uuid"]] += s["memory_mib"]
            used_pct[s["uuid"]] += s["compute_pct"]
    over_gpu = [u for u in used_mem if used_mem[u] > memory[u] or used_pct[u] > 100 + 1e-9]
    over_team = []
    for (team, pool), units in team_units.items():
        q = policy.team(team).quota(pool)  # type: ignore[union-attr]
        if units * 1000 > q.guaranteed_milli + q.borrow_limit_milli + 1e-6:  # type: ignore[union-attr]
            over_team.append((team, pool, units))
    holders = sorted(g["user"] for g in grants)
    for u in ready:
        hub.api("DELETE", f"/users/{u}/server")
    return {
        "spawns": n,
        "teams": len(TEAMS),
        "ready": len(ready),
        "refused": len(refused),
        "refusal_statuses": sorted({r[0] for r in refused.values()}),
        "live_grants": len(grants),
        "gpus_over_allocated": over_gpu,
        "teams_over_quota": over_team,
        "servers_without_exactly_one_grant": sorted(
            u for u in ready if holders.count(u) != 1
        ) + sorted(set(holders) - ready),
        "max_gpu_memory_used_pct": round(
            max((100 * used_mem[u] / memory[u] for u in used_mem), default=0), 1),
        "team_units": {f"{t}/{p}": round(v, 3) for (t, p), v in sorted(team_units.items())},
        "wall_s": round(elapsed, 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--concurrent", type=int, default=50)
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="spawnbench-") as tmp_s:
        tmp = Path(tmp_s)
        policy = tmp / "policy.yaml"
        policy.write_text(POLICY)
        bport = free_port()
        plain = start_hub(tmp / "plain", PLAIN_CONFIG)
        share = start_hub(tmp / "gpushare", gpushare_config(policy, bport))
        try:
            out["latency"] = latency(plain, share, args.rounds)
        finally:
            plain.stop()
            share.stop()
        lat = out["latency"]
        print(f"spawn-to-ready median over {lat['rounds']} alternating rounds: "
              f"plain {lat['plain_median_s']:.3f} s, gpushare {lat['gpushare_median_s']:.3f} s "
              f"-> {lat['slowdown_pct']:+.1f} % (target <= +5 %)")
        tiny = tmp / "tiny_server.py"
        tiny.write_text(TINY_SERVER)
        bport2 = free_port()
        hub = start_hub(tmp / "concurrent",
                        gpushare_config(policy, bport2, [sys.executable, str(tiny)]))
        try:
            out["concurrent"] = concurrent(hub, bport2, policy, args.concurrent)
        finally:
            hub.stop()
        con = out["concurrent"]
        print(f"{con['spawns']} concurrent spawns across {con['teams']} teams in "
              f"{con['wall_s']} s: {con['ready']} ready, {con['refused']} refused "
              f"(HTTP {con['refusal_statuses']}), {con['live_grants']} live grants; "
              f"GPUs over-allocated: {len(con['gpus_over_allocated'])}, teams over quota: "
              f"{len(con['teams_over_quota'])}, servers without exactly one grant: "
              f"{len(con['servers_without_exactly_one_grant'])}; "
              f"fullest GPU {con['max_gpu_memory_used_pct']} % of its memory")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    ok = (lat["slowdown_pct"] <= 5 and not con["gpus_over_allocated"]
          and not con["teams_over_quota"] and not con["servers_without_exactly_one_grant"])
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
