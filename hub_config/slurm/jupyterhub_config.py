"""JupyterHub on a Slurm login node: every single-user server is a Slurm job that holds a
gpushare grant (``SlurmGPUShareSpawner``, on batchspawner's ``SlurmSpawner``).

Run it as root on a machine that can submit jobs (``sbatch``, ``squeue``, ``scancel`` work
there) and that the compute nodes can reach::

    GPUSHARE_HUB_IP=10.0.0.5 jupyterhub -f hub_config/slurm/jupyterhub_config.py

Environment (all optional):

* ``GPUSHARE_HUB_IP``: the login node's address on the cluster network. The hub API and
  the broker listen there, and servers on the compute nodes call them there (default: the
  address this host name resolves to).
* ``GPUSHARE_POLICY``: the policy file (default: ``gpushare.yaml`` beside this file). Its
  node names are Slurm NodeNames, its teams Slurm accounts, its priority classes QOS names
  (``jupyter-gpushare export slurm POLICY`` writes them for ``sacctmgr``).
* ``GPUSHARE_DATA_DIR``: where the hub and the broker keep their databases and tokens
  (default ``/var/lib/jupyterhub``).
* ``SLURM_PARTITION``: the partition for servers (default: the cluster's default one).

Users log in with their system accounts (PAM); batchspawner submits each job with
``sudo -E -u <user> sbatch``, so it runs as that user, who must exist on the nodes too.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from jupyter_gpushare.hubsetup import setup_gpushare

c = get_config()  # type: ignore[name-defined]  # noqa: F821

HERE = Path(__file__).resolve().parent
POLICY = os.environ.get("GPUSHARE_POLICY", str(HERE / "gpushare.yaml"))
DATA = os.environ.get("GPUSHARE_DATA_DIR", "/var/lib/jupyterhub")
HUB_IP = os.environ.get("GPUSHARE_HUB_IP") or socket.gethostbyname(socket.gethostname())

os.makedirs(DATA, exist_ok=True)

# --- the hub -----------------------------------------------------------------------------
c.JupyterHub.ip = "0.0.0.0"  # the public proxy (put TLS in front of it)
c.JupyterHub.port = 8000
c.JupyterHub.hub_ip = HUB_IP  # the hub API, reached by servers on the compute nodes
c.JupyterHub.hub_connect_ip = HUB_IP  # what JUPYTERHUB_API_URL in the job says
c.JupyterHub.db_url = f"sqlite:///{DATA}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = f"{DATA}/jupyterhub_cookie_secret"
# Slurm jobs outlive a hub restart; the spawner finds them again (job id and grant id are
# in its state) instead of having them cancelled
c.JupyterHub.cleanup_servers = False
c.JupyterHub.authenticator_class = "pam"
c.Authenticator.allowed_groups = {"vision", "nlp"}  # the policy's teams' groups
c.Authenticator.admin_users = {"hubadmin"}
c.LocalAuthenticator.create_system_users = False


def unix_groups(authenticator: object, handler: object, auth_model: dict) -> dict:
    """At each login, the user's Unix groups become their JupyterHub groups: gpushare
    teams are JupyterHub groups (the policy's teams.*.groups)."""
    import grp
    import pwd

    name = auth_model["name"]
    gids = os.getgrouplist(name, pwd.getpwnam(name).pw_gid)
    auth_model["groups"] = sorted({grp.getgrgid(g).gr_name for g in gids})
    return auth_model


c.Authenticator.post_auth_hook = unix_groups
c.Authenticator.manage_groups = True

# --- gpushare: the broker service, roles, and the Slurm spawner --------------------------
setup_gpushare(
    c,
    POLICY,
    spawner="slurm",  # jupyter_gpushare.spawner.slurm.SlurmGPUShareSpawner
    broker_ip=HUB_IP,  # servers send their heartbeats to the broker from the nodes
    broker_port=10101,
    data_dir=DATA,
    admin_users=["hubadmin"],
)
c.GPUShareSpawner.policy_file = POLICY

# --- the Slurm job -----------------------------------------------------------------------
# gres.conf's shard Count per GPU (when the policy has no slurm.shards_per_gpu):
# a 1/4 GPU profile asks for --gres=shard:2 with 8
c.SlurmGPUShareSpawner.shards_per_gpu = 8
c.SlurmGPUShareSpawner.account_template = "{team}"  # "" passes no --account
c.SlurmGPUShareSpawner.qos_template = "{priority}"  # "" passes no --qos
c.SlurmGPUShareSpawner.pin_to_node = True  # --nodelist = the node the broker chose
if os.environ.get("SLURM_PARTITION"):
    c.SlurmGPUShareSpawner.req_partition = os.environ["SLURM_PARTITION"]
# where node names do not resolve from the hub, the address of each node:
# c.SlurmGPUShareSpawner.node_addresses = {"gpu01": "10.0.0.11", "gpu02": "10.0.0.12"}
# where the policy names nodes differently from Slurm:
# c.SlurmGPUShareSpawner.node_names = {"lab-0": "gpu01"}

# run inside the job before the server (modules, conda...); the server must be
# jupyterhub-singleuser from an environment with jupyter-gpushare (same version as here)
# c.SlurmGPUShareSpawner.req_prologue = "source /etc/profile; module load jupyter"
c.Spawner.cmd = ["jupyterhub-singleuser"]
c.Spawner.default_url = "/lab"
# a job may wait in the Slurm queue: give it time (the broker's own queue comes first)
c.Spawner.http_timeout = 120
c.GPUShareSpawner.queue_timeout = 900.0
c.SlurmGPUShareSpawner.startup_poll_interval = 1.0
