"""Spawn-to-ready of a server run as a Slurm job: SlurmGPUShareSpawner against plain
batchspawner, in the same run, on the same test cluster.

One real Slurm cluster (tests/slurmcluster.py: slurmctld and slurmd nodes in network
namespaces, fake GPUs) and two real hubs with their proxies on it:

* ``plain``: batchspawner's ``SlurmSpawner`` (as ``MultiSlurmSpawner``, which adds only the
  node-name -> address map the namespaces need) with the same job resources written by
  hand (``shard:2``, account, QOS, node, time, 1 CPU, 1 GiB);
* ``gpushare``: ``SlurmGPUShareSpawner`` with the broker service, a 1/4 GPU profile, the
  resources derived from the grant.

Each round is an A/B pair (both spawns back to back, in a random order, so both see the
same load): POST /users/<u>/server -> the hub reports the server ready, then stop and wait
until it is gone. Printed: the median spawn-to-ready of each arm, the ratio of medians and
the median of the paired ratios (target: at most 1.2).

    .venv/bin/python benchmarks/slurm_spawn.py [--rounds 7] [--warmup 1] [--seed 1]
        [--port-wait 60] [--json out.json]

Needs root, Slurm (slurmctld, slurmd, munged on PATH) and hub_config/proxy's
configurable-http-proxy.
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from realhub import RealHub, free_port, start_hub  # noqa: E402
from slurmcluster import SlurmCluster, have_slurm  # noqa: E402
from slurmhub import hub_env, slurm_hub_config  # noqa: E402

POLICY = """
inventory:
  source: simulated
  nodes:
    - {name: node1, pool: interactive, cpu: 4, memory: 4000MiB,
       gpus: [{model: H200, memory: 80GiB, count: 2}]}
pools:
  interactive: {mode: shared}
priority_classes:
  interactive: {value: 500, preemptible: false, grace_period: 3s}
teams:
  alpha: {groups: [alpha], quotas: {interactive: {guaranteed: 1}}}
profiles:
  - {slug: quarter, display_name: Quarter GPU, pool: interactive, gpu: {fraction: 1/4},
     cpu: 1, memory: 1GiB, max_lifetime: 2h}
"""


def server(hub: RealHub, user: str) -> tuple[int, dict | None, dict]:
    status, model = hub.api("GET", f"/users/{user}")
    return status, ((model or {}).get("servers") or {}).get(""), model or {}


def wait_ready(hub: RealHub, user: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, srv, model = server(hub, user)
        if srv and srv.get("ready"):
            return
        if status == 200 and srv is None and not model.get("pending"):
            raise RuntimeError(f"{user}'s spawn failed:\n{hub.log_text()[-3000:]}")
        time.sleep(0.05)
    raise RuntimeError(f"{user} not ready after {timeout}s:\n{hub.log_text()[-3000:]}")


def wait_gone(hub: RealHub, user: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and server(hub, user)[1] is not None:
        time.sleep(0.1)


JOB_FIELDS = ("TresPerNode", "ReqNodeList", "Account", "TimeLimit", "NumCPUs", "Partition",
              "Requeue")


def job_resources(cluster: SlurmCluster, job_id: str) -> dict[str, str]:
    out = cluster.run("scontrol", "show", "job", job_id, check=False).stdout
    found = dict(m.groups() for m in re.finditer(r"(\w[\w/:]*)=(\S*)", out))
    return {k: found.get(k, "") for k in JOB_FIELDS}


STAMP = re.compile(r"^\[\w (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) [^]]*\] (.*)$")
MARKS = {"submitted": "Job submitted.", "port": "Notebook server job"}


def log_marks(hub: RealHub, since: float) -> dict[str, float]:
    """Wall-clock times (UTC) of the hub's 'job submitted' and 'server job started at'
    lines written after ``since``."""
    found: dict[str, float] = {}
    for line in hub.log_text().splitlines():
        m = STAMP.match(line)
        if not m:
            continue
        ts = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").replace(
            tzinfo=datetime.timezone.utc).timestamp()
        for key, text in MARKS.items():
            if ts >= since - 0.01 and m.group(2).startswith(text):
                found[key] = ts
    return found


def timed_spawn(
    hub: RealHub, user: str, body: dict | None, cluster: SlurmCluster
) -> tuple[dict[str, float], dict[str, str]]:
    """Seconds from the spawn request to ready (and to sbatch's answer, and to the port
    report), and the Slurm job's resources."""
    wall, t0 = time.time(), time.monotonic()
    status, answer = hub.api("POST", f"/users/{user}/server", body, timeout=200)
    if status not in (201, 202):
        raise RuntimeError(f"spawn of {user} failed: {status} {answer}")
    wait_ready(hub, user)
    took = {"ready": time.monotonic() - t0}
    marks = log_marks(hub, wall)
    for key in MARKS:
        took[key] = marks[key] - wall if key in marks else float("nan")
    srv = server(hub, user)[1] or {}
    resources = job_resources(cluster, str((srv.get("state") or {}).get("job_id")))
    hub.api("DELETE", f"/users/{user}/server")
    wait_gone(hub, user)
    return took, resources


