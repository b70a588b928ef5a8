"""Read a planning input (``TEAMS.yaml``) and card catalogues, with line-precise errors.

It reuses the policy loader's YAML-with-line-numbers reader and its field helpers, so a
planning input fails the way a policy file does: every problem at once, each naming the
file, the line, the dotted field and what was expected. The schema is documented, with
an example, in ``hub_config/plan-example.yaml``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from ..policy import PolicyError, PolicyIssue, YList, YMap
from ..policy_units import UnitError, parse_memory_mib, parse_ratio
from .fields import Ctx, Fields, as_map, read_root, unknown_ref
from .fields import boolean as _bool
from .fields import choice as _choice
from .fields import positive as _positive
from .fields import text as _str
from .fields import whole as _int
from .model import (
    DTYPES,
    KINDS,
    METHODS,
    OPTIMIZERS,
    POOL_OF_KIND,
    PRECISIONS,
    SCHEDULERS,
    Card,
    CardChoice,
    ModelShape,
    PlanInput,
    Racks,
    Settings,
    TeamSpec,
    Workload,
)

CATALOGUE = Path(__file__).with_name("cards.yaml")
"""The bundled card catalogue."""

__all__ = ["CATALOGUE", "PlanError", "load_catalogue", "parse_plan_input", "read_plan_file"]

PlanError = PolicyError
"""Errors in a planning input or catalogue (the policy loader's error type: every issue)."""

_COUNT = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kKmMbBtT]?)\s*$")
_COUNT_FACTORS = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}
_POWER = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(W|kW|MW)?\s*$", re.IGNORECASE)
_POWER_FACTORS = {"": 1.0, "w": 1.0, "kw": 1e3, "mw": 1e6}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


# ----------------------------------------------------------------------- converters


def _param_count(value: object) -> float:
    """7B, 6.74B, 350M, 1.5e9 or a plain number of parameters."""
    expected = "a parameter count such as 7B, 6.74B, 350M or 1.5e9"
    return _scaled_number(value, _COUNT, _COUNT_FACTORS, expected, plain_text=True)


def _watts(value: object) -> float:
    """700W, 17kW, 0.7kW or a plain number of watts."""
    expected = "a power such as 700W, 17kW or a number of watts"
    return _scaled_number(value, _POWER, _POWER_FACTORS, expected)


def _scaled_number(
    value: object,
    pattern: re.Pattern[str],
    factors: dict[str, float],
    expected: str,
    *,
    plain_text: bool = False,
) -> float:
    """A finite number above 0: a number, or a text ``<number><suffix>`` matching
    ``pattern`` and scaled by the suffix's factor (``plain_text``: or any number as text,
    such as 1.5e9); otherwise :class:`UnitError` with ``expected``."""
    number: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = _as_float(value)
    elif isinstance(value, str):
        match = pattern.match(value)
        if match:
            number = float(match.group(1)) * factors[(match.group(2) or "").lower()]
        if plain_text and (number is None or number <= 0):
            number = _as_float(value.strip())
    if number is None or not math.isfinite(number) or number <= 0:
        raise UnitError(expected)
    return number


def _as_float(value: object) -> float | None:
    """``float(value)``, or ``None`` for a text that is no number or an integer too large
    for a float."""
    try:
        return float(value)  # type: ignore[arg-type]
    except (ValueError, OverflowError):
        return None


def _bytes(value: object) -> int:
    """A memory size (policy units) in bytes."""
    mib = parse_memory_mib(value)
    if mib <= 0:
        raise UnitError("a memory size greater than 0 such as 8GiB")
    return mib * 1024 * 1024


def _share(value: object) -> float:
    ratio = parse_ratio(value, "a share such as 20%, 0.2 or 1/5")
    return float(ratio)


def _headroom(value: object) -> float:
    share = _share(value)
    if share >= 0.9:
        raise UnitError("a share below 90% such as 20%")
    return share


def _compute(value: object) -> float:
    share = _share(value)
    if share <= 0 or share > 1:
        raise UnitError("a share of one card's compute, above 0 and at most 100%")
    return share


