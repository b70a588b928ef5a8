"""Group commits (broker/store/commitpipe.py, commitasync.py, commitloop.py), on a real database.

Every test runs on SQLite with the writer thread and on a real PostgreSQL server with the
writer thread and with the event loop's own non-blocking commits; those that do not need the
loop to run while a commit waits also on SQLite with the loop's own commits at the end of a
turn (``OFF_LOOP``: the others). A second connection takes the write lock, so the group's
commit waits for it; this shows what the pipeline promises:

* an admission is applied at once but answered only once it is durable, and the event loop
  serves other requests while the commit waits;
* a failed commit answers 503 to every change not yet durable, keeps none of them (memory is
  rebuilt from the database) and the broker then takes writes again;
* a SQLAlchemy transaction (here: the idempotency lookup) waits for the queue, so it finds
  a change answered or about to be;
* changes that queued up while a commit waited go to the database together, in order.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import jobnotebooks as nbs
import pytest
from brokerkit import call, start_broker, static_tokens
from brokerpolicies import small
from corefactory import request
from pgserver import postgres  # noqa: F401  (fixture)
from sqlalchemy import create_engine, func, select

from jupyter_gpushare.broker.jobs.store import Job, JobStore
from jupyter_gpushare.broker.service.base import TASK_WRITES
from jupyter_gpushare.broker.service.broker import Broker
from jupyter_gpushare.broker.service.effects import NoEffects
from jupyter_gpushare.broker.store.commitasync import AsyncCommits
from jupyter_gpushare.broker.store.commitpipe import CommitFailed
from jupyter_gpushare.broker.store.db import grants_table, jobs_table, make_engine, requests_table
from jupyter_gpushare.core.jobs import JobState
from jupyter_gpushare.core.model import Kind
from jupyter_gpushare.policy import load_policy

USERS = {"alice": ["a"], "bob": ["b"]}

OFF_LOOP = ["sqlite-thread", "postgresql-thread", "postgresql-async"]
"""The committers whose commit waits while the loop serves (a lock held by another
connection then leaves the loop free); the loop's own committer (``loop``) waits on the loop,
as an inline commit does, so the tests that hold a lock while the loop goes on are theirs."""
off_loop = pytest.mark.parametrize("case", OFF_LOOP, indirect=True)


@pytest.fixture(params=[*OFF_LOOP, "sqlite-loop"])
def case(request: pytest.FixtureRequest) -> tuple[str, str]:
    """The database and the committer (BrokerApp.commit_mode)."""
    db, mode = request.param.split("-")
    return db, mode


@pytest.fixture
def db_url(case: tuple[str, str], request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if case[0] == "sqlite":
        return f"sqlite:///{tmp_path}/pipe.sqlite"
    return str(request.getfixturevalue("postgres").new_database("pipe"))


@pytest.fixture
def mode(case: tuple[str, str]) -> str:
    return case[1]


class WriteLock:
    """Another connection holding the lock the broker's next insert needs."""

    def __init__(self, db_url: str) -> None:
        self.db_url = db_url
        self._sqlite: sqlite3.Connection | None = None
        self._pg: Any = None
        self._releasing = threading.Lock()

    def hold(self) -> None:
        if self.db_url.startswith("sqlite"):
            path = self.db_url.split("///", 1)[1]
            self._sqlite = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self._sqlite.execute("BEGIN IMMEDIATE")
        else:
            engine = create_engine(self.db_url)
            self._pg = (engine, engine.connect())
            self._pg[1].exec_driver_sql("LOCK TABLE gpushare_requests IN EXCLUSIVE MODE")

    def release(self) -> None:
        with self._releasing:
            self._release()

    def _release(self) -> None:
        if self._sqlite is not None:
            self._sqlite.execute("ROLLBACK")
            self._sqlite.close()
            self._sqlite = None
        if self._pg is not None:
            engine, conn = self._pg
            conn.rollback()
            conn.close()
            engine.dispose()
            self._pg = None

    def break_waiting_writer(self, app: Any) -> bool:
        """Make the writer thread's waiting commit fail (as if the database went away);
        ``False`` if it is not waiting yet."""
        if self._sqlite is not None:
            app.broker.fast._conn.interrupt()  # the one call meant for another thread
            return True
        _, conn = self._pg
        killed = conn.exec_driver_sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND wait_event_type = 'Lock'"
        ).fetchall()
        return bool(killed)


def rows(db_url: str, table: Any) -> list[Any]:
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(select(table)))
    finally:
        engine.dispose()


