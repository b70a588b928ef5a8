"""Read a planning input (``TEAMS.yaml``), with line-precise errors (its card catalogues:
:mod:`.catalogue`; the converters of its values: :mod:`.units`).

It reuses the policy loader's YAML-with-line-numbers reader and its field helpers, so a
planning input fails the way a policy file does: every problem at once, each naming the
file, the line, the dotted field and what was expected. The schema is documented, with
an example, in ``hub_config/plan-example.yaml``.
"""

from __future__ import annotations

from pathlib import Path

from ..policy import YList, YMap
from ..policy_units import UnitError
from .catalogue import (
    CATALOGUE,
    PlanError,
    load_catalogue,
    parse_catalogue,
    parse_models,
    read_text,
)
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
from .units import NAME as _NAME
from .units import compute_share as _compute
from .units import headroom as _headroom
from .units import memory_bytes as _bytes
from .units import name as _name
from .units import share as _share
from .units import watts as _watts

__all__ = [
    "CATALOGUE",
    "PlanError",
    "load_catalogue",
    "parse_catalogue",
    "parse_plan_input",
    "read_plan_file",
]

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
    data = read_root(ctx, text, "teams, cards and racks")
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
    parse_models(ctx, root, local_models)
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
    return parse_plan_input(read_text(Path(path)), str(path), extra_catalogues)