def _name(value: object) -> str:
    text = _str(value)
    if not _NAME.match(text):
        raise UnitError("a name of letters, digits, '.', '_' and '-'")
    return text


# ---------------------------------------------------------------------- catalogue


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


def _positive_float(value: object) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = _as_float(value)
        if number is not None and math.isfinite(number) and number > 0:
            return number
    raise UnitError("a finite number greater than 0")


def _parse_models(ctx: Ctx, root: Fields, out: dict[str, ModelShape]) -> None:
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


def _read_root(ctx: Ctx, text: str, what: str) -> YMap | None:
    expected = "cards and models" if what == "catalogue" else "teams, cards and racks"
    return read_root(ctx, text, expected)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanError([PolicyIssue(str(path), 0, "", f"cannot read the file: {exc}")]) from exc


def parse_catalogue(
    text: str, filename: str, cards: dict[str, Card], models: dict[str, ModelShape]
) -> list[PolicyIssue]:
    """Add the cards and models of one catalogue text; returns its issues."""
    ctx = Ctx(filename)
    data = _read_root(ctx, text, "catalogue")
    if data is not None:
        root = Fields(ctx, data, "", ("cards", "models"))
        _parse_cards(ctx, root, cards)
        _parse_models(ctx, root, models)
    return ctx.issues


def load_catalogue(
    extra: list[str | Path] | tuple[str | Path, ...] = (),
) -> tuple[dict[str, Card], dict[str, ModelShape]]:
    """The bundled catalogue plus admins' files (later files override by name)."""
    cards: dict[str, Card] = {}
    models: dict[str, ModelShape] = {}
    issues: list[PolicyIssue] = []
    for path in (CATALOGUE, *(Path(p) for p in extra)):
        issues += parse_catalogue(_read_text(Path(path)), str(path), cards, models)
    errors = [i for i in issues if i.severity == "error"]
    if errors:
        raise PlanError(errors)
    return cards, models


# -------------------------------------------------------------------- plan input

_WORK_KEYS = (
    "name",
    "kind",
    "model",
    "concurrent",
    "method",
    "precision",
    "optimizer",
    "micro_batch",
    "sequence_length",
    "activation_checkpointing",
    "lora_rank",
    "lora_targets",
    "weights",
    "kv_cache",
    "requests",
    "memory",
    "compute",
    "growth",
    "description",
)


def _parse_workload(
    ctx: Ctx, body: YMap, path: str, team: str, index: int, models: dict[str, ModelShape]
) -> Workload | None:
    f = Fields(ctx, body, path, _WORK_KEYS)
    kind = f.get("kind", _choice(*KINDS), required=True)
    name = f.get("name", _name, default=None)
    concurrent = f.get("concurrent", _positive(_int, "a whole number of tasks"), required=True)
    memory = f.get("memory", _bytes)
    model_name = f.get("model", _str, required=memory is None)
    model = None
    if model_name is not None:
        model = models.get(model_name)
        if model is None:
            ctx.error(f.line("model"), f"{path}.model", unknown_ref("model", model_name, models))
            return None
    dtypes = tuple(DTYPES)
    is_training = kind in ("training", "fine-tuning")
    for key in (
        "method",
        "precision",
        "optimizer",
        "micro_batch",
        "activation_checkpointing",
        "lora_rank",
        "lora_targets",
    ):
        if f.has(key) and kind is not None and not is_training:
            ctx.error(
                f.key_line(key),
                f"{path}.{key}",
                f"only used by training and fine-tuning work (this is {kind})",
            )
    for key in ("weights", "kv_cache", "requests"):
        if f.has(key) and is_training:
            ctx.error(
                f.key_line(key),
                f"{path}.{key}",
                f"only used by inference and debugging work (this is {kind})",
            )
    method = f.get("method", _choice(*METHODS), default="full") or "full"
    if kind == "training" and method != "full":
        ctx.error(
            f.line("method"),
            f"{path}.method",
            f"got {method!r} (expected full: lora and qlora are fine-tuning methods)",
        )
    precision = f.get("precision", _choice(*PRECISIONS), default="mixed") or "mixed"
    optimizer = f.get("optimizer", _choice(*OPTIMIZERS), default="adamw") or "adamw"
    positive = _positive(_int, "a whole number")
    default_seq = 2048 if is_training else (512 if kind == "debugging" else 4096)
    workload = Workload(
        team=team,
        name=name or f"{kind}-{index}",
        kind=kind or "inference",
        model=model,
        concurrent=concurrent or 1,
        line=body.line,
        method=method,
        precision=precision,
        optimizer=optimizer,
        micro_batch=f.get("micro_batch", positive, default=1) or 1,
        sequence_length=f.get("sequence_length", positive, default=default_seq) or default_seq,
        activation_checkpointing=bool(f.get("activation_checkpointing", _bool, default=False)),
        lora_rank=f.get("lora_rank", positive, default=16) or 16,
        lora_targets=f.get("lora_targets", positive, default=4) or 4,
        weights_dtype=f.get("weights", _choice(*dtypes), default="bf16") or "bf16",
        kv_dtype=f.get("kv_cache", _choice(*dtypes), default="bf16") or "bf16",
        concurrent_requests=f.get("requests", positive, default=1) or 1,
        memory_override_bytes=memory,
        compute_share=f.get("compute", _compute),
        growth=f.get("growth", _share),
    )
    if None in (kind, concurrent):
        return None
    return workload


