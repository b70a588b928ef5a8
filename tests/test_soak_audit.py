"""The soak harness's audit (issue 28) catches what it is there to catch.

A small hand-made history of a month's run (two teams sharing a GPU, a checkpointing job
preempted once and resumed) audits clean; each planted violation (a GPU over-allocated, a
grant outliving its server, a job ending twice, a ledger or report that disagrees with the
recomputed integral, a team over its limit, a user over their cap, an in-guarantee request
left waiting, a server with two grants, a preemption without its grace, a 5xx, a resumed
job restarting from scratch, a heartbeat without a grant) makes it report exactly one.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from soak import history as soak_history  # noqa: E402
from soak.audit import audit, recompute_gpu_hours  # noqa: E402
from soak.history import History  # noqa: E402
from soak.summary import render  # noqa: E402

T0 = 1_000.0


def grant(
    gid: str,
    user: str,
    team: str,
    pool: str,
    kind: str,
    holder: str,
    units: int,
    slices: list[tuple[str, int, int]],
    start: float,
    end: float | None,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "id": gid,
        "request_id": "r" + gid[1:],
        "username": user,
        "server": holder,
        "team": team,
        "pool": pool,
        "profile": extra.pop("profile", ""),
        "kind": kind,
        "units_milli": units,
        "grace_period_s": extra.pop("grace", 5),
        "slices": [{"uuid": u, "memory_mib": m, "compute_milli": c} for u, m, c in slices],
        "granted_at": start,
        "released_at": end,
        "end_kind": extra.pop("end_kind", None),
        "preempt_deadline": extra.pop("deadline", None),
        "release_reason": extra.pop("reason", "released"),
        **extra,
    }


def request(
    rid: str, user: str, team: str, pool: str, profile: str, created: float, status: str = "granted"
) -> dict[str, Any]:
    return {
        "id": rid,
        "username": user,
        "team": team,
        "pool": pool,
        "profile": profile,
        "status": status,
        "reason": "",
        "created_at": created,
        "updated_at": created,
    }


def with_figures(h: History) -> History:
    """The broker's figures as they should be: equal to the recomputation."""
    for source in ("ledger", "report"):
        h.figures[source] = {
            "start": h.started,
            "now": h.ended,
            "hours": recompute_gpu_hours(h, h.started, h.ended),
        }
    return h


