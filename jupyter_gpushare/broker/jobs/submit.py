"""Submitting a job: every check before anything is stored, then admission, then the row.

The order is the one a user can act on: the profile and team (the policy's rules, as for
servers: :func:`~jupyter_gpushare.core.rules.check_request`), the priority, the notebook,
the parameters, the runtime and checkpointing, the output path, the per-user bound. Any
failure is a :class:`~.errors.BrokerError` naming the field and nothing is written. Then
the batch request goes through the broker's own admission (:meth:`Broker.submit`): a
refusal (the debug pool never queues, a budget is spent) is answered 409 and stores no
job; queued or granted, the job is written in one transaction.

A submission may carry an ``idempotency_key`` (what the lab's server sends): sent again
after its answer was lost (a broker killed after storing the job), it is answered with the
job it made (200) and makes nothing new.
"""

from __future__ import annotations

import json
import os
import posixpath
import sys
import time
from typing import TYPE_CHECKING, Any

from ...core import rules
from ...core.jobs import (
    JobState,
    RuntimeRules,
    effective_runtime,
    kernel_name_of,
    validate_notebook,
    validate_parameters,
    validate_runtime,
)
from ...core.model import Kind, Profile, Request
from ..errors import BrokerError
from ..service.fields import shorten
from ..service.ids import new_id
from ..service.ratelimit import request_buckets, retry_after
from ..store.serial import iso, request_to_spec
from .store import Job

if TYPE_CHECKING:
    from .runner import JobManager

MAX_PATH = 1024
KERNELS_TTL_S = 30.0  # how long a list of installed kernels is trusted
_kernels_seen: list[tuple[float, frozenset[str]]] = []  # (when, names): the last look


def _field(name: str, message: str, status: int = 400) -> BrokerError:
    return BrokerError(status, message, name)


def _opt_str(body: dict[str, Any], key: str, max_len: int = 255) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > max_len:
        raise _field(key, f"{key} must be a string of at most {max_len} characters")
    return value


def clean_relative(path: str, key: str) -> str:
    """A path inside the user's files: relative, no '..', no NUL; normalised."""
    if "\x00" in path or path.startswith(("/", "~")) or "\\" in path:
        raise _field(key, f"{key} must be a path relative to your files")
    norm = posixpath.normpath(path)
    if norm == ".." or norm.startswith("../") or norm == ".":
        raise _field(key, f"{key} is outside your files")
    return norm


def _notebook_label(body: dict[str, Any]) -> str:
    """How a refusal names the notebook: its name or path as sent, shortened."""
    label = body.get("name") or body.get("path")
    return shorten(label) if isinstance(label, str) and label else "the notebook"


def check_kernel(manager: JobManager, notebook: dict[str, Any], label: str) -> None:
    """The notebook must name its kernel (``metadata.kernelspec.name``) and, where the
    broker can know it (the local backend runs jobs with the broker's own Python), that
    kernel must be installed; else a 400 naming the notebook and the field, before a GPU
    share is held for a run that cannot start."""
    kernel = kernel_name_of(notebook)
    if not isinstance(kernel, str):
        raise _field(kernel.field, f"{label}: {kernel.message}", kernel.status)
    installed = installed_kernels(manager)
    if installed is not None and kernel.lower() not in installed:
        raise _field(
            "notebook.metadata.kernelspec.name",
            f"{label}: its kernel {shorten(kernel)} is not installed where jobs run here "
            f"(installed: {', '.join(sorted(installed)) or 'none'})",
        )


def installed_kernels(manager: JobManager) -> frozenset[str] | None:
    """Names (lower case) of the kernels a job can start, or ``None`` where the broker
    cannot know them: a cluster backend, another Python, or jobs run as their user (who
    may have kernels of their own, which the broker, as root, does not look for in a home
    folder the user controls)."""
    backend = manager.backend
    if backend.name != "local" or getattr(backend, "python", sys.executable) != sys.executable:
        return None
    if str(getattr(backend, "run_as", "hub")) == "user":
        return None
    now = time.monotonic()
    if _kernels_seen and now - _kernels_seen[0][0] < KERNELS_TTL_S:
        return _kernels_seen[0][1]
    names = _find_kernels(manager)
    _kernels_seen[:] = [(now, names)]
    return names