def ask(server: str, fraction: float = 0.25, **extra: Any) -> dict[str, Any]:
    return {"pool": "shared", "server": server, "gpu": {"fraction": fraction}, **extra}


async def until(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


@pytest.fixture
async def app(db_url: str, mode: str) -> Any:
    broker_app = await start_broker(small(), db_url, static_tokens(USERS), commit_mode=mode)
    yield broker_app
    await broker_app.stop_async()


@off_loop
async def test_answer_waits_for_the_commit_while_the_loop_serves(app: Any, db_url: str) -> None:
    broker = app.broker
    assert broker.commits is not None
    status, first = await call(app, "POST", "/requests", "tok-alice", ask("warm"))
    assert status == 201 and first["status"] == "granted", first
    lock = WriteLock(db_url)
    lock.hold()
    try:
        body = ask("s1", idempotency_key="k-s1")
        post = asyncio.ensure_future(call(app, "POST", "/requests", "tok-alice", body))
        await until(lambda: len(broker.state.grants) == 2)  # applied at once...
        await asyncio.sleep(0.5)
        assert not post.done(), "answered before the commit"  # ...answered only when durable
        # a retry with its key finds it (in memory, without waiting on the loop for the
        # commit) and is answered once it is durable too
        retry = asyncio.ensure_future(call(app, "POST", "/requests", "tok-alice", body))
        await asyncio.sleep(0.3)
        assert not retry.done()
        # the loop is free meanwhile: a read and another user's admission are served
        status, health = await call(app, "GET", "/health")
        assert status == 200 and health["status"] == "ok"
        # a client's poll reads what is committed without waiting for the queue (if it
        # waited, the loop would stop until the safety timer lets the commit through)
        safety = threading.Timer(5.0, lock.release)
        safety.start()
        t0 = time.monotonic()
        status, polled = await call(app, "GET", f"/requests/{first['request_id']}", "tok-alice")
        assert status == 200 and polled["status"] == "granted"
        assert time.monotonic() - t0 < 2.5, "the poll waited for the commit in flight"
        safety.cancel()
        other = asyncio.ensure_future(call(app, "POST", "/requests", "tok-bob", ask("b1")))
        await until(lambda: len(broker.state.grants) == 3)
        assert not other.done()
        assert len(rows(db_url, grants_table)) == 1  # only the warm-up grant is in the database
        status, text = await call(app, "GET", "/metrics", "tok-metrics")
        assert status == 200 and "\ngpushare_commit_backlog 2.0\n" in text, text
    finally:
        lock.release()
    status, view = await post
    assert status == 201 and view["status"] == "granted", view
    status, again = await retry
    assert status == 201 and again["request_id"] == view["request_id"], again
    assert len(broker.state.grants) == 3
    status, view_b = await other
    assert status == 201, view_b
    in_db = {r.id for r in rows(db_url, grants_table)}
    assert in_db == {first["grant_id"], view["grant_id"], view_b["grant_id"]}
    assert broker.commits.broken is None


@off_loop
async def test_a_failed_commit_keeps_nothing_and_the_broker_recovers(
    app: Any, db_url: str
) -> None:
    broker = app.broker
    status, first = await call(app, "POST", "/requests", "tok-alice", ask("warm"))
    assert status == 201, first
    lock = WriteLock(db_url)
    lock.hold()
    try:
        body = ask("s1", idempotency_key="k-s1")
        posts = [
            asyncio.ensure_future(call(app, "POST", "/requests", "tok-alice", body)),
            asyncio.ensure_future(call(app, "POST", "/requests", "tok-bob", ask("b1"))),
        ]
        await until(lambda: len(broker.state.grants) == 3)
        await asyncio.sleep(0.3)  # the writer thread is waiting for the lock by now
        await until(lambda: lock.break_waiting_writer(app))
    finally:
        lock.release()  # before the loop runs again: the rebuild reads the database
    answers = await asyncio.gather(*posts)
    for status, err in answers:
        assert status == 503 and err["code"] == "db_unavailable", err
    await until(lambda: broker.commits.broken is None)
    # nothing of the failed changes is kept, in memory or in the database
    assert set(broker.state.grants) == {first["grant_id"]}
    assert {r.id for r in rows(db_url, grants_table)} == {first["grant_id"]}
    assert len(rows(db_url, requests_table)) == 1
    # and the broker takes writes again: the retry with the same key is a new, durable grant
    status, again = await call(app, "POST", "/requests", "tok-alice", body)
    assert status == 201 and again["status"] == "granted", again
    assert again["grant_id"] in {r.id for r in rows(db_url, grants_table)}
    status, same = await call(app, "POST", "/requests", "tok-alice", body)
    assert status == 201 and same["request_id"] == again["request_id"]


@off_loop
async def test_changes_queued_behind_a_waiting_commit_go_together_in_order(
    app: Any, db_url: str
) -> None:
    broker = app.broker
    lock = WriteLock(db_url)
    lock.hold()
    try:
        posts = [
            asyncio.ensure_future(
                call(app, "POST", "/requests", "tok-alice", ask(f"s{i}", fraction=0.125))
            )
            for i in range(24)
        ]
        await until(lambda: broker.commits.enqueued >= 24)
        groups_before = broker.commits.groups
    finally:
        lock.release()
    answers = await asyncio.gather(*posts)
    assert all(status in (201, 409) for status, _ in answers), answers
    assert broker.commits.largest_group >= 2  # group commit: not one round trip each
    assert broker.commits.groups - groups_before < 24
    # the database went through the same changes as memory
    live = {r.id for r in rows(db_url, grants_table) if r.released_at is None}
    assert live == set(broker.state.grants)
    by_id = {r.id: r.status for r in rows(db_url, requests_table)}
    for _, view in answers:
        assert by_id[view["request_id"]] == view["status"]


async def test_a_sqlalchemy_transaction_waits_for_the_queue(db_url: str, mode: str) -> None:
    engine = make_engine(db_url)
    broker = Broker(small(), engine)
    broker.load()
    broker.start_commits(asyncio.get_running_loop(), mode)
    lock = WriteLock(db_url)
    try:
        lock.hold()
        view = broker.submit(request("a", "shared", user="alice"), idempotency_key="k1")
        assert view["status"] == "granted"
        threading.Timer(0.5, lock.release).start()
        t0 = time.monotonic()
        # blocks (on this loop) until the insert above is committed, then reads it
        with engine.begin() as conn:
            count = conn.execute(select(func.count()).select_from(grants_table)).scalar()
        assert count == 1, "the transaction did not wait for the queue"
        assert time.monotonic() - t0 > 0.3
        assert broker.commits is not None and broker.commits.backlog == 0
        found = broker.find_idempotent("alice", "k1")
        assert found is not None and found["request_id"] == view["request_id"]
        await broker.durable()
        with engine.connect() as conn:
            assert conn.execute(select(func.count()).select_from(grants_table)).scalar() == 1
    finally:
        broker.close()
        engine.dispose()


@off_loop
async def test_a_transaction_on_a_worker_thread_waits_for_the_queue(
    db_url: str, mode: str
) -> None:
    """A read in run_in_executor (the job runner's sweep, the admin page) waits for the
    queue like one on the loop, while the loop goes on (and, with async commits, is the
    only one that touches the writer's connection)."""
    engine = make_engine(db_url)
    broker = Broker(small(), engine)
    broker.load()
    loop = asyncio.get_running_loop()
    broker.start_commits(loop, mode)
    lock = WriteLock(db_url)

    def count() -> int:
        with engine.begin() as conn:
            return int(conn.execute(select(func.count()).select_from(grants_table)).scalar())

    try:
        lock.hold()
        view = broker.submit(request("a", "shared", user="alice"))
        assert view["status"] == "granted"
        read = loop.run_in_executor(None, count)
        await asyncio.sleep(0.5)  # the loop runs meanwhile
        assert not read.done(), "the worker's transaction did not wait for the queue"
        lock.release()
        assert await asyncio.wait_for(read, 10) == 1
        assert broker.commits is not None and broker.commits.backlog == 0
    finally:
        lock.release()
        broker.close()
        engine.dispose()


# -- what the review found (each went red before its fix) ---------------------------------


def _in_process(db_url: str, mode: str) -> Broker:
    broker = Broker(small(), make_engine(db_url))
    broker.load()
    broker.start_commits(asyncio.get_running_loop(), mode)
    return broker


def _failing_commits(broker: Broker) -> None:
    """The committer's next group fails (as when the database restarts)."""
    fast = broker.fast
    assert fast is not None
    name = "query" if isinstance(broker.commits, AsyncCommits) else "write"
    real = getattr(fast, name)

    def failing(statements: Any) -> Any:
        setattr(fast, name, real)
        raise sqlite3.OperationalError("disk I/O error (injected)")

    setattr(fast, name, failing)


def _slow_commits(broker: Broker, seconds: float) -> Any:
    """Every group commit takes ``seconds`` more (the writer thread sleeps; on the loop's
    connection, the server does); returns the undo."""
    fast = broker.fast
    assert fast is not None
    if isinstance(broker.commits, AsyncCommits):
        real_query = fast.query

        def slow_query(statements: Any) -> Any:
            text, params = real_query(statements)
            return f"SELECT pg_sleep({seconds}); {text}", params

        fast.query = slow_query  # type: ignore[method-assign]
        return lambda: setattr(fast, "query", real_query)
    real = fast.write

    def slow(statements: Any) -> None:
        time.sleep(seconds)
        real(statements)

    fast.write = slow  # type: ignore[method-assign]
    return lambda: setattr(fast, "write", real)


async def test_no_transaction_is_built_on_a_change_that_failed(db_url: str, mode: str) -> None:
    """A job ends: its grant's release is queued, then the job's row is written through
    SQLAlchemy. If the release's commit fails, the job's row must not say it ended (the
    grant is live again after the rebuild, and nobody would release it)."""
    broker = _in_process(db_url, mode)
    store = JobStore(broker.engine)
    try:
        view = broker.submit(request("a", "shared", fraction=0.25, kind=Kind.BATCH))
        await broker.durable()
        gid, now = view["grant_id"], time.time()
        job = Job(
            id="j1", user=view["user"], team="a", name="nb", pool="shared",
            priority="batch", request_spec={}, max_runtime_s=60, checkpoint=False,
            backend="local", output_path="/tmp/x", state=JobState.RUNNING,
            request_id=view["request_id"], grant_id=gid, created_at=now, updated_at=now,
        )
        store.insert(job, "{}", [])
        _failing_commits(broker)
        broker.release(gid, "released: job finished")
        with pytest.raises(CommitFailed):
            store.transition(job, JobState.SUCCEEDED, "finished", grant_id=None)
        await until(lambda: broker.commits is not None and broker.commits.broken is None)
        assert gid in broker.state.grants  # the release was lost: the grant is live again
        with broker.engine.connect() as conn:
            row = conn.execute(select(jobs_table).where(jobs_table.c.id == "j1")).one()
        assert row.state == "running" and row.grant_id == gid
    finally:
        broker.close()
        broker.engine.dispose()


async def test_a_request_whose_own_change_failed_is_not_answered_success(
    db_url: str, mode: str
) -> None:
    """A handler that awaits between its change and its answer (the admin reconcile): its
    change fails, the broker recovers, another request's change commits; the first must
    still get the 503, not a success for a change that was rolled back."""
    broker = _in_process(db_url, mode)
    try:
        first = broker.submit(request("a", "shared", fraction=0.25))
        second = broker.submit(request("a", "shared", fraction=0.25))
        await broker.durable()
        commits = broker.commits
        assert commits is not None

        async def reconcile_like() -> None:
            TASK_WRITES.set(None)  # a request of its own (tornado: a task per request)
            broker.release(first["grant_id"], "reconciled: gone")
            await until(lambda: commits.broken is None and commits.groups > 1)
            await broker.durable()

        async def another_request() -> None:
            TASK_WRITES.set(None)
            broker.release(second["grant_id"], "released by holder")
            await broker.durable()

        _failing_commits(broker)
        mine = asyncio.ensure_future(reconcile_like())
        await until(lambda: commits.broken is None and bool(commits._failed))
        await asyncio.ensure_future(another_request())  # commits after the recovery
        with pytest.raises(CommitFailed):
            await mine
        assert first["grant_id"] in broker.state.grants  # rolled back, as the 503 says
        assert second["grant_id"] not in broker.state.grants
    finally:
        broker.close()
        broker.engine.dispose()


async def test_a_job_answered_503_is_not_kept(tmp_path: Path) -> None:
    """POST /jobs whose grant's commit fails: 503, and neither the job nor its grant is
    kept (the job's row waited for the grant's commit and was refused)."""
    tokens = static_tokens({"alice": ["vision"]})
    policy = load_policy(str(Path(__file__).resolve().parent / "data" / "jobs_policy.yaml"))
    db = f"sqlite:///{tmp_path}/jobs.sqlite"
    app = await start_broker(policy, db, tokens, commit_mode="thread")
    app.jobs.user_root_template = str(tmp_path / "home" / "{username}")
    (tmp_path / "home" / "alice").mkdir(parents=True)
    try:
        _failing_commits(app.broker)
        status, body = await call(
            app, "POST", "/jobs", "tok-alice",
            {"notebook": nbs.sleeping(30), "profile": "job-1gpu", "max_runtime": 300},
        )
        assert status == 503 and body["code"] == "db_unavailable", body
        await until(lambda: app.broker.commits.broken is None)
        await asyncio.sleep(0.5)  # a job runner tick
        assert rows(db, jobs_table) == [] and rows(db, grants_table) == []
        assert not app.jobs.store.live and not app.broker.state.grants
    finally:
        await app.stop_async()


class NoticeRecorder(NoEffects):
    def __init__(self) -> None:
        self.notices: list[dict[str, Any]] = []

    def notice(self, notice: dict[str, Any]) -> None:
        self.notices.append(notice)


@pytest.mark.parametrize(
    ("case", "commit"),
    [*((c, "waits") for c in OFF_LOOP), *((c, "fails") for c in [*OFF_LOOP, "sqlite-loop"])],
    indirect=["case"],
)
async def test_a_victim_is_told_only_once_its_preemption_is_durable(
    db_url: str, mode: str, commit: str
) -> None:
    recorder = NoticeRecorder()
    broker = Broker(small(), make_engine(db_url), effects=recorder)
    broker.load()
    broker.start_commits(asyncio.get_running_loop(), mode)
    lock = WriteLock(db_url)
    try:
        borrowed = broker.submit(request("b", "train", user="bob", whole=4))  # a's idle GPUs
        await broker.durable()
        victim = borrowed["grant_id"]
        if commit == "fails":
            _failing_commits(broker)
        else:
            lock.hold()
        view = broker.submit(request("a", "train", user="carol", whole=2))  # a's guarantee
        assert view["status"] == "preempting" and victim in broker.state.preempting
        await asyncio.sleep(0.3)
        if commit == "waits":
            assert recorder.notices == [] and victim not in broker.preempt_info
            lock.release()
            await broker.durable(everything=True)
            await until(lambda: bool(recorder.notices))  # on the loop, right after the commit
            assert [n["grant_id"] for n in recorder.notices] == [victim]
            assert victim in broker.preempt_info
        else:
            await until(lambda: broker.commits is not None and broker.commits.broken is None)
            assert recorder.notices == [] and victim not in broker.preempt_info
            assert victim not in broker.state.preempting  # rebuilt: nothing was planned
    finally:
        lock.release()
        broker.close()
        broker.engine.dispose()


async def test_a_handler_that_answers_without_waiting_still_answers_a_durable_change(
    app: Any, db_url: str
) -> None:
    """An admin's resume (a plain handler that does not await) lets a queued request
    through: its answer is sent only once that transition is committed (BaseHandler.send
    waits for the request's own changes)."""
    broker = app.broker
    node = next(n.name for n in broker.policy.nodes if n.pool == "train")
    status, _ = await call(app, "POST", f"/admin/nodes/{node}/drain", "tok-admin")
    assert status == 200
    body = {"pool": "train", "gpu": {"count": 1}, "kind": "batch", "priority": "training"}
    status, queued = await call(app, "POST", "/requests", "tok-alice", body)
    assert status == 201 and queued["status"] == "queued", queued
    undo = _slow_commits(broker, 1.0)
    status, _ = await call(app, "POST", f"/admin/nodes/{node}/resume", "tok-admin")
    assert status == 200
    by_id = {r.id: r.status for r in rows(db_url, requests_table)}
    assert by_id[queued["request_id"]] == "granted", "answered before the transition's commit"
    undo()


async def test_async_commits_reconnect_after_the_server_drops_an_idle_connection(
    postgres: Any,  # noqa: F811  (the fixture)
) -> None:
    """The server closes the writer's idle connection (a restart, an idle timeout): the
    loop notices on the socket, and the next change goes through a new connection instead
    of failing with a 503."""
    db_url = postgres.new_database("pipe")
    broker = _in_process(db_url, "async")
    try:
        first = broker.submit(request("a", "shared", user="alice"))
        await broker.durable()
        commits = broker.commits
        assert isinstance(commits, AsyncCommits)
        writer_pid = commits._conn.info.backend_pid
        killer = create_engine(db_url)
        with killer.connect() as conn:
            conn.exec_driver_sql(f"SELECT pg_terminate_backend({writer_pid})")
        killer.dispose()
        await until(lambda: commits._conn is None, timeout=10)  # seen on the loop
        second = broker.submit(request("a", "shared", user="bob"))
        await broker.durable()
        assert commits.broken is None and commits._conn is not None
        assert commits._conn.info.backend_pid != writer_pid
        in_db = {r.id for r in rows(db_url, grants_table)}
        assert in_db == {first["grant_id"], second["grant_id"]}
    finally:
        broker.close()
        broker.engine.dispose()


@pytest.mark.parametrize("case", ["postgresql-async", "sqlite-loop"], indirect=True)
async def test_a_worker_threads_write_is_committed_by_the_loop(db_url: str, mode: str) -> None:
    """A change enqueued on a worker thread is committed (with async commits: sent) by the
    loop: only the loop touches the writer's connection."""
    broker = _in_process(db_url, mode)
    commits, fast = broker.commits, broker.fast
    assert commits is not None and fast is not None
    name = "query" if isinstance(commits, AsyncCommits) else "write"
    real = getattr(fast, name)
    users: list[int] = []

    def recorded(statements: Any) -> Any:
        users.append(threading.get_ident())
        return real(statements)

    try:
        setattr(fast, name, recorded)
        loop = asyncio.get_running_loop()
        change = [("close_request", (time.time(), "r-none"))]  # a valid write of no row
        seq = await loop.run_in_executor(None, commits.write, change)
        await asyncio.wait_for(commits.wait(seq), 10)
        assert users == [threading.get_ident()]  # this test runs on the loop's thread
    finally:
        setattr(fast, name, real)
        broker.close()
        broker.engine.dispose()


# -- the loop's own committer (SQLite, commit_mode loop) ----------------------------------


def _sqlite_rows(db_url: str, table: str) -> int:
    """Rows in ``table`` through a plain sqlite3 connection (not the broker's engine, whose
    transactions would commit the queue first)."""
    conn = sqlite3.connect(db_url.split("///", 1)[1])
    try:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    finally:
        conn.close()


async def test_loop_commits_one_group_per_turn(tmp_path: Path) -> None:
    """Changes made in one turn of the loop are committed together once the turn's other
    callbacks ran: one transaction, nothing in the database before."""
    db_url = f"sqlite:///{tmp_path}/loop.sqlite"
    broker = _in_process(db_url, "loop")
    try:
        commits = broker.commits
        assert commits is not None
        views = [broker.submit(request("a", "shared", fraction=0.125)) for _ in range(5)]
        assert all(v["status"] == "granted" for v in views)
        assert _sqlite_rows(db_url, "gpushare_grants") == 0, "committed before the turn ended"
        assert not commits.check(commits.enqueued)
        await broker.durable(everything=True)
        assert commits.groups == 1 and commits.largest_group == 5
        assert _sqlite_rows(db_url, "gpushare_grants") == 5
    finally:
        broker.close()
        broker.engine.dispose()


async def test_loop_commits_the_queue_before_a_sqlalchemy_transaction_on_the_loop(
    tmp_path: Path,
) -> None:
    db_url = f"sqlite:///{tmp_path}/loop.sqlite"
    broker = _in_process(db_url, "loop")
    try:
        broker.submit(request("a", "shared", user="alice"))
        with broker.engine.begin() as conn:  # same turn: the queue is committed first
            count = conn.execute(select(func.count()).select_from(grants_table)).scalar()
        assert count == 1
        assert broker.commits is not None and broker.commits.backlog == 0
    finally:
        broker.close()
        broker.engine.dispose()


async def test_loop_commits_a_worker_threads_transaction_waits_for_the_loop(
    tmp_path: Path,
) -> None:
    """A transaction on a worker thread waits for the loop to commit the queue (the loop's
    commit is held until the worker has begun its wait)."""
    db_url = f"sqlite:///{tmp_path}/loop.sqlite"
    broker = _in_process(db_url, "loop")
    fast = broker.fast
    assert fast is not None
    reading = threading.Event()
    real = fast.write

    def write_after_the_worker_began(statements: Any) -> None:
        reading.wait(10)
        time.sleep(0.3)  # the worker's transaction has begun by now
        real(statements)

    def count() -> int:
        reading.set()
        with broker.engine.begin() as conn:
            return int(conn.execute(select(func.count()).select_from(grants_table)).scalar())

    try:
        fast.write = write_after_the_worker_began  # type: ignore[method-assign]
        loop = asyncio.get_running_loop()
        broker.submit(request("a", "shared", user="alice"))
        assert await asyncio.wait_for(loop.run_in_executor(None, count), 10) == 1
    finally:
        fast.write = real  # type: ignore[method-assign]
        broker.close()
        broker.engine.dispose()
