"""jupyter-gpushare: share scarce GPUs from JupyterHub and JupyterLab."""

__version__ = "0.1.0"
