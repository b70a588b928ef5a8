"""One call in ``jupyterhub_config.py`` wires jupyter-gpushare into JupyterHub::

    from jupyter_gpushare.hubsetup import setup_gpushare
    setup_gpushare(c, "/etc/jupyterhub/gpushare.yaml", admin_users=["ada"])

It adds:

* the managed service ``gpushare`` (the broker under its supervisor, which restarts it at
  once if it dies and lets it serve the servers' releases while the hub shuts down; listening on
  ``127.0.0.1:<broker_port>``, proxied at ``/services/gpushare/``) and the URL-less service
  ``gpushare-spawner`` whose token the spawner uses (set as ``c.GPUShareSpawner.broker_api_token``
  with ``c.GPUShareSpawner.broker_url``);
* custom scopes ``custom:gpushare:admin``, ``custom:gpushare:act-as-users`` and
  ``custom:gpushare:metrics``, and roles: ``gpushare-broker`` (what the broker needs from the
  hub: read users, groups and servers, stop servers), ``gpushare-spawner`` (act-as-users),
  ``gpushare-admin`` (for ``admin_users``), ``gpushare-team-admin`` (the teams' ``admins``
  named in the policy file) and ``custom:gpushare:use`` added to the ``user`` role so users'
  own tokens may call the broker's API;
* the Services menu entry: JupyterHub lists a service to those holding
  ``access:services!service=gpushare``, so only the two admin roles carry it (everyone else
  uses the API through ``custom:gpushare:use``): admins open the admin page, team admins
  their team's page, and nobody else sees the entry. Team admins are read from the policy
  when the hub starts (a policy reload changes who may open which page at once, the menu
  at the hub's next start);
* ``c.Spawner.server_token_scopes``: JupyterHub's default for the server token (the ``server``
  role: ``users:activity!user`` and ``access:servers!server``) plus
  ``custom:gpushare:use``, so a single-user server may talk to the broker for its own server
  only;
* OAuth for the broker's browser pages (``oauth_no_confirm``, and
  ``oauth_client_allowed_scopes`` so an admin's login carries ``custom:gpushare:admin``);
* ``c.JupyterHub.spawner_class`` (``local``, ``simple``, ``kube`` or ``slurm``) and the environment
  ``GPUSHARE_BROKER_URL`` of single-user servers;
* ``c.JupyterHub.init_spawners_timeout = 1`` unless set (:data:`INIT_SPAWNERS_TIMEOUT_S`): a
  restarted hub starts the broker after at most a second of checking servers, not ten.

With ``broker_managed=False`` the broker runs **outside the hub** (a systemd unit, a
container): the service entry has no ``command``, so the hub only proxies to the broker and
registers its token and OAuth client, and a restart or a crash of the hub no longer takes the
broker with it. The hub's config then writes ``gpushare_broker.json`` (mode 0600) in
``data_dir``, from which ``python -m jupyter_gpushare.broker.ops.external <file>`` runs the
broker (:mod:`jupyter_gpushare.broker.ops.external`). Call ``setup_gpushare`` after setting
``hub_ip``, ``hub_port`` and ``base_url`` (or pass ``hub_api_url``): the launch file names the
hub's API URL the broker is to use.

The two service tokens are kept in ``gpushare_tokens.json`` in ``data_dir`` (default: the
directory of the hub's SQLite database, else the working directory) so they survive restarts.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from typing import Any

SPAWNERS = {
    "local": "jupyter_gpushare.spawner.local.LocalGPUShareSpawner",
    "simple": "jupyter_gpushare.spawner.local.SimpleLocalGPUShareSpawner",
    "kube": "jupyter_gpushare.spawner.kube.KubeGPUShareSpawner",
    "slurm": "jupyter_gpushare.spawner.slurm.SlurmGPUShareSpawner",
}
SERVICE = "gpushare"
SPAWNER_SERVICE = "gpushare-spawner"
ACCESS = f"access:services!service={SERVICE}"
USE = "custom:gpushare:use"
"""The broker's API for one's own servers and jobs (every user; not the menu entry)."""
CUSTOM_SCOPES = {
    USE: {"description": "Ask for, hold and release GPU shares for one's own servers and jobs."},
    "custom:gpushare:admin": {
        "description": "See and change every GPU grant, drain nodes, reconcile, read metrics.",
    },
    "custom:gpushare:act-as-users": {
        "description": "Request and release GPU shares for any user (the hub's spawner).",
    },
    "custom:gpushare:metrics": {"description": "Read the gpushare broker's Prometheus metrics."},
}
BROWSER_SCOPES = ("custom:gpushare:admin", "custom:gpushare:metrics")
"""Scopes a browser login (OAuth token) of the broker may carry, where the user has them."""
BROKER_HUB_SCOPES = [
    "list:users",
    "read:users",
    "read:users:groups",
    "read:groups",
    "read:servers",
    "delete:servers",
    "servers",
]
# The hub starts its managed services, the broker among them, only once init_spawners is done
# or has taken this long; JupyterHub's default (10 s) is what a restarted hub waits for a server
# that was starting when the old hub died (its jupyterhub-singleuser cannot finish starting
# until the hub answers), and meanwhile no one can spawn and no grant can be checked. Servers
# still being checked show "pending check" and finish in the background.
INIT_SPAWNERS_TIMEOUT_S = 1
# JupyterHub's default server token scopes (the 'server' role in jupyterhub/roles.py)
DEFAULT_SERVER_TOKEN_SCOPES = ["users:activity!user", "access:servers!server"]


def _cfg_get(section: Any, name: str, default: Any) -> Any:
    try:
        return section.get(name, default)
    except TypeError:
        return default


def _data_dir(c: Any) -> str:
    db_url = _cfg_get(c.JupyterHub, "db_url", "sqlite:///jupyterhub.sqlite")
    if isinstance(db_url, str) and db_url.startswith("sqlite:///"):
        path = db_url[len("sqlite:///") :]
        return (
            os.path.dirname(os.path.abspath(path)) if path and path != ":memory:" else os.getcwd()
        )
    return os.getcwd()


def _tokens(data_dir: str) -> dict[str, str]:
    path = os.path.join(data_dir, "gpushare_tokens.json")
    tokens: dict[str, str] = {}
    if os.path.exists(path):
        with open(path) as f:
            tokens = json.load(f)
    changed = False
    for key in ("broker", "spawner"):
        if not tokens.get(key):
            tokens[key] = secrets.token_hex(32)
            changed = True
    if changed:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(tokens, f)
    return tokens


def team_admins(policy_file: str) -> list[str]:
    """The users named as ``admins`` of any team in the policy file (sorted, once each).

    Read from the YAML alone (no discovery, no validation: the broker validates the policy
    and names a bad field); an unreadable file names no one."""
    import yaml

    try:
        with open(policy_file, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return []
    teams = doc.get("teams") if isinstance(doc, dict) else None
    names: set[str] = set()
    for team in (teams or {}).values() if isinstance(teams, dict) else ():
        admins = team.get("admins") if isinstance(team, dict) else None
        if isinstance(admins, list):
            names.update(str(a) for a in admins)
    return sorted(names)


def _job_args(c: Any, spawner: str | None, broker_args: Any) -> list[str]:
    """Batch jobs go where the spawner puts users' files, as the user it runs servers as."""
    if any(str(a).startswith("--JobManager.user_root_template") for a in broker_args):
        return []
    if spawner == "simple":
        home = _cfg_get(c.SimpleLocalProcessSpawner, "home_dir_template", "/tmp/{username}")
        return [f"--JobManager.user_root_template={home}"]
    if spawner == "local":
        return ["--JobManager.run_as=user"]
    return []


