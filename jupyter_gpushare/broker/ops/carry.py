"""What a broker hands on to the one that takes over from it: the hub's recent answers about
tokens and groups (never anything of the database).

A broker learns from the hub which identity a token has (the authenticator keeps the answer
``cache_max_age``, 300 s) and a user's groups (the hub client keeps them ``groups_ttl_s``, 60 s).
A broker killed and replaced by its warm standby (:mod:`.supervisor`) took those answers with it,
so the new broker's first requests each waited for the hub again: one round trip for the token,
one for the groups of a user the caller did not name groups for, 30-160 ms with a busy hub
(``benchmarks/broker_takeover.py``), at the moment every client resends what the kill cut.

So the serving broker appends each answer it learns to a file (it is told each one: it is
the second memory of the authenticator and of the hub client, ``auth.memory`` and
``hub.memory``, which also ask it what they do not know) in its working folder (one JSON
line; a token only as its SHA-256, the file mode 0600, never through a link), and the standby
reads the file ahead (:meth:`Carry.read`, again at takeover: only what was appended since)
and answers from them. Each keeps the time the hub gave it, on the wall clock: it
expires when it would have in the broker that learnt it, so a revoked token or a changed group
takes effect no later than before. The file is rewritten from what is still fresh when it has
grown ``COMPACT_AFTER`` lines; its first line is new for each file written anew, so a reader
that sees another one reads it from the start. A file owned by another user, or one others may
read or write, is not used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ..hubclient import HubClient

log = logging.getLogger("gpushare.carry")

COMPACT_AFTER = 20_000  # lines appended before the file is rewritten from what is fresh
MAX_READ_BYTES = 64 << 20  # a file bigger than this is not ours: ignored


class TokenAnswer(Protocol):
    """The hub's answer about a token as an authenticator holds it (``api.auth.TokenAnswer``:
    this module is below the HTTP layer, so it names only what it reads)."""

    @property
    def identity(self) -> Any: ...
    @property
    def expires(self) -> float | None: ...
    @property
    def confirmed(self) -> float | None: ...


class Authenticator(Protocol):
    """What the carry uses of a ``TokenAuthenticator``."""

    memory: Any  # its second memory: the carry, once handed over

    def answers(self) -> Mapping[str, TokenAnswer]: ...


def token_key(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def identity_doc(identity: Any) -> dict[str, Any]:
    """An identity (a dataclass of strings, tuples and frozensets of strings) as JSON: a
    tuple as a list, a frozenset as ``{"set": [...]}``."""
    doc: dict[str, Any] = {}
    for f in dataclasses.fields(identity):
        value = getattr(identity, f.name)
        doc[f.name] = (
            {"set": sorted(value)}
            if isinstance(value, frozenset)
            else (list(value) if isinstance(value, tuple) else value)
        )
    return doc


def identity_from_doc(identity_type: Callable[..., Any], doc: dict[str, Any]) -> Any:
    """What :func:`identity_doc` wrote, as ``identity_type`` again."""

    def value(v: Any) -> Any:
        if isinstance(v, dict):
            return frozenset(map(str, v["set"]))
        return tuple(map(str, v)) if isinstance(v, list) else v

    return identity_type(**{k: value(v) for k, v in doc.items()})


def _line(doc: dict[str, Any]) -> bytes:
    return (json.dumps(doc, separators=(",", ":")) + "\n").encode()


def _header() -> bytes:
    """A file's first line, new for each file written anew (a reader that sees another one
    reads the file from the start)."""
    return _line({"carry": secrets.token_hex(8), "pid": os.getpid()})


def _mono(wall: float, now_wall: float, now_mono: float) -> float:
    return now_mono - (now_wall - wall)


def _wall(mono: float) -> float:
    """A monotonic time on the wall clock (a file outlives this process's monotonic clock)."""
    return time.time() - (time.monotonic() - mono)


@dataclasses.dataclass
class Carry:
    """The carry file ``path`` of one broker, the second memory (``TokenMemory``,
    ``GroupsMemory``) of its authenticator ``auth`` and its hub client ``hub`` (None without
    a hub)."""

    path: str
    auth: Authenticator
    hub: HubClient | None
    identity_type: Callable[..., Any]  # the authenticator's identity class
    identities: dict[str, tuple[float, float | None, Any]] = dataclasses.field(
        default_factory=dict
    )  # token key -> (expires, confirmed at: wall clock, identity)
    groups: dict[str, tuple[float, tuple[str, ...]]] = dataclasses.field(default_factory=dict)
    _offset: int = 0  # how far the file was read
    _first: bytes = b""  # the header line of the file as last read
    _appended: int = 0  # lines in the file (read or appended) since it was written anew

    # -- reading (the standby, and any broker's start) ---------------------------------------

    def read(self) -> None:
        """Read what was appended to the file since the last read (all of it if the file was
        rewritten or replaced); a line that cannot be read is skipped."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_uid != os.geteuid() or st.st_mode & 0o077 or st.st_size > MAX_READ_BYTES:
                log.warning(
                    "gpushare: %s is not used: owned by uid %d (not %d), mode %04o "
                    "(others may read or write it), or bigger than %d bytes",
                    self.path,
                    st.st_uid,
                    os.geteuid(),
                    st.st_mode & 0o7777,
                    MAX_READ_BYTES,
                )
                return
            first = f.readline(200)  # the header: a new one for each file written anew
            if first != self._first or st.st_size < self._offset:
                self._first, self._offset, self._appended = first, 0, 0
                self.identities.clear()
                self.groups.clear()
            f.seek(self._offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        self._offset += end
        lines = data[:end].splitlines()
        self._appended += len(lines)  # the file's length: it is rewritten at COMPACT_AFTER
        for line in lines:
            with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
                self._take(json.loads(line))

    def _take(self, doc: dict[str, Any]) -> None:
        if doc.get("revoked"):
            self.identities.pop(str(doc["token"]), None)
        elif "token" in doc:
            confirmed = doc.get("confirmed")
            self.identities[str(doc["token"])] = (
                float(doc["expires"]),
                None if confirmed is None else float(confirmed),
                identity_from_doc(self.identity_type, doc["identity"]),
            )
        elif "user" in doc:
            self.groups[str(doc["user"])] = (
                float(doc["read"]),
                tuple(str(g) for g in doc["groups"]),
            )

    def hand_over(self) -> None:
        """Give the groups read to the hub client (the fresh ones, on its monotonic clock),
        and from now on be the authenticator's and the hub client's second memory: asked for
        what they do not know, told what they learn."""
        self.read()
        now_wall, now_mono = time.time(), time.monotonic()
        if self.hub is not None:
            stale_s = float(self.hub.groups_stale_max_s)
            for user, (read, groups) in self.groups.items():
                if now_wall - read <= stale_s:
                    self.hub.remember_groups(user, _mono(read, now_wall, now_mono), groups)
            self.hub.memory = self
        self.groups.clear()
        self.auth.memory = self

    # -- the authenticator's second memory (``TokenMemory``) ----------------------------------

    def recall(self, token: str) -> tuple[float, Any] | None:
        hit = self.identities.get(token_key(token)) if self.identities else None
        if hit is None:
            return None
        expires, _confirmed, identity = hit
        return _mono(expires, time.time(), time.monotonic()), identity

    def recall_confirmed(self, token: str) -> tuple[float, Any] | None:
        hit = self.identities.get(token_key(token)) if self.identities else None
        if hit is None or hit[1] is None:
            return None
        return _mono(hit[1], time.time(), time.monotonic()), hit[2]

    def learnt(self, token: str, answer: TokenAnswer) -> None:
        line = self._identity_line(token, answer)
        self.identities.pop(line["token"], None)  # learnt again: the carried one is old
        self._append(line)

    def refused(self, token: str) -> None:
        key = token_key(token)
        if self.identities.pop(key, None) is not None:
            self._append({"token": key, "revoked": True})

    # -- the hub client's (``GroupsMemory``) -------------------------------------------------

    def groups_learnt(self, name: str, read_at: float, groups: tuple[str, ...]) -> None:
        self._append({"user": name, "groups": list(groups), "read": _wall(read_at)})

    # -- the serving broker's side ------------------------------------------------------------

    @staticmethod
    def _identity_line(token: str, answer: TokenAnswer) -> dict[str, Any]:
        """``token``'s line: its identity, when it expires (the wall clock; now if it is not
        kept, only its last confirmation) and when the hub confirmed it."""
        return {
            "token": token_key(token),
            "identity": identity_doc(answer.identity),
            "expires": time.time() if answer.expires is None else _wall(answer.expires),
            "confirmed": None if answer.confirmed is None else _wall(answer.confirmed),
        }

    def _append(self, line: dict[str, Any]) -> None:
        if self._appended >= COMPACT_AFTER:
            self._rewrite()
        data = _line(line)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            log.warning("gpushare: cannot write %s: %s", self.path, exc)
            return
        try:
            if os.fstat(fd).st_size == 0:
                data = _header() + data
            os.write(fd, data)
        finally:
            os.close(fd)
        self._appended += 1

    def _rewrite(self) -> None:
        """The file again, from what the authenticator and the hub client hold now."""
        self._appended = 0
        tmp = f"{self.path}.{os.getpid()}.tmp"
        lines = [self._identity_line(t, a) for t, a in self.auth.answers().items()]
        if self.hub is not None:
            lines += [
                {"user": user, "groups": list(groups), "read": _wall(read)}
                for user, (read, groups) in self.hub.groups_read().items()
            ]
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(_header() + b"".join(map(_line, lines)))
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("gpushare: cannot rewrite %s: %s", self.path, exc)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
