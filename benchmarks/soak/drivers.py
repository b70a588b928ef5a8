"""What drives a soak run: simulated users, the admission prober and the hub snapshotter.

Each runs in a thread of its own until ``stop`` is set and records what it saw in the
history: users through the hub's REST API (spawn, stop) and through their own server's
gpushare extension (jobs: the lab's path), the snapshotter through the hub's REST API.
"""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import jobnotebooks as nbs

from .history import History
from .stack import Stack
from .world import SERVER_PROFILES


def http(
    url: str, token: str, method: str = "GET", body: Any = None, timeout: float = 60
) -> tuple[int, Any]:
    """One call; a connection that fails is status 599 (no answer)."""
    req = urllib.request.Request(
        url,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw, status = resp.read(), resp.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    except OSError as exc:
        return 599, str(exc)
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")[:500]


@dataclass
class Faults:
    """Which parts a fault hit, and when (the drivers do not count a failure that a fault
    of the part itself explains: a killed hub cannot answer, a killed server is gone)."""

    windows: list[tuple[float, float, str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def open(self, kind: str, target: str) -> int:
        with self.lock:
            self.windows.append((time.time(), float("inf"), kind, target))
            return len(self.windows) - 1

    def close(self, i: int, grace: float = 3.0) -> None:
        with self.lock:
            start, _, kind, target = self.windows[i]
            self.windows[i] = (start, time.time() + grace, kind, target)

    def hit(self, t0: float, t1: float, targets: tuple[str, ...]) -> bool:
        with self.lock:
            return any(
                start <= t1 and t0 <= end and target in targets
                for start, end, _, target in self.windows
            )

    def any_at(self, t: float) -> bool:
        return self.kind_at(t) is not None

    def kind_at(self, t: float) -> str | None:
        """The part a fault window open at ``t`` hit (broker, hub, server, policy, db)."""
        with self.lock:
            return next((kind for start, end, kind, _ in self.windows if start <= t <= end), None)


class User(threading.Thread):
    """Starts a server of some profile, holds it, may send a notebook to run as a job, stops
    it; again until told to stop."""

    def __init__(
        self,
        name: str,
        team: str,
        stack: Stack,
        history: History,
        faults: Faults,
        seats: threading.Semaphore,
        rng: random.Random,
        stop: threading.Event,
        hold_s: tuple[float, float],
    ) -> None:
        super().__init__(daemon=True, name=f"user-{name}")
        self.user, self.team, self.stack, self.h, self.faults = name, team, stack, history, faults
        self.seats, self.rng, self.stopping, self.hold_s = seats, rng, stop, hold_s
        self.token = ""
        self.jobs: list[str] = []

    def call(
        self,
        what: str,
        url: str,
        method: str = "GET",
        body: Any = None,
        targets: tuple[str, ...] = ("hub",),
        token: str | None = None,
    ) -> tuple[int, Any]:
        t0 = time.time()
        status, answer = http(url, token or self.token, method, body)
        t1 = time.time()
        self.h.record(
            "call",
            t=t0,
            client=self.user,
            what=what,
            method=method,
            path=url.split("127.0.0.1", 1)[-1].split("/", 1)[-1][:120],
            status=status,
            ms=round((t1 - t0) * 1000, 1),
            counts=not self.faults.hit(t0 - 2, t1 + 2, targets),
            body=answer if status >= 400 else None,
        )
        return status, answer

    def run(self) -> None:
        self.token = self.stack.hub.token_for(self.user, note="soak")
        home = self.stack.hub.tmp / "home" / self.user / "work"
        home.mkdir(parents=True, exist_ok=True)
        (home / "count.ipynb").write_text(json.dumps(nbs.counting(30, 0.5)))
        (home / "short.ipynb").write_text(json.dumps(nbs.sleeping(2)))
        while not self.stopping.is_set():
            with self.seats:
                if self.stopping.is_set():
                    break
                self.session()
            self.stopping.wait(self.rng.uniform(1, 5))

    def session(self) -> None:
        profiles, weights = zip(*SERVER_PROFILES, strict=True)
        profile = self.rng.choices(profiles, weights)[0]
        hub = self.stack.hub
        t0 = time.time()
        status, _ = self.call(
            "spawn",
            f"{hub.api_url}/users/{self.user}/server",
            "POST",
            {"profile": profile},
            token=hub.admin_token,
        )
        ready = status in (201, 202) and self.wait_ready(120)
        self.h.record(
            "spawn",
            t=t0,
            user=self.user,
            profile=profile,
            status=status,
            ready=ready,
            took_s=round(time.time() - t0, 2),
        )
        if ready:
            end = time.time() + self.rng.uniform(*self.hold_s)
            if profile != "debug-eighth" and self.rng.random() < 0.7:
                self.submit_job()
            while time.time() < end and not self.stopping.is_set():
                time.sleep(0.5)
        self.stop_server()

    def server(self) -> dict[str, Any] | None:
        status, model = http(
            f"{self.stack.hub.api_url}/users/{self.user}", self.stack.hub.admin_token, timeout=10
        )
        if status != 200 or not isinstance(model, dict):
            return {"unknown": True}
        return (model.get("servers") or {}).get("")

    def wait_ready(self, timeout: float) -> bool:
        deadline = time.time() + timeout
        while time.time() < deadline:
            srv = self.server()
            if srv is None:
                return False
            if srv.get("ready"):
                return True
            time.sleep(0.5)
        return False

    def submit_job(self) -> None:
        base = f"{self.stack.hub.url}/user/{self.user}/gpushare/api/jobs"
        if self.rng.random() < 0.6:
            body = {
                "path": "work/count.ipynb",
                "profile": "job-1gpu",
                "max_runtime": 600,
                "checkpoint": True,
            }
        else:
            body = {"path": "work/short.ipynb", "profile": "job-quarter", "max_runtime": 300}
        status, job = self.call(
            "submit", base, "POST", body, targets=("hub", f"server:{self.user}")
        )
        if status == 201 and isinstance(job, dict):
            self.jobs.append(str(job["id"]))

    def stop_server(self) -> None:
        hub = self.stack.hub
        deadline = time.time() + 90
        while time.time() < deadline:
            status, _ = self.call(
                "stop", f"{hub.api_url}/users/{self.user}/server", "DELETE", token=hub.admin_token
            )
            if status in (202, 204, 400, 404) and self.server() is None:
                return
            time.sleep(1)


class SlurmNodeWatch(threading.Thread):
    """With ``--slurm``, every ``interval_s`` Slurm's own view of its nodes (``sinfo``): the
    backend's view of the capacity, which the audit holds a guarantee against."""

    def __init__(
        self, stack: Stack, history: History, stop: threading.Event, interval_s: float = 2.0
    ) -> None:
        super().__init__(daemon=True, name="slurm-nodes")
        self.stack, self.h, self.stopping, self.interval_s = stack, history, stop, interval_s

    def run(self) -> None:
        while not self.stopping.is_set():
            t0 = time.time()
            try:
                states = self.stack.slurm.node_states()
            except Exception:  # noqa: BLE001 - slurmctld down: no view this time
                states = {}
            if states:
                self.h.record("slurm_nodes", t=t0, states=states)
            self.stopping.wait(self.interval_s)


class Snapshotter(threading.Thread):
    """Every ``interval_s`` the hub's view of every server (when the hub answers)."""

    def __init__(
        self, stack: Stack, history: History, stop: threading.Event, interval_s: float = 2.0
    ) -> None:
        super().__init__(daemon=True, name="snapshots")
        self.stack, self.h, self.stopping, self.interval_s = stack, history, stop, interval_s

    def run(self) -> None:
        while not self.stopping.is_set():
            self.take()
            self.stopping.wait(self.interval_s)

    def take(self) -> None:
        t0 = time.time()
        status, users = http(
            f"{self.stack.hub.api_url}/users", self.stack.hub.admin_token, timeout=10
        )
        if status != 200 or not isinstance(users, list):
            return
        servers = {}
        for u in users:
            for name, srv in (u.get("servers") or {}).items():
                servers[f"{u['name']}/{name}"] = {
                    "profile": (srv.get("user_options") or {}).get("profile", ""),
                    "ready": bool(srv.get("ready")),
                    "pending": srv.get("pending"),
                    "pid": (srv.get("state") or {}).get("pid"),
                }
        self.h.record("hub_snapshot", t=t0, servers=servers)
