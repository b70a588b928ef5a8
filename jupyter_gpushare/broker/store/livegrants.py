"""Start-up's bulk reader of the live grants (100,000 rows on a big site).

:meth:`.service.Broker.load` rebuilds the state from every live grant row. Read through
SQLAlchemy result rows, with its JSON type decoding ``spec`` and ``slices`` one value at a
time, that took about 1.4 s of CPU per 100,000 rows before any grant was built. This module
reads the same rows with the DB-API cursor of the load's own connection (same transaction),
only the columns the state needs, the JSON columns as text (``CAST … AS TEXT``: PostgreSQL's
driver would otherwise decode each value itself), and decodes all ``spec`` values with one
``json.loads`` of a joined array (and all ``slices`` with another): the decoder's per-call
work is paid twice instead of 200,000 times, and dict keys are shared by every spec.

A joined decode is only trusted when it yields one value per row, each of the expected kind,
and each spec names its row's request id; anything else (a row an older version wrote
differently, a damaged value) falls back to decoding row by row, and a row that cannot be
decoded is handed back as a failure for the caller to release, as a grant that no longer fits.

Requests whose spec has exactly the keys and value types :func:`.serial.request_to_spec`
writes become ``Request`` objects without the frozen dataclass's per-field ``__init__``
(the decoded dict, with its ask, kind and models converted, is the instance's ``__dict__``);
any other spec goes through :func:`.serial.spec_to_request`. Both give equal objects
(``tests/test_broker_livegrants.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import fields
from typing import Any

from sqlalchemy import Text, cast, select

from ...core.model import Grant, Placement, Request
from .db import grants_table
from .serial import _KINDS, _gpu_ask, _gpu_slice, spec_to_request

_c = grants_table.c
# column positions in LIVE_GRANTS' rows
(ID, REQUEST_ID, USERNAME, SPEC, NODE, SLICES, UNITS, BORROWED, VALUE, PREEMPTIBLE, GRANTED_AT,
 GRACE, PREEMPT_FOR, PREEMPT_REASON, PREEMPT_DEADLINE) = range(15)
LIVE_GRANTS = (
    select(
        _c.id, _c.request_id, _c.username, cast(_c.spec, Text), _c.node, cast(_c.slices, Text),
        _c.units_milli, _c.borrowed, _c.priority_value, _c.preemptible, _c.granted_at,
        _c.grace_period_s, _c.preempt_for, _c.preempt_reason, _c.preempt_deadline,
    )
    .where(_c.released_at.is_(None))
    .order_by(_c.granted_at, _c.id)
)

_KEYS = frozenset(f.name for f in fields(Request))
_new = object.__new__
_set = object.__setattr__


def fetch(conn: Any) -> list[tuple[Any, ...]]:
    """The live grant rows (``LIVE_GRANTS`` columns) through ``conn``'s DB-API cursor."""
    compiled = LIVE_GRANTS.compile(dialect=conn.dialect)
    cursor = conn.connection.cursor()  # the driver's cursor, in conn's transaction
    try:
        cursor.execute(str(compiled), compiled.params or ())
        return list(cursor.fetchall())
    finally:
        cursor.close()


def _decode_joined(texts: list[Any], kind: type) -> list[Any] | None:
    """``[json.loads(t) for t in texts]`` in one call, or ``None`` if that is not sure."""
    if not texts:
        return []
    if not all(type(t) is str for t in texts):
        return None
    try:
        values = json.loads("[" + ",".join(texts) + "]")
    except ValueError:
        return None
    if len(values) != len(texts) or not all(type(v) is kind for v in values):
        return None
    return values  # type: ignore[no-any-return]


def _decode_one(text: Any) -> Any:
    return json.loads(text) if isinstance(text, (str, bytes)) else text


def request_of(spec: dict[str, Any]) -> Request:
    """``spec_to_request(spec)``, faster for specs as the broker writes them (and using
    ``spec`` itself as the request's attributes: the caller gives it up)."""
    if (
        spec.keys() == _KEYS
        and type(spec["cpu_milli"]) is int
        and type(spec["memory_mib"]) is int
        and type(spec["checkpointing"]) is bool
        and type(spec["created_at"]) is float
        and type(spec["gpu_models"]) is list
        and type(spec["gpu"]) is dict
    ):
        kind = _KINDS.get(spec["kind"]) if type(spec["kind"]) is str else None
        if kind is not None:
            spec["gpu"] = _gpu_ask(spec["gpu"])
            spec["kind"] = kind
            spec["gpu_models"] = tuple(spec["gpu_models"])
            req: Request = _new(Request)
            _set(req, "__dict__", spec)
            return req
    return spec_to_request(spec)



def read(rows: list[tuple[Any, ...]]) -> Iterator[tuple[tuple[Any, ...], Grant | None, str]]:
    """(row, its grant, "") for each row in order; (row, None, why) for a row that cannot be
    read."""
    specs = _decode_joined([r[SPEC] for r in rows], dict)
    slices = _decode_joined([r[SLICES] for r in rows], list)
    if specs is not None and not all(
        s.get("id") == r[REQUEST_ID] for s, r in zip(specs, rows, strict=True)
    ):
        specs = None
    for i, row in enumerate(rows):
        try:
            spec = specs[i] if specs is not None else _decode_one(row[SPEC])
            placed = slices[i] if slices is not None else _decode_one(row[SLICES])
            grant = Grant(
                row[ID],
                request_of(spec),
                Placement(row[NODE], tuple([_gpu_slice(s) for s in placed])),
                int(row[UNITS]),
                bool(row[BORROWED]),
                int(row[VALUE]),
                bool(row[PREEMPTIBLE]),
                float(row[GRANTED_AT]),
                int(row[GRACE]),
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            yield row, None, f"its row cannot be read ({exc!r})"
            continue
        yield row, grant, ""
