"""Jinja templates that extend JupyterHub's own pages (``c.JupyterHub.template_paths``).

``home.html``, ``not_running.html`` and ``spawn.html`` add why the user's last server went away
(``GPUShareSpawner.gpushare_stop_message``: preempted for the owning team, or died).
"""

from pathlib import Path

TEMPLATES_DIR = str(Path(__file__).resolve().parent)
