"""The admission prober's own process (started by :class:`soak.prober.Prober`).

Every ``interval`` seconds it asks the broker for a 1/8 debug GPU the way the spawner does
(``BrokerClient``: its retries are the spawner's; the spawner's token; an idempotency key),
lets the grant go, and prints one JSON line per probe on stdout. A process of its own, so
that what it times is the broker's answer, not the soak harness's threads holding the GIL
(the spawner it stands in for lives in the hub, not in the harness). It leaves when its
stdin closes (the harness stopped or died).

    python probe_child.py URL TOKEN USER INTERVAL_S
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from typing import Any

from jupyter_gpushare.broker.client import BrokerClient, BrokerError


def _watch_stdin(done: threading.Event) -> None:
    sys.stdin.read()  # end of file: the harness is gone or wants us to stop
    done.set()


async def probe_once(client: BrokerClient, user: str, n: int) -> dict[str, Any]:
    t0 = time.time()
    body = {"user": user, "profile": "debug-eighth", "server": "probe",
            "idempotency_key": f"soak-probe-{n}-{t0}"}
    try:
        status, answer = await client.call("POST", "/requests", body)
    except BrokerError as exc:
        status, answer = exc.status, str(exc)
    line: dict[str, Any] = {"t": t0, "ms": round((time.time() - t0) * 1000, 2),
                            "status": status, "body": answer if status >= 400 else None}
    grant = answer.get("grant") if isinstance(answer, dict) else None
    if grant:
        try:
            await client.call("DELETE", f"/grants/{grant['id']}")
        except BrokerError as exc:
            line["release"] = {"status": exc.status, "body": str(exc)}
    return line


async def main(url: str, token: str, user: str, interval_s: float) -> None:
    done = threading.Event()
    threading.Thread(target=_watch_stdin, args=(done,), daemon=True).start()
    client = BrokerClient(url, token, request_timeout=30, connect_timeout=2, retry_window_s=10)
    n = 0
    while not done.is_set():
        n += 1
        print(json.dumps(await probe_once(client, user, n)), flush=True)
        await asyncio.sleep(interval_s)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])))