def clean() -> History:
    h = History(seed=7, started=T0, ended=T0 + 1000)
    h.settings = {"slack_s": 5.0, "admit_within_s": 10.0}
    h.policy = {
        "gpus": {"G0": {"memory_mib": 1000}, "T0": {"memory_mib": 1000}},
        "quotas": {
            "vision": {
                "interactive": {"guaranteed": 500, "borrow": 250, "cap": 500},
                "train": {"guaranteed": 1000, "borrow": 0, "cap": None},
            },
            "nlp": {"interactive": {"guaranteed": 500, "borrow": 0, "cap": None}},
        },
        "profiles": {
            "quarter": {"units": 250},
            "half": {"units": 500},
            "cpu-only": {"units": 0},
            "job-1gpu": {"units": 1000},
        },
    }
    h.rows["grants"] = [
        grant(
            "g1",
            "alice",
            "vision",
            "interactive",
            "interactive",  # the kind a server's request is stored with
            "",
            250,
            [("G0", 250, 250)],
            T0,
            T0 + 500,
            profile="quarter",
        ),
        grant(
            "g2",
            "bob",
            "nlp",
            "interactive",
            "interactive",  # the kind a server's request is stored with
            "",
            500,
            [("G0", 500, 500)],
            T0 + 100,
            T0 + 900,
            profile="half",
        ),
        grant(
            "g3",
            "alice",
            "vision",
            "train",
            "batch",
            "j1",
            1000,
            [("T0", 1000, 1000)],
            T0 + 200,
            T0 + 300,
            end_kind="preempted",
            deadline=T0 + 300,
            reason="preempted: its grace period ran out",
        ),
        grant(
            "g4",
            "alice",
            "vision",
            "train",
            "batch",
            "j1",
            1000,
            [("T0", 1000, 1000)],
            T0 + 320,
            T0 + 400,
        ),
    ]
    h.rows["requests"] = [
        request("r1", "alice", "vision", "interactive", "quarter", T0 - 0.5),
        request("r2", "bob", "nlp", "interactive", "half", T0 + 99),
        request("r3", "alice", "vision", "train", "job-1gpu", T0 + 199),
        request("r4", "alice", "vision", "train", "job-1gpu", T0 + 315),
    ]
    h.rows["jobs"] = [
        {
            "id": "j1",
            "state": "succeeded",
            "reason": "",
            "updated_at": T0 + 400,
            "ended_at": T0 + 400,
        }
    ]
    states = [
        ("queued", 199),
        ("admitted", 199.5),
        ("running", 200),
        ("preempted", 300),
        ("queued", 301),
        ("admitted", 320),
        ("running", 321),
        ("succeeded", 400),
    ]
    h.rows["job_events"] = [
        {"id": i, "job_id": "j1", "ts": T0 + t, "to_state": s, "reason": ""}
        for i, (s, t) in enumerate(states)
    ]
    h.rows["heartbeats"] = [{"grant_id": "g1", "ts": T0 + 10}, {"grant_id": "g2", "ts": T0 + 200}]
    h.backend["attempts"] = {"j1": [[1, 0], [2, 3]]}
    for t in range(0, 1000, 10):
        servers = {}
        if t < 500:
            servers["alice/"] = {"profile": "quarter", "ready": True}
        if 100 <= t < 900:
            servers["bob/"] = {"profile": "half", "ready": True}
        if 600 <= t < 700:
            servers["carol/"] = {"profile": "cpu-only", "ready": True}
        h.record("hub_snapshot", t=T0 + t, servers=servers)
    h.record("call", t=T0 + 50, client="alice", method="POST", path="/jobs", status=201)
    return with_figures(h)


def over_allocated_gpu(h: History) -> None:
    h.rows["grants"].append(
        grant(
            "g5",
            "carol",
            "vision",
            "interactive",
            "batch",
            "x5",
            500,
            [("G0", 500, 100)],
            T0 + 200,
            T0 + 250,
        )
    )


def grant_outlives_its_server(h: History) -> None:
    h.rows["grants"][0]["released_at"] = T0 + 600


def job_ends_twice(h: History) -> None:
    h.rows["job_events"].append(
        {"id": 99, "job_id": "j1", "ts": T0 + 410, "to_state": "failed", "reason": "again"}
    )


def ledger_disagrees(h: History) -> None:
    h.figures["ledger"]["hours"]["vision/interactive"] += 0.01


def report_disagrees(h: History) -> None:
    h.figures["report"]["hours"]["nlp/interactive"] *= 1.01


def team_above_its_limit(h: History) -> None:
    h.rows["grants"].append(
        grant(
            "g5",
            "bob",
            "nlp",
            "interactive",
            "batch",
            "x5",
            250,
            [("G0", 200, 200)],
            T0 + 600,
            T0 + 650,
        )
    )


def user_above_the_cap(h: History) -> None:
    h.rows["grants"].append(
        grant(
            "g5",
            "alice",
            "vision",
            "interactive",
            "batch",
            "x5",
            400,
            [("G0", 200, 200)],
            T0 + 20,
            T0 + 30,
        )
    )


def in_guarantee_request_left_waiting(h: History) -> None:
    h.rows["requests"].append(
        request("r9", "dan", "nlp", "interactive", "quarter", T0 + 950, status="queued")
    )
    h.ended = T0 + 1000  # 50 s later: past the stated 10 s


def server_with_two_grants(h: History) -> None:
    h.rows["grants"].append(
        grant(
            "g5",
            "bob",
            "nlp",
            "interactive",
            "interactive",  # the kind a server's request is stored with
            "",
            0,
            [],
            T0 + 400,
            T0 + 450,
            profile="half",
        )
    )


