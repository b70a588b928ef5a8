"""Hand-computed capacity plans for three organisations, checked figure by figure.

Every expected number below is worked out by hand in the comments from the formulas in
``jupyter_gpushare/planner/memory.py`` and the card catalogue; the draft policy of each
plan is loaded with the real policy loader (what ``check-policy`` runs).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from jupyter_gpushare import cli
from jupyter_gpushare.planner import draft_policy, make_plan, read_plan_file
from jupyter_gpushare.planner.plan import Plan
from jupyter_gpushare.policy import check_policy

DATA = Path(__file__).parent / "data" / "planner"
GIB = 1024**3
MIB = 1024**2


def _plan(name: str) -> Plan:
    return make_plan(read_plan_file(DATA / name))


def _task(plan: Plan, label: str, grown: bool = False):  # type: ignore[no-untyped-def]
    scenario = plan.grown if grown else plan.now
    for p in scenario.pools:
        for t in p.tasks:
            if f"{t.workload.team}/{t.workload.name}" == label:
                return t
    raise AssertionError(label)


def _policy_ok(plan: Plan) -> None:
    text = draft_policy(plan)
    check = check_policy(text, "draft.yaml")
    assert check.policy is not None, [str(i) for i in check.issues]
    assert not check.warnings, [str(i) for i in check.warnings]
    # the policy's capacity per pool is the plan's
    for p in plan.grown.pools:
        gpus = [g for n in check.policy.nodes_in(p.name) for g in n.gpus]
        assert len(gpus) == p.cards
        assert {g.model for g in gpus} == {p.card.model}
        assert {g.vendor for g in gpus} == {p.card.vendor}


# ------------------------------------------------------------------ organisation 1


def test_org1_two_teams_fine_tuning_7b_and_one_inference_service() -> None:
    plan = _plan("org1-finetune-7b.yaml")
    # alpha: full fine-tune of Llama-2-7B (6.74e9 params), mixed precision AdamW:
    # states 16 B x 6.74e9 = 107.84e9 B; activations with checkpointing
    # 2 x 2048 x 1 x 4096 x 32 + 34 x 2048 x 4096 = 536,870,912 + 285,212,672 = 822,083,584 B;
    # reserve 1 GiB. One H100 (80 GiB = 85,899,345,920 B) is too small: sharded, the room
    # per card is 85,899,345,920 - 822,083,584 - 1,073,741,824 = 84,003,520,512 B and
    # 107.84e9 / 84.0e9 = 1.28 -> 2 cards per task, 2 tasks -> 4 cards.
    alpha = _task(plan, "alpha/full-ft")
    assert alpha.estimate.shardable_bytes == pytest.approx(107.84e9)
    assert alpha.estimate.fixed_bytes == 822_083_584 + GIB
    assert alpha.whole_cards == 2 and alpha.units_milli == 4000
    # beta: LoRA, frozen weights 2 B x 6.74e9 = 13.48e9 B; adapters 32 layers x 4 matrices
    # x rank 16 x 2 x 4096 = 16,777,216 params x 16 B = 268,435,456 B; activations as
    # above; total 13.48e9 + 268,435,456 + 822,083,584 + 1,073,741,824 = 15,644,260,864 B
    # -> one H100 per task, 3 tasks -> 3 cards.
    beta = _task(plan, "beta/lora-ft")
    assert beta.estimate.total_bytes == pytest.approx(15_644_260_864)
    assert beta.whole_cards == 1 and beta.units_milli == 3000
    # product: inference, weights 13.48e9 B + KV 2 x 32 x 32 x 128 x 4096 x 4 x 2 B
    # = 8,589,934,592 B (2 GiB per 4096-token request) + 1 GiB = 23,143,676,416 B
    # = 22,071.5 -> 22,072 MiB. L40S: 49,152 MiB x 0.8 = 39,321 usable MiB;
    # fraction ceil(22,072,000 / 39,321) = 562 milli -> one per card, 2 tasks -> 2 cards.
    chat = _task(plan, "product/chat")
    assert chat.estimate.part("KV cache") == 8_589_934_592
    assert chat.memory_mib == 22_072
    assert chat.milli == 562
    pools = {p.name: p for p in plan.now.pools}
    assert pools["train"].cards == 7 and pools["train"].card.name == "H100-SXM"
    assert pools["inference"].cards == 2 and pools["inference"].usable_mib == 39_321
    assert "debug" not in pools
    # growth 0 %: the same next year
    assert plan.grown.cards == plan.now.cards == 9
    # power: train server 7 x 700 + 2000 = 6,900 W; inference 2 x 350 + 2000 = 2,700 W
    assert [s.watts for s in plan.now.power.servers] == [6900, 2700]
    assert plan.now.power.peak_w == 9600 and plan.now.power.racks_needed == 1
    assert plan.now.power.fits and not plan.problems
    # one large card or two smaller: the full fine-tune fits neither L40S (3 sharded) nor
    # one H100 -> one large, no choice; LoRA (15.6 GB) fits an L40S -> two smaller;
    # the service (22,072 MiB) does not fit an L4 (24,576 x 0.8 = 19,660 MiB) -> one large
    verdicts = {f"{c.workload.team}/{c.workload.name}": c for c in plan.comparisons}
    assert verdicts["alpha/full-ft"].verdict == "one large"
    assert (verdicts["alpha/full-ft"].large_cards, verdicts["alpha/full-ft"].small_cards) == (
        2, 3)
    assert verdicts["beta/lora-ft"].verdict == "two smaller"
    assert verdicts["beta/lora-ft"].small_tasks == 2
    assert verdicts["product/chat"].verdict == "one large"
    assert verdicts["product/chat"].small is not None
    assert verdicts["product/chat"].small.name == "L4"
    assert "no choice" in verdicts["product/chat"].why
    _policy_ok(plan)


# ------------------------------------------------------------------ organisation 2


def test_org2_five_teams_mixed_work_on_metax() -> None:
    plan = _plan("org2-metax-mixed.yaml")
    # pretrain: GPT-2 XL 1.5e9 params, states 24e9 B; activations 34 x 1024 x 8 x 1600 x 48
    # = 21,390,950,400 B; + 1 GiB = 46,464,692,224 B (43.3 GiB) < 64 GiB -> 1 card each
    gpt2 = _task(plan, "pretrain/gpt2")
    assert gpt2.estimate.total_bytes == pytest.approx(46_464_692_224)
    assert gpt2.whole_cards == 1
    # tune: QLoRA Llama-2-13B: 13e9 x 4.127/8 = 6,706,375,000 B; adapters 40 x 4 x 16 x 2 x
    # 5120 = 26,214,400 params x 16 B = 419,430,400 B; activations 2 x 2048 x 5120 x 40 +
    # 34 x 2048 x 5120 = 1,195,376,640 B; + 1 GiB -> 9,394,923,864 B -> 1 card each
    tune = _task(plan, "tune/qlora13b")
    assert tune.estimate.total_bytes == pytest.approx(9_394_923_864)
    assert tune.whole_cards == 1
    # serve: OPT-13B fp16 weights 25.8e9 B + KV 2 x 40 x 40 x 128 x 2048 x 8 x 2 B
    # = 13,421,772,800 B + 1 GiB = 40,295,514,624 B = 38,428.8 -> 38,429 MiB; C500 64 GiB:
    # 65,536 x 0.8 = 52,428 usable MiB; ceil(38,429,000 / 52,428) = 733 milli
    serve = _task(plan, "serve/opt13b")
    assert serve.memory_mib == 38_429 and serve.milli == 733
    # chat: Llama-2-7B, 13.48e9 + KV 524,288 B/token x 2048 x 4 = 4,294,967,296 + 1 GiB
    # = 18,848,709,120 B = 17,975.5 -> 17,976 MiB; ceil(17,976,000 / 52,428) = 343 milli
    chat = _task(plan, "chat/llama7b")
    assert chat.memory_mib == 17_976 and chat.milli == 343
    # lab: 8 GiB = 8,192 MiB measured; ceil(8,192,000 / 52,428) = 157 milli (6 per card)
    lab = _task(plan, "lab/notebooks")
    assert lab.milli == 157 and lab.estimate.measured
    # inference: 733 + 343 > 1000 and 3 x 343 > 1000, so a card holds {733} or {343, 343}:
    # 1 + 2 cards = 3; train 2 + 2 = 4; debug 5 x 157 = 785 -> 1
    pools = {p.name: p for p in plan.now.pools}
    assert {n: p.cards for n, p in pools.items()} == {"train": 4, "inference": 3, "debug": 1}
    assert sorted(sum(m for _l, m in card) for card in pools["inference"].packed) == [
        343, 686, 733]  # {343}, {343, 343}, {733}
    assert all(p.card.vendor == "metax" and p.card.model == "MetaX C500"
               for p in pools.values())
    # growth: chat 25 % -> ceil(3 x 1.25) = 4 tasks: {733}, {343, 343}, {343, 343} = 3 cards
    assert _task(plan, "chat/llama7b", grown=True).concurrent == 4
    assert plan.grown.pool("inference").cards == 3  # type: ignore[union-attr]
    # power: 4 x 350 + 1000 = 2,400; 3 x 350 + 1000 = 2,050; 350 + 1000 = 1,350 W
    # = 5,800 W, one rack (8 kW cooling of 10 kW power)
    assert plan.now.power.peak_w == 5800
    assert plan.now.power.rack_limit_w == 8000 and plan.now.power.limited_by == "cooling"
    assert plan.now.power.racks_needed == 1 and plan.grown.power.fits
    # no smaller MetaX card in the catalogue (all 64 GiB): said plainly
    assert {c.verdict for c in plan.comparisons} == {"no smaller card"}
    _policy_ok(plan)


# ------------------------------------------------------------------ organisation 3


def test_org3_growth_needs_a_second_rack() -> None:
    plan = _plan("org3-growth-two-racks.yaml")
    # now: training 8 x 60 GiB (measured) -> 8 H100 = one server of 8 x 700 + 2000 = 7,600 W;
    # serving 6 x 20 GiB: 20,480 MiB of 81,920 x 0.8 = 65,536 -> ceil(312.5) = 313 milli,
    # 3 per card -> 2 cards, a server of 2 x 700 + 2000 = 3,400 W; 11,000 W <= 15 kW
    assert _task(plan, "apps/serve").milli == 313
    assert plan.now.cards == 10
    assert plan.now.power.peak_w == 11_000 and plan.now.power.fits
    # growth 100 %: 16 training cards = 2 servers of 7,600 W; 12 services -> 4 cards,
    # 4 x 700 + 2000 = 4,800 W; 20,000 W; racks hold 15 kW (cooling): 7,600 + 4,800 in one,
    # 7,600 in the second -> 2 racks, 1 available
    assert {p.name: p.cards for p in plan.grown.pools} == {"train": 16, "inference": 4}
    assert sorted(s.watts for s in plan.grown.power.servers) == [4800, 7600, 7600]
    assert plan.grown.power.racks_needed == 2 and not plan.grown.power.fits
    assert sorted(plan.grown.power.rack_watts(i) for i in range(2)) == [7600, 12_400]
    assert any("needs 2 racks" in p for p in plan.problems)
    _policy_ok(plan)


def test_growth_rounds_up_to_whole_tasks() -> None:
    plan = _plan("org2-metax-mixed.yaml")
    t = _task(plan, "chat/llama7b", grown=True)
    assert t.concurrent == math.ceil(3 * 1.25)


# --------------------------------------------------------------------------- CLI


def test_cli_plan_writes_policy_and_reports(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    policy, md, page = tmp_path / "draft.yaml", tmp_path / "plan.md", tmp_path / "plan.html"
    assert cli.main(["plan", str(DATA / "org2-metax-mixed.yaml"), "--policy", str(policy),
                     "--report", str(md), "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert "inference  shared        3 x C500 (metax)" in out
    assert cli.main(["check-policy", "-q", str(policy)]) == 0
    text = md.read_text()
    # the figures behind the numbers: formulas, the catalogue's sources, the assumptions
    assert "2 x L 40 x KV heads 40 x head dim 128 x seq 2048 x requests 8 x 2 B" in text
    assert "https://www.metax-tech.com/" in text and "unverified" in text
    assert "hami-metax" in text
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and "<table>" in html and "C500" in html


def test_cli_plan_example_in_hub_config(tmp_path: Path) -> None:
    example = Path(__file__).parent.parent / "hub_config" / "plan-example.yaml"
    policy = tmp_path / "draft.yaml"
    assert cli.main(["plan", str(example), "--policy", str(policy)]) == 0
    assert cli.main(["check-policy", "-q", str(policy)]) == 0


def test_cli_draft_for_today_or_after_growth(tmp_path: Path) -> None:
    org3 = str(DATA / "org3-growth-two-racks.yaml")
    grown, now = tmp_path / "grown.yaml", tmp_path / "now.yaml"
    assert cli.main(["plan", org3, "--policy", str(grown)]) == 0
    assert cli.main(["plan", org3, "--policy", str(now), "--for", "now"]) == 0
    count = {f.name: sum(len(n.gpus) for n in check_policy(f.read_text()).policy.nodes)
             for f in (grown, now)}  # type: ignore[union-attr]
    assert count == {"grown.yaml": 20, "now.yaml": 10}


# ------------------------------------------------------------- vendor in the policy


def test_policy_names_the_vendor_and_the_spawn_form_shows_the_card() -> None:
    from jupyter_gpushare.spawner.form import choices_for, render_form

    check = check_policy(draft_policy(_plan("org2-metax-mixed.yaml")), "draft.yaml")
    assert check.policy is not None
    choices = {c.slug: c for c in choices_for(check.policy, ["chat"])}
    assert choices["chat-llama7b"].card == "MetaX C500"
    assert "on MetaX C500" in render_form(list(choices.values()))
    nvidia = check_policy(draft_policy(_plan("org3-growth-two-racks.yaml")), "d.yaml").policy
    assert nvidia is not None
    (choice,) = choices_for(nvidia, ["apps"])
    assert choice.card == "NVIDIA H100 80GB HBM3"  # the model already names its vendor


def test_a_bad_vendor_is_an_error_with_its_line() -> None:
    text = draft_policy(_plan("org3-growth-two-racks.yaml")).replace(
        "vendor: nvidia", "vendor: 'nvidia corp'", 1)
    check = check_policy(text, "draft.yaml")
    assert check.policy is None
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "nvidia corp" in t)
    assert any(str(e).startswith(f"draft.yaml:{line}: inventory.nodes[0].gpus[0].vendor: got "
                                 "'nvidia corp' (expected a vendor name") for e in check.errors)