def setup_gpushare(
    c: Any,
    policy_file: str,
    *,
    db_url: str | None = None,
    spawner: str | None = "local",
    broker_port: int = 10101,
    broker_ip: str = "127.0.0.1",
    admin_users: list[str] | tuple[str, ...] = (),
    data_dir: str | None = None,
    broker_args: list[str] | tuple[str, ...] = (),
    broker_env: dict[str, str] | None = None,
    broker_managed: bool = True,
    hub_api_url: str | None = None,
) -> dict[str, Any]:
    """Wire the broker service, roles, scopes, spawner class and server token scopes into ``c``.

    ``broker_managed=False``: the broker runs outside the hub, from the launch file written
    in ``data_dir`` (module docstring); ``hub_api_url`` is the hub API URL it uses (default:
    from ``c.JupyterHub``'s ``hub_connect_url``, else ``hub_ip``, ``hub_port`` and
    ``base_url``). Returns what it set up (service URLs, tokens, the launch file) for tests
    and further config.
    """
    data_dir = data_dir or _data_dir(c)
    os.makedirs(data_dir, exist_ok=True)
    tokens = _tokens(data_dir)
    db_url = db_url or "sqlite:///" + os.path.join(data_dir, "gpushare.sqlite")
    service_url = f"http://{broker_ip}:{broker_port}"
    api_url = f"{service_url}/services/{SERVICE}/api/v1"

    args = [
        f"--BrokerApp.policy_file={os.path.abspath(policy_file)}",
        f"--BrokerApp.db_url={db_url}",
        *_job_args(c, spawner, broker_args),
        *broker_args,
    ]
    service: dict[str, Any] = {
        "name": SERVICE,
        "url": service_url,
        "api_token": tokens["broker"],
        "display": True,  # the Services menu links to the admin page (admins only)
        # browsers log in to the broker's pages with the hub's OAuth: no confirmation
        # page, and a login carries the admin and metrics scopes of users who have them
        "oauth_no_confirm": True,
        "oauth_client_allowed_scopes": list(BROWSER_SCOPES),
    }
    launch_file = None
    if broker_managed:
        # the supervisor runs and restarts the broker (broker/ops/supervisor.py)
        service["command"] = [sys.executable, "-m", "jupyter_gpushare.broker.ops.supervisor",
                              *args]
        service["environment"] = dict(broker_env or {})
        service["cwd"] = data_dir
    else:
        launch_file = _write_launch(c, data_dir, args, tokens["broker"], service_url,
                                    hub_api_url, broker_env)
    services = list(_cfg_get(c.JupyterHub, "services", []))
    services = [s for s in services if s.get("name") not in (SERVICE, SPAWNER_SERVICE)]
    services.append(service)
    services.append({"name": SPAWNER_SERVICE, "api_token": tokens["spawner"]})
    c.JupyterHub.services = services

    custom = dict(_cfg_get(c.JupyterHub, "custom_scopes", {}))
    custom.update(CUSTOM_SCOPES)
    c.JupyterHub.custom_scopes = custom

    roles = [
        r
        for r in _cfg_get(c.JupyterHub, "load_roles", [])
        if r.get("name") not in ("gpushare-broker", "gpushare-spawner", "gpushare-admin",
                                 "gpushare-team-admin")
    ]
    user_role = next((r for r in roles if r.get("name") == "user"), None)
    if user_role is None:
        user_role = {"name": "user", "scopes": ["self"]}
        roles.append(user_role)
    if USE not in user_role.setdefault("scopes", ["self"]):
        user_role["scopes"] = [*user_role["scopes"], USE]
    roles.append(
        {
            "name": "gpushare-broker",
            "description": "the gpushare broker",
            "scopes": BROKER_HUB_SCOPES,
            "services": [SERVICE],
        }
    )
    roles.append(
        {
            "name": "gpushare-spawner",
            "description": "the hub's GPU spawner",
            "scopes": ["custom:gpushare:act-as-users", ACCESS],
            "services": [SPAWNER_SERVICE],
        }
    )
    roles.append(
        {
            "name": "gpushare-admin",
            "description": "gpushare administrators",
            "scopes": ["custom:gpushare:admin", ACCESS],
            "users": list(admin_users),
        }
    )
    roles.append(
        {
            "name": "gpushare-team-admin",
            "description": "admins of a gpushare team (their team's page and report)",
            "scopes": [ACCESS],
            "users": team_admins(policy_file),
        }
    )
    c.JupyterHub.load_roles = roles

    scopes = _cfg_get(c.Spawner, "server_token_scopes", None)
    if not isinstance(scopes, list):
        scopes = list(DEFAULT_SERVER_TOKEN_SCOPES)
    if USE not in scopes:
        scopes = [*scopes, USE]
    c.Spawner.server_token_scopes = scopes

    env = dict(_cfg_get(c.Spawner, "environment", {}))
    env["GPUSHARE_BROKER_URL"] = api_url
    c.Spawner.environment = env

    # the hub's home and "not running" pages say why a server went away (preempted, died)
    from jupyter_gpushare.spawner.templates import TEMPLATES_DIR

    paths = list(_cfg_get(c.JupyterHub, "template_paths", []))
    if TEMPLATES_DIR not in paths:
        c.JupyterHub.template_paths = [*paths, TEMPLATES_DIR]

    if spawner:
        c.JupyterHub.spawner_class = SPAWNERS.get(spawner, spawner)
    if _cfg_get(c.JupyterHub, "init_spawners_timeout", None) is None:
        c.JupyterHub.init_spawners_timeout = INIT_SPAWNERS_TIMEOUT_S
    c.GPUShareSpawner.broker_url = api_url
    c.GPUShareSpawner.broker_api_token = tokens["spawner"]
    return {"service_url": service_url, "api_url": api_url, "tokens": tokens, "db_url": db_url,
            "launch_file": launch_file}