def _parse_teams(ctx: Ctx, root: Fields, models: dict[str, ModelShape]) -> list[TeamSpec]:
    teams: list[TeamSpec] = []
    if not root.has("teams"):
        root.missing("teams")
    for name, body, line, path in root.entries("teams"):
        if not _NAME.match(name):
            ctx.error(line, path, "a team name is letters, digits, '.', '_' and '-'")
            continue
        f = Fields(ctx, body, path, ("work", "growth", "description"))
        growth = f.get("growth", _share)
        items = f.list("work", required=True)
        work: list[Workload] = []
        seen: dict[str, int] = {}
        for i, item in enumerate(items or ()):
            ipath = f"{path}.work[{i}]"
            iline = items.item_lines[i] if isinstance(items, YList) else line
            mapping = as_map(ctx, item, iline, ipath)
            if mapping is None:
                continue
            w = _parse_workload(ctx, mapping, ipath, name, i, models)
            if w is None:
                continue
            if w.name in seen:
                ctx.error(
                    iline,
                    f"{ipath}.name",
                    f"duplicate work name {w.name!r} in team {name} (first at line {seen[w.name]})",
                )
                continue
            seen[w.name] = iline
            work.append(w)
        if items is not None and not items:
            ctx.error(
                f.key_line("work"),
                f"{path}.work",
                "no work listed (expected at least "
                "one kind of work with kind, model and concurrent)",
            )
        teams.append(TeamSpec(name, tuple(work), growth, line))
    return teams


def _parse_cards_choice(ctx: Ctx, root: Fields, cards: dict[str, Card]) -> CardChoice | None:
    section = root.map("cards", required=True)
    if section is None:
        return None
    f = Fields(ctx, section, "cards", ("default", "train", "inference", "debug", "smaller"))

    def card(key: str) -> str | None:
        name = f.get(key, _str)
        if name is not None and name not in cards:
            ctx.error(f.line(key), f"cards.{key}", unknown_ref("card", name, cards))
            return None
        return name

    default = card("default")
    chosen = {k: card(k) or default for k in ("train", "inference", "debug")}
    smaller = card("smaller")
    return CardChoice(
        chosen["train"] or "", chosen["inference"] or "", chosen["debug"] or "", smaller
    )


def _check_cards_cover(ctx: Ctx, root: Fields, choice: CardChoice, teams: list[TeamSpec]) -> None:
    """Every pool that has work needs a card."""
    chosen = {"train": choice.train, "inference": choice.inference, "debug": choice.debug}
    used = {POOL_OF_KIND[w.kind] for t in teams for w in t.workloads}
    missing = sorted(p for p in used if not chosen[p])
    if missing:
        section = root.data.get("cards")
        line = section.line if isinstance(section, YMap) else root.data.line
        ctx.error(
            line,
            "cards",
            "no card for pool(s) "
            + ", ".join(missing)
            + " that have work (expected default: <card> or one per pool: train, "
            "inference, debug)",
        )


