"""What both gpushare spawners share: profile choice, the broker, grants in spawner state.

``GPUShareSpawner`` is a :class:`~jupyterhub.spawner.Spawner` subclass used as a mixin in
front of a concrete spawner::

    class LocalGPUShareSpawner(GPUShareSpawner, LocalProcessSpawner): ...
    class KubeGPUShareSpawner(GPUShareSpawner, KubeSpawner): ...

so both pick up configuration from ``c.GPUShareSpawner`` (``broker_url``,
``broker_api_token``, ``policy_file``, ...) as well as their own section.

Start: resolve the profile (:mod:`.profile_choice`, the rules of :mod:`.form`), ask the
broker, wait in its queue while reporting the position on the progress page, then apply the
grant (:meth:`apply_grant`, per spawner) and start the server. A refusal ends the spawn at once
with :class:`~jupyterhub.spawner.SpawnException` carrying the broker's reason. Stop: stop
the server, then release the grant. The grant id lives in the spawner state, so a hub
restart finds servers and grants as they were.

Asking the broker and waiting in its queue is :mod:`.grant_request`; the times shown on the
progress page are written by :mod:`.time_text`.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from jupyterhub.spawner import Spawner
from jupyterhub.utils import maybe_future
from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from traitlets import Float, Unicode, default

from jupyter_gpushare.broker.client import BrokerClient, BrokerError, GrantInfo
from jupyter_gpushare.core.model import Profile
from jupyter_gpushare.spawner import form as formlib
from jupyter_gpushare.spawner.errors import spawn_error
from jupyter_gpushare.spawner.grant_request import REASON_CHARS, GrantRequestMixin
from jupyter_gpushare.spawner.profile_choice import ProfileChoiceMixin
from jupyter_gpushare.spawner.time_text import _iso

__all__ = ["REASON_CHARS", "GPUShareSpawner", "GPUShareSpawnerMixin", "spawn_error"]

DEFAULT_BROKER_URL = "http://127.0.0.1:10101/services/gpushare/api/v1"

CHECK_RETRY_S = 10.0
"""Default of ``grant_check_retry_s``."""
ANSWER_POLL_S = 0.1
"""How often the hub's check of a running server on its start asks whether it answers."""


