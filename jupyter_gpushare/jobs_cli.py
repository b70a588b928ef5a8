"""``jupyter-gpushare job ...``: batch jobs from a terminal, with the user's hub token.

    jupyter-gpushare job submit NOTEBOOK --profile P [-p NAME VALUE]... [--checkpoint]
                                [--max-runtime 2h] [--priority C] [--team T] [--output PATH]
    jupyter-gpushare job list
    jupyter-gpushare job log [-f] ID
    jupyter-gpushare job cancel ID

The token is ``--token`` or ``$JUPYTERHUB_API_TOKEN`` (every single-user server's terminal
has it); the broker is ``--url`` or ``$GPUSHARE_BROKER_URL`` (set by ``setup_gpushare``), or
``$JUPYTERHUB_URL`` + ``/services/gpushare/api/v1``. Paths are relative to ``--root``
(default ``$HOME``), the folder the broker delivers outputs into.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from .cli import Command, register
from .core.jobs import parse_cli_parameter
from .policy_units import parse_duration_s


def _base(args: argparse.Namespace) -> str:
    url = args.url or os.environ.get("GPUSHARE_BROKER_URL", "")
    if not url and os.environ.get("JUPYTERHUB_URL"):
        url = os.environ["JUPYTERHUB_URL"].rstrip("/") + "/services/gpushare/api/v1"
    if not url:
        raise SystemExit("jupyter-gpushare job: no broker URL (--url or $GPUSHARE_BROKER_URL)")
    return url.rstrip("/")


def _token(args: argparse.Namespace) -> str:
    token = args.token or os.environ.get("JUPYTERHUB_API_TOKEN", "")
    if not token:
        raise SystemExit("jupyter-gpushare job: no token (--token or $JUPYTERHUB_API_TOKEN)")
    return str(token)


def _call(args: argparse.Namespace, method: str, path: str, body: Any = None,
          accept: str = "application/json", timeout: float = 30) -> tuple[int, Any]:
    req = urllib.request.Request(
        _base(args) + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"token {_token(args)}", "Content-Type": "application/json",
                 "Accept": accept},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            status = resp.status
            ctype = resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        raw, status, ctype = exc.read(), exc.code, exc.headers.get("Content-Type", "")
    except OSError as exc:
        raise SystemExit(f"jupyter-gpushare job: cannot reach the broker: {exc}") from exc
    if "json" in ctype:
        return status, json.loads(raw) if raw else None
    return status, raw.decode(errors="replace")


def _fail(status: int, answer: Any) -> int:
    if isinstance(answer, dict):
        where = f" (field {answer['field']})" if answer.get("field") else ""
        print(f"error {status}: {answer.get('error') or answer.get('reason')}{where}",
              file=sys.stderr)
    else:
        print(f"error {status}: {answer}", file=sys.stderr)
    return 1


def _line(job: dict[str, Any]) -> str:
    extra = ""
    if job.get("position"):
        extra = f" (position {job['position']})"
    return (f"{job['id']}  {job['state']:<9}{extra}  {job['name']}  {job['profile']}  "
            f"attempt {job['attempt']}  {job['gpu_hours']:.4f} GPU-h  {job['reason']}")


# -- submit ----------------------------------------------------------------------------------


def _submit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("notebook", help="the notebook (.ipynb) to run")
    p.add_argument("--profile", required=True, help="a profile with a GPU your team may use")
    p.add_argument("-p", "--parameter", nargs=2, action="append", default=[],
                   metavar=("NAME", "VALUE"), help="a papermill parameter (VALUE as JSON if it "
                   "parses, else a string); repeat for more")
    p.add_argument("--priority", help="a priority class allowed for your team")
    p.add_argument("--team", help="the team to charge (default: the first that may)")
    p.add_argument("--max-runtime", help="runtime limit, e.g. 30m, 2h (default: the profile's)")
    p.add_argument("--checkpoint", action="store_true",
                   help="the notebook saves and resumes in $GPUSHARE_CHECKPOINT_DIR")
    p.add_argument("--output", help="output notebook, relative to --root")
    p.add_argument("--root", default=None, help="your files' root (default $HOME)")


def _submit(args: argparse.Namespace) -> int:
    path = os.path.abspath(args.notebook)
    try:
        with open(path, encoding="utf-8") as f:
            notebook = json.load(f)
    except (OSError, ValueError) as exc:
        print(f"error: cannot read {args.notebook} as a notebook: {exc}", file=sys.stderr)
        return 1
    root = os.path.realpath(args.root or os.path.expanduser("~"))
    body: dict[str, Any] = {
        "notebook": notebook,
        "profile": args.profile,
        "name": os.path.basename(path),
        "parameters": {k: parse_cli_parameter(v) for k, v in args.parameter},
        "checkpoint": bool(args.checkpoint),
    }
    real = os.path.realpath(path)
    if real.startswith(root.rstrip("/") + "/"):
        body["path"] = os.path.relpath(real, root)
    for key, value in (("priority", args.priority), ("team", args.team),
                       ("output_path", args.output)):
        if value:
            body[key] = value
    if args.max_runtime:
        try:
            body["max_runtime"] = int(parse_duration_s(args.max_runtime))
        except (ValueError, TypeError) as exc:
            print(f"error: --max-runtime: {exc}", file=sys.stderr)
            return 2
    status, answer = _call(args, "POST", "/jobs", body)
    if status == 409:
        print(f"refused: {answer['reason']}", file=sys.stderr)
        return 1
    if status != 201:
        return _fail(status, answer)
    print(_line(answer))
    print(f"output: {answer['output_path']}")
    return 0


# -- list, log, cancel -------------------------------------------------------------------------


def _list_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--all", action="store_true", help="every user's jobs (admins)")


def _list(args: argparse.Namespace) -> int:
    status, answer = _call(args, "GET", "/jobs" + ("?all=1" if args.all else ""))
    if status != 200:
        return _fail(status, answer)
    for job in answer["jobs"]:
        print(_line(job))
    return 0


def _id_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", help="the job id")


def _log_args(p: argparse.ArgumentParser) -> None:
    _id_args(p)
    p.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")


def _log(args: argparse.Namespace) -> int:
    offset = 0
    while True:
        status, text = _call(args, "GET", f"/jobs/{args.id}/log?offset={offset}", accept="*/*")
        if status != 200:
            return _fail(status, text)
        data = text.encode() if isinstance(text, str) else b""
        sys.stdout.write(text if isinstance(text, str) else "")
        sys.stdout.flush()
        offset += len(data)
        if not args.follow:
            return 0
        if not data:
            status, job = _call(args, "GET", f"/jobs/{args.id}")
            if status != 200:
                return _fail(status, job)
            if job["state"] in ("succeeded", "failed", "cancelled", "lost"):
                print(f"--- job {job['state']}: {job['reason']}", file=sys.stderr)
                return 0 if job["state"] == "succeeded" else 1
            time.sleep(0.5)


def _cancel(args: argparse.Namespace) -> int:
    status, answer = _call(args, "DELETE", f"/jobs/{args.id}")
    if status != 200:
        return _fail(status, answer)
    print(_line(answer))
    return 0


def _job_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="the broker's API URL (default $GPUSHARE_BROKER_URL)")
    p.add_argument("--token", help="your hub token (default $JUPYTERHUB_API_TOKEN)")
    sub = p.add_subparsers(dest="job_command", metavar="ACTION", required=True)
    for name, help_, add, run in (
        ("submit", "send a notebook to run as a batch job", _submit_args, _submit),
        ("list", "your jobs, newest first", _list_args, _list),
        ("log", "a job's log (-f: follow it)", _log_args, _log),
        ("cancel", "cancel a job", _id_args, _cancel),
    ):
        child = sub.add_parser(name, help=help_, description=help_)
        add(child)
        child.set_defaults(_job_run=run)


def _job(args: argparse.Namespace) -> int:
    return int(args._job_run(args))


register(Command("job", "Batch jobs: submit, list, log, cancel", _job_args, _job))