def _parse_racks(ctx: Ctx, root: Fields) -> Racks:
    section = root.map("racks", required=True)
    if section is None:
        return Racks()
    keys = ("count", "power", "cooling", "gpus_per_server", "server_overhead", "max_servers")
    f = Fields(ctx, section, "racks", keys)
    positive = _positive(_int, "a whole number")
    power = f.get("power", _watts, required=True)
    return Racks(
        count=f.get("count", positive, default=1) or 1,
        power_w=power or 0.0,
        cooling_w=f.get("cooling", _watts, default=power) or power or 0.0,
        gpus_per_server=f.get("gpus_per_server", positive, default=8) or 8,
        server_overhead_w=f.get("server_overhead", _watts, default=1000.0) or 1000.0,
        max_servers=f.get("max_servers", positive),
    )


def _parse_settings(ctx: Ctx, root: Fields) -> Settings:
    planning = root.map("planning")
    growth_map = root.map("growth")
    headroom: float | None = 0.2
    reserve: int | None = 1024**3
    if planning is not None:
        p = Fields(ctx, planning, "planning", ("headroom", "runtime_reserve"))
        headroom = p.get("headroom", _headroom, default=0.2)
        reserve = p.get("runtime_reserve", _bytes, default=1024**3)
    growth: float | None = 0.0
    horizon: int | None = 12
    if growth_map is not None:
        g = Fields(ctx, growth_map, "growth", ("tasks", "horizon_months"))
        growth = g.get("tasks", _share, default=0.0)
        horizon = g.get("horizon_months", _positive(_int, "a number of months"), default=12)
    return Settings(
        headroom if headroom is not None else 0.2,
        reserve if reserve is not None else 1024**3,
        growth or 0.0,
        horizon or 12,
    )


_TOP = (
    "organisation",
    "scheduler",
    "catalogues",
    "cards",
    "planning",
    "growth",
    "racks",
    "models",
    "teams",
)


def parse_plan_input(
    text: str, filename: str = "<string>", extra_catalogues: tuple[str | Path, ...] = ()
) -> PlanInput:
    """Read a planning input; raises :class:`PlanError` listing every error."""
    ctx = Ctx(filename)
    data = _read_root(ctx, text, "planning input")
    if data is None:
        raise PlanError(ctx.issues)
    root = Fields(ctx, data, "", _TOP)
    files: list[str | Path] = list(extra_catalogues)
    listed = root.get("catalogues", _str_list_of_paths)
    base = Path(filename).parent
    for item in listed or ():
        path = Path(item)
        files.append(path if path.is_absolute() else base / path)
    try:
        cards, models = load_catalogue(files)
    except PlanError as exc:
        raise PlanError([*ctx.issues, *exc.errors]) from None
    local_models: dict[str, ModelShape] = {}
    _parse_models(ctx, root, local_models)
    models.update(local_models)
    organisation = root.get("organisation", _str, default="") or Path(filename).stem
    scheduler = root.get("scheduler", _choice(*SCHEDULERS), default="none") or "none"
    choice = _parse_cards_choice(ctx, root, cards)
    racks = _parse_racks(ctx, root)
    settings = _parse_settings(ctx, root)
    teams = _parse_teams(ctx, root, models)
    if choice is not None and not ctx.failed:
        _check_cards_cover(ctx, root, choice, teams)
    errors = [i for i in ctx.issues if i.severity == "error"]
    if errors or choice is None:
        raise PlanError(sorted(errors, key=lambda i: i.line))
    return PlanInput(
        organisation, tuple(teams), choice, racks, settings, scheduler, filename, cards
    )


def _str_list_of_paths(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise UnitError("a list of file names")


def read_plan_file(path: str | Path, extra_catalogues: tuple[str | Path, ...] = ()) -> PlanInput:
    """:func:`parse_plan_input` on a file; an unreadable file is one error naming it."""
    return parse_plan_input(_read_text(Path(path)), str(path), extra_catalogues)
