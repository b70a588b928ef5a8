"""Small async client for the broker API, tolerant of an absent or unreachable broker.

Every call returns a :class:`BrokerAnswer`; nothing raises. When the broker cannot be
reached the answer says ``"broker unreachable"`` with the cause.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from .attribution import Attribution

UNREACHABLE = "broker unreachable"
NOT_CONFIGURED = "no broker configured"


@dataclass(frozen=True)
class BrokerAnswer:
    """Outcome of one broker call: ``ok`` with ``data``, or an ``error`` a person can read."""

    ok: bool
    data: Any = None
    error: str | None = None
    status: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "data": self.data, "error": self.error, "status": self.status}


def iso_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


def heartbeat_body(
    grant_id: str, att: Attribution, simulated: bool, ts: float | None = None
) -> dict[str, Any]:
    """The ``POST /heartbeats`` body for this server's use in one sample.

    ``ts`` is the sample's time in seconds since the epoch (a number: the broker's
    contract, ``broker/api/openapi.yaml``), default now."""
    return {
        "grant_id": grant_id,
        "ts": round(time.time() if ts is None else float(ts), 3),
        "gpus": [
            {
                "uuid": g.uuid,
                "memory_used_mib": round(g.own_memory_mib, 1),
                "utilization_pct": g.own_util_pct
                if g.own_util_pct is not None
                else g.gpu.utilization_pct,
                # the whole card's power (the report's peak and average power per node)
                **({} if g.gpu.power_w is None else {"power_w": round(g.gpu.power_w, 1)}),
            }
            for g in att.gpus
        ],
        "simulated": simulated,
    }


class BrokerLink:
    """``GET`` grant / team usage / notices and ``POST`` heartbeats to the broker."""

    def __init__(self, base_url: str | None, token: str | None, timeout_s: float = 5.0) -> None:
        self.base_url = (base_url or "").rstrip("/")
        self.token = token or ""
        self.timeout_s = timeout_s

    @property
    def configured(self) -> bool:
        return bool(self.base_url)

    async def _call(self, method: str, path: str, body: Any = None) -> BrokerAnswer:
        if not self.configured:
            return BrokerAnswer(False, error=NOT_CONFIGURED)
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"token {self.token}"
        if body is not None:
            headers["Content-Type"] = "application/json"
        req = HTTPRequest(
            self.base_url + path,
            method=method,
            headers=headers,
            body=None if body is None else json.dumps(body),
            connect_timeout=self.timeout_s,
            request_timeout=self.timeout_s,
        )
        try:
            resp = await AsyncHTTPClient().fetch(req)
        except HTTPClientError as exc:
            if exc.code == 599 or exc.response is None:
                return BrokerAnswer(False, error=f"{UNREACHABLE}: {exc}")
            return BrokerAnswer(
                False, data=_json(exc.response.body), status=exc.code,
                error=f"broker answered {exc.code}: {_reason(exc.response.body) or exc.message}",
            )
        except OSError as exc:
            return BrokerAnswer(False, error=f"{UNREACHABLE}: {exc}")
        return BrokerAnswer(True, data=_json(resp.body), status=resp.code)

    async def grant(self, grant_id: str) -> BrokerAnswer:
        return await self._call("GET", f"/grants/{quote(grant_id, safe='')}")

    async def team_usage(self, team: str) -> BrokerAnswer:
        return await self._call("GET", f"/teams/{quote(team, safe='')}/usage")

    async def notices(self, grant_id: str) -> BrokerAnswer:
        return await self._call("GET", "/notices?" + urlencode({"grant_id": grant_id}))

    async def heartbeat(self, body: dict[str, Any]) -> BrokerAnswer:
        """Send one heartbeat. A power figure the broker finds beyond the card's limit (its
        catalogue or settings do not know this card) is left out and the heartbeat sent
        again, so the use still counts; the answer's ``error`` says what was left out."""
        ans = await self._call("POST", "/heartbeats", body)
        field = ans.data.get("field") if ans.status == 400 and isinstance(ans.data, dict) else None
        if not (isinstance(field, str) and field.endswith(".power_w")):
            return ans
        bare = {**body, "gpus": [{k: v for k, v in g.items() if k != "power_w"}
                                 for g in body.get("gpus", []) if isinstance(g, dict)]}
        again = await self._call("POST", "/heartbeats", bare)
        if not again.ok:
            return again
        return BrokerAnswer(True, again.data, f"sent without power_w ({ans.error})", again.status)


def _json(body: bytes | None) -> Any:
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return body.decode(errors="replace")[:500]


def _reason(body: bytes | None) -> str | None:
    data = _json(body)
    if isinstance(data, dict):
        for key in ("message", "reason", "error"):
            if isinstance(data.get(key), str):
                return str(data[key])
    return None