def run(rounds: int, warmup: int, seed: int, tmp: Path, port_wait: float) -> dict:
    rng = random.Random(seed)
    with SlurmCluster(base_dir=tmp, nodes=("node1", "node2")) as cluster:
        policy = tmp / "policy.yaml"
        policy.write_text(POLICY)
        env = hub_env(cluster)
        plain = start_hub(tmp / "plain", slurm_hub_config(cluster, tmp / "home-plain",
                                                          spawner="plain"), env=env)
        try:
            share_config = slurm_hub_config(cluster, tmp / "home-share", policy=policy,
                                            broker_port=free_port())
            share_config += f"c.SlurmGPUShareSpawner.wait_for_port = {port_wait}\n"
            share = start_hub(tmp / "share", share_config, env=env)
            try:
                plain.create_user("u")
                share.create_user("u", groups=["alpha"])
                arms = {"plain": (plain, None), "gpushare": (share, {"profile": "quarter"})}
                pairs: list[dict[str, dict[str, float]]] = []
                jobs: dict[str, dict[str, str]] = {}
                for i in range(warmup + rounds):
                    order = list(arms)
                    rng.shuffle(order)
                    pair = {}
                    for name in order:
                        pair[name], jobs[name] = timed_spawn(arms[name][0], "u",
                                                             arms[name][1], cluster)
                    print(f"round {i + 1}: " + ", ".join(
                        f"{k} {v['ready']:.2f} s" for k, v in pair.items())
                        + (" (warm-up)" if i < warmup else ""), flush=True)
                    if i >= warmup:
                        pairs.append(pair)
            finally:
                share.stop()
        finally:
            plain.stop()
    if jobs["plain"] != jobs["gpushare"]:
        raise RuntimeError(f"the two arms' jobs differ: {jobs}")
    def median(arm: str, key: str) -> float:
        return statistics.median(p[arm][key] for p in pairs)

    med = {arm: median(arm, "ready") for arm in arms}
    ratios = [p["gpushare"]["ready"] / p["plain"]["ready"] for p in pairs]
    return {
        "rounds": rounds,
        "warmup": warmup,
        "seed": seed,
        "gpushare_wait_for_port_s": port_wait,
        # the hub's side: request -> sbatch answered (gpushare: broker grant + script), and
        # -> the job reported its port (Slurm scheduling and the job's start)
        "post_to_submitted_ms": {a: round(1000 * median(a, "submitted"), 1) for a in arms},
        "post_to_port_s": {a: round(median(a, "port"), 3) for a in arms},
        "plain_median_s": round(med["plain"], 3),
        "gpushare_median_s": round(med["gpushare"], 3),
        "ratio_of_medians": round(med["gpushare"] / med["plain"], 3),
        "paired_ratio_median": round(statistics.median(ratios), 3),
        "target": "<= 1.2",
        "met": statistics.median(ratios) <= 1.2,
        "slurm_job_both_arms": jobs["gpushare"],
        "pairs": [{arm: {k: round(v, 3) for k, v in t.items()} for arm, t in p.items()}
                  for p in pairs],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--port-wait", type=float, default=60.0,
                    help="SlurmGPUShareSpawner.wait_for_port (0: hand over to the hub's "
                         "HTTP check at once, as plain batchspawner does)")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    if not have_slurm():
        print("slurmctld is not on PATH (apt-get install slurm-wlm munge)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="slurm-spawn-bench-") as tmp:
        out = run(args.rounds, args.warmup, args.seed, Path(tmp), args.port_wait)
    print(json.dumps({k: v for k, v in out.items() if k != "pairs"}, indent=2))
    print(f"spawn-to-ready on Slurm: gpushare {out['gpushare_median_s']:.2f} s, plain "
          f"batchspawner {out['plain_median_s']:.2f} s, ratio {out['paired_ratio_median']:.3f}"
          f" (paired median; target <= 1.2: {'met' if out['met'] else 'NOT met'})")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
