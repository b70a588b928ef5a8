"""Code the server runs inside its kernels: the preemption-notice watcher and one-off messages.

A busy kernel answers an execute request only after its cell, so the watcher is a daemon thread
started once in each kernel; it asks the broker for the grant's notices and writes a
preemption notice into the output of whatever cell runs at that moment.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from jupyter_core.utils import ensure_async

log = logging.getLogger(__name__)

KERNEL_WATCHER = r"""
def _gpushare_watch(interval, last_call):
    import datetime, json, os, sys, time, urllib.parse, urllib.request
    gid = os.environ.get("GPUSHARE_GRANT_ID")
    url = os.environ.get("GPUSHARE_BROKER_URL", "").rstrip("/")
    token = os.environ.get("JUPYTERHUB_API_TOKEN", "")
    if not gid or not url:
        return
    told = set()
    while True:
        try:
            req = urllib.request.Request(
                url + "/notices?" + urllib.parse.urlencode({"grant_id": gid}),
                headers={"Authorization": "token " + token})
            with urllib.request.urlopen(req, timeout=5) as resp:
                notices = json.loads(resp.read() or b"{}").get("notices") or []
        except Exception:
            notices = []
        for n in notices:
            if not isinstance(n, dict) or n.get("kind", "preemption") != "preemption":
                continue
            deadline = n.get("deadline_ts")
            left = deadline - time.time() if isinstance(deadline, (int, float)) else None
            key = (n.get("grant_id"), deadline)
            stage = "last" if left is not None and left <= last_call else "first"
            if (key, stage) in told:
                continue
            told.update({(key, "first"), (key, stage)})
            when = ""
            if left is not None:
                clock = datetime.datetime.fromtimestamp(
                    deadline, datetime.timezone.utc).strftime("%H:%M:%S UTC")
                when = " at %s (in %d s)" % (clock, max(0, round(left)))
            why = n.get("reason") or "the owning team needs its GPU share back"
            # a thread of its own: this reaches the cell that is running now
            sys.stderr.write(
                "\n[gpushare] PREEMPTION: this server's GPU share is borrowed and is being "
                "reclaimed (%s). The server will be stopped%s: save your work now.\n"
                % (why, when))
            sys.stderr.flush()
        time.sleep(interval)


import threading as _gs_threading
_gs_threading.Thread(target=_gpushare_watch, args=(__INTERVAL__, __LAST_CALL__),
                     name="gpushare-notices", daemon=True).start()
del _gs_threading, _gpushare_watch
"""
"""Run once in each kernel: a daemon thread that asks the broker for this grant's notices and
writes a preemption notice, with its deadline, into the output of the cell running at that
moment (a busy kernel would answer an execute request only after its cell)."""


def watcher_code(interval_s: float, last_call_s: float) -> str:
    """The watcher's source with its poll interval and last-call threshold filled in."""
    return KERNEL_WATCHER.replace("__INTERVAL__", repr(float(interval_s))).replace(
        "__LAST_CALL__", repr(float(last_call_s))
    )


async def run_in_kernel(kernel_manager: Any, kernel_id: str, code: str) -> bool:
    """Run ``code`` in the kernel, silently for the history, and wait for the reply.

    False when the kernel is gone or does not answer within 30 s.
    """
    from jupyter_client.session import Session

    try:
        kernel = kernel_manager.get_kernel(kernel_id)
        # A session of its own: sharing the kernel manager's session id would
        # share a ZMQ identity and steal other clients' shell replies.
        session = Session(
            key=kernel.session.key,
            signature_scheme=kernel.session.signature_scheme,
            username="gpushare",
        )
        client = kernel.client(session=session)
    except Exception:
        return False
    try:
        client.start_channels()
        await ensure_async(client.wait_for_ready(timeout=30))
        msg_id = client.execute(code, silent=False, store_history=False)
        while True:
            reply = await ensure_async(client.get_shell_msg(timeout=30))
            if reply.get("parent_header", {}).get("msg_id") == msg_id:
                return True
    except Exception as exc:
        log.warning("gpushare could not write to kernel %s: %s", kernel_id, exc)
        return False
    finally:
        with contextlib.suppress(Exception):  # the kernel may be gone already
            client.stop_channels()
