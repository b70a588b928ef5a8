"""Why an admitted job pod has not started, in plain words (pure: dicts in, words out).

Once Kueue has let a Job run, its pod can still wait before the notebook starts: the
scheduler finds no node (``PodScheduled=False``, ``Unschedulable``), a volume cannot be
attached or mounted (the container stays ``ContainerCreating``; the cause, e.g. a
``Multi-Attach error`` of a ReadWriteOnce volume, is only in the pod's events), the image
cannot be pulled (``ErrImagePull``/``ImagePullBackOff``), or the container cannot be
created from its configuration (``CreateContainerConfigError``). :func:`pod_wait` reads the
pod's container statuses, its ``PodScheduled`` condition and, for a container still being
created, its events, and says which of these holds; the backend decides what is terminal.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .kube_status import timestamp

TEXT_LIMIT = 240
"""The most characters of a waiting reason (the broker keeps at most 300)."""

IMAGE_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull",
                           "RegistryUnavailable", "ImageInspectError"})
CONFIG_REASONS = frozenset({"CreateContainerConfigError", "InvalidImageName"})
CREATING_REASONS = frozenset({"ContainerCreating", "PodInitializing"})


@dataclass(frozen=True)
class PodWait:
    """One reason why a pod's container has not started."""

    kind: str  # "image" | "config" | "volume" | "unschedulable" | "creating" | "other"
    code: str  # Kubernetes' word for it (ImagePullBackOff, Unschedulable, FailedMount...)
    text: str  # "waiting: ..." in plain words, at most TEXT_LIMIT characters
    image: str = ""
    cause: str = ""  # for an image: why it cannot be pulled, where the message says


def short(text: Any, limit: int = TEXT_LIMIT) -> str:
    """``text`` on one line, at most ``limit`` characters."""
    one = " ".join(str(text or "").split())
    return one if len(one) <= limit else one[: limit - 3].rstrip() + "..."


def _container_status(pod: Mapping[str, Any], container: str) -> dict[str, Any] | None:
    status = pod.get("status") or {}
    for cs in (status.get("initContainerStatuses") or []) + (
            status.get("containerStatuses") or []):
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting and (cs.get("name") == container or waiting.get("reason")
                        not in CREATING_REASONS):
            return dict(cs)
    for cs in status.get("containerStatuses") or []:
        if cs.get("name") == container:
            return dict(cs)
    return None


def _image_of(pod: Mapping[str, Any], cs: Mapping[str, Any]) -> str:
    if cs.get("image"):
        return str(cs["image"])
    spec = pod.get("spec") or {}
    for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        if c.get("name") == cs.get("name"):
            return str(c.get("image") or "")
    return ""


_PULL_CAUSES = (
    (re.compile(r"not found|manifest unknown|NotFound|does not exist", re.I),
     "not found in the registry"),
    (re.compile(r"unauthori[sz]ed|denied|forbidden|authenticat|401|403", re.I),
     "the registry refused access (check the image name and imagePullSecrets)"),
    (re.compile(r"no such host|i/o timeout|connection refused|dial tcp|TLS handshake", re.I),
     "the registry cannot be reached"),
)


def pull_cause(message: str) -> str:
    """Why an image cannot be pulled, from the kubelet's message ('' for a back-off)."""
    if not message or message.lower().startswith("back-off pulling image"):
        return ""
    for pattern, words in _PULL_CAUSES:
        if pattern.search(message):
            return words
    return short(message, 120)


def image_text(image: str, cause: str, code: str = "ImagePullBackOff") -> str:
    """``waiting: the image X cannot be pulled: <cause> (ImagePullBackOff)``."""
    return short(f"waiting: the image {image or '(unnamed)'} cannot be pulled"
                 + (f": {cause}" if cause else "") + f" ({code})")


def _when(event: Mapping[str, Any]) -> float:
    series = (event.get("series") or {}).get("lastObservedTime")
    for text in (event.get("lastTimestamp"), series, event.get("eventTime"),
                 event.get("firstTimestamp")):
        when = timestamp(text)
        if when is not None:
            return when
    return 0.0


