"""The broker outside the hub: a launch file the hub's config writes, and the command that
runs the broker from it.

A managed service is the hub's child: it stops when the hub stops and dies when the hub is
killed, so every restart of the hub (an upgrade, a config change, a crash) takes the broker
with it, and no spawn, release or admission is answered until both are back. With
``setup_gpushare(c, ..., broker_managed=False)`` the hub only proxies to the broker and
registers its token and OAuth client; the broker runs on its own (a systemd unit, a
container) from the launch file ``gpushare_broker.json`` the hub's config writes next to
its tokens::

    python -m jupyter_gpushare.broker.ops.external /srv/jupyterhub/gpushare_broker.json

The file holds the broker's arguments, the environment JupyterHub would give a managed
service (``JUPYTERHUB_API_TOKEN`` and the rest) and the working folder. It holds a token, so
it is written with mode 0600, and it is read only if it is a regular file (not a link) owned
by the user running the broker and readable by no one else. The broker then runs under the
supervisor's ``--external`` mode (:mod:`.supervisor`): restarted at once when it dies, never
following the hub.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

FORMAT = "gpushare-broker-launch/1"
FILE_NAME = "gpushare_broker.json"


class LaunchFileError(ValueError):
    """A launch file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class Launch:
    """What the broker outside the hub runs with."""

    broker_args: list[str]
    environment: dict[str, str]
    cwd: str


def write_launch_file(path: str, launch: Launch) -> None:
    """Write ``launch`` to ``path`` (mode 0600, replaced atomically, never through a link)."""
    doc = {
        "format": FORMAT,
        "broker_args": launch.broker_args,
        "environment": launch.environment,
        "cwd": launch.cwd,
    }
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def read_launch_file(path: str) -> Launch:
    """The launch in ``path``, checked: a regular file, not a link, owned by this user and
    neither readable nor writable by others; every field of the right type."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise LaunchFileError(
            f"{path}: cannot open ({exc.strerror}; links are not followed)"
        ) from None
    with os.fdopen(fd, encoding="utf-8") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise LaunchFileError(f"{path}: not a regular file")
        if st.st_uid != os.geteuid():
            raise LaunchFileError(
                f"{path}: owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
            )
        if st.st_mode & 0o077:
            raise LaunchFileError(
                f"{path}: holds the broker's token but its mode is "
                f"{stat.S_IMODE(st.st_mode):04o}; chmod 600 it"
            )
        try:
            doc = json.load(f)
        except ValueError as exc:
            raise LaunchFileError(f"{path}: not JSON ({exc})") from None
    return _launch(path, doc)


def _launch(path: str, doc: Any) -> Launch:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise LaunchFileError(f"{path}: field 'format' must be {FORMAT!r}")
    args, env, cwd = doc.get("broker_args"), doc.get("environment"), doc.get("cwd")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise LaunchFileError(f"{path}: field 'broker_args' must be a list of strings")
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise LaunchFileError(f"{path}: field 'environment' must map strings to strings")
    if not isinstance(cwd, str) or not os.path.isabs(cwd):
        raise LaunchFileError(f"{path}: field 'cwd' must be an absolute path")
    return Launch(list(args), dict(env), cwd)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m jupyter_gpushare.broker.ops.external LAUNCH_FILE``: run the broker outside
    the hub, under its supervisor, from the launch file."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0].startswith("-"):
        print(
            f"usage: python -m {__spec__.name if __spec__ else __name__} LAUNCH_FILE "
            f"(the {FILE_NAME} the hub's config wrote)",
            file=sys.stderr,
        )
        return 2
    try:
        launch = read_launch_file(args[0])
    except LaunchFileError as exc:
        print(f"gpushare broker: {exc}", file=sys.stderr)
        return 2
    os.chdir(launch.cwd)
    os.environ.update(launch.environment)
    from .supervisor import Supervisor

    standby = os.environ.get("GPUSHARE_SUPERVISOR_STANDBY", "1") not in ("0", "false", "no")
    return Supervisor(launch.broker_args, standby=standby, external=True).run()


if __name__ == "__main__":
    sys.exit(main())
