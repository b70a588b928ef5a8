"""JupyterHub spawners that start servers with a GPU share granted by the gpushare broker.

Registered as ``jupyterhub.spawners`` entry points: ``gpushare-local``,
``gpushare-simple`` and ``gpushare-kube``. The Kubernetes spawner is imported lazily, so
the local ones work without kubespawner installed.
"""

from jupyter_gpushare.spawner.mixin import GPUShareSpawner, GPUShareSpawnerMixin

__all__ = ["GPUShareSpawner", "GPUShareSpawnerMixin"]
