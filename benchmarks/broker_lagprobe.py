"""The broker with an event-loop lag probe, for ``benchmarks/broker.py`` (not for production).

    python benchmarks/broker_lagprobe.py --BrokerApp.… (the broker's own options)

Runs ``jupyter_gpushare.broker``'s ``main`` unchanged, plus one task on its event loop that
sleeps ``TICK`` seconds at a time while it is switched on (``SIGUSR2`` switches it on or
off, as ``$GPUSHARE_LAG_FILE.ctl`` says: ``on``, ``on callbacks``, ``off``). Each wake-up
records how long the loop took to come back, as wall time and as the CPU time of the loop's
thread (``time.thread_time``) spent in between: the CPU figure is the work that held the
loop, the wall figure adds the time the process waited for a core (a shared machine). On
exit the records, ``[unix time, wall s, CPU s]`` per wake-up, are written as JSON to
``$GPUSHARE_LAG_FILE``, and the garbage collector's passes of over a millisecond (``[unix
time at the end, generation, CPU s]``, while the probe is on) to the same name plus ``.gc``:
a hold with a collection in it is the collector's, not the code's.

While on, it also records, to the same name plus ``.req``, where an admission's time goes:
``["req", end, server s, start, user]`` per ``POST /requests`` answered (tornado's request
time: headers read to answer written; start: unix time the headers were read), ``["submit",
end, wall s, CPU s]`` per ``Broker.submit`` (decision, commit and apply) and ``["write",
end, wall s, CPU s]`` per fast-path transaction (the commit: wall minus CPU is the wait for
the database; for a group the event loop sent, ``BrokerApp.commit_mode = async``, its round
trip with CPU 0), and ``["slow", end, CPU s, what]`` per callback of the loop that took over
``SLOW`` seconds of CPU (what: the handle's repr, for a task its coroutine and where it
stood), this only while the control file says ``on callbacks``: reading a thread's CPU time
is a system call (0.65 µs here), two per callback are ~2 % of the loop at 500 admissions/s,
so the open loop runs without them. With ``$GPUSHARE_LAG_GCWHY`` set, the first 20
collections of over 1 ms also record what their generation held when they began (``["gcwhy",
end, generation, CPU s, objects, most common types, biggest containers]``; listing it costs
time before each collection, outside the CPU it records). On exit, the garbage that was
frozen (``gc.unfreeze()`` then a full collection) goes to ``.leak``."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import time
from typing import Any

# the modules' paths from before the broker's rooms (they still import, with a warning): the
# probe also runs a --baseline checkout of benchmarks/broker.py, which may predate the rooms
# (service.Broker is the class in either layout)
from jupyter_gpushare.broker import app as broker_app
from jupyter_gpushare.broker import fastsql, service  # type: ignore[attr-defined]

TICK = 0.001
SLOW = 0.005  # callbacks of more CPU than this are named in the records


def main() -> None:
    records: list[tuple[float, float, float]] = []
    collections: list[tuple[float, int, float]] = []
    steps: list[tuple[Any, ...]] = []
    state: dict[str, Any] = {"task": None, "gc_start": 0.0}

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if state["task"] is None:
            return
        if phase == "start":
            if os.environ.get("GPUSHARE_LAG_GCWHY") and state.get("why", 0) < 20:
                young = gc.get_objects(int(info["generation"]))
                kinds: dict[str, int] = {}
                for o in young:
                    kinds[type(o).__name__] = kinds.get(type(o).__name__, 0) + 1
                top = sorted(kinds.items(), key=lambda kv: -kv[1])[:12]
                state["young"] = (len(young), top, sorted(
                    ((len(o), type(o).__name__, repr(o)[:80]) for o in young
                     if isinstance(o, (dict, list, set, tuple, frozenset)) and len(o) > 200),
                    reverse=True,
                )[:6])
                del young
            state["gc_start"] = time.thread_time()
            return
        took = time.thread_time() - state["gc_start"]
        if took > 0.001 and os.environ.get("GPUSHARE_LAG_GCWHY") and state.get("why", 0) < 20:
            state["why"] = state.get("why", 0) + 1  # the biggest containers left young
            count, top, big = state["young"]
            steps.append(("gcwhy", time.time(), int(info["generation"]), took, count, top, big))
        if took > 0.0002:
            collections.append((time.time(), int(info["generation"]), took))

    gc.callbacks.append(on_gc)

    async def probe() -> None:
        last_wall, last_cpu = time.perf_counter(), time.thread_time()
        while True:
            await asyncio.sleep(TICK)
            wall, cpu = time.perf_counter(), time.thread_time()
            records.append((time.time(), wall - last_wall - TICK, cpu - last_cpu))
            last_wall, last_cpu = wall, cpu

    def toggle() -> None:
        # the wanted state is in the control file: two signals sent close together may
        # reach the process as one (an off and an on would then be lost)
        try:
            with open(os.environ["GPUSHARE_LAG_FILE"] + ".ctl") as ctl:
                words = ctl.read().split()
            wanted = bool(words) and words[0] == "on"
            state["callbacks"] = "callbacks" in words
        except FileNotFoundError:
            wanted = state["task"] is None
        task = state["task"]
        if task is None and wanted:
            state["task"] = asyncio.ensure_future(probe())
        elif task is not None and not wanted:
            task.cancel()
            state["task"] = None

    def timed(cls: Any, name: str, label: str) -> None:
        inner = getattr(cls, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if state["task"] is None:
                return inner(*args, **kwargs)
            w0, c0 = time.perf_counter(), time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                steps.append((label, time.time(), time.perf_counter() - w0,
                              time.thread_time() - c0))

        setattr(cls, name, wrapper)

    timed(service.Broker, "submit", "submit")
    timed(fastsql.FastWriter, "write", "write")
    try:  # commits sent by the loop: a group's round trip, from its query sent to its answer
        from jupyter_gpushare.broker import commitasync  # type: ignore[attr-defined]
    except ImportError:  # a baseline from before them
        commitasync = None  # type: ignore[assignment]
    if commitasync is not None:
        send, committed = commitasync.AsyncCommits._send, commitasync.AsyncCommits._committed

        def _send(self: Any) -> bool:
            sent = send(self)
            if sent and state["task"] is not None:
                self._probe_sent = time.perf_counter()
            return sent

        def _committed(self: Any, group: Any) -> None:
            sent = getattr(self, "_probe_sent", None)
            if sent is not None and state["task"] is not None:
                steps.append(("write", time.time(), time.perf_counter() - sent, 0.0))
            self._probe_sent = None
            committed(self, group)

        commitasync.AsyncCommits._send = _send  # type: ignore[method-assign]
        commitasync.AsyncCommits._committed = _committed  # type: ignore[method-assign]
    def note_request(handler: Any) -> None:
        if state["task"] is not None and handler.request.method == "POST" and \
                type(handler).__name__ == "RequestsHandler":
            request = handler.request
            try:
                user = str(json.loads(request.body).get("user", ""))
            except ValueError:
                user = ""
            steps.append(("req", time.time(), request.request_time(), request._start_time, user))

    if hasattr(broker_app.BrokerApp, "_log_request"):  # a baseline from before request_logger
        log_request = broker_app.BrokerApp._log_request

        def _log_request(self: broker_app.BrokerApp, handler: Any) -> None:
            note_request(handler)
            log_request(self, handler)

        broker_app.BrokerApp._log_request = _log_request  # type: ignore[attr-defined]
    else:
        make_logger = broker_app.request_logger

        def request_logger(log: Any) -> Any:
            inner = make_logger(log)

            def log_request(handler: Any) -> None:
                note_request(handler)
                inner(handler)

            return log_request

        broker_app.request_logger = request_logger  # type: ignore[assignment]
    leak: dict[str, int] = {}
    try:
        from jupyter_gpushare.broker import gcpace  # type: ignore[attr-defined]
    except ImportError:  # a baseline from before the pacer
        gcpace = None  # type: ignore[assignment]
    if gcpace is not None:
        pacer_stop = gcpace.CollectorPacer.stop

        def stop(self: Any) -> None:  # count what the steps froze that is garbage now
            leak["young"] = gc.collect()
            leak["frozen"] = gc.get_freeze_count()
            gc.unfreeze()
            leak["leaked"] = gc.collect()
            pacer_stop(self)

        gcpace.CollectorPacer.stop = stop  # type: ignore[method-assign]
    run_handle = asyncio.events.Handle._run

    def _run(self: asyncio.events.Handle) -> None:  # which callback held the loop
        if state["task"] is None or not state.get("callbacks"):
            return run_handle(self)
        c0 = time.thread_time()
        try:
            return run_handle(self)
        finally:
            took = time.thread_time() - c0
            if took > SLOW:
                owner = getattr(self._callback, "__self__", None)  # a task's step: the task
                what = repr(owner) if isinstance(owner, asyncio.Task) else repr(self)
                steps.append(("slow", time.time(), took, what[:400]))

    asyncio.events.Handle._run = _run  # type: ignore[method-assign]
    original = broker_app.BrokerApp.start_async

    async def start_async(self: broker_app.BrokerApp) -> None:
        await original(self)
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, toggle)

    broker_app.BrokerApp.start_async = start_async  # type: ignore[method-assign]
    try:
        broker_app.main()
    finally:
        with open(os.environ["GPUSHARE_LAG_FILE"], "w") as out:
            json.dump(records, out)
        with open(os.environ["GPUSHARE_LAG_FILE"] + ".gc", "w") as out:
            json.dump(collections, out)
        with open(os.environ["GPUSHARE_LAG_FILE"] + ".req", "w") as out:
            json.dump(steps, out)
        # what freezing kept that was garbage: unfreeze and collect (the start-up's freeze
        # included); the young garbage of the last moments is counted apart, before
        if not leak:  # no pacer: what the start-up froze
            leak["young"] = gc.collect()
            leak["frozen"] = gc.get_freeze_count()
            gc.unfreeze()
            leak["leaked"] = gc.collect()
        with open(os.environ["GPUSHARE_LAG_FILE"] + ".leak", "w") as out:
            json.dump(leak, out)


if __name__ == "__main__":
    main()
