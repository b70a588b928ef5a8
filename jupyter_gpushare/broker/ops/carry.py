"""What a broker hands on to the one that takes over from it: the hub's recent answers about
tokens and groups (never anything of the database).

A broker learns from the hub which identity a token has (the authenticator keeps the answer
``cache_max_age``, 300 s) and a user's groups (the hub client keeps them ``groups_ttl_s``, 60 s).
A broker killed and replaced by its warm standby (:mod:`.supervisor`) took those answers with it,
so the new broker's first requests each waited for the hub again: one round trip for the token,
one for the groups of a user the caller did not name groups for, 30-160 ms with a busy hub
(``benchmarks/broker_takeover.py``), at the moment every client resends what the kill cut.

So the serving broker appends each answer it learns to a file in its working folder (one JSON
line; a token only as its SHA-256, the file mode 0600, never through a link), and the standby
reads the file ahead (:meth:`Carry.read`, again at takeover: only what was appended since)
and starts with those answers. Each keeps the time the hub gave it, on the wall clock: it
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
from collections.abc import Callable
from typing import Any

log = logging.getLogger("gpushare.carry")

COMPACT_AFTER = 20_000  # lines appended before the file is rewritten from what is fresh
MAX_READ_BYTES = 64 << 20  # a file bigger than this is not ours: ignored


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


@dataclasses.dataclass
class Carry:
    """The carry file ``path`` of one broker, between its authenticator ``auth`` (a
    ``TokenAuthenticator``) and its hub client ``hub`` (None without a hub)."""

    path: str
    auth: Any
    hub: Any
    identity_type: Callable[..., Any]  # the authenticator's identity class
    identities: dict[str, tuple[float, float | None, Any]] = dataclasses.field(
        default_factory=dict
    )  # token key -> (expires, confirmed at: wall clock, identity)
    groups: dict[str, tuple[float, tuple[str, ...]]] = dataclasses.field(default_factory=dict)
    _offset: int = 0  # how far the file was read
    _first: bytes = b""  # the header line of the file as last read
    _appended: int = 0  # lines in the file (read or appended) since it was written anew
    _attached: bool = False

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
        """Give what was read to the authenticator and the hub client (the fresh part, on
        their monotonic clocks), and from now on append what they learn."""
        self.read()
        now_wall, now_mono = time.time(), time.monotonic()
        if self.hub is not None:
            stale_s = float(getattr(self.hub, "groups_stale_max_s", 0.0))
            for user, (read, groups) in self.groups.items():
                if now_wall - read <= stale_s and user not in self.hub._groups:
                    self.hub._groups[user] = (_mono(read, now_wall, now_mono), groups)
        self.groups.clear()
        self._attach()

    # -- the serving broker's side ------------------------------------------------------------

    def _attach(self) -> None:
        if self._attached:
            return
        self._attached = True
        auth, hub = self.auth, self.hub
        cached, identify = auth.cached, auth.identify_and_cache

        def cached_or_carried(token: str) -> Any:
            identity = cached(token)
            if identity is None and self.identities:
                identity = self._carried(token)
            return identity

        async def identify_and_note(token: str) -> Any:
            self._confirmed_from_carry(token)
            identity = await identify(token)
            if identity is not None:
                self._note_identity(token)
            else:  # the hub refused it: never again, not even as the last confirmation
                key = token_key(token)
                if self.identities.pop(key, None) is not None:
                    self._append({"token": key, "revoked": True})
            return identity

        auth.cached = cached_or_carried
        auth.identify_and_cache = identify_and_note
        if hub is not None:
            groups_of = hub.groups_of

            async def groups_and_note(name: str) -> tuple[str, ...]:
                before = hub._groups.get(name)
                groups: tuple[str, ...] = await groups_of(name)
                after = hub._groups.get(name)
                if after is not None and after is not before:
                    self._append(
                        {
                            "user": name,
                            "groups": list(after[1]),
                            "read": time.time() - (time.monotonic() - after[0]),
                        }
                    )
                return groups

            hub.groups_of = groups_and_note

    def _carried(self, token: str) -> Any:
        """The identity carried for ``token`` while it is fresh, now in the auth's own cache."""
        hit = self.identities.get(token_key(token))
        if hit is None:
            return None
        expires, _confirmed, identity = hit
        now_wall, now_mono = time.time(), time.monotonic()
        if expires <= now_wall:
            return None
        self.auth._identities[token] = (_mono(expires, now_wall, now_mono), identity)
        return identity

    def _confirmed_from_carry(self, token: str) -> None:
        """The hub's last confirmation carried for ``token`` (the authenticator's answer while
        the hub cannot be reached), unless it has one of its own."""
        if not self.identities or token in self.auth._confirmed:
            return
        hit = self.identities.get(token_key(token))
        if hit is not None and hit[1] is not None:
            self.auth._confirmed[token] = (_mono(hit[1], time.time(), time.monotonic()), hit[2])

    def _note_identity(self, token: str) -> None:
        kept = self.auth._identities.get(token)
        if kept is not None or token in self.auth._confirmed:
            line = self._identity_line(token, kept[0] if kept else None)
            self.identities.pop(line["token"], None)  # learnt again: the carried one is old
            self._append(line)

    def _identity_line(self, token: str, expires: float | None) -> dict[str, Any]:
        """``token``'s line: its identity, when it expires (monotonic ``expires``; None: it
        is not kept, only its last confirmation) and when the hub confirmed it."""
        now_wall, now_mono = time.time(), time.monotonic()
        confirmed = self.auth._confirmed.get(token)
        kept = self.auth._identities.get(token)
        identity = (kept or confirmed)[1]
        return {
            "token": token_key(token),
            "identity": identity_doc(identity),
            "expires": now_wall if expires is None else now_wall + (expires - now_mono),
            "confirmed": None if confirmed is None else now_wall - (now_mono - confirmed[0]),
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
        now_wall, now_mono = time.time(), time.monotonic()
        fresh = {t: kept[0] for t, kept in self.auth._identities.items() if kept[0] > now_mono}
        lines = [
            self._identity_line(token, fresh.get(token))
            for token in {**fresh, **dict.fromkeys(self.auth._confirmed)}
        ]
        for user, (read, groups) in list(getattr(self.hub, "_groups", {}).items()):
            lines.append(
                {"user": user, "groups": list(groups), "read": now_wall - (now_mono - read)}
            )
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(_header() + b"".join(map(_line, lines)))
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("gpushare: cannot rewrite %s: %s", self.path, exc)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