def preempted_before_its_grace(h: History) -> None:
    g1 = h.rows["grants"][0]  # alice's server grant, released at T0 + 500
    g1.update(end_kind="preempted", preempt_deadline=T0 + 503)  # 3 s of its 5 s grace left


def preempted_without_notice(h: History) -> None:
    h.rows["grants"][2]["preempt_deadline"] = None


def client_got_a_5xx(h: History) -> None:
    h.record("call", t=T0 + 60, client="alice", method="POST", path="/jobs", status=502)


def resumed_from_scratch(h: History) -> None:
    h.backend["attempts"]["j1"].append([3, 0])


def heartbeat_without_a_grant(h: History) -> None:
    h.rows["heartbeats"].append({"grant_id": "g2", "ts": T0 + 950})


PLANTED: list[Callable[[History], None]] = [
    over_allocated_gpu,
    grant_outlives_its_server,
    job_ends_twice,
    ledger_disagrees,
    report_disagrees,
    team_above_its_limit,
    user_above_the_cap,
    in_guarantee_request_left_waiting,
    server_with_two_grants,
    preempted_before_its_grace,
    preempted_without_notice,
    client_got_a_5xx,
    resumed_from_scratch,
    heartbeat_without_a_grant,
]
FIGURES_KEPT = {ledger_disagrees, report_disagrees}


def test_the_clean_history_audits_clean_and_checks_every_invariant() -> None:
    out = audit(clean())
    assert out.violations == []
    assert all(n > 0 for n in out.checked.values()), out.checked
    assert render(clean(), out).splitlines()[-1] == "violations: 0"


@pytest.mark.parametrize("plant", PLANTED, ids=lambda f: f.__name__)
def test_each_planted_violation_is_reported_once(plant: Callable[[History], None]) -> None:
    h = clean()
    plant(h)
    if plant not in FIGURES_KEPT:
        with_figures(h)  # the broker's figures follow the planted rows: only the plant shows
    out = audit(h)
    assert len(out.violations) == 1, [v.detail for v in out.violations]
    text = render(h, out)
    assert text.splitlines()[-1] == "violations: 1"
    assert "VIOLATION " + out.violations[0].check in text


def test_a_holder_letting_go_during_its_grace_is_no_violation() -> None:
    h = clean()
    preempted_before_its_grace(h)
    h.record(
        "call",
        t=T0 + 499.9,
        client="spawner",
        what="release",
        method="DELETE",
        path="grants",
        status=200,
        released="g1",
    )
    assert audit(h).violations == []
    h = clean()
    preempted_before_its_grace(h)
    h.record(
        "call",
        t=T0 + 499,
        client="alice",
        what="stop",
        method="DELETE",
        path="hub/api/users/alice/server",
        status=202,
    )
    assert audit(h).violations == []


def test_a_stop_asked_before_the_announcement_and_ending_in_the_grace_is_letting_go() -> None:
    """Soak seed 21: the user asked to stop the server, the broker announced a preemption
    while the stop was under way, and the server ended 1 s before the deadline. The call's
    event is stamped when it ended; it was asked for ``ms`` before that, during the grant."""
    h = clean()
    preempted_before_its_grace(h)  # announced at T0 + 498, released at T0 + 500
    h.record(
        "call",
        t=T0 + 497,
        client="alice",
        what="stop",
        method="DELETE",
        path="hub/api/users/alice/server",
        status=204,
        ms=3000.0,  # asked for at T0 + 494, during g1 (granted at T0)
    )
    assert audit(h).violations == []


def test_a_server_killed_by_a_fault_during_the_grace_is_its_holder_gone() -> None:
    """CI soak seed 884206: a fault killed the preempted server 0.5 s before the deadline;
    the spawner released its grant then (recorded as the preemption)."""
    h = clean()
    preempted_before_its_grace(h)  # announced at T0 + 498, released at T0 + 500
    h.record("fault", t=T0 + 499.5, fault="server_kill9", target="server of alice pid 4242",
             hold_s=3.0, recovered_s=1.9)
    assert audit(h).violations == []
    h = clean()
    preempted_before_its_grace(h)
    h.record("fault", t=T0 + 499.5, fault="server_kill9", target="server of bob pid 4242",
             hold_s=3.0, recovered_s=1.9)  # another user's server: not this grant's holder
    assert [v.check for v in audit(h).violations] == ["preemption_notice"]


