"""Card catalogues: the bundled ``cards.yaml`` and admins' own files of cards and model
shapes, read with line-precise errors (later files override earlier ones by name)."""

from __future__ import annotations

from pathlib import Path

from ..policy import PolicyError, PolicyIssue
from .fields import Ctx, Fields, read_root
from .fields import boolean as _bool
from .fields import choice as _choice
from .fields import positive as _positive
from .fields import text as _str
from .fields import whole as _int
from .model import Card, ModelShape
from .units import memory_bytes as _bytes
from .units import name as _name
from .units import param_count as _param_count
from .units import positive_number as _positive_float
from .units import watts as _watts

__all__ = [
    "CATALOGUE",
    "PlanError",
    "load_catalogue",
    "parse_catalogue",
    "parse_models",
    "read_text",
]

CATALOGUE = Path(__file__).with_name("cards.yaml")
"""The bundled card catalogue."""

PlanError = PolicyError
"""Errors in a planning input or catalogue (the policy loader's error type: every issue)."""


def _parse_cards(ctx: Ctx, root: Fields, out: dict[str, Card]) -> None:
    keys = ("vendor", "model", "memory", "bf16_tflops", "power_w", "form", "source", "verified")
    for name, body, _line, path in root.entries("cards"):
        f = Fields(ctx, body, path, keys)
        vendor = f.get("vendor", _name, required=True)
        model = f.get("model", _str, required=True)
        memory = f.get("memory", _bytes, required=True)
        tflops = f.get("bf16_tflops", _positive_float, required=True)
        power = f.get("power_w", _watts, required=True)
        form = f.get("form", _choice("sxm", "oam", "pcie"), default="pcie") or "pcie"
        source = f.get("source", _str, default="") or ""
        verified = f.get("verified", _bool, default=True)
        if vendor is None or model is None or memory is None or tflops is None or power is None:
            continue
        card = Card(
            name, vendor.lower(), model, memory, tflops, power, form, source, bool(verified)
        )
        out[name] = card


def parse_models(ctx: Ctx, root: Fields, out: dict[str, ModelShape]) -> None:
    keys = ("params", "layers", "hidden", "heads", "kv_heads", "source")
    for name, body, _line, path in root.entries("models"):
        f = Fields(ctx, body, path, keys)
        params = f.get("params", _param_count, required=True)
        layers = f.get("layers", _positive(_int, "a whole number"), required=True)
        hidden = f.get("hidden", _positive(_int, "a whole number"), required=True)
        heads = f.get("heads", _positive(_int, "a whole number"), required=True)
        kv_heads = f.get("kv_heads", _positive(_int, "a whole number"), default=heads)
        source = f.get("source", _str, default="") or ""
        if params is None or layers is None or hidden is None or heads is None or not kv_heads:
            continue
        if heads % kv_heads:
            ctx.error(
                f.line("kv_heads"),
                f"{path}.kv_heads",
                f"got {kv_heads} (expected a divisor of heads, {heads})",
            )
            continue
        out[name] = ModelShape(name, params, layers, hidden, heads, kv_heads, source)


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanError([PolicyIssue(str(path), 0, "", f"cannot read the file: {exc}")]) from exc


def parse_catalogue(
    text: str, filename: str, cards: dict[str, Card], models: dict[str, ModelShape]
) -> list[PolicyIssue]:
    """Add the cards and models of one catalogue text; returns its issues."""
    ctx = Ctx(filename)
    data = read_root(ctx, text, "cards and models")
    if data is not None:
        root = Fields(ctx, data, "", ("cards", "models"))
        _parse_cards(ctx, root, cards)
        parse_models(ctx, root, models)
    return ctx.issues


def load_catalogue(
    extra: list[str | Path] | tuple[str | Path, ...] = (),
) -> tuple[dict[str, Card], dict[str, ModelShape]]:
    """The bundled catalogue plus admins' files (later files override by name)."""
    cards: dict[str, Card] = {}
    models: dict[str, ModelShape] = {}
    issues: list[PolicyIssue] = []
    for path in (CATALOGUE, *(Path(p) for p in extra)):
        issues += parse_catalogue(read_text(Path(path)), str(path), cards, models)
    errors = [i for i in issues if i.severity == "error"]
    if errors:
        raise PlanError(errors)
    return cards, models