def _find_kernels(manager: JobManager) -> frozenset[str]:
    from jupyter_client.kernelspec import KernelSpecManager

    ksm = KernelSpecManager()
    dirs = list(ksm.kernel_dirs)
    extra = getattr(manager, "extra_env", {}) or {}
    for root in str(extra.get("JUPYTER_PATH", "")).split(os.pathsep):
        if root:  # the admin's extra_env reaches every job
            dirs.insert(0, os.path.join(root, "kernels"))
    ksm.kernel_dirs = dirs
    return frozenset(name.lower() for name in ksm.find_kernel_specs())


def build_job(
    manager: JobManager, *, user: str, user_teams: tuple[str, ...], is_admin: bool,
    server: str, body: dict[str, Any], body_bytes: int,
) -> tuple[Job, Request, str]:
    """Validate a submission; the job (not stored), its batch request and the snapshot."""
    policy = manager.broker.policy
    limits = manager.limits
    if not manager.enabled:
        raise BrokerError(403, "batch jobs are switched off on this hub")
    if body_bytes > limits.max_notebook_bytes + limits.max_parameters_bytes + 65536:
        raise _field("notebook", f"the request is too large (at most "
                     f"{limits.max_notebook_bytes} bytes of notebook)", 413)
    slug = _opt_str(body, "profile")
    explicit_pool: str | None = None
    if slug:
        profile = policy.profile(slug)
        if profile is None:
            raise _field("profile", f"unknown profile {shorten(slug)}")
        if profile.gpu.is_empty or not profile.pool:
            raise _field("profile", f"profile {slug} has no GPU: batch jobs run under a GPU grant")
        priority = _opt_str(body, "priority") or profile.priority
    elif body.get("gpu") is not None or body.get("pool") is not None:
        # an explicit GPU ask, where the policy allows one (rules.check_request says)
        from ..service.fields import Fields

        explicit_pool = _opt_str(body, "pool")
        if not explicit_pool or policy.pool(explicit_pool) is None:
            raise _field("pool", f"unknown pool {shorten(explicit_pool)}")
        gpu = Fields(manager.broker.limits).gpu_ask(body.get("gpu"))
        priority = _opt_str(body, "priority") or ""
        if not priority:
            raise _field("priority", "an explicit GPU ask needs a priority class")
        profile = Profile(slug="", display_name="explicit", pool=explicit_pool, gpu=gpu,
                          priority=priority, cpu_milli=0, memory_mib=0)
    else:
        raise _field("profile", "profile is required (a profile slug)")
    rules_profile = profile if explicit_pool is None else None
    what = f"profile {slug}" if slug else f"explicit GPU asks in pool {explicit_pool}"
    team = _opt_str(body, "team")
    if team is None:
        team, refusal = rules.choose_team(
            policy, user_teams=user_teams, profile=rules_profile, explicit_pool=explicit_pool,
            priority=priority, is_admin=is_admin,
        )
        if team is None and refusal is None:
            raise BrokerError(403, f"{user} is in no team that may use {what}", "profile")
    else:
        refusal = rules.check_request(
            policy, user_teams=user_teams, team=team, profile=rules_profile,
            explicit_pool=explicit_pool, priority=priority, is_admin=is_admin,
        )
    if refusal is not None:
        field = "profile" if refusal.code == rules.PROFILE_NOT_FOR_TEAM else refusal.field
        status = 400 if refusal.code == rules.UNKNOWN_PRIORITY else 403
        raise BrokerError(status, refusal.message, field)
    assert team is not None
    prio = policy.priority(priority)
    assert prio is not None
    notebook = body.get("notebook")
    try:
        text = json.dumps(notebook, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise _field("notebook", "the notebook must be plain JSON") from exc
    bad = validate_notebook(notebook, len(text), limits)
    if bad is not None:
        raise _field(bad.field, bad.message, bad.status)
    assert isinstance(notebook, dict)  # validate_notebook says so
    check_kernel(manager, notebook, _notebook_label(body))
    params = body.get("parameters") or {}
    bad = validate_parameters(params, limits)
    if bad is not None:
        raise _field(bad.field, bad.message, bad.status)
    asked = body.get("max_runtime", body.get("max_runtime_s"))
    if asked is not None and (
        isinstance(asked, bool) or not isinstance(asked, int) or not 0 < asked < 10**9
    ):
        raise _field("max_runtime", "max_runtime must be a positive whole number of seconds")
    checkpoint = body.get("checkpoint", False)
    if not isinstance(checkpoint, bool):
        raise _field("checkpoint", "checkpoint must be true or false")
    run_rules = RuntimeRules(
        profile_max_s=profile.max_lifetime_s,
        priority_preemptible=prio.preemptible,
        checkpoint_required_after_s=prio.checkpoint_required_after_s,
        grace_period_s=prio.grace_period_s,
    )
    bad = validate_runtime(asked, checkpoint, run_rules, limits)
    if bad is not None:
        raise _field(bad.field, bad.message, bad.status)
    runtime = effective_runtime(asked, run_rules, limits)
    backend = _opt_str(body, "backend") or manager.backend.name
    if backend != manager.backend.name:
        raise _field(
            "backend", f"unknown backend {shorten(backend)} (this hub: {manager.backend.name})"
        )
    path = _opt_str(body, "path", MAX_PATH)
    path = clean_relative(path, "path") if path else ""
    name = _opt_str(body, "name") or (posixpath.basename(path) if path else "notebook.ipynb")
    if "/" in name or not name.strip():
        raise _field("name", "name must be a file name")
    job_id = new_id("job")
    output = _opt_str(body, "output_path", MAX_PATH)
    if output:
        output = clean_relative(output, "output_path")
        if not output.endswith(".ipynb"):
            raise _field("output_path", "output_path must end with .ipynb")
    else:
        stem = name[:-6] if name.endswith(".ipynb") else name
        output = posixpath.join(posixpath.dirname(path), f"{stem}-{job_id[-8:]}.ipynb")
    root = manager.user_root(user)
    full = os.path.realpath(os.path.join(root, output))
    if not full.startswith(root.rstrip("/") + "/"):
        raise _field("output_path", "output_path is outside your files")
    if manager.store.waiting_of(user) >= limits.max_queued_per_user:
        raise BrokerError(
            429, f"you have {limits.max_queued_per_user} unfinished jobs, the most allowed; "
            "wait for some to end or cancel some", "max_queued_per_user",
        )
    now = manager.broker.clock()
    request = Request(
        id=new_id("r"), user=user, team=team, pool=profile.pool, gpu=profile.gpu,
        priority=priority, kind=Kind.BATCH, holder=job_id, profile=profile.slug,
        cpu_milli=profile.cpu_milli, memory_mib=profile.memory_mib,
        gpu_models=profile.gpu_models, checkpointing=checkpoint, max_runtime_s=runtime,
        created_at=now,
    )
    job = Job(
        id=job_id, user=user, team=team, server=server, name=name, path=path,
        profile=profile.slug, pool=profile.pool, priority=priority,
        request_spec=request_to_spec(request), parameters=params, max_runtime_s=runtime,
        checkpoint=checkpoint, backend=backend, output_path=output, state=JobState.QUEUED,
        request_id=request.id, created_at=now, updated_at=now,
    )
    return job, request, text


def submit_job(
    manager: JobManager, *, user: str, user_teams: tuple[str, ...], is_admin: bool,
    server: str, body: dict[str, Any], body_bytes: int,
) -> tuple[int, dict[str, Any]]:
    """Validate, admit and store a job; (HTTP status, answer)."""
    key = idempotency_key(body)
    if key is not None:
        earlier = manager.store.find_idempotent(user, key)
        if earlier is not None:  # a retry of a submission that was stored: the same job
            return 200, job_view(manager, earlier)
    job, request, text = build_job(
        manager, user=user, user_teams=user_teams, is_admin=is_admin, server=server,
        body=body, body_bytes=body_bytes,
    )
    take_rate_token(manager, user)
    answer = manager.broker.submit(request)
    if answer["status"] == "refused":
        return 409, {
            "state": "refused", "reason": answer["reason"], "code": answer["code"],
            "job": None, "request": answer,
        }
    history: list[tuple[str | None, str, str]] = [
        (None, "queued", f"submitted by {user}: {answer['reason']}".rstrip(": "))
    ]
    if answer["status"] == "granted" and answer.get("grant_id"):
        grant = answer["grant"] or {}
        job.state = JobState.ADMITTED
        job.grant_id = answer["grant_id"]
        job.reason = f"admitted: granted {grant.get('units', 0):g} GPU on {grant.get('node')}"
        history.append(("queued", "admitted", job.reason))
    else:
        job.reason = answer["reason"]
    job.idempotency_key = key
    manager.store.insert(job, text, history)
    manager.wake.set()
    return 201, job_view(manager, job, answer)


def idempotency_key(body: dict[str, Any]) -> str | None:
    """The submission's ``idempotency_key``: 1-255 printable ASCII characters, or none."""
    key = _opt_str(body, "idempotency_key")
    if key is not None and not (key and key.isascii() and key.isprintable()):
        raise _field("idempotency_key", "idempotency_key must be 1-255 printable ASCII characters")
    return key


def take_rate_token(manager: JobManager, user: str) -> None:
    """A submission that reaches admission stores a request row, refused or not: it takes a
    token of the user's ``POST /requests`` bucket (the same
    :class:`~.ratelimit.TokenBuckets`), else 429 with Retry-After, storing nothing."""
    buckets = request_buckets(manager.broker)
    wait = buckets.take(user) if buckets is not None else None
    if wait is None:
        return
    limits = manager.broker.limits
    after = retry_after(wait)
    raise BrokerError(
        429,
        f"too many requests for {shorten(user)}: at most "
        f"{limits.requests_per_minute_per_user:g} a minute after a burst of "
        f"{limits.request_burst_per_user} (BrokerLimits.requests_per_minute_per_user); "
        f"retry in {after} s",
        headers={"Retry-After": after},
        code="requests_per_minute_per_user",
    )


def job_view(
    manager: JobManager, job: Job, answer: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The JSON of a job (also what the lab's jobs panel shows)."""
    broker = manager.broker
    now = broker.clock()
    position = None
    expected = None
    req = broker.queue.get(job.request_id or "")
    if job.state is JobState.QUEUED and req is not None:
        position = broker.position(req)
        expected = broker.expected_wait(req, now)
    hours = job.gpu_hours
    grant = broker.state.grants.get(job.grant_id or "")
    if grant is not None:
        hours += grant.units_milli / 1000 * max(0.0, now - grant.granted_at) / 3600.0
    ended = job.ended_at
    runtime = (ended or now) - job.started_at if job.started_at else None
    queue_reason = None
    if job.state is JobState.QUEUED:
        queue_reason = answer["reason"] if answer else job.reason
    return {
        "id": job.id,
        "user": job.user,
        "team": job.team,
        "server": job.server,
        "name": job.name,
        "path": job.path,
        "profile": job.profile,
        "pool": job.pool,
        "priority": job.priority,
        "parameters": job.parameters,
        "max_runtime": job.max_runtime_s,
        "checkpoint": job.checkpoint,
        "backend": job.backend,
        "state": job.state.value,
        "reason": job.reason,
        "queue_reason": queue_reason,
        "position": position,
        "expected_wait_s": expected,
        "attempt": job.attempt,
        "request_id": job.request_id,
        "grant_id": job.grant_id,
        "borrowed": grant.borrowed if grant is not None else None,
        "preemption": (
            {"reason": broker.preempt_info[grant.id][0],
             "deadline": iso(broker.preempt_info[grant.id][1])}
            if grant is not None and grant.id in broker.preempt_info else None
        ),
        "output_path": job.output_path,
        "error": job.error,
        "gpu_hours": round(hours, 6),
        "runtime_s": round(runtime, 3) if runtime is not None else None,
        "created_at": iso(job.created_at),
        "started_at": iso(job.started_at),
        "ended_at": iso(job.ended_at),
        "updated_at": iso(job.updated_at),
    }
