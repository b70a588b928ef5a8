"""Names that lived here while the broker was a chain of mixins over ``BrokerBase``.

The broker is now composed of collaborators (:mod:`.broker`, :mod:`.parts`); the group
commits' per-task span is :data:`.writes.TASK_WRITES`, the waiting statuses and
:class:`~.waiting.Pending` are in :mod:`.waiting`. Kept for imports written against this
module (and the old ``jupyter_gpushare.broker.base``); new code imports from those.
"""

from __future__ import annotations

from .waiting import LIVE_STATUSES, Pending
from .writes import TASK_WRITES

__all__ = ["LIVE_STATUSES", "TASK_WRITES", "Pending"]
