"""The broker's tuning: how it commits, collects garbage and works between requests.

Options of ``BrokerApp`` (``--BrokerApp.commit_mode``, ``c.BrokerApp.gc_pace_interval_s``
...): the application inherits them from :class:`BrokerTuning`, so their names are the
application's. What the broker serves and where (policy, database, hub, ports, files) stays
in ``broker/app.py``; these only change how fast it does it. Each help says what was
measured.
"""

from __future__ import annotations

from traitlets import Bool, CaselessStrEnum, Float, HasTraits, Integer


class BrokerTuning(HasTraits):
    """The tuning options (configurable through the application that inherits them)."""

    raw_sql = Bool(
        True,
        config=True,
        help="Write the hot paths (admission, release) through the DB-API driver directly "
        "(SQLite, PostgreSQL+psycopg2); False: SQLAlchemy Core for every write.",
    )
    commit_mode = CaselessStrEnum(
        ["auto", "inline", "thread", "async", "loop"],
        "auto",
        config=True,
        help="How the hot-path writes (admission, release) are committed. inline: each on the "
        "event loop, which waits for it. thread: grouped, on a writer thread "
        "(broker/store/commitpipe.py). async (PostgreSQL only): grouped, sent by the event loop "
        "without waiting for the answer (broker/store/commitasync.py). loop: grouped, committed by "
        "the event loop once the turn that made them has run its other callbacks "
        "(broker/store/commitloop.py). With thread, async and loop a change is applied at once and "
        "its client answered once it is durable. auto: async for PostgreSQL, whose commit is "
        "a network round trip (0.3 ms mean, 2-3 ms p99) the loop would otherwise wait for; "
        "loop for SQLite, whose commit writes each page it touched to the WAL (0.26-0.31 ms "
        "per admission with 100,000 live grants): one commit per turn writes the shared pages "
        "once and merges a restart's release with its admission. thread, async and loop need "
        "raw_sql (else: inline).",
    )
    gil_switch_interval_ms = Float(
        0.5,
        config=True,
        help="Python's thread switch interval (sys.setswitchinterval) in ms while the writer "
        "thread runs (commit_mode thread); 0: Python's default (5 ms). A thread that wants "
        "the interpreter lock waits up to this long while the event loop holds it; the writer "
        "needs it twice per group commit, so with 5 ms an answer could wait 10 ms more.",
    )
    sqlite_checkpoint_interval_s = Float(
        1.0,
        config=True,
        help="SQLite: seconds between WAL checkpoints, done by a background thread instead "
        "of inside a commit on the event loop (0: SQLite's automatic checkpoints). The first "
        "commit after each complete checkpoint syncs the WAL header (~4 ms on the loop), so "
        "fewer checkpoints mean fewer slow commits; the WAL holds about 13 pages (52 KiB) per "
        "admission in between.",
    )
    sqlite_wal_restart_mib = Float(
        0.0,
        config=True,
        help="SQLite: once the WAL passes this size (MiB), the checkpoint thread makes the "
        "next commit start it over (wal_checkpoint(RESTART) after passive ones), so that it "
        "stays about this big under commits that never pause (else it grows by ~52 KiB per "
        "admission until a quiet moment). Off by default (0): the commit that starts the WAL "
        "over waits on the event loop for the sync of its header, measured at 30-130 ms with "
        "64-256 MiB and 3.6 s with 1 GiB on a loaded disk. For bulk loads (the benchmark's "
        "seed uses 64 MiB), or a site whose commits never pause and whose disk is fast.",
    )
    gc_freeze = Bool(
        True,
        config=True,
        help="After loading the state, move every object alive into the garbage collector's "
        "permanent generation (gc.freeze): the grants, nodes and policy loaded on start are "
        "then never scanned again, so full collections stop pausing the event loop for "
        "~15 ms per 1,000 live grants.",
    )
    gc_pace_interval_s = Float(
        0.1,
        config=True,
        help="Seconds between two steps of the garbage collector's pacer (broker/ops/gcpace.py): "
        "one full collection of what is not frozen (what was allocated since the last step, "
        "2-4 ms at 500 admissions/s), then freeze what survived, so that the grants admitted "
        "since start never pile up for one long full collection (100-125 ms on the event "
        "loop after 13,000 admissions; ~1 s at 100,000). 0: CPython's own schedule only.",
    )
    why_warm_interval_s = Float(
        0.005,
        min=0.0,
        config=True,
        help="Seconds between two steps that make the refusal tables ahead (broker/ops/"
        "whywarm.py): once a pool holds why_warm_at of its GPU units, CPU or RAM, each step "
        "reads at most why_warm_nodes nodes into the tables of the asks seen there (and "
        "brings those made up to date), so that an "
        "ask's first refusal does not read the whole pool on the event loop (15-60 ms at "
        "12,000 nodes). A step with nothing to do waits ten times longer. 0: never; each "
        "first refusal makes its table.",
    )
    why_warm_at = Float(
        0.6,
        min=0.0,
        max=1.0,
        config=True,
        help="Share of a pool's GPU units, CPU or RAM held from which the refusal tables of "
        "the asks seen there are made ahead and kept up to date (see why_warm_interval_s). "
        "Lower: made earlier, more background work per decision (each table made re-reads "
        "the node a decision changed).",
    )
    why_warm_nodes = Integer(
        250,
        min=1,
        max=1_000_000,
        config=True,
        help="Nodes read at most per step into the refusal tables being made ahead, and as "
        "many again to bring those made up to date (a step took 2.3 ms at the median, "
        "4.1 ms at the 99th percentile at 250, on 12,000 nodes: see why_warm_interval_s).",
    )
    why_warm_positions = Integer(
        4000,
        min=0,
        max=10_000_000,
        config=True,
        help="Node positions read at most per step of why_warm_interval_s into the short "
        "lists of each pool's next placement target (core/packnext.py): a new target waits "
        "until the lists of the shapes asked lately are made for it, so that no request "
        "after it pays for a full scan with cold memos (cpu-heavy at ten times the Alibaba "
        "cluster: decisions over 10 ms 62 -> 16); with what a step has left, rows scored "
        "again to keep the short lists in use up to date and carried on where they run low "
        "(core/packshort.py ShortLists.freshen: the same cluster's decision p99 1.55 -> "
        "0.79 ms). 0: a new target is taken at once and no list is kept up between requests.",
    )
