"""A Slurm job missing from a state listing that may predate it is asked about again before
it is called gone.

Found by CI under load: the broker submitted a job and, 0.24 s later, polled it against the
``squeue`` listing its commands part had cached from before the ``sbatch`` (the cache lives
``min_poll_interval_s``). The job was not in it, so the broker failed it as "gone (slurmctld
no longer knows it) without a result", while Slurm ran it to a clean exit. The watch now asks
again with a fresh listing before it believes a launched job gone.

The watch part is driven with a stand-in for its commands part (the part it is handed), whose
cached listing lacks the job and whose fresh one has it: the race itself cannot be timed
against a real slurmctld.
"""

from __future__ import annotations

from pathlib import Path

from jupyter_gpushare.backends.base import RunHandle
from jupyter_gpushare.backends.slurm import SlurmBackend
from jupyter_gpushare.backends.slurm_state import SlurmJob

JOB = "job-0123456789abcdef0123"


class Listing:
    """The commands part as the watch uses it: a cached listing without the job, a fresh one
    with it (running), or with nothing at all (``known=False``)."""

    def __init__(self, known: bool) -> None:
        self.known = known
        self.asked: list[bool] = []

    def show_job(self, slurm_id: str, *, fresh: bool = False) -> SlurmJob | None:
        self.asked.append(fresh)
        if not fresh or not self.known:
            return None
        return SlurmJob(slurm_id, f"gpushare-{JOB}-a1", "RUNNING", "None", None, None,
                        "node-0", 1.0, None)


def backend_with(tmp_path: Path, listing: Listing) -> tuple[SlurmBackend, RunHandle]:
    backend = SlurmBackend(jobs_dir=str(tmp_path / "jobs"), min_poll_interval_s=60.0)
    backend.watch.commands = listing  # type: ignore[assignment]
    attempt = tmp_path / "jobs" / JOB / "attempt-1"
    attempt.mkdir(parents=True)
    (attempt / "launched").write_text("")
    return backend, RunHandle("slurm", JOB, 1, {"slurm_job_id": "5"})


def test_a_launched_job_missing_from_a_cached_listing_is_asked_about_again(
    tmp_path: Path,
) -> None:
    listing = Listing(known=True)
    backend, handle = backend_with(tmp_path, listing)
    status = backend.poll(handle)
    assert status.alive, status
    assert listing.asked == [False, True]  # the cached listing, then a fresh one


def test_a_job_no_fresh_listing_knows_is_gone(tmp_path: Path) -> None:
    listing = Listing(known=False)
    backend, handle = backend_with(tmp_path, listing)
    status = backend.poll(handle)
    assert not status.alive
    assert "gone" in (status.error or {}).get("summary", ""), status


class Reused:
    """The commands part after slurmctld restarted without its state: the run's id now names
    another job (``gpushare-<other>-a1``), running."""

    def show_job(self, slurm_id: str, *, fresh: bool = False) -> SlurmJob | None:
        return SlurmJob(slurm_id, "gpushare-job-ffffffffffffffffffff-a1", "RUNNING", "None",
                        None, None, "node-0", 1.0, None)


def test_an_id_that_names_another_job_after_a_slurmctld_restart_is_the_run_gone(
    tmp_path: Path,
) -> None:
    backend, handle = backend_with(tmp_path, Listing(known=True))
    backend.watch.commands = Reused()  # type: ignore[assignment]
    assert backend.watch.slurm_job(handle) is None
    status = backend.poll(handle)
    assert not status.alive  # not "running" on someone else's job
    assert "gone" in (status.error or {}).get("summary", ""), status
