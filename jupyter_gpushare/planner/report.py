"""The plan as a report, in markdown and in HTML, with the figures behind every number.

Both renderings come from one list of blocks (heading, paragraph, list, table), so they
always say the same thing.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from .memory import gib
from .model import GIB
from .plan import Plan, Scenario, task_label


@dataclass(frozen=True)
class Block:
    """One piece of the report: ``kind`` is h1, h2, p, ul or table."""

    kind: str
    text: str = ""
    items: tuple[str, ...] = ()
    header: tuple[str, ...] = ()
    rows: tuple[tuple[str, ...], ...] = ()


def _h(level: int, text: str) -> Block:
    return Block(f"h{level}", text)


def _p(text: str) -> Block:
    return Block("p", text)


def _ul(items: list[str]) -> Block:
    return Block("ul", items=tuple(items))


def _table(header: list[str], rows: list[list[str]]) -> Block:
    return Block("table", header=tuple(header), rows=tuple(tuple(r) for r in rows))


def _summary(plan: Plan) -> list[Block]:
    rows = []
    for label, s in (("now", plan.now), ("after growth", plan.grown)):
        for p in s.pools:
            rows.append([label, p.name, p.mode, p.card.name, p.card.vendor, str(p.cards)])
        rows.append([label, "**total**", "", "", "", f"**{s.cards}**"])
    blocks = [_h(2, "Cards per pool and model"),
              _table(["when", "pool", "mode", "card", "vendor", "cards"], rows)]
    if plan.problems:
        blocks += [_h(3, "Problems"), _ul(list(plan.problems))]
    return blocks


_ADVICE = {
    "none": "local servers: grants are enforced with CUDA_VISIBLE_DEVICES, MPS limits where "
            "an MPS daemon runs, and framework memory caps",
    "local": "local servers: grants are enforced with CUDA_VISIBLE_DEVICES, MPS limits "
             "where an MPS daemon runs, and framework memory caps",
    "slurm": "Slurm: whole cards as gres/gpu, fractions as gres/shard",
    "kubernetes": "Kubernetes: whole cards only (gpu_backend whole); fractions need HAMi",
    "kubernetes-hami": "Kubernetes with HAMi: memory and compute limits per grant "
                       "(KubeGPUShareSpawner.gpu_backend = {hami})",
    "kubernetes-kai": "Kubernetes with the KAI scheduler: fractions without memory isolation "
                      "(only framework caps apply)",
}


def enforcement_advice(plan: Plan) -> str:
    """How grants become real with the input's scheduler and the plan's card vendors."""
    vendors = sorted({p.card.vendor for p in plan.grown.pools})
    advice = _ADVICE[plan.input.scheduler]
    backend = " / ".join("hami-metax" if v == "metax" else "hami" for v in vendors) or "hami"
    advice = advice.replace("{hami}", repr(backend))
    if "metax" in vendors and plan.input.scheduler in ("kubernetes", "kubernetes-kai"):
        advice += "; MetaX cards are shared through HAMi (metax-tech.com/sgpu), use "\
                  "kubernetes-hami"
    if "amd" in vendors and plan.input.scheduler.startswith("kubernetes"):
        advice += "; AMD cards are requested as amd.com/gpu (whole cards)"
    return advice


def _assumptions(plan: Plan) -> list[Block]:
    inp = plan.input
    st = inp.settings
    items = [
        "memory is planned by peak: every task at its peak at the same time, never an average",
        f"inference and debugging are packed with {st.headroom:.0%} of each card's memory "
        "kept free; a packed task is charged max(memory / usable memory, compute) of a card, "
        "as the broker charges it",
        "training and fine-tuning get whole cards, one task per card, or several cards when "
        "the model needs them (model states sharded, ZeRO-3 / FSDP)",
        f"runtime reserve {gib(st.runtime_reserve_bytes)} per task per card",
        f"growth: {st.growth:.0%} more concurrent tasks over {st.horizon_months} months "
        "unless a team or a kind of work says otherwise (rounded up to whole tasks)",
        f"servers hold {inp.racks.gpus_per_server} cards and draw "
        f"{inp.racks.server_overhead_w:.0f} W beyond their cards at peak",
        "all electrical power becomes heat: cooling is compared with the same watts",
        f"scheduler: {inp.scheduler}: {enforcement_advice(plan)}",
    ]
    unverified = sorted({p.card.name for p in plan.grown.pools if not p.card.verified})
    if unverified:
        items.append("figures not checked on the vendor's own page: " + ", ".join(unverified)
                     + " (see the catalogue's source)")
    return [_h(2, "Assumptions"), _ul(items)]


def _memory(plan: Plan) -> list[Block]:
    blocks = [_h(2, "Memory per task")]
    for p in plan.now.pools:
        for t in p.tasks:
            w = t.workload
            model = w.model.name if w.model else "given peak"
            blocks.append(_h(3, f"{task_label(w)}: {w.kind}, {model}"))
            rows = [[c.label, gib(c.bytes), f"{c.bytes / 1e9:.2f} GB", c.formula,
                     "yes" if c.shardable else "no"] for c in t.estimate.components]
            rows.append(["**total, one card**", f"**{gib(t.estimate.total_bytes)}**",
                         f"{t.estimate.total_bytes / 1e9:.2f} GB", "", ""])
            blocks.append(_table(["part", "GiB", "GB", "how", "splits over cards"], rows))
            if t.problem:
                placed = t.problem
            elif t.whole_cards:
                placed = (f"{t.whole_cards} whole {p.card.name} per task "
                          f"({t.memory_mib} MiB per card of {p.card.memory_bytes // 2**20})")
            else:
                placed = (f"{t.milli / 1000:.3f} of a {p.card.name} per task: {t.memory_mib} "
                          f"MiB of {p.usable_mib} usable MiB ({plan.input.settings.headroom:.0%}"
                          " headroom)" + (f", compute {w.compute_share:.0%}"
                                          if w.compute_share else ""))
            blocks.append(_ul([f"pool {p.name}: {placed}"] + list(t.estimate.assumptions)))
    return blocks


def _pools(plan: Plan, s: Scenario, grown: bool) -> list[Block]:
    blocks = [_h(2, f"Pools {s.label}")]
    for p in s.pools:
        rows = []
        for t in p.tasks:
            per = (f"{t.whole_cards} card(s)" if t.whole_cards
                   else f"{t.milli / 1000:.3f} card")
            growth = ""
            if grown:
                growth = f" (from {t.workload.concurrent})"
            rows.append([task_label(t.workload), t.workload.kind, f"{t.concurrent}{growth}",
                         per, f"{t.units_milli / 1000:g}"])
        blocks.append(_h(3, f"{p.name} ({p.mode}, {p.card.name}): {p.cards} cards"))
        blocks.append(_table(["work", "kind", "at peak", "per task", "GPU units"], rows))
        if p.packed:
            per_card = []
            for i, b in enumerate(p.packed[:12]):
                counts: dict[str, int] = {}
                for label, _m in b:
                    counts[label] = counts.get(label, 0) + 1
                used = sum(m for _l, m in b)
                per_card.append(f"card {i + 1}: " + ", ".join(
                    f"{n} x {label}" for label, n in counts.items()) + f" ({used / 1000:.3f})")
            if len(p.packed) > 12:
                per_card.append(f"... {len(p.packed) - 12} more cards")
            blocks.append(_p(f"{p.whole_cards} card(s) for whole-card tasks, "
                             f"{len(p.packed)} packed (best-fit decreasing):"))
            blocks.append(_ul(per_card))
    return blocks


def _comparison(plan: Plan) -> list[Block]:
    rows = []
    for c in plan.comparisons:
        small = c.small.name if c.small else "-"
        power = (f"{c.large.power_w:.0f} W vs {2 * c.small.power_w:.0f} W" if c.small else "-")
        compute = (f"{c.large.bf16_tflops:g} vs {2 * c.small.bf16_tflops:g}" if c.small
                   else "-")
        rows.append([task_label(c.workload), f"1 x {c.large.name}", f"2 x {small}",
                     f"{c.large_tasks} vs {c.small_tasks}", power, compute,
                     f"**{c.verdict}**: {c.why}"])
    return [_h(2, "One large card or two smaller ones"),
            _p("Two smaller cards win where the task fits one of them: twice the independent "
               "slots, and one failure takes half as much away. A task that does not fit the "
               "smaller card leaves no choice."),
            _table(["work", "large", "smaller", "tasks at once", "power", "BF16 TFLOPS",
                    "verdict"], rows)]


def _power(plan: Plan) -> list[Block]:
    racks = plan.input.racks
    blocks = [_h(2, "Power and cooling at peak"),
              _p(f"{racks.count} rack(s) available, each {racks.power_w / 1000:g} kW of power "
                 f"and {racks.cooling_w / 1000:g} kW of cooling; a rack holds "
                 f"{min(racks.power_w, racks.cooling_w) / 1000:g} kW of servers"
                 + (f" and at most {racks.max_servers} servers" if racks.max_servers else "")
                 + ".")]
    for s in (plan.now, plan.grown):
        pw = s.power
        rows = [[f"{s_.pool}", s_.card, str(s_.cards),
                 f"{s_.cards} x {plan.input.catalogue[s_.card].power_w:.0f} W + "
                 f"{racks.server_overhead_w:.0f} W", f"{s_.watts:.0f} W"]
                for s_ in pw.servers]
        verdict = ("fits" if pw.fits else "DOES NOT FIT")
        blocks.append(_h(3, f"{s.label}: {pw.peak_w / 1000:.2f} kW at peak, "
                         f"{pw.racks_needed} rack(s) needed, {verdict}"))
        blocks.append(_table(["pool", "card", "cards", "peak", "server"], rows))
        blocks.append(_ul([f"rack {i + 1}: {len(r)} server(s), {pw.rack_watts(i):.0f} W of "
                           f"{pw.rack_limit_w:.0f} W" for i, r in enumerate(pw.racks)]))
    return blocks


def _catalogue(plan: Plan) -> list[Block]:
    used = {p.card.name: p.card for s in (plan.now, plan.grown) for p in s.pools}
    for c in plan.comparisons:
        if c.small:
            used[c.small.name] = c.small
    rows = [[c.name, c.vendor, c.model, f"{c.memory_bytes / GIB:g} GiB", f"{c.bf16_tflops:g}",
             f"{c.power_w:g} W", c.source + ("" if c.verified else " (unverified)")]
            for c in sorted(used.values(), key=lambda c: c.name)]
    return [_h(2, "Cards used (from the catalogue)"),
            _table(["card", "vendor", "model", "memory", "BF16 TFLOPS", "power", "source"],
                   rows)]


def report_blocks(plan: Plan) -> list[Block]:
    """Everything the report says, in order."""
    inp = plan.input
    return ([_h(1, f"GPU capacity plan: {inp.organisation}"),
             _p(f"From `{inp.filename}`: {len(inp.teams)} team(s), "
                f"{sum(len(t.workloads) for t in inp.teams)} kind(s) of work.")]
            + _summary(plan) + _assumptions(plan) + _memory(plan)
            + _pools(plan, plan.now, False) + _pools(plan, plan.grown, True)
            + _comparison(plan) + _power(plan) + _catalogue(plan))


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_report(plan: Plan) -> str:
    """The report as markdown."""
    out: list[str] = []
    for b in report_blocks(plan):
        if b.kind.startswith("h"):
            out += ["#" * int(b.kind[1]) + " " + b.text, ""]
        elif b.kind == "p":
            out += [b.text, ""]
        elif b.kind == "ul":
            out += [f"- {item}" for item in b.items] + [""]
        elif b.kind == "table":
            out.append("| " + " | ".join(_md_cell(h) for h in b.header) + " |")
            out.append("|" + "---|" * len(b.header))
            out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b.rows]
            out.append("")
    return "\n".join(out)


def _inline(text: str) -> str:
    """Escape, then render **bold** and `code`."""
    parts = html.escape(text).split("**")
    text = "".join(f"<strong>{p}</strong>" if i % 2 else p for i, p in enumerate(parts))
    parts = text.split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def html_report(plan: Plan) -> str:
    """The report as a self-contained HTML page."""
    body: list[str] = []
    for b in report_blocks(plan):
        if b.kind.startswith("h"):
            body.append(f"<{b.kind}>{_inline(b.text)}</{b.kind}>")
        elif b.kind == "p":
            body.append(f"<p>{_inline(b.text)}</p>")
        elif b.kind == "ul":
            body.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in b.items) + "</ul>")
        elif b.kind == "table":
            head = "".join(f"<th>{_inline(h)}</th>" for h in b.header)
            rows = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>"
                           for row in b.rows)
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
    title = html.escape(f"GPU capacity plan: {plan.input.organisation}")
    style = ("body{font-family:sans-serif;max-width:72em;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse;margin:.5em 0}"
             "td,th{border:1px solid #bbb;padding:.2em .5em;text-align:left;vertical-align:top}"
             "th{background:#eee}")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{title}</title><style>{style}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def text_summary(plan: Plan) -> str:
    """A short summary for the terminal."""
    lines = [f"Plan for {plan.input.organisation} ({plan.input.filename})"]
    for s in (plan.now, plan.grown):
        lines.append(f"  {s.label}: {s.cards} cards, {s.power.peak_w / 1000:.2f} kW at peak, "
                     f"{s.power.racks_needed} of {s.power.available_racks} rack(s)"
                     + ("" if s.power.fits else "  <-- does not fit"))
        for p in s.pools:
            lines.append(f"    {p.name:<10} {p.mode:<10} {p.cards:>4} x {p.card.name} "
                         f"({p.card.vendor})")
    if plan.problems:
        lines.append("Problems:")
        lines += [f"  - {p}" for p in plan.problems]
    return "\n".join(lines)