def latest_event(events: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The pod's newest event (a Warning wins a tie)."""
    ranked = sorted(events, key=lambda e: (_when(e), e.get("type") == "Warning"))
    return ranked[-1] if ranked else None


_MULTI_ATTACH = re.compile(r"Multi-Attach error for volume \S+ (.*)", re.I)


def _creating(events: Iterable[Mapping[str, Any]], code: str) -> PodWait:
    event = latest_event(events)
    if event is not None and event.get("type") == "Warning":
        reason = str(event.get("reason") or "")
        message = str(event.get("message") or "")
        if "multi-attach" in message.lower():
            found = _MULTI_ATTACH.search(message)
            detail = short(found.group(1) if found else message, 110)
            return PodWait("volume", "Multi-Attach", short(
                f"waiting: the user's volume is attached on another node (Multi-Attach error: "
                f"{detail}; a ReadWriteOnce volume: the job starts once it is free, e.g. when "
                "the user's server stops)"))
        if reason in ("FailedAttachVolume", "FailedMount"):
            return PodWait("volume", reason, short(
                f"waiting: a volume of the pod cannot be mounted yet ({reason}: {message})"))
        return PodWait("other", reason or code, short(
            f"waiting: the container is being created ({reason or code}: {message})"))
    if event is not None and event.get("reason") == "Pulling":
        return PodWait("creating", "Pulling",
                       short(f"waiting: pulling the image ({event.get('message') or ''})"))
    return PodWait("creating", code, f"waiting: the container is being created ({code})")


def _failed_pull(events: Iterable[Mapping[str, Any]], image: str) -> str:
    """The cause of the newest failed pull of ``image`` in the pod's events (the kubelet's
    ``Failed`` Warning carries the registry's words; its back-off says none)."""
    failed = [e for e in events if e.get("type") == "Warning" and e.get("reason") == "Failed"
              and image in str(e.get("message") or "")]
    event = latest_event(failed)
    return pull_cause(str(event.get("message") or "")) if event is not None else ""


def pod_wait(pod: Mapping[str, Any], container: str,
             events: Iterable[Mapping[str, Any]] | None = None) -> PodWait | None:
    """Why ``pod`` has not started ``container`` (None: it is no longer Pending).

    ``events`` are the pod's events; they matter only for a container still being created
    and an image pull in back-off (:func:`needs_events` says when to read them)."""
    status = pod.get("status") or {}
    if status.get("phase") not in (None, "Pending"):
        return None
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            code = str(cond.get("reason") or "Unschedulable")
            return PodWait("unschedulable", code, short(
                f"waiting: no node can take the job's pod yet ({code}: "
                f"{cond.get('message') or 'no node fits'})"))
    cs = _container_status(pod, container)
    waiting = ((cs or {}).get("state") or {}).get("waiting") if cs else None
    if not waiting:  # scheduled, no container status yet (or a running init container)
        return PodWait("creating", "Pending", "waiting: the job's pod is starting")
    code = str(waiting.get("reason") or "ContainerCreating")
    message = str(waiting.get("message") or "")
    assert cs is not None
    if code in IMAGE_REASONS:
        image = _image_of(pod, cs)
        cause = pull_cause(message) or _failed_pull(events or (), image)
        shown = "ImagePullBackOff" if code == "ErrImagePull" else code
        return PodWait("image", shown, image_text(image, cause, shown), image, cause)
    if code in CONFIG_REASONS:
        return PodWait("config", code, short(
            f"the job's container cannot be created from its configuration ({code}: "
            f"{message or 'no message'})"))
    if code in CREATING_REASONS:
        return _creating(events or (), code)
    return PodWait("other", code, short(
        f"waiting: the container has not started ({code}" + (f": {message})" if message
                                                            else ")")))


def needs_events(pod: Mapping[str, Any], container: str) -> bool:
    """Whether the pod waits in ``ContainerCreating``, or for an image in back-off: the
    cause is only in its events."""
    status = pod.get("status") or {}
    if status.get("phase") not in (None, "Pending"):
        return False
    if any(c.get("type") == "PodScheduled" and c.get("status") == "False"
           for c in status.get("conditions") or []):
        return False
    cs = _container_status(pod, container)
    waiting = ((cs or {}).get("state") or {}).get("waiting") or {}
    code = str(waiting.get("reason") or "")
    return code in CREATING_REASONS or (
        code in IMAGE_REASONS and not pull_cause(str(waiting.get("message") or "")))


@dataclass
class _Seen:
    kind: str
    since: float
    cause: str


class WaitTracker:
    """Since when each live attempt has waited for the same kind of thing, and the best
    cause seen of an image that cannot be pulled (the kubelet alternates ``ErrImagePull``,
    which says why, and ``ImagePullBackOff``, which does not: the text stays the same).
    Holds only attempts the backend polls while they wait (:meth:`clear` when they run or
    end), in memory: a restarted broker starts their clocks again."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, int], _Seen] = {}

    def see(self, key: tuple[str, int], wait: PodWait, now: float) -> tuple[PodWait, float]:
        """``wait`` with its stable text, and how long the attempt has waited for it."""
        seen = self._seen.get(key)
        if seen is None or seen.kind != wait.kind:
            seen = self._seen[key] = _Seen(wait.kind, now, "")
        if wait.kind == "image":
            seen.cause = wait.cause or seen.cause
            wait = PodWait(wait.kind, wait.code, image_text(wait.image, seen.cause, wait.code),
                           wait.image, seen.cause)
        return wait, now - seen.since

    def clear(self, key: tuple[str, int]) -> None:
        self._seen.pop(key, None)

    def forget(self, job_id: str) -> None:
        for key in [k for k in self._seen if k[0] == job_id]:
            del self._seen[key]

    def __len__(self) -> int:
        return len(self._seen)


def terminal(wait: PodWait, waited_s: float, image_pull_timeout_s: float) -> str | None:
    """Why the attempt must end now (None: it keeps waiting, saying why).

    A configuration the container cannot be created from (``CreateContainerConfigError``,
    ``InvalidImageName``) never heals by waiting; an image that cannot be pulled for longer
    than ``image_pull_timeout_s`` is given up. A volume attached elsewhere, a pod no node
    can take yet, a container being created: they wait (the Job's ``activeDeadlineSeconds``
    still ends the attempt at its maximum runtime)."""
    if wait.kind == "config":
        return short(wait.text[0].upper() + wait.text[1:], TEXT_LIMIT)
    if wait.kind == "image" and waited_s >= image_pull_timeout_s:
        cause = f": {wait.cause}" if wait.cause else ""
        return short(f"the image {wait.image or '(unnamed)'} could not be pulled{cause} "
                     f"({wait.code} for {waited_s:.0f} s, over "
                     f"c.KubeJobsBackend.image_pull_timeout_s = {image_pull_timeout_s:g} s)")
    return None
