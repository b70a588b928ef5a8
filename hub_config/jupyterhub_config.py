"""The local demo hub: JupyterHub + jupyter-gpushare at http://127.0.0.1:8000.

Run it with ``./hub_config/demo.sh`` (or ``jupyterhub -f hub_config/jupyterhub_config.py``
from the repository root with the virtual environment active).

* Users (any password): ``alice``, ``amy`` (team vision), ``bob``, ``bea`` (team nlp),
  ``rita`` (team research) and the hub admin ``admin`` (also a gpushare admin).
* GPUs: the ones NVML finds on this machine when there are any (a static inventory is
  written to the data folder: one GPU to the debug pool when there are two or more, the rest
  to the shared interactive pool); otherwise the simulated inventory of
  ``hub_config/gpushare.yaml``, labelled as simulated everywhere.
* Everything the hub writes goes to ``$GPUSHARE_DEMO_DIR`` (default ``hub_config/.demo``).
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import yaml

from jupyter_gpushare.hubsetup import setup_gpushare

c = get_config()  # type: ignore[name-defined]  # noqa: F821

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DATA = Path(os.environ.get("GPUSHARE_DEMO_DIR", HERE / ".demo")).resolve()
DATA.mkdir(parents=True, exist_ok=True)
PORT = int(os.environ.get("GPUSHARE_DEMO_PORT", "8000"))
EXAMPLE_POLICY = HERE / "gpushare.yaml"

TEAMS = {"vision": ["alice", "amy"], "nlp": ["bob", "bea"], "research": ["rita"]}
ADMIN = "admin"


def discovered_gpus() -> list[dict[str, object]]:
    """The GPUs NVML finds here: uuid, model, memory (MiB). Empty without a GPU or driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return []
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            name = pynvml.nvmlDeviceGetName(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h).total // (1024 * 1024)
            name = name.decode() if isinstance(name, bytes) else name
            out.append({
                "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
                "model": name.replace("NVIDIA ", ""),
                "memory_mib": int(mem),
            })
        return out
    finally:
        pynvml.nvmlShutdown()


def policy_for(gpus: list[dict[str, object]]) -> Path:
    """The example policy with this machine's real GPUs as a static inventory."""
    if not gpus:
        return EXAMPLE_POLICY
    policy = yaml.safe_load(EXAMPLE_POLICY.read_text())
    host = socket.gethostname().split(".")[0].lower() or "local"
    debug = gpus[-1:] if len(gpus) >= 2 else []
    shared = gpus[:-1] if debug else gpus
    # CPU and RAM are not what this demo shares: give the nodes enough for every profile
    cpu = max([os.cpu_count() or 4] + [int(float(str(p.get("cpu", 1)))) + 1
                                        for p in policy.get("profiles", [])])
    nodes = []
    for pool, group in (("interactive", shared), ("debug", debug)):
        if not group:
            continue
        nodes.append({
            "name": f"{host}-{pool}",
            "pool": pool,
            "cpu": cpu,
            "memory": "4TiB",
            "gpus": [{"model": str(g["model"]), "memory": f"{g['memory_mib']}MiB", "count": 1,
                      "uuids": [str(g["uuid"])]} for g in group],
        })
    policy["inventory"] = {"source": "static", "nodes": nodes}
    path = DATA / "gpushare-nvml.yaml"
    path.write_text(yaml.safe_dump(policy, sort_keys=False))
    return path


POLICY = policy_for(discovered_gpus())

# ---------------------------------------------------------------- JupyterHub
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = PORT
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = int(os.environ.get("GPUSHARE_DEMO_HUB_PORT", "8081"))
PROXY_API_PORT = int(os.environ.get("GPUSHARE_DEMO_PROXY_API_PORT", "8001"))
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{PROXY_API_PORT}"
BROKER_PORT = int(os.environ.get("GPUSHARE_DEMO_BROKER_PORT", "10101"))
c.JupyterHub.db_url = f"sqlite:///{DATA / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(DATA / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(DATA / "jupyterhub.pid")
c.ConfigurableHTTPProxy.command = [
    str(HERE / "proxy" / "node_modules" / ".bin" / "configurable-http-proxy")
]
c.ConfigurableHTTPProxy.pid_file = str(DATA / "jupyterhub-proxy.pid")

# demo login: the users below, any password
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allowed_users = {u for users in TEAMS.values() for u in users} | {ADMIN}
c.Authenticator.admin_users = {ADMIN}
c.JupyterHub.load_groups = {team: {"users": users} for team, users in TEAMS.items()}
c.JupyterHub.allow_named_servers = True

# ---------------------------------------------------------------- gpushare
# set before setup_gpushare: batch jobs deliver their notebooks into the same folders
c.SimpleLocalProcessSpawner.home_dir_template = str(DATA / "home" / "{username}")
setup_gpushare(
    c, str(POLICY), spawner="simple", data_dir=str(DATA), admin_users=[ADMIN],
    broker_port=BROKER_PORT,
)
c.GPUShareSpawner.policy_file = str(POLICY)

# ---------------------------------------------------------------- single-user servers
VENV_BIN = Path(sys.executable).parent
c.Spawner.cmd = [str(VENV_BIN / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.args = ["--allow-root"] if os.geteuid() == 0 else []
c.Spawner.http_timeout = 60
