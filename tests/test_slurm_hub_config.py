"""hub_config/slurm/: the example Slurm site config loads, wires the Slurm spawner and puts
the hub API and the broker where compute nodes reach them; its policy is valid."""

from __future__ import annotations

from pathlib import Path

from traitlets.config.loader import PyFileConfigLoader

from jupyter_gpushare.policy import load_policy
from jupyter_gpushare.spawner.slurm import SlurmGPUShareSpawner

HERE = Path(__file__).resolve().parent.parent / "hub_config" / "slurm"


def test_the_example_config_wires_the_slurm_spawner(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSHARE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("GPUSHARE_HUB_IP", "10.0.0.5")
    monkeypatch.setenv("SLURM_PARTITION", "gpu")
    c = PyFileConfigLoader("jupyterhub_config.py", path=str(HERE)).load_config()
    assert c.JupyterHub.spawner_class == "jupyter_gpushare.spawner.slurm.SlurmGPUShareSpawner"
    assert c.JupyterHub.hub_ip == c.JupyterHub.hub_connect_ip == "10.0.0.5"
    assert c.JupyterHub.cleanup_servers is False
    (broker,) = [s for s in c.JupyterHub.services if s["name"] == "gpushare"]
    assert broker["url"] == "http://10.0.0.5:10101"
    assert c.GPUShareSpawner.broker_url.startswith("http://10.0.0.5:10101/")
    assert c.Spawner.environment["GPUSHARE_BROKER_URL"].startswith("http://10.0.0.5:10101/")
    assert c.SlurmGPUShareSpawner.req_partition == "gpu"
    # every setting it makes for the spawner is one the spawner has
    traits = set(SlurmGPUShareSpawner.class_trait_names(config=True))
    assert set(c.SlurmGPUShareSpawner) <= traits, set(c.SlurmGPUShareSpawner) - traits
    assert (tmp_path / "gpushare_tokens.json").exists()
    # logins carry the user's Unix groups (the teams) into JupyterHub
    assert c.Authenticator.manage_groups is True
    model = c.Authenticator.post_auth_hook(None, None, {"name": "root"})
    assert "root" in model["groups"]


def test_the_example_policy_is_valid_and_names_slurm_nodes():
    policy = load_policy(str(HERE / "gpushare.yaml"))
    assert {n.name for n in policy.nodes} == {"gpu01", "gpu02"}
    assert policy.slurm.shards_per_gpu == 8
    assert {p.slug for p in policy.profiles} >= {"quarter", "train-1"}
