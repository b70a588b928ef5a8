"""Stateful fuzzing of the broker's API: sequences of calls by several users, the spawner,
crashing servers and an admin's reconcile, against the real broker over HTTP (in-process,
with its production token path against a stand-in hub, ``fakehub.FakeHub``).

The stand-in hub is the truth about which servers run: the machine starts a server there
when the spawner's request is granted (at once, or after a preemption), stops it when the
spawner stops it, and removes it without telling the broker when it "crashes"; the broker
stops victims of a preemption through it, as through a real hub. Users also misbehave with
their own and their servers' tokens (``GreedyMachine``): more requests for a server that
runs, releasing the grant of a server that keeps running, batch grants for jobs that do not
exist, requests for servers that never start, another user's grant. After every step:

* no HTTP answer is a 5xx;
* every running server holds exactly one live grant (the spawner's);
* a reconcile releases every interactive grant whose server did not run when it began
  (and, where no job runs, every batch grant);
* no GPU, node, team (guarantee + borrow limit) or user (per-user cap) is over its limit,
  recounted from the live grants (``test_core_invariants.recount``);
and at the end the database holds exactly the in-memory live grants.

Bounded: a few dozen short sequences (seconds on two loaded cores); each example gets a
fresh broker and database.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import hypothesis.strategies as st
from brokerkit import ACCESS, call
from corefactory import policy
from fakehub import FakeHub, start_broker_with_hub
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from test_core_invariants import recount

from jupyter_gpushare.core.model import GPUAsk, Kind, Policy, PriorityClass, Profile, SharingMode
from jupyter_gpushare.core.state import ClusterState

T = TypeVar("T")

USERS = {"alice": "a", "carol": "a", "bob": "b"}
SERVERS = ("", "s1", "s2")
PROFILES = ("lab", "half", "dbg", "train1")


def fuzz_policy() -> Policy:
    """One GPU per pool and tight quotas, so that borrowing, reclaiming by preemption and
    the per-user cap all happen within a few steps; no grace periods (preemption acts at
    once)."""
    base = policy(
        {
            "a": {"train": (1, 0), "shared": (0.5, 0.5), "debug": (0.25, 0)},
            "b": {"train": (0, 1), "shared": (0.25, 0.75), "debug": (0.25, 0.125)},
        },
        pools={"train": SharingMode.EXCLUSIVE, "shared": SharingMode.SHARED,
               "debug": SharingMode.DEBUG},
        gpus=1,
        per_user_cap=0.75,
    )
    priorities = (
        PriorityClass("training", 1000, preemptible=False, grace_period_s=0),
        PriorityClass("interactive", 500, preemptible=False, grace_period_s=0),
    )
    profiles = (
        Profile("lab", "Lab 1/4 GPU", "shared", GPUAsk(fraction_milli=250), "interactive"),
        Profile("half", "Half GPU", "shared", GPUAsk(fraction_milli=500), "interactive"),
        Profile("dbg", "Debug 1/8 GPU", "debug", GPUAsk(fraction_milli=125), "interactive"),
        Profile("train1", "Train 1 GPU", "train", GPUAsk(whole=1), "training"),
    )
    return dataclasses.replace(base, priority_classes=priorities, profiles=profiles, _index={})


class LoopThread:
    """An event loop in a thread of its own: the broker and the stand-in hub live there,
    the state machine (synchronous, in the test's thread) hands it coroutines."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


LOOP: LoopThread | None = None


def loop() -> LoopThread:
    global LOOP
    if LOOP is None:
        LOOP = LoopThread()
    return LOOP


class BrokerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.loop = loop()
        self.tmp = tempfile.TemporaryDirectory(prefix="gpushare-fuzz-")
        self.hub = FakeHub()
        for user, team in USERS.items():
            self.hub.add_user(user, [team])

        async def start() -> Any:
            self.hub.start()
            return await start_broker_with_hub(
                fuzz_policy(), f"sqlite:///{self.tmp.name}/b.sqlite", self.hub,
                reconcile_min_age_s=0,
            )

        self.app = self.loop.run(start())
        self.tok = {u: self.hub.user_token(u) for u in USERS}
        self.srv_tok = {(u, s): self.hub.server_token(u, s) for u in USERS for s in SERVERS}
        self.spawner = self.hub.token("gpushare-spawner", ["custom:gpushare:act-as-users", ACCESS],
                                      kind="service")
        self.admin = self.hub.token("boss", ["custom:gpushare:admin", ACCESS])
        self.serial = 0
        # the spawner's view: which request/grant belongs to each server it starts
        self.pending: dict[tuple[str, str], str] = {}  # (user, server) -> request id
        self.spawned: dict[tuple[str, str], str] = {}  # (user, server) -> grant id
        self.dead: dict[tuple[str, str], str] = {}  # crashed, the hub has not noticed yet
        self.log: list[str] = []
        self.no_jobs = False  # True: no batch job runs, so no batch grant may outlive a reconcile

    # -- plumbing --------------------------------------------------------------------------

    def api(self, method: str, path: str, token: str, body: Any = None) -> tuple[int, Any]:
        status, ans = self.loop.run(call(self.app, method, path, token, body))
        self.log.append(f"{method} {path} {body} -> {status}")
        assert status < 500, (method, path, body, status, ans)
        return status, ans

    def running(self) -> set[tuple[str, str]]:
        return {(u, s) for u in USERS for s in self.hub.running(u)}

    def live(self, gid: str) -> bool:
        return gid in self.app.broker.state.grants

    def free_slots(self) -> list[tuple[str, str]]:
        busy = self.running() | set(self.pending) | set(self.dead)
        return [(u, s) for u in USERS for s in SERVERS if (u, s) not in busy]

    def _start(self, key: tuple[str, str], gid: str) -> None:
        self.spawned[key] = gid
        self.hub.start_server(*key)

    # -- one rule: an action drawn from those possible now ----------------------------------
    # (one rule rather than one per action: hypothesis' swarm testing would otherwise switch
    # whole actions off for most examples; here every example may mix all of them)

    def actions(self) -> list[str]:
        can = {
            "spawn": bool(self.free_slots()),
            "poll": bool(self.pending),
            "stop": bool(self.spawned),
            "crash": bool(self.spawned),
            "hub_notices_the_crash": bool(self.dead),
            "cancel": bool(self.pending),
            "reconcile": True,
            "settle": bool(self.pending),
            "ask_for_a_server_that_never_starts": True,
            "touch_another_users_grant": bool(self.spawned),
        }
        weights = {"spawn": 4, "stop": 2}
        return [a for a, ok in can.items() if ok for _ in range(weights.get(a, 1))]

    @rule(data=st.data())
    def act(self, data: st.DataObject) -> None:
        # what to do next depends only on what happened before, never on timing: the
        # broker's follow-ups (preemptions, their hub calls) finish first, and the servers
        # the broker stopped leave the spawner's books
        self.loop.run(self.quiet())
        running = self.running()
        self.spawned = {k: g for k, g in self.spawned.items() if k in running}
        name = data.draw(st.sampled_from(self.actions()), label="action")
        event(f"action: {name}")
        getattr(self, name)(data)

    # -- the spawner -----------------------------------------------------------------------

    def spawn(self, data: st.DataObject) -> None:
        """JupyterHub starts a server: the spawner asks for its grant, starts it if granted."""
        user, server = data.draw(st.sampled_from(self.free_slots()), label="server")
        profile = data.draw(st.sampled_from(PROFILES), label="profile")
        self.serial += 1
        status, ans = self.api("POST", "/requests", self.spawner, {
            "user": user, "server": server, "profile": profile, "groups": [USERS[user]],
            "idempotency_key": f"spawn-{self.serial}",
        })
        event(f"spawn: {ans['status']}" + (" (borrowed)" if (ans.get("grant") or {}).get(
            "borrowed") else ""))
        if status == 201 and ans["status"] == "granted":
            self._start((user, server), ans["grant"]["id"])
        elif status == 201:
            assert ans["status"] in ("queued", "preempting"), ans
            self.pending[(user, server)] = ans["request_id"]
        else:
            assert status == 409 and ans["status"] == "refused", (status, ans)

    def poll(self, data: st.DataObject | None = None) -> None:
        """The spawner's wait for a queued or preempting request."""
        for key, rid in list(self.pending.items()):
            status, view = self.api("GET", f"/requests/{rid}", self.spawner)
            assert status == 200, view
            if view["status"] in ("queued", "preempting"):
                continue
            del self.pending[key]
            gid = (view.get("grant") or {}).get("id") or view.get("grant_id")
            event(f"waited: {view['status']}")
            if view["status"] == "granted" and gid and self.live(gid):
                self._start(key, gid)

    def stop(self, data: st.DataObject) -> None:
        """JupyterHub stops a server: the process ends, the spawner releases its grant."""
        key = data.draw(st.sampled_from(sorted(self.spawned)), label="server")
        gid = self.spawned.pop(key)
        self.hub.stop_server(*key)
        status, ans = self.api("DELETE", f"/grants/{gid}", self.spawner)
        assert status == 200, ans

    def crash(self, data: st.DataObject) -> None:
        """A server dies and nobody tells the broker (a reconcile must find its grant)."""
        key = data.draw(st.sampled_from(sorted(self.spawned)), label="server")
        self.dead[key] = self.spawned.pop(key)
        self.hub.stop_server(*key)

    def hub_notices_the_crash(self, data: st.DataObject) -> None:
        """JupyterHub's poll finds the dead server and calls the spawner's stop (release);
        until then the hub would not start that server again."""
        key = data.draw(st.sampled_from(sorted(self.dead)), label="server")
        gid = self.dead.pop(key)
        status, ans = self.api("DELETE", f"/grants/{gid}", self.spawner)
        assert status == 200, ans

    def cancel(self, data: st.DataObject) -> None:
        """The user gives up waiting: JupyterHub cancels the spawn."""
        key = data.draw(st.sampled_from(sorted(self.pending)), label="server")
        rid = self.pending.pop(key)
        status, view = self.api("DELETE", f"/requests/{rid}", self.spawner)
        assert status == 200, view

    def reconcile(self, data: st.DataObject) -> None:
        """The admin's (or the periodic) reconcile: every interactive grant whose server does
        not run when it begins is released by its end."""
        self.poll()  # requests granted by a preemption: the spawner starts their servers

        async def orphans() -> set[str]:
            running = self.running()
            return {g.id for g in self.app.broker.state.grants.values()
                    if (g.request.kind is Kind.INTERACTIVE
                        and (g.user, g.request.holder) not in running)
                    or (g.request.kind is Kind.BATCH and self.no_jobs)}

        stale = self.loop.run(orphans())
        status, ans = self.api("POST", "/admin/reconcile", self.admin)
        assert status == 200, ans
        event(f"reconcile released {min(len(ans['released']), 3)}+ grants")
        left = sorted(g for g in stale if self.live(g))
        assert not left, f"grants {left} outlived a reconcile with no server"
        for key, gid in list(self.dead.items()):
            if not self.live(gid):  # the reconcile released it: the hub may start it again
                del self.dead[key]

    def settle(self, data: st.DataObject) -> None:
        """Time passes: preemptions run, the spawner's waits end."""
        time.sleep(0.05)
        self.poll()

    # -- users misbehaving -----------------------------------------------------------------

    def ask_for_a_server_that_never_starts(self, data: st.DataObject) -> None:
        user = data.draw(st.sampled_from(sorted(USERS)), label="user")
        profile = data.draw(st.sampled_from(PROFILES), label="profile")
        self.serial += 1
        status, ans = self.api("POST", "/requests", self.tok[user],
                               {"profile": profile, "server": f"ghost{self.serial}"})
        assert status in (201, 403, 409), (status, ans)

    def touch_another_users_grant(self, data: st.DataObject) -> None:
        (user, server), gid = data.draw(st.sampled_from(sorted(self.spawned.items())),
                                        label="grant")
        thief = data.draw(st.sampled_from(sorted(set(USERS) - {user})), label="thief")
        for method in ("GET", "DELETE"):
            status, _ = self.api(method, f"/grants/{gid}", self.tok[thief])
            assert status == 403, (thief, method, gid)
        assert self.live(gid)

    # -- invariants ------------------------------------------------------------------------

    async def quiet(self) -> None:
        """Let the broker's own follow-ups finish: preemptions due now, their hub calls."""
        runner = self.app.runner
        for _ in range(50):
            await asyncio.sleep(0.005)
            due = [t for t in runner.timers.values()
                   if t.when() <= asyncio.get_running_loop().time() + 0.01]
            if not due and not runner.tasks:
                return
            if runner.tasks:
                await asyncio.wait(list(runner.tasks), timeout=2)

    def _violations(self) -> list[str]:
        state: ClusterState = self.app.broker.state
        grants = list(state.grants.values())
        running = self.running()
        out = []
        for user, server in sorted(running):
            mine = [g.id for g in grants if g.user == user and g.request.holder == server
                    and g.request.kind is Kind.INTERACTIVE]
            if len(mine) != 1:
                out.append(f"server {user}/{server} runs with live grants {mine}")
        try:
            recount(state)
        except AssertionError as exc:
            out.append(str(exc))
        return out

    @invariant()
    def one_live_grant_per_running_server_and_nothing_over_its_limit(self) -> None:
        async def check() -> list[str]:
            return self._violations()

        self.loop.run(self.quiet())
        deadline = time.monotonic() + 0.3  # effects the broker runs just after answering
        while True:
            found = self.loop.run(check())
            if not found or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert not found, "\n".join(found + ["-- calls:"] + self.log[-30:])

    def teardown(self) -> None:
        event(f"servers stopped by preemption: {min(len(self.hub.stops), 3)}+")

        async def stop() -> None:
            b = self.app.broker
            db = sorted(g.id for g in b.db_live_grants())
            mem = sorted(b.state.grants)
            await self.app.stop_async()
            self.hub.stop()
            assert db == mem, (db, mem)

        try:
            self.loop.run(stop())
        finally:
            self.tmp.cleanup()


class GreedyMachine(BrokerMachine):
    """Also: users who ask for more grants for a server that runs, or release the grant of
    a server that keeps running, and batch grants for jobs that do not exist (issue 8,
    items 4 and 5): refused, or undone (the server stopped, the grant reconciled away)."""

    def __init__(self) -> None:
        super().__init__()
        self.no_jobs = True

    def actions(self) -> list[str]:
        more = ["ask_again_for_a_running_server", "release_a_running_servers_grant"]
        return super().actions() + (more if self.spawned else []) + ["ask_for_a_batch_grant"]

    def ask_for_a_batch_grant(self, data: st.DataObject) -> None:
        """A batch grant for a job that does not exist, asked with a user's token."""
        user = data.draw(st.sampled_from(sorted(USERS)), label="user")
        profile = data.draw(st.sampled_from(PROFILES), label="profile")
        self.serial += 1
        status, ans = self.api("POST", "/requests", self.tok[user], {
            "profile": profile, "kind": "batch", "server": f"job{self.serial}",
            "checkpointing": True})
        assert status in (201, 403, 409), (status, ans)

    def ask_again_for_a_running_server(self, data: st.DataObject) -> None:
        """More grants for a server that runs, with its own token or its user's."""
        user, server = data.draw(st.sampled_from(sorted(self.spawned)), label="server")
        own = data.draw(st.booleans(), label="with the server's token")
        profile = data.draw(st.sampled_from(PROFILES), label="profile")
        token = self.srv_tok[(user, server)] if own else self.tok[user]
        status, ans = self.api("POST", "/requests", token, {"profile": profile, "server": server})
        assert status in (201, 403, 409), (status, ans)

    def release_a_running_servers_grant(self, data: st.DataObject) -> None:
        """A user releases the grant of a server that keeps running."""
        user, server = data.draw(st.sampled_from(sorted(self.spawned)), label="server")
        own = data.draw(st.booleans(), label="with the server's token")
        gid = self.spawned[(user, server)]
        token = self.srv_tok[(user, server)] if own else self.tok[user]
        status, ans = self.api("DELETE", f"/grants/{gid}", token)
        assert status in (200, 403, 409), (status, ans)
        if not self.live(gid):  # allowed: then the broker must have stopped the server
            self.spawned.pop((user, server), None)


BrokerMachine.TestCase.settings = settings(
    max_examples=25, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestBrokerMachine = BrokerMachine.TestCase


GreedyMachine.TestCase.settings = settings(BrokerMachine.TestCase.settings, max_examples=20)
TestGreedyMachine = GreedyMachine.TestCase
