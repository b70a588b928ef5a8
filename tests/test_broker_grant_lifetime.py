"""The grant view carries the profile's max lifetime and when the server is stopped.

The lab's GPU panel shows them ("max lifetime 8 h, stops at 18:40") from the broker's
``GET /grants/{id}``; a profile without ``max_lifetime`` gives nulls.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from brokerkit import call, start_broker, static_tokens

from jupyter_gpushare.policy import parse_policy


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


async def test_grant_view_has_max_lifetime_and_ends_at(tmp_path: Any) -> None:
    text = (Path(__file__).parents[1] / "hub_config" / "gpushare.yaml").read_text()
    assert "    max_lifetime: 12h\n" in text
    text = text.replace("    max_lifetime: 12h\n", "", 1)  # inference-quarter: no lifetime
    policy = parse_policy(text)
    assert policy.profile("inference-quarter").max_lifetime_s is None
    app = await start_broker(policy, f"sqlite:///{tmp_path}/b.sqlite",
                             static_tokens({"vic": ["vision"]}))
    try:
        status, ans = await call(app, "POST", "/requests", "tok-vic",
                                 {"profile": "lab-small", "server": "s1"})
        assert status == 201 and ans["status"] == "granted", ans
        grant = ans["grant"]
        assert grant["max_lifetime_s"] == 8 * 3600
        assert _ts(grant["ends_at"]) - _ts(grant["granted_at"]) == 8 * 3600
        gid = grant["id"]
        status, live = await call(app, "GET", f"/grants/{gid}", "tok-vic")
        assert status == 200 and live["ends_at"] == grant["ends_at"]
        assert live["max_lifetime_s"] == 8 * 3600

        status, ans = await call(app, "POST", "/requests", "tok-vic",
                                 {"profile": "inference-quarter", "server": "s2"})
        assert status == 201 and ans["status"] == "granted", ans
        assert ans["grant"]["max_lifetime_s"] is None and ans["grant"]["ends_at"] is None

        # a released grant (read from the database) keeps them
        assert (await call(app, "DELETE", f"/grants/{gid}", "tok-vic"))[1]["released"] is True
        status, row = await call(app, "GET", f"/grants/{gid}", "tok-vic")
        assert status == 200 and row["released_at"] is not None
        assert row["max_lifetime_s"] == 8 * 3600 and row["ends_at"] == grant["ends_at"]
    finally:
        await app.stop_async()
