"""The monthly GPU report: figures, the buy / redistribute rule, and its output formats.

* :mod:`.rows` plain input rows; :mod:`.figures` every figure (pure, standard library);
* :mod:`.rule` the recommendation rule; :mod:`.document` the rounded document every
  format shows; :mod:`.render` json / csv / md / html (with :mod:`.plots`, inline SVG);
* :mod:`.source` reads the rows from the broker's database (SQLAlchemy);
* :mod:`.command` the ``jupyter-gpushare report`` subcommand.

Use :func:`make_report` to go from rows to a document.
"""

from __future__ import annotations

from typing import Any

from .document import build
from .figures import MonthFigures, Thresholds, compute
from .rows import MonthRows
from .rule import Recommendation, RuleConfig, recommend


def make_report(
    rows: MonthRows, rule: RuleConfig | None = None, thresholds: Thresholds | None = None
) -> tuple[MonthFigures, list[Recommendation], dict[str, Any]]:
    """Figures, recommendations and the rounded document of one month."""
    cfg = rule or RuleConfig()
    figures = compute(rows, thresholds)
    recs = recommend(figures, cfg)
    return figures, recs, build(figures, recs, cfg)


__all__ = ["MonthRows", "RuleConfig", "Thresholds", "compute", "make_report", "recommend"]
