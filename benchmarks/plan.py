"""How long `jupyter-gpushare plan` takes for 50 teams and 500 kinds of work (target < 1 s).

    .venv/bin/python benchmarks/plan.py [--teams 50] [--kinds-per-team 10]

Generates a planning input (a mix of training, fine-tuning, inference and debugging on
several models, peak concurrency 1-12), then times reading it (with line numbers and
every check), planning (estimates, packing, comparison, growth, power), the draft policy,
checking that draft with the real policy loader, and the markdown and HTML reports. The
baseline, measured in the same run, is a plain ``yaml.safe_load`` of the same text.
"""

from __future__ import annotations

import argparse
import random
import time

import yaml

from jupyter_gpushare.planner import (
    draft_policy,
    html_report,
    make_plan,
    markdown_report,
    parse_plan_input,
)
from jupyter_gpushare.policy import check_policy

MODELS = ("llama-2-7b", "llama-2-13b", "mistral-7b", "llama-3-8b", "gpt2-xl", "opt-13b")


def make_input(teams: int, kinds: int, seed: int = 7) -> str:
    rng = random.Random(seed)
    lines = ["organisation: Benchmark", "scheduler: kubernetes-hami",
             "cards: {train: H200-SXM, inference: L40S, debug: L40S}",
             "growth: {tasks: 30%}",
             "racks: {count: 40, power: 40kW, cooling: 35kW, gpus_per_server: 8}", "teams:"]
    for t in range(teams):
        lines += [f"  team-{t}:", "    work:"]
        for k in range(kinds):
            kind = rng.choice(("training", "fine-tuning", "inference", "inference",
                               "debugging"))
            model = rng.choice(MODELS)
            item = f"      - {{name: w{k}, kind: {kind}, concurrent: {rng.randint(1, 12)}"
            if kind == "debugging":
                item += f", memory: {rng.choice((2, 4, 8, 12))}GiB"
            else:
                item += f", model: {model}"
            if kind == "fine-tuning":
                item += f", method: {rng.choice(('full', 'lora', 'qlora'))}"
                item += ", activation_checkpointing: true"
            if kind == "inference":
                item += (f", requests: {rng.choice((1, 2, 4, 8))}, sequence_length: "
                         f"{rng.choice((1024, 2048, 4096))}")
            lines.append(item + "}")
    return "\n".join(lines) + "\n"


def best(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teams", type=int, default=50)
    ap.add_argument("--kinds-per-team", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    text = make_input(args.teams, args.kinds_per_team)
    kinds = args.teams * args.kinds_per_team
    baseline = best(lambda: yaml.safe_load(text), args.repeat)
    read = best(lambda: parse_plan_input(text, "bench.yaml"), args.repeat)
    inp = parse_plan_input(text, "bench.yaml")
    plan_t = best(lambda: make_plan(inp), args.repeat)
    plan = make_plan(inp)
    draft_t = best(lambda: draft_policy(plan), args.repeat)
    draft = draft_policy(plan)
    check_t = best(lambda: check_policy(draft, "draft.yaml"), args.repeat)
    assert check_policy(draft, "draft.yaml").policy is not None
    report_t = best(lambda: (markdown_report(plan), html_report(plan)), args.repeat)
    total = read + plan_t + draft_t + report_t
    tasks = sum(t.concurrent for p in plan.grown.pools for t in p.tasks)
    print(f"{args.teams} teams, {kinds} kinds of work, {tasks} tasks at peak after growth, "
          f"{plan.grown.cards} cards, {plan.grown.power.racks_needed} racks")
    print(f"baseline yaml.safe_load           {baseline * 1000:8.1f} ms   1.00x")
    for label, value in (("read input (lines, checks)", read), ("plan", plan_t),
                         ("draft policy", draft_t), ("markdown + HTML report", report_t),
                         ("check-policy on the draft", check_t)):
        print(f"{label:<33} {value * 1000:8.1f} ms {value / baseline:6.2f}x")
    print(f"{'read + plan + draft + report':<33} {total * 1000:8.1f} ms {total / baseline:6.2f}x"
          f"   target < 1000 ms: {'met' if total < 1.0 else 'MISSED'}")


if __name__ == "__main__":
    main()