class GPUShareSpawner(GrantRequestMixin, ProfileChoiceMixin, Spawner):
    """Mixin: put it first in the bases of a concrete spawner (the profile, the form and
    the options: :class:`~.profile_choice.ProfileChoiceMixin`)."""

    broker_url = Unicode(
        os.environ.get("GPUSHARE_BROKER_URL", DEFAULT_BROKER_URL),
        config=True,
        help="Base URL of the gpushare broker API (ends in /api/v1), as the hub reaches it.",
    )
    broker_api_token = Unicode(
        os.environ.get("GPUSHARE_BROKER_API_TOKEN", ""),
        config=True,
        help="JupyterHub API token the hub's spawners present to the broker.",
    )
    server_broker_url = Unicode(
        "",
        config=True,
        help="""Broker URL as the single-user server reaches it (GPUSHARE_BROKER_URL in its
        environment). Default: c.Spawner.environment's GPUSHARE_BROKER_URL, else broker_url.""",
    )
    broker_retry_window_s = Float(
        10.0,
        config=True,
        help="""While the broker restarts (its supervisor brings a killed broker back within a
        few seconds) a call to it is sent again for up to this many seconds where that is
        safe (reads, releases, requests with their idempotency key), so no spawn fails with
        a 5xx meanwhile (broker/client.py). 0: fail at once.""",
    )
    queue_poll_interval = Float(1.0, config=True, help="Seconds between queue status polls.")
    queue_timeout = Float(
        900.0,
        config=True,
        help="""Longest wait in the broker's queue before the spawn gives up (the request is
        cancelled). start_timeout defaults to this plus http_timeout.""",
    )
    gpu_poll_interval = Float(
        2.0,
        config=True,
        help="""poll_interval (seconds) of a server that holds a GPU grant: how soon the hub
        notices that its process died and releases the grant (the hub's own poll_interval,
        30 s by default, still applies to servers without a grant). 0 keeps poll_interval.""",
    )
    grant_check_retry_s = Float(
        CHECK_RETRY_S,
        config=True,
        help="""After a hub restart each server's grant is checked with the broker; while the
        broker cannot be reached, the check is tried again this many seconds later (at the
        next poll after that), until the broker answers.""",
    )
    countdown_interval = Float(
        5.0,
        config=True,
        help="""Seconds between progress-page updates of the countdown while a spawn waits for
        borrowed capacity to be reclaimed (the last 10 seconds are counted every second).""",
    )

    @default("start_timeout")
    def _default_start_timeout(self) -> int:
        return int(self.queue_timeout + 120)

    # ---------------------------------------------------------------- state

    grant_id: str | None = None
    gpushare_request_id: str | None = None
    gpushare_profile: str | None = None
    gpushare_grant: GrantInfo | None = None
    gpushare_cpu_only: bool = False  # the running server's profile asks for no GPU
    gpushare_last_stop: dict[str, Any] | None = None  # why the last server went away

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        if self.grant_id:
            state["gpushare_grant_id"] = self.grant_id
            state["gpushare_request_id"] = self.gpushare_request_id
            state["gpushare_profile"] = self.gpushare_profile
            if self.gpushare_grant is not None:
                state["gpushare_grant"] = self.gpushare_grant.to_json()
        elif self.gpushare_cpu_only:
            state["gpushare_profile"] = self.gpushare_profile
            state["gpushare_cpu_only"] = True
        if self.gpushare_last_stop:
            state["gpushare_last_stop"] = self.gpushare_last_stop
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.grant_id = state.get("gpushare_grant_id") or None
        self.gpushare_request_id = state.get("gpushare_request_id") or None
        self.gpushare_profile = state.get("gpushare_profile") or None
        self.gpushare_cpu_only = bool(state.get("gpushare_cpu_only"))
        raw = state.get("gpushare_grant")
        self.gpushare_grant = GrantInfo.from_json(raw) if isinstance(raw, dict) else None
        last = state.get("gpushare_last_stop")
        self.gpushare_last_stop = last if isinstance(last, dict) else None
        if self.grant_id:
            self._poll_fast()

    def clear_state(self) -> None:
        super().clear_state()
        gid = getattr(self, "grant_id", None)
        if gid:
            # the server is gone (or a new one starts): its grant must not outlive it
            self._schedule_release(gid)
        self.grant_id = None
        self.gpushare_request_id = None
        self.gpushare_grant = None
        self.gpushare_cpu_only = False
        self.__dict__.pop("_gpushare_checked", None)
        # a new spawn starts from here: the progress page waits for our events
        self.__dict__["_gpushare_events"] = []
        self.__dict__["_gpushare_granted"] = False

    # ---------------------------------------------------------------- helpers

    @property
    def broker(self) -> BrokerClient:
        client = getattr(self, "_gpushare_client", None)
        if client is None or client.base_url != self.broker_url.rstrip("/"):
            client = BrokerClient(
                self.broker_url, self.broker_api_token, retry_window_s=self.broker_retry_window_s
            )
            self._gpushare_client = client
        return client

    def singleuser_broker_url(self) -> str:
        """The broker URL for the single-user server (its GPUSHARE_BROKER_URL)."""
        return (
            self.server_broker_url
            or str((self.environment or {}).get("GPUSHARE_BROKER_URL") or "")
            or self.broker_url
        )

    def gpu_memory_map(self) -> dict[str, int]:
        policy = self.gpushare_policy()
        if policy is None:
            return {}
        return {g.uuid: g.memory_mib for n in policy.nodes for g in n.gpus}

    def _poll_fast(self) -> None:
        """A server holding a grant is polled every ``gpu_poll_interval`` seconds."""
        if self.gpu_poll_interval > 0:
            current: float = float(getattr(self, "poll_interval", 30.0))
            self.poll_interval = min(current, self.gpu_poll_interval)

    @property
    def gpushare_stop_message(self) -> str:
        """Why the last server went away, for the hub's pages ("" if nothing to say)."""
        last = self.gpushare_last_stop or {}
        return str(last.get("message") or "")

    def _event(self, progress: int, message: str, **extra: Any) -> None:
        events = self.__dict__.setdefault("_gpushare_events", [])
        events.append({"progress": progress, "message": message, **extra})
        self.log.info("gpushare %s: %s", self._log_name, message)

    def apply_grant(self, grant: GrantInfo, profile: Profile | None) -> None:
        """Make the grant real for the server about to start (per spawner)."""
        raise NotImplementedError

    # ---------------------------------------------------------------- start and stop

    async def start(self) -> Any:  # type: ignore[override]
        self.__dict__["_gpushare_events"] = []
        self.__dict__["_gpushare_granted"] = False
        try:
            slug = self.resolve_profile()
            policy = self.gpushare_policy()
            profile = policy.profile(slug) if policy else None
            # the slug is the user's when no policy checked it: never logged whole
            label = f"profile '{profile.display_name if profile else formlib.clip(slug)}'"
            self.gpushare_profile = slug
            self.gpushare_last_stop = None
            if profile is not None and profile.gpu.is_empty:
                return await self._start_without_gpu(profile, label)
            self._event(5, f"Asking the GPU broker for {label}")
            grant = await self.acquire_grant(slug, label)
            self.grant_id = grant.id
            self.gpushare_grant = grant
            gpus = ", ".join(g.uuid for g in grant.gpus) or "no GPU"
            self._event(
                30,
                f"Granted {grant.units:g} GPU on {grant.node or 'this machine'} ({gpus})"
                + (", borrowed: preemptible" if grant.borrowed else ""),
                gpushare={"grant_id": grant.id},
            )
        finally:
            self.__dict__["_gpushare_granted"] = True
        self._poll_fast()
        try:
            if profile is not None:
                self.apply_profile(profile)
            self.apply_grant(grant, profile)
            return await maybe_future(super().start())
        except BaseException:
            gid, self.grant_id = self.grant_id, None
            if gid:
                await asyncio.shield(self.release_grant(gid))
            raise

    async def _start_without_gpu(self, profile: Profile, label: str) -> Any:
        """A profile without GPU: no broker request, no grant, no GPU visible."""
        self.gpushare_cpu_only = True
        self._event(30, f"Starting {label} without a GPU: this profile asks for none")
        self.__dict__["_gpushare_granted"] = True
        self.apply_profile(profile)
        self.apply_no_gpu(profile)
        try:
            return await maybe_future(super().start())
        except BaseException:
            self.gpushare_cpu_only = False
            raise

    def apply_no_gpu(self, profile: Profile) -> None:
        """Make sure a server without a grant sees no GPU (per spawner; env by default)."""

    async def stop(self, now: bool = False) -> Any:  # type: ignore[override]
        gid = self.grant_id
        self.__dict__["_gpushare_stopping"] = True  # a poll meanwhile leaves the grant to us
        try:
            if gid and not (self.gpushare_last_stop or {}).get("message"):
                await self._note_stop_reason(gid)
            return await maybe_future(super().stop(now=now))
        finally:
            self.__dict__["_gpushare_stopping"] = False
            if gid:
                await self.release_grant(gid)
                if self.grant_id == gid:
                    self.grant_id = None

    async def _note_stop_reason(self, grant_id: str) -> None:
        """Remember why the server stops when the broker asked for it (preemption)."""
        try:
            grant = await asyncio.wait_for(self.broker.get_grant(grant_id), 3.0)
        except (BrokerError, asyncio.TimeoutError) as exc:
            self.log.warning("gpushare: no stop reason from the broker for %s: %s", grant_id, exc)
            return
        pre = grant.preemption if grant is not None else None
        if isinstance(pre, dict) and pre:
            self._record_stop(
                "preempted",
                "Your server was stopped because its GPU share was borrowed and the owning "
                f"team needed it back ({pre.get('reason') or 'preemption'}). Nothing of yours "
                "was lost on disk; start it again with a profile inside your team's guarantee.",
            )

    def _record_stop(self, kind: str, message: str) -> None:
        self.gpushare_last_stop = {
            "kind": kind,
            "message": message,
            "at": _iso(time.time()),
            "profile": self.gpushare_profile,
        }
        self.log.info("gpushare %s: %s", self._log_name, message)

    async def poll(self) -> Any:  # type: ignore[override]
        held = self.grant_id
        status = await maybe_future(super().poll())
        if self._check_pending and status is None:  # the hub's check of it on its start
            await self._answering()
        if status is not None and self.__dict__.get("_gpushare_stopping"):
            return status  # a stop is under way: it says why and releases the grant
        # a spawner whose poll clears its own state (batchspawner's, when the job is gone)
        # has scheduled the release already: the grant is still this poll's to report
        gid = self.grant_id or (held if status is not None else None)
        if gid and status is not None:
            # the process is gone: its grant goes at once, not at the hub's next stop()
            self._record_stop(
                "died",
                f"Your server stopped by itself (exit status {status}); its GPU share was "
                "released.",
            )
            self.grant_id = None
            await self.release_grant(gid)
            return status
        if status is None and gid and not self.__dict__.get("_gpushare_checked"):
            # after a hub restart: does the broker still know this grant? Ask until it answers.
            next_try = self.__dict__.get("_gpushare_check_after", 0.0)
            if time.monotonic() < next_try:
                return status
            try:
                # asked once, not retried: the broker may be the hub's own service, which the
                # hub starts only after this first poll of every server (init_spawners)
                grant = await self.broker.get_grant(gid, retry_window_s=0)
            except BrokerError as exc:
                retry = self.grant_check_retry_s
                self.__dict__["_gpushare_check_after"] = time.monotonic() + retry
                self.log.warning(
                    "gpushare: cannot check grant %s yet (asking again in %.0f s): %s",
                    gid,
                    retry,
                    exc,
                )
                return status
            self.__dict__["_gpushare_checked"] = True
            if grant is None or grant.raw.get("released_at"):
                self.log.warning(
                    "gpushare: %s runs but its grant %s is no longer live",
                    self._log_name,
                    gid,
                )
            else:
                self.gpushare_grant = grant
                self.log.info(
                    "gpushare: grant %s of %s confirmed by the broker", gid, self._log_name
                )
        return status

    async def _answering(self) -> None:
        """Wait, asking every ``ANSWER_POLL_S`` (at most ``http_timeout``), until the server
        answers HTTP: a hub that restarts while a server starts (it went during the spawn)
        finds the process running and checks it with JupyterHub's own wait (``User._wait_up``),
        whose tries back off to 5 s apart; a server that answers just after a try was seen up
        to 5 s late, and meanwhile the hub answers a stop of it 500 ("pending check"). Asked
        here first, the hub's check finds it answering at its first try. A server that does
        not answer in time is left to that check (which then stops it, as before). Only
        while the hub checks the server on its start (JupyterHub's ``_check_pending``):
        any other poll, e.g. of a server whose node just died, never waits."""
        server = self.server
        if server is None or self.internal_ssl:
            return  # (no server to ask; with internal SSL, the hub's own check only)
        deadline = time.monotonic() + self.http_timeout
        client = AsyncHTTPClient()
        while True:
            try:
                await client.fetch(server.url, follow_redirects=False, request_timeout=5)
                return
            except HTTPClientError as exc:
                if exc.code < 500:  # any answer (a redirect to the login page)
                    return
            except OSError:
                pass  # not listening yet
            if time.monotonic() + ANSWER_POLL_S > deadline:
                return
            await asyncio.sleep(ANSWER_POLL_S)

    async def release_grant(self, grant_id: str) -> None:
        """Release a grant once, even if several paths ask at the same time."""
        pending: dict[str, asyncio.Future] = self.__dict__.setdefault("_gpushare_releasing", {})
        fut = pending.get(grant_id)
        if fut is None:
            fut = asyncio.ensure_future(self._release(grant_id))
            pending[grant_id] = fut
            fut.add_done_callback(lambda _f: pending.pop(grant_id, None))
        await asyncio.shield(fut)

    async def _release(self, grant_id: str) -> None:
        try:
            await self.broker.release_grant(grant_id)
            self.log.info("gpushare: released grant %s of %s", grant_id, self._log_name)
        except BrokerError as exc:
            # the broker reconciles grants of stopped servers on its side
            self.log.warning("gpushare: could not release grant %s: %s", grant_id, exc)

    def _schedule_release(self, grant_id: str) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.log.warning("gpushare: no event loop to release grant %s", grant_id)
            return
        loop.create_task(self.release_grant(grant_id))

    async def progress(self) -> Any:
        """Queue position and grant on the spawn page, then the spawner's own progress."""
        sent = 0
        while True:
            events = self.__dict__.get("_gpushare_events", [])
            while sent < len(events):
                yield events[sent]
                sent += 1
            if self.__dict__.get("_gpushare_granted", True) or not self._spawn_pending:
                break
            await asyncio.sleep(0.2)
        async for event in super().progress():
            yield event


GPUShareSpawnerMixin = GPUShareSpawner
