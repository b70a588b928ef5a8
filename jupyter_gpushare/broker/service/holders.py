"""Which live grants and waiting requests each holder (a user's server or job) has.

The index answers "does this server already hold a grant?" (the hub's spawn, reconcile, the
job runner) without a pass over every live grant.
"""

from __future__ import annotations

from collections.abc import Iterable

from ...core.model import Request

HolderKey = tuple[str, str, str]
"""(kind, user, holder): ``("interactive", "ada", "")`` is ada's default server."""


class Holders:
    """(kind, user, holder) -> live grant ids (``g-…``) and waiting request ids (``r-…``)."""

    def __init__(self) -> None:
        self.index: dict[HolderKey, set[str]] = {}

    def hold(self, req: Request, live_id: str) -> None:
        """Record that ``live_id`` (a grant, or a waiting request) belongs to req's holder."""
        self.index.setdefault((req.kind.value, req.user, req.holder), set()).add(live_id)

    def unhold(self, req: Request, live_id: str) -> None:
        key = (req.kind.value, req.user, req.holder)
        ids = self.index.get(key)
        if ids is not None:
            ids.discard(live_id)
            if not ids:
                del self.index[key]

    def held_by(self, kind: str, user: str, holder: str) -> set[str]:
        """Live grant ids and waiting request ids of one holder (a copy)."""
        return set(self.index.get((kind, user, holder), ()))

    def get(self, key: HolderKey, default: Iterable[str] = ()) -> Iterable[str]:
        """The ids of one holder as held (not a copy), or ``default``."""
        return self.index.get(key, default)

    def clear(self) -> None:
        self.index.clear()

    def __len__(self) -> int:
        return len(self.index)
