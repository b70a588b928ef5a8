"""Memory per task from first principles, with every assumption written down.

Pure functions of a :class:`~.model.Workload`; nothing here reads files. Each estimate is a
list of :class:`Component` s (what, how many bytes, the formula with its figures), so the
report can show the figures behind every number.

Training and fine-tuning (mixed precision, ZeRO paper, Rajbhandari et al. 2020, §3.1):
weights 2 B + gradients 2 B + optimizer states K B per parameter, K = 12 for mixed-precision
Adam (fp32 master weights, momentum and variance, 4 B each): 16 B per parameter in all.
Activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", eq. 1): 34·s·b·h bytes per layer with 16-bit activations when the
attention scores are not stored (FlashAttention-style kernels, the default of current
frameworks); with activation checkpointing only each layer's 16-bit input, 2·s·b·h bytes,
is kept, plus one layer's full working set while it is recomputed.

Inference: weights (parameters × bytes per weight) + KV cache (2 tensors, K and V, × layers
× KV heads × head dimension × tokens × concurrent requests × bytes per value; the formula of
NVIDIA's "Mastering LLM Techniques: Inference Optimization" and of the vLLM paper §3).
Activations of one forward pass are transient and small beside the KV cache; they are
covered by the runtime reserve and the pool's headroom.

Every task also gets a runtime reserve per card (default 1 GiB: CUDA/ROCm context and
allocator slack).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .model import DTYPES, GIB, Settings, Workload

MIXED_OPTIMIZER_BYTES = {"adamw": 12.0, "adam": 12.0, "adam-8bit": 6.0, "sgd": 8.0}
"""Optimizer state bytes per trained parameter with mixed precision (fp32 master included)."""
FP32_OPTIMIZER_BYTES = {"adamw": 8.0, "adam": 8.0, "adam-8bit": 2.0, "sgd": 4.0}
BF16_OPTIMIZER_BYTES = {"adamw": 4.0, "adam": 4.0, "adam-8bit": 2.0, "sgd": 2.0}
QLORA_BYTES_PER_WEIGHT = 4.127 / 8
"""NF4 weights with double-quantised constants: 4.127 bits per parameter (QLoRA paper §3)."""
ACTIVATION_BYTES_PER_LAYER = 34
"""Bytes per token per hidden unit per layer, 16-bit activations (Korthikanti et al. eq. 1)."""
CHECKPOINT_BYTES_PER_LAYER = 2
"""Bytes per token per hidden unit per layer kept with activation checkpointing."""


@dataclass(frozen=True)
class Component:
    """One part of a task's memory."""

    label: str
    bytes: float
    formula: str
    shardable: bool = True  # splits over the cards of a multi-card task


@dataclass(frozen=True)
class Estimate:
    """A task's peak memory, part by part."""

    components: tuple[Component, ...]
    assumptions: tuple[str, ...]
    measured: bool = False  # the admin gave the peak instead of the model

    @property
    def shardable_bytes(self) -> float:
        return sum(c.bytes for c in self.components if c.shardable)

    @property
    def fixed_bytes(self) -> float:
        return sum(c.bytes for c in self.components if not c.shardable)

    @property
    def total_bytes(self) -> float:
        """Peak memory on one card when the task runs on one card."""
        return self.shardable_bytes + self.fixed_bytes

    def per_card_bytes(self, cards: int) -> float:
        """Peak memory on each card when the task is split over ``cards`` cards."""
        return self.shardable_bytes / max(cards, 1) + self.fixed_bytes

    def part(self, label: str) -> float:
        """Bytes of the component called ``label`` (0 when absent)."""
        return sum(c.bytes for c in self.components if c.label == label)


def gib(value: float) -> str:
    """Bytes as GiB text with two decimals."""
    return f"{value / GIB:.2f} GiB"


def _count(value: float) -> str:
    if value >= 1e9:
        return f"{value / 1e9:g}e9"
    if value >= 1e6:
        return f"{value / 1e6:g}e6"
    return f"{value:g}"


def _reserve(settings: Settings) -> Component:
    return Component("runtime reserve", settings.runtime_reserve_bytes,
                     f"{gib(settings.runtime_reserve_bytes)} per card (context, allocator slack)",
                     shardable=False)


def _measured(w: Workload) -> Estimate:
    value = float(w.memory_override_bytes or 0)
    return Estimate(
        (Component("measured peak", value, f"{gib(value)} as given in the input",
                   shardable=False),),
        ("the peak was given (measured), so no estimate and no reserve were added",),
        measured=True,
    )


def estimate(w: Workload, settings: Settings) -> Estimate:
    """The peak memory of one task of ``w`` (dispatch on its kind)."""
    if w.memory_override_bytes is not None:
        return _measured(w)
    if w.kind in ("training", "fine-tuning"):
        return training_estimate(w, settings)
    return inference_estimate(w, settings)


def _optimizer_bytes(precision: str, optimizer: str) -> float:
    table = {"mixed": MIXED_OPTIMIZER_BYTES, "fp32": FP32_OPTIMIZER_BYTES,
             "bf16": BF16_OPTIMIZER_BYTES}[precision]
    return table[optimizer]


def lora_parameters(w: Workload) -> float:
    """Trainable adapter parameters: layers × targets × rank × (d_in + d_out), d = hidden."""
    assert w.model is not None
    return float(w.model.layers * w.lora_targets * w.lora_rank * 2 * w.model.hidden)