def test_a_stop_of_an_earlier_server_is_not_letting_go_of_this_grant() -> None:
    h = clean()
    preempted_before_its_grace(h)
    h.record(
        "call",
        t=T0 + 2,  # ended after g1 was granted, but asked for before it: an earlier server
        client="alice",
        what="stop",
        method="DELETE",
        path="hub/api/users/alice/server",
        status=204,
        ms=5000.0,
    )
    assert [v.check for v in audit(h).violations] == ["preemption_notice"]


def test_time_the_broker_was_down_is_not_admission_time() -> None:
    h = clean()
    h.rows["grants"][3]["granted_at"] = T0 + 340  # r4 (T0 + 315) waits 25 s
    with_figures(h)
    assert [v.check for v in audit(h).violations] == ["admission"]
    h.record("fault", t=T0 + 316, fault="hub_kill9", target="hub", recovered_s=20.0)
    assert audit(h).violations == []  # 5 s of it while the broker served


def train_request_refused() -> History:
    h = clean()
    h.policy["gpus"] = {
        "G0": {"memory_mib": 1000, "pool": "interactive", "node": "lab-0"},
        "T0": {"memory_mib": 1000, "pool": "train", "node": "train-0"},
    }
    h.rows["requests"].append(  # inside vision's train guarantee, refused
        request("r9", "carol", "vision", "train", "job-1gpu", T0 + 600, status="refused")
    )
    return with_figures(h)


def test_a_teams_earlier_request_being_admitted_claims_its_guarantee_first() -> None:
    # seeds 105 and 106: a team's batch job asked at +595 and got the team's one train GPU at
    # +602 by preemption; its reclaim request at +600 came second and was refused. Refusing it
    # was right: the guarantee was the earlier request's
    h = train_request_refused()
    assert [v.check for v in audit(h).violations] == ["admission"]
    h.rows["requests"].append(request("r8", "dave", "vision", "train", "job-1gpu", T0 + 595))
    h.rows["grants"].append(grant("g8", "dave", "vision", "train", "batch", "job-8", 1000,
                                  [("T0", 1000, 1000)], T0 + 602, T0 + 650))
    assert audit(with_figures(h)).violations == []
    # one asked after it, or another team's, claims nothing of vision's guarantee
    for team, asked in (("vision", T0 + 601), ("nlp", T0 + 595)):
        other = train_request_refused()
        other.rows["requests"].append(request("r8", "dave", team, "train", "job-1gpu", asked))
        other.rows["grants"].append(grant("g8", "dave", team, "train", "batch", "job-8", 1000,
                                          [("T0", 1000, 1000)], T0 + 602, T0 + 650))
        assert "admission" in [v.check for v in audit(with_figures(other)).violations]


def test_a_guarantee_is_held_against_the_nodes_slurm_had_in_service() -> None:
    h = train_request_refused()
    assert [v.check for v in audit(h).violations] == ["admission"]
    # Slurm had train-0 up meanwhile: still the broker's refusal
    h.record("slurm_nodes", t=T0 + 603, states={"train-0": "idle", "lab-0": "idle"})
    assert [v.check for v in audit(h).violations] == ["admission"]
    # another pool's node out of service is no excuse
    h.record("slurm_nodes", t=T0 + 605, states={"train-0": "idle", "lab-0": "drained"})
    assert [v.check for v in audit(h).violations] == ["admission"]
    # the harness killed lab-0 meanwhile: another pool's node, no excuse
    h.record("fault", t=T0 + 598, fault="slurm_node_kill9", target="Slurm node lab-0",
             recovered_s=4.0)
    assert [v.check for v in audit(h).violations] == ["admission"]
    # the harness killed train-0 (Slurm still said mixed): the node was dead
    killed = train_request_refused()
    killed.record("fault", t=T0 + 596, fault="slurm_node_kill9",
                  target="Slurm node train-0 (running a job)", recovered_s=4.0)
    assert audit(killed).violations == []
    # Slurm itself had train-0 drained (after its slurmctld died): the capacity was gone
    h.record("slurm_nodes", t=T0 + 607, states={"train-0": "drained", "lab-0": "idle"})
    assert audit(h).violations == []


