"""Issue 23, "reload (which grants lose their guarantee when it shrinks)": a team's guarantee is
cut while it holds several grants; exactly the newest ones beyond the new guarantee become
borrowed and preemptible (at the exact boundary too), the older ones keep their guarantee,
grants that were borrowed already and other teams' grants are not touched.

Through the real broker (HTTP, the YAML loader, ``POST /admin/policy/reload``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from brokerkit import call, start_broker, static_tokens

POLICY = """
inventory:
  source: simulated
  simulated:
    - {name: n, pool: train, nodes: 1, gpus_per_node: 8, model: H200, gpu_memory: 141GiB}
pools:
  train: {mode: exclusive}
priority_classes:
  interactive: {value: 500}
teams:
  vision:
    groups: [vision]
    quotas:
      train: {guaranteed: GUARANTEE, borrow_limit: 4}
  nlp:
    groups: [nlp]
    quotas:
      train: {guaranteed: 2, borrow_limit: 0}
profiles:
  - {slug: one, pool: train, gpu: {count: 1}}
  - {slug: two, pool: train, gpu: {count: 2}}
"""


def policy_text(guarantee: int) -> str:
    return POLICY.replace("GUARANTEE", str(guarantee))


@pytest.fixture
async def app(tmp_path: Path) -> Any:
    path = tmp_path / "policy.yaml"
    path.write_text(policy_text(4))
    broker = await start_broker(
        None,
        f"sqlite:///{tmp_path}/b.sqlite",
        static_tokens({"alice": ["vision"], "bob": ["nlp"]}),
        policy_file=str(path),
    )
    broker.policy_path = path
    yield broker
    await broker.stop_async()


async def grant(app: Any, user: str, profile: str, server: str) -> dict[str, Any]:
    status, ans = await call(app, "POST", "/requests", f"tok-{user}",
                             {"profile": profile, "server": server})
    assert status == 201 and ans["status"] == "granted", ans
    await asyncio.sleep(0.02)  # distinct grant times: "newest" is well defined
    return dict(ans["grant"])


async def borrowed(app: Any, gid: str, user: str) -> bool:
    status, view = await call(app, "GET", f"/grants/{gid}", f"tok-{user}")
    assert status == 200 and not view["released_at"], view
    assert view["borrowed"] == view["preemptible"], view
    return bool(view["borrowed"])


async def reload_with(app: Any, guarantee: int) -> list[tuple[str, str]]:
    app.policy_path.write_text(policy_text(guarantee) + "# reloaded\n")  # a new version
    status, done = await call(app, "POST", "/admin/policy/reload", "tok-admin")
    assert status == 200 and done["last_result"] == "ok", done
    return sorted((c["grant_id"], c["change"]) for c in done["changes"])


@pytest.mark.parametrize(("new", "demoted"), [
    (4, []),                 # unchanged guarantee: nothing moves
    (3, ["g3"]),             # 4 held: the newest (1 GPU) goes, 3 == 3 fits exactly
    (2, ["g2", "g3"]),       # 3 left > 2: the two-GPU grant goes too, 1 fits
    (1, ["g2", "g3"]),       # 1 == 1: the oldest keeps its guarantee
    (0, ["g1", "g2", "g3"]),  # nothing is guaranteed any more
])
async def test_a_shrunk_guarantee_demotes_exactly_the_newest_grants_beyond_it(
    app: Any, new: int, demoted: list[str]
) -> None:
    grants = {
        "g1": await grant(app, "alice", "one", "a"),  # oldest
        "g2": await grant(app, "alice", "two", "b"),
        "g3": await grant(app, "alice", "one", "c"),  # newest: 1 + 2 + 1 = 4 = guarantee
    }
    assert [g["borrowed"] for g in grants.values()] == [False, False, False]
    # beyond the guarantee: borrowed already, never counted against the new one
    extra = await grant(app, "alice", "one", "d")
    other = await grant(app, "bob", "two", "x")  # another team, inside its own guarantee
    assert extra["borrowed"] is True and other["borrowed"] is False

    changes = await reload_with(app, new)

    ids = {g["id"]: name for name, g in grants.items()}
    assert sorted(ids[gid] for gid, _ in changes) == demoted
    assert {change for _, change in changes} <= {"borrowed"}
    for name, g in grants.items():
        assert await borrowed(app, g["id"], "alice") is (name in demoted), name
    assert await borrowed(app, extra["id"], "alice") is True
    assert await borrowed(app, other["id"], "bob") is False
    status, usage = await call(app, "GET", "/teams/vision/usage", "tok-alice")
    kept = sum(g["units"] for name, g in grants.items() if name not in demoted)
    assert usage["pools"]["train"]["guaranteed"] == new
    assert usage["pools"]["train"]["borrowed"] == 4 + 1 - kept