def activation_bytes(w: Workload) -> tuple[float, str, str]:
    """Activation memory of one training micro-batch: (bytes, formula, assumption)."""
    assert w.model is not None
    m = w.model
    s, b, h, layers = w.sequence_length, w.micro_batch, m.hidden, m.layers
    scale = 2.0 if w.precision == "fp32" else 1.0  # fp32 activations take twice the bytes
    per_layer = ACTIVATION_BYTES_PER_LAYER * s * b * h * scale
    if w.activation_checkpointing:
        kept = CHECKPOINT_BYTES_PER_LAYER * s * b * h * layers * scale
        total = kept + per_layer
        factor = f" x {scale:g}" if scale != 1 else ""
        formula = (f"2 B x s {s} x b {b} x h {h} x L {layers}{factor} (layer inputs kept) "
                   f"+ 34 B x s x b x h{factor} (one layer recomputed)")
        note = "activation checkpointing: only each layer's 16-bit input is kept"
    else:
        total = per_layer * layers
        factor = f" x {scale:g}" if scale != 1 else ""
        formula = f"34 B x s {s} x b {b} x h {h} x L {layers}{factor}"
        note = ("activations 34·s·b·h bytes per layer (Korthikanti et al. 2022), attention "
                "scores not stored (FlashAttention-style kernels)")
    return total, formula, note


def training_estimate(w: Workload, settings: Settings) -> Estimate:
    """Training or fine-tuning: weights + gradients + optimizer states + activations."""
    assert w.model is not None
    p = w.model.params
    parts: list[Component] = []
    notes: list[str] = []
    weight_bytes = 4.0 if w.precision == "fp32" else 2.0
    if w.method == "full":
        grad_bytes = weight_bytes
        opt = _optimizer_bytes(w.precision, w.optimizer)
        parts += [
            Component("weights", p * weight_bytes, f"{_count(p)} params x {weight_bytes:g} B"),
            Component("gradients", p * grad_bytes, f"{_count(p)} params x {grad_bytes:g} B"),
            Component("optimizer states", p * opt,
                      f"{_count(p)} params x {opt:g} B ({w.optimizer}, {w.precision})"),
        ]
        notes.append(f"{w.precision} precision, {w.optimizer}: "
                     f"{weight_bytes + grad_bytes + opt:g} bytes per parameter for weights, "
                     "gradients and optimizer states (ZeRO paper §3.1: 16 for mixed Adam)")
    else:
        base = QLORA_BYTES_PER_WEIGHT if w.method == "qlora" else 2.0
        trainable = lora_parameters(w)
        opt = MIXED_OPTIMIZER_BYTES[w.optimizer]
        parts += [
            Component("weights", p * base,
                      f"{_count(p)} frozen params x {base:.3g} B ({w.method})"),
            Component("adapter states", trainable * (2 + 2 + opt),
                      f"{_count(trainable)} adapter params (L x {w.lora_targets} matrices x "
                      f"rank {w.lora_rank} x 2h) x {2 + 2 + opt:g} B"),
        ]
        notes.append(f"{w.method}: frozen base weights at {base:.3g} B per parameter, "
                     f"rank-{w.lora_rank} adapters on {w.lora_targets} matrices per layer "
                     "trained in mixed precision")
    act, formula, note = activation_bytes(w)
    parts.append(Component("activations", act, formula, shardable=False))
    notes.append(note)
    parts.append(_reserve(settings))
    notes.append("split over several cards the model states shard (ZeRO-3 / FSDP), the "
                 "activations of each card's micro-batch do not")
    return Estimate(tuple(parts), tuple(notes))


def kv_cache_bytes(w: Workload) -> float:
    """2 × layers × KV heads × head dim × tokens × requests × bytes per value."""
    assert w.model is not None
    m = w.model
    return (2 * m.layers * m.kv_heads * m.head_dim * w.sequence_length
            * w.concurrent_requests * DTYPES[w.kv_dtype])


def inference_estimate(w: Workload, settings: Settings) -> Estimate:
    """Inference or debugging: weights + KV cache for the concurrent requests."""
    assert w.model is not None
    m = w.model
    wb, kvb = DTYPES[w.weights_dtype], DTYPES[w.kv_dtype]
    kv = kv_cache_bytes(w)
    parts = (
        Component("weights", m.params * wb, f"{_count(m.params)} params x {wb:g} B "
                  f"({w.weights_dtype})"),
        Component("KV cache", kv,
                  f"2 x L {m.layers} x KV heads {m.kv_heads} x head dim {m.head_dim:g} x "
                  f"seq {w.sequence_length} x requests {w.concurrent_requests} x {kvb:g} B"),
        _reserve(settings),
    )
    notes = (
        f"KV cache for {w.concurrent_requests} concurrent request(s) of "
        f"{w.sequence_length} tokens each, all at full length at once (peak)",
        "activations of one forward pass are transient; the runtime reserve and the "
        "pool's headroom cover them",
    )
    return Estimate(parts, notes)


def cards_for(est: Estimate, usable_bytes: float) -> int | None:
    """Fewest cards of ``usable_bytes`` each that hold the task (None: never fits)."""
    if est.total_bytes <= usable_bytes:
        return 1
    room = usable_bytes - est.fixed_bytes
    if room <= 0 or est.shardable_bytes <= 0:
        return None
    return max(2, math.ceil(est.shardable_bytes / room - 1e-12))