def test_a_5xx_from_ones_own_server_while_a_preemption_stops_it_is_no_violation() -> None:
    h = clean()
    g1 = h.rows["grants"][0]  # alice's server, T0 .. T0 + 500
    assert (g1["username"], g1["server"]) == ("alice", "")
    h.record("call", t=T0 + 490, client="alice", what="submit", method="POST",
             path="user/alice/gpushare/api/jobs", status=503, ms=56000.0)
    assert [v.check for v in audit(h).violations] == ["client_5xx"]  # a release of her own
    g1["end_kind"] = "preempted"  # (its announcement is another check's: left out here)
    assert five_hundreds(h) == []  # the broker's preemption stopped the server
    h.record("call", t=T0 + 600, client="alice", what="submit", method="POST",
             path="user/alice/gpushare/api/jobs", status=503, ms=100.0)
    h.record("call", t=T0 + 490, client="bob", what="submit", method="POST",
             path="user/bob/gpushare/api/jobs", status=503, ms=100.0)
    # after the preemption, and another user's call: both count
    assert sorted(v.detail.split()[0] for v in five_hundreds(h)) == ["alice", "bob"]


def five_hundreds(h: History) -> list[Any]:
    return [v for v in audit(h).violations if v.check == "client_5xx"]


def test_a_violation_found_in_a_saved_history_is_found_again_by_replay(tmp_path: Path) -> None:
    h = clean()
    over_allocated_gpu(h)
    with_figures(h)
    saved = h.save(tmp_path / "history.json")
    again = soak_history.load(saved)
    assert [v.detail for v in audit(again).violations] == [v.detail for v in audit(h).violations]
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "soak.py"), "--replay", str(saved)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == "violations: 1"
    assert "GPU G0 holds 1250 MiB of 1000 MiB" in proc.stdout
    clean_file = clean().save(tmp_path / "clean.json")
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "soak.py"), "--replay", str(clean_file)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "violations: 0", proc.stdout


def test_a_file_that_is_not_a_history_is_refused_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    with pytest.raises(SystemExit, match="x.json: format"):
        soak_history.load(bad)


def test_the_clean_history_is_not_changed_by_auditing() -> None:
    h = clean()
    before = copy.deepcopy(h.to_json())
    audit(h)
    assert h.to_json() == before


def test_the_schedule_of_chosen_kinds_holds_only_those_and_names_an_unknown_one() -> None:
    from soak.faults import KINDS, schedule

    everything = schedule(7, 30, 25)
    # the first round has each kind once; SQLite's database fault is a lock; no Slurm here
    assert {p.kind for p in everything} == set(KINDS) - {
        "db_stopped", "slurm_node_kill9", "slurm_ctld_kill9"}
    on_pg = {p.kind for p in schedule(7, 30, 25, db="postgresql", slurm=True)}
    assert on_pg == set(KINDS) - {"db_locked"}  # PostgreSQL's is a stop and a start
    with pytest.raises(ValueError, match="unknown kind db_locked with --db postgresql"):
        schedule(7, 30, 25, ["db_locked"], db="postgresql")
    with pytest.raises(ValueError, match="unknown kind slurm_node_kill9 with --db sqlite"):
        schedule(7, 30, 25, ["slurm_node_kill9"])
    hubs = schedule(7, 30, 25, ["hub_kill9", "hub_term"])
    assert {p.kind for p in hubs} == {"hub_kill9", "hub_term"}
    assert len(hubs) == pytest.approx(len(everything), abs=len(everything) // 4)
    assert schedule(7, 30, 25, ["hub_kill9"]) == schedule(7, 30, 25, ["hub_kill9"])
    with pytest.raises(ValueError, match="--faults: unknown kind hub_kill"):
        schedule(7, 30, 25, ["hub_kill"])
