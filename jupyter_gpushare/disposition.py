"""``Content-Disposition`` for a file name a user chose (RFC 6266 and RFC 5987).

A notebook named ``Эксперимент.ipynb``, or with a ``"``, a CR or LF in its name, must not
break the header (Tornado refuses CR/LF and non-Latin-1 with a 500) nor inject another:
the answer has an ASCII fallback ``filename="..."`` (non-ASCII, quotes, backslashes and
control characters replaced by ``_``) and the exact name as ``filename*=UTF-8''<percent-
encoded>`` (control characters replaced there too: no client should make such a file).
"""

from __future__ import annotations

import posixpath
import unicodedata
from urllib.parse import quote

FALLBACK = "output.ipynb"


def _no_controls(name: str) -> str:
    return "".join("_" if ord(c) < 32 or ord(c) == 127 else c for c in name)


def ascii_fallback(name: str) -> str:
    """``name`` in printable ASCII for ``filename=``: accents dropped, the rest ``_``."""
    plain = unicodedata.normalize("NFKD", name)
    out = []
    for c in plain:
        if unicodedata.combining(c):
            continue
        out.append(c if 32 <= ord(c) < 127 and c not in '"\\' else "_")
    return "".join(out).strip() or FALLBACK


def attachment(path: str) -> str:
    """The header value that offers ``path``'s last component as a download."""
    name = _no_controls(posixpath.basename(str(path))).strip() or FALLBACK
    return (f'attachment; filename="{ascii_fallback(name)}"; '
            f"filename*=UTF-8''{quote(name, safe='')}")