def _base_url(c: Any) -> str:
    base = str(_cfg_get(c.JupyterHub, "base_url", "/") or "/")
    return "/" + base.strip("/") + "/" if base.strip("/") else "/"


def _hub_api_url(c: Any) -> str:
    """The hub API URL the hub gives its managed services, from ``c.JupyterHub``."""
    hub_prefix = _base_url(c) + "hub/"
    connect = str(_cfg_get(c.JupyterHub, "hub_connect_url", "") or "")
    if connect:
        root = connect.rstrip("/")
        return (root if root.endswith(hub_prefix.rstrip("/")) else root + hub_prefix[:-1]) + "/api"
    ip = str(_cfg_get(c.JupyterHub, "hub_connect_ip", "") or "") or str(
        _cfg_get(c.JupyterHub, "hub_ip", "") or "127.0.0.1")
    port = int(_cfg_get(c.JupyterHub, "hub_port", 8081) or 8081)
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}{hub_prefix}api"


def _write_launch(c: Any, data_dir: str, args: list[str], token: str, service_url: str,
                  hub_api_url: str | None, broker_env: dict[str, str] | None) -> str:
    """Write the broker's launch file (what the hub would give its managed service)."""
    from .broker.ops.external import FILE_NAME, Launch, write_launch_file

    prefix = f"{_base_url(c)}services/{SERVICE}/"
    env = {
        **(broker_env or {}),
        "JUPYTERHUB_SERVICE_NAME": SERVICE,
        "JUPYTERHUB_API_TOKEN": token,
        "JUPYTERHUB_API_URL": hub_api_url or _hub_api_url(c),
        "JUPYTERHUB_BASE_URL": _base_url(c),
        "JUPYTERHUB_SERVICE_URL": service_url,
        "JUPYTERHUB_SERVICE_PREFIX": prefix,
        "JUPYTERHUB_CLIENT_ID": f"service-{SERVICE}",
        "JUPYTERHUB_OAUTH_CALLBACK_URL": prefix + "oauth_callback",
    }
    path = os.path.join(data_dir, FILE_NAME)
    write_launch_file(path, Launch(args, env, os.path.abspath(data_dir)))
    return path
