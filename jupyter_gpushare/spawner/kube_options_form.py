"""The site's ``profile_options`` in the gpushare spawn form.

KubeSpawner's own form lists the whole ``profile_list`` as radio buttons named
``profile``; gpushare's form already offers the policy's profiles that way, so this adds,
per offered profile with ``profile_options``, one select (and, where the site enables it, a
free-text "unlisted choice") named as KubeSpawner names them:
``profile-option-<profile slug>--<option>`` and ``...--<option>--unlisted-choice``.
:func:`site_options_from_form` reads them back into the user options KubeSpawner's
``_load_profile`` expects (``{"image": "cuda"}``).
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

__all__ = ["render_options", "site_options_from_form"]

PREFIX = "profile-option-"
UNLISTED = "--unlisted-choice"


def _select(slug: str, name: str, option: Mapping[str, Any], chosen: object) -> str:
    field = html.escape(f"{PREFIX}{slug}--{name}", quote=True)
    rows = []
    for key, choice in (option.get("choices") or {}).items():
        selected = key == chosen or (not chosen and choice.get("default"))
        rows.append(
            f'<option value="{html.escape(str(key), quote=True)}"'
            f"{' selected' if selected else ''}>"
            f"{html.escape(str(choice.get('display_name') or key))}</option>"
        )
    label = html.escape(str(option.get("display_name") or name))
    out = (
        f'<label class="gpushare-kube-option">{label} '
        f'<select class="form-control" name="{field}">{"".join(rows)}</select></label>'
    )
    unlisted = option.get("unlisted_choice") or {}
    if unlisted.get("enabled"):
        out += (
            f'<label class="gpushare-kube-option">'
            f"{html.escape(str(unlisted.get('display_name') or 'Other'))} "
            f'<input class="form-control" type="text" name="{field}{UNLISTED}"></label>'
        )
    return out


def render_options(entries: list[Mapping[str, Any]], user_options: Mapping[str, Any]) -> str:
    """HTML of the options of each entry that has any ("" when none has)."""
    parts = []
    for entry in entries:
        options = entry.get("profile_options") or {}
        if not options:
            continue
        slug = str(entry.get("slug"))
        mine = user_options if user_options.get("profile") == slug else {}
        fields = "".join(_select(slug, n, o, mine.get(n)) for n, o in options.items())
        parts.append(
            f'<fieldset class="gpushare-kube-options" '
            f'data-profile="{html.escape(slug, quote=True)}"><legend>'
            f"{html.escape(str(entry.get('display_name') or slug))}: options</legend>"
            f"{fields}</fieldset>"
        )
    return "".join(parts)


def site_options_from_form(
    formdata: Mapping[str, list[str]],
) -> tuple[dict[str, list[str]], dict[str, dict[str, str]]]:
    """(the other fields, {profile slug: {option: value}}) of a submitted form; an empty
    unlisted choice is left out (the select's choice stands)."""
    rest: dict[str, list[str]] = {}
    site: dict[str, dict[str, str]] = {}
    for key, values in formdata.items():
        if not key.startswith(PREFIX) or "--" not in key[len(PREFIX) :]:
            rest[key] = values
            continue
        slug, option = key[len(PREFIX) :].split("--", 1)
        value = values[0] if values else ""
        if value:
            site.setdefault(slug, {})[option] = value
    return rest, site
