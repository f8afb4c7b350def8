"""Seven modelled tables over the real-data knobs that can say no to the registry (issue 23), and
three held-out ones (:data:`HELD_OUT`) written after the default search was settled.

The project's own knobs table (``search_tables.py``) agrees with the registry's speed orders, so a
search that starts from those orders looks perfect on it. These tables come from a separate,
physics-shaped model written for this purpose: it shares no code and no order with
``explorer/knobs`` (the search never reads it; the project's code is used only to enumerate each
study's space and draw its entries' lengths). Where the model and the registry disagree, it is
because the public sources below say so.

Scenarios (:data:`SCENARIOS`): granite-3.1-2b, llama-3.1-8b (full and LoRA), qwen2.5-0.5b and
mistral-7b LoRA; H100-80GB, A100-40GB, A100-80GB and PCIe L40S; 1 to 8 GPUs; short
(``instruction-short``) and long (``instruction-long``) entries; one with ``torch_compile``.

The model, per device and per optimizer micro-step on ``b`` entries of sequence length ``s``
(P parameters, h hidden, I intermediate, L layers, V vocabulary, kv the key/value width):

**Work.** ``max_length`` pads every entry to ``s``; ``longest`` to the expected longest of ``b``
entries drawn at random; ``packed`` concatenates them into one row of ``b * mean`` tokens. The
linear layers process the padded tokens T. Flash attention (varlen) works on each entry's own
square (sum of l^2); the dense kernels (sdpa with a mask runs the memory-efficient kernel, eager)
compute the full square of each row: ``b * row^2``, and for ``packed`` the whole packed row
``(b * mean)^2`` under transformers' block-diagonal mask (masking_utils builds it from the
position ids; issue 27, item 5).

**Memory** (GiB; OOM when the reserved peak exceeds the card's :attr:`Gpu.capacity_gib`):

* context: 0.75 GiB (CUDA context and cuBLAS workspace), +0.6 GiB NCCL buffers on 2+ GPUs
  (assumptions, typical ``nvidia-smi`` readings);
* states, bytes a parameter (weights, gradients, optimizer): mixed 4/4 and AdamW 8 (both
  ``adamw_torch`` and ``adamw_torch_fused``: the fused kernel keeps the same ``exp_avg`` and
  ``exp_avg_sq``, torch/optim/adam.py), ``adamw_bnb_8bit`` 2 (two 8-bit states, bitsandbytes),
  ``adafactor`` 0.1 (factored row and column moments of the 2-D weights, transformers'
  Adafactor) except under FSDP1, whose flat 1-D shards get full second moments: 4 (issue 27,
  item 5); pure_bf16 2/2 and half the AdamW and Adafactor bytes. Mixed precision on one device or
  DDP keeps autocast's bf16 weight copies (2). DDP adds a gradient bucket copy
  (``gradient_as_bucket_view=False``, PyTorch DDP docs). LoRA (r 16 on the seven projections):
  frozen bf16 base weights (2) and fp32 adapters with AdamW (16 a trainable parameter);
* sharding: FULL_SHARD divides states by N and holds two layers of gathered bf16 weights and one
  of unsharded gradients; SHARD_GRAD_OP keeps all bf16 weights gathered (2P) plus sharded states;
  ``fsdp_cpu_offload`` leaves only the gathered working set on the GPU; FSDP with offload on
  one GPU (issue 23) is the same with N = 1 (no NCCL buffers, no communication: a world of one);
* activations, bytes a token a layer: what a transformers decoder layer saves, as
  ``benchmarks/activation_bytes.py`` counts it (autograd's saved-tensor hooks): ``30h + 4kv + 8I``
  under bf16 autocast (fp32 RMSNorm tensors, every projection's bf16 input cast), ``20h + 4kv +
  8I`` in pure bf16; Liger's fused RMSNorm and SwiGLU keep ``8h + 2I`` less (its RMSNorm its bf16
  input and an fp32 rstd a row, its SwiGLU the gate and up projections: Liger-Kernel's source); a
  checkpointed layer keeps its input (fp32 under autocast: 4h; 2h in pure bf16) and one layer is
  recomputed at a time; torch_compile's min-cut saves 15% (assumption) unless Liger breaks the
  graph. The tables as first written priced Korthikanti et al. 2022's count, ``2 * (6h + 2kv +
  3I)`` (+4h under mixed; Liger ``2h + 2I`` less; a checkpointed layer 2h): their bests are in
  ``knobs-*tables.korthikanti.sha256.json``;
* attention: eager keeps 6 bytes a score element a head (fp32 softmax output, bf16
  probabilities) in each layer not checkpointed plus one fp32 layer transient, and a bf16 additive
  mask; sdpa a 1-byte boolean mask; flash nothing;
* logits: 10 bytes a token a vocabulary entry (bf16 logits, fp32 upcast, fp32 gradient); Liger's
  fused linear cross entropy keeps one chunk (its chunk-size rule) except on granite, where
  Liger's patch has no fused loss (issue 27, item 4);
* the caching allocator reserves 10% above the allocated peak under FSDP1 (flat parameters,
  ``record_stream``), 5% otherwise, 3% under FSDP2 (assumptions).

**Time per step** (seconds):

* matmuls: ``(6 + 2f) * P_body * T + 6hVT`` FLOPs (``4 + 2f`` for LoRA: no weight gradients of
  the frozen base), at ``mfu_max * T / (T + 4e6/h)`` of the card's bf16 peak (small layers and
  small steps use a GPU badly; mfu_max per card below, assumptions near published MFU reports);
* attention: flash ``(7 + 2f) * h * sum(l^2)`` FLOPs a layer at the card's FlashAttention-2
  efficiency (Dao 2023; Shah et al. 2024); sdpa ``(14 + 4f) * h * dense`` at 0.6 of it; eager
  the same FLOPs at half the matmul efficiency plus 24 bytes a score element a head through HBM;
* element-wise work (norms, activations, RoPE, residuals): three passes over the activation
  bytes through HBM; Liger fuses them (x0.6), torch_compile too (x0.55); the cross entropy reads
  and writes the logits twice (gone with Liger's fused loss);
* mixed precision: autocast re-casts the weights, forward and backward (6 bytes a parameter
  twice through HBM); pure_bf16 does not;
* optimizer: the bytes it touches through HBM, x1.3 ``adamw_torch`` (foreach, several passes),
  x1.0 fused, x1.2 8-bit (dequantise), x1.8 adafactor (row and column reductions): assumptions;
* communication (2+ GPUs, NCCL bus bandwidth per card below): DDP all-reduces the gradients
  (fp32 under mixed), FSDP gathers bf16 weights (twice with FULL_SHARD, once with SHARD_GRAD_OP)
  and reduce-scatters bf16 gradients; hidden behind compute up to 80% (DDP), 85% (FSDP2), 70%
  (FSDP1): assumptions;
* CPU offload (one GPU too): weights (twice) and gradients cross PCIe (per-card bandwidth below) and PyTorch's
  CPU AdamW steps 0.3e9 parameters a second a rank (ZeRO-Offload, Ren et al. 2021, measures
  PyTorch's CPU Adam several times slower than its 1-2e9/s CPU-Adam), none of it overlapped;
* torch_compile: graph breaks cost 6% of the step with Liger (its autograd functions), 10% with
  flash attention's unpadding (data-dependent shapes) and 15% with flash on packed rows
  (recompiles for new sequence boundaries), and the element-wise gain falls to x0.8: assumptions
  that follow the issue's report;
* near the memory limit the allocator frees its cache and retries (``num_alloc_retries``): above
  90% of the card, the step is ``1 + 3 * (used - 0.9)`` slower (assumption).

**Measured throughput** is dataset tokens (``b * mean``) over the step time, times a
multiplicative noise of 2% (log-normal, seeded by the configuration): the column
``dataset_tokens_per_second_per_gpu``. The noise-free value is
``dataset_tokens_per_second_per_gpu_noise_free``, which benchmark-search scores against.

**Duration** of a trial (``wall_seconds``, for GPU-hours): 15 s plus the bf16 weights read at
1.5 GB/s, +60 s and 0.5 s a layer with torch_compile, then 25 steps when it fits, one when it
runs out of memory.

**Certified tables** (``--certified``: ``knobs-<name>-certified.csv.gz``, hashes in
``knobs-certified-tables.sha256.json``): the same rows, except that a configuration whose batches
change shape (``longest``, ``packed``) has the peak of its worst case, ``b`` entries of ``s``
tokens each (``T = b s``; flash ``b s^2``; the dense kernels ``b s^2``, or ``(b s)^2`` for one
packed row), and runs out of memory above the card's limit there. That is what a trial measures:
the worker trains one step on such a batch after the measured window and counts its peak
(``explorer/worker/_worst_case.py``). The first tables price the sampled batches only, so their
packed and longest rows fit where a real trial would not. The throughput is the sampled batches'
in both.

    .venv/bin/python benchmarks/knob_tables.py              # write the studies and tables
    .venv/bin/python benchmarks/knob_tables.py --check      # only compare with the recorded hashes
    .venv/bin/python benchmarks/knob_tables.py --certified  # the certified tables (and --check)
"""

from __future__ import annotations

import argparse
import csv
import gzip
import hashlib
import io
import json
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TABLES = ROOT / "benchmarks" / "results" / "tables"
STUDIES = ROOT / "benchmarks" / "search_studies" / "knobs"
HASHES = TABLES / "knobs-tables.sha256.json"
CERTIFIED_HASHES = TABLES / "knobs-certified-tables.sha256.json"
GIB = 2**30


@dataclass(frozen=True)
class Arch:
    name: str
    model_type: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    fused_loss: bool
    """Whether Liger's patch for this model type fuses the linear cross entropy."""

    @property
    def kv(self) -> int:
        return self.hidden // self.heads * self.kv_heads

    @property
    def body(self) -> float:
        """Parameters of the decoder layers (the matmuls)."""
        h, i = self.hidden, self.intermediate
        return self.layers * (h * (2 * h + 2 * self.kv) + 3 * h * i + 2 * h)

    @property
    def params(self) -> float:
        emb = self.vocab * self.hidden
        return self.body + emb * (1 if self.tied else 2) + self.hidden

    def lora_params(self, r: int) -> float:
        h, i, kv = self.hidden, self.intermediate, self.kv
        per_layer = r * ((h + h) * 2 + (h + kv) * 2 + (h + i) * 2 + (i + h))
        return self.layers * per_layer


ARCHS = {  # each model's config.json on the Hugging Face Hub
    "granite-3.1-2b": Arch("granite-3.1-2b", "granite", 2048, 8192, 40, 32, 8, 49155, True, False),
    "llama-3.1-8b": Arch("llama-3.1-8b", "llama", 4096, 14336, 32, 32, 8, 128256, False, True),
    "qwen2.5-0.5b": Arch("qwen2.5-0.5b", "qwen2", 896, 4864, 24, 14, 2, 151936, True, True),
    "mistral-7b": Arch("mistral-7b", "mistral", 4096, 14336, 32, 32, 8, 32768, False, True),
    # the held-out tables' models (added after the default search was settled)
    "phi-3-mini": Arch("phi-3-mini", "phi3", 3072, 8192, 32, 32, 32, 32064, False, True),
    "gemma-2-2b": Arch("gemma-2-2b", "gemma2", 2304, 9216, 26, 8, 4, 256000, True, True),
    "qwen2.5-7b": Arch("qwen2.5-7b", "qwen2", 3584, 18944, 28, 28, 4, 152064, False, True),
}


@dataclass(frozen=True)
class Gpu:
    name: str
    capacity_gib: float
    """Memory a process can reserve."""
    peak: float
    """Dense bf16 FLOP/s (datasheet)."""
    hbm: float
    """Memory bandwidth, bytes/s (datasheet)."""
    bus: float
    """NCCL bus bandwidth reached between its GPUs, bytes/s (about 40% of NVLink's datasheet
    figure; PCIe cards without NVLink: host PCIe; assumptions)."""
    pcie: float
    """Host-device bandwidth reached, bytes/s (assumption: about 60% of the link)."""
    mfu_max: float
    """Best matmul efficiency of a training step (assumption near published MFU reports)."""
    flash: float
    """FlashAttention-2's share of the peak (Dao 2023: 50-73% forward on A100; about 35-40% on
    H100, Shah et al. 2024)."""


GPUS = {
    "NVIDIA-H100-80GB-HBM3": Gpu("NVIDIA-H100-80GB-HBM3", 79.2, 989e12, 3.35e12, 360e9, 40e9, 0.60, 0.38),
    "NVIDIA-A100-SXM4-40GB": Gpu("NVIDIA-A100-SXM4-40GB", 39.4, 312e12, 1.555e12, 230e9, 20e9, 0.68, 0.55),
    "NVIDIA-A100-SXM4-80GB": Gpu("NVIDIA-A100-SXM4-80GB", 79.2, 312e12, 2.039e12, 230e9, 20e9, 0.68, 0.55),
    "NVIDIA-L40S": Gpu("NVIDIA-L40S", 44.4, 362e12, 0.864e12, 16e9, 20e9, 0.58, 0.45),
    # the held-out tables' cards: H200 (141 GB HBM3e, 4.8 TB/s, H100's compute) and the L4 (24 GB
    # GDDR6 at 300 GB/s, 121 TFLOP/s dense bf16, PCIe 4.0 only), NVIDIA's data sheets
    "NVIDIA-H200": Gpu("NVIDIA-H200", 139.8, 989e12, 4.8e12, 360e9, 40e9, 0.60, 0.38),
    "NVIDIA-L4": Gpu("NVIDIA-L4", 22.0, 121e12, 0.3e12, 12e9, 18e9, 0.55, 0.45),
}


@dataclass(frozen=True)
class Scenario:
    name: str
    arch: str
    gpu: str
    gpus_per_node: int
    method: str
    preset: str
    space: dict[str, list[Any]]
    description: str


_KNOBS = {
    "distributed_backend": ["DDP", "FSDP"],
    "fsdp_version": [1, 2],
    "fsdp_sharding_strategy": ["FULL_SHARD", "SHARD_GRAD_OP"],
    "fsdp_cpu_offload": [False, True],
    "gradient_checkpointing": [False, True],
    "checkpoint_fraction": [0.5, 1.0],
    "padding": ["max_length", "longest", "packed"],
    "attn_implementation": ["eager", "sdpa", "flash_attention_2"],
    "precision": ["mixed", "pure_bf16"],
    "liger_kernel": [False, True],
    "optim": ["adamw_torch", "adamw_torch_fused", "adamw_bnb_8bit", "adafactor"],
}


def _space(**over: list[Any]) -> dict[str, list[Any]]:
    out = {k: over.pop(k) for k in ("batch_size", "number_gpus", "model_max_length")}
    out |= _KNOBS
    out |= over
    return out


SCENARIOS = (
    Scenario(
        "granite-2b-h100x8-short",
        "granite-3.1-2b",
        "NVIDIA-H100-80GB-HBM3",
        8,
        "full",
        "instruction-short",
        _space(batch_size=[16, 64, 256], number_gpus=[1, 2, 8], model_max_length=[2048]),
        "granite full fine-tuning on short entries: Liger has no fused loss on granite",
    ),
    Scenario(
        "llama-8b-a100-40x2-full",
        "llama-3.1-8b",
        "NVIDIA-A100-SXM4-40GB",
        2,
        "full",
        "instruction-short",
        _space(batch_size=[4, 8, 16, 32], number_gpus=[1, 2], model_max_length=[1024]),
        "an 8B full fine-tune on two 40 GB cards: only sharding, pure bf16, small optimizers or "
        "offload hold it",
    ),
    Scenario(
        "llama-8b-h100x4-lora-long",
        "llama-3.1-8b",
        "NVIDIA-H100-80GB-HBM3",
        4,
        "lora",
        "instruction-long",
        _space(batch_size=[16, 64], number_gpus=[1, 2, 4], model_max_length=[4096]),
        "llama LoRA on long chat entries: packed rows under dense kernels blow up",
    ),
    Scenario(
        "qwen-0.5b-l40s-x4-short",
        "qwen2.5-0.5b",
        "NVIDIA-L40S",
        4,
        "full",
        "instruction-short",
        _space(batch_size=[32, 128, 512], number_gpus=[1, 2, 4], model_max_length=[1024]),
        "a small model with a large vocabulary on PCIe cards: logits dominate, communication is slow",
    ),
    Scenario(
        "mistral-7b-a100-80x2-lora",
        "mistral-7b",
        "NVIDIA-A100-SXM4-80GB",
        2,
        "lora",
        "instruction-long",
        _space(batch_size=[8, 32], number_gpus=[1, 2], model_max_length=[2048, 4096]),
        "mistral LoRA on long entries, two sequence lengths",
    ),
    Scenario(
        "granite-2b-a100-80x4-compile",
        "granite-3.1-2b",
        "NVIDIA-A100-SXM4-80GB",
        4,
        "full",
        "instruction-short",
        _space(
            batch_size=[16, 64],
            number_gpus=[1, 4],
            model_max_length=[2048],
            torch_compile=[False, True],
            optim=["adamw_torch", "adamw_torch_fused", "adafactor"],
        ),
        "torch_compile against flash attention's unpadding and Liger's graph breaks",
    ),
    Scenario(
        "llama-8b-h100x8-full-long",
        "llama-3.1-8b",
        "NVIDIA-H100-80GB-HBM3",
        8,
        "full",
        "instruction-long",
        _space(batch_size=[8, 32, 128], number_gpus=[1, 2, 8], model_max_length=[4096]),
        "an 8B full fine-tune on long entries: one card holds it only in pure bf16 with 8-bit states",
    ),
)


HELD_OUT = (
    Scenario(
        "phi3-mini-h200x8-short",
        "phi-3-mini",
        "NVIDIA-H200",
        8,
        "full",
        "instruction-short",
        _space(batch_size=[16, 64, 256], number_gpus=[1, 2, 8], model_max_length=[2048]),
        "a 3.8B model with full multi-head attention on 141 GB cards: memory rarely decides",
    ),
    Scenario(
        "gemma2-2b-l4x2-lora-long",
        "gemma-2-2b",
        "NVIDIA-L4",
        2,
        "lora",
        "instruction-long",
        _space(batch_size=[4, 16, 64], number_gpus=[1, 2], model_max_length=[1024, 2048]),
        "a 256k vocabulary on 24 GB PCIe cards whose memory is not in their name: the logits decide",
    ),
    Scenario(
        "qwen-7b-a100-80x8-full-long",
        "qwen2.5-7b",
        "NVIDIA-A100-SXM4-80GB",
        8,
        "full",
        "instruction-long",
        _space(batch_size=[8, 32, 128], number_gpus=[1, 2, 4, 8], model_max_length=[4096]),
        "a 7B full fine-tune with a 152k vocabulary on 1 to 8 A100-80GB, long entries",
    ),
)
"""Three tables added after the default search and its constants were settled (models, cards and
shapes none of the seven has), run once and reported as they came out: the search was never
tuned on them."""


# -- the entries ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entries:
    lengths: tuple[int, ...]

    def mean(self, s: int) -> float:
        return sum(min(n, s) for n in self.lengths) / len(self.lengths)

    def mean_square(self, s: int) -> float:
        return sum(min(n, s) ** 2 for n in self.lengths) / len(self.lengths)

    def longest_of(self, b: int, s: int) -> float:
        n = len(self.lengths)
        return sum(min(x, s) * (((k + 1) / n) ** b - (k / n) ** b) for k, x in enumerate(self.lengths))


@dataclass(frozen=True)
class Work:
    tokens: float  # processed by the linear layers (padding included)
    dataset: float  # real entry tokens
    flash: float  # sum of squared entry lengths
    dense: float  # score elements of one head (the full squares)


def work_of(e: Entries, padding: str, b: int, s: int) -> Work:
    mean, flash = e.mean(s), b * e.mean_square(s)
    if padding == "packed":
        return Work(b * mean, b * mean, flash, (b * mean) ** 2)
    row = s if padding == "max_length" else e.longest_of(b, s)
    return Work(b * row, b * mean, flash, b * row**2)


# -- the model -----------------------------------------------------------------------------------


def _states(a: Arch, c: Any, lora: bool) -> tuple[float, float]:
    """(bytes held on the GPU for weights, gradients and optimizer; bytes a step's optimizer touches)."""
    n, pure = c.number_gpus, c.precision == "pure_bf16"
    fsdp = c.distributed_backend == "FSDP"
    p, body_layer = a.params, a.body / a.layers
    if lora:
        t = a.lora_params(16)
        w_frozen, train = 2 * p, 16 * t
        opt_bytes = 16 * t
    else:
        t = p
        w, g = (2, 2) if pure else (4, 4)
        o = {"adamw_bnb_8bit": 2.0, "adafactor": 4.0 if (fsdp and c.fsdp_version == 1) else 0.1}.get(
            c.optim, 8.0
        )
        if pure and c.optim != "adamw_bnb_8bit":
            o /= 2
        w_frozen, train = 0.0, (w + g + o) * p
        opt_bytes = (w + g + o) * p
    if not fsdp:
        held = w_frozen + train
        if not lora and not pure:
            held += 2 * p  # autocast's bf16 weight copies
        if c.distributed_backend == "DDP":
            held += (2 if pure else 4) * t  # DDP's gradient buckets
        return held, opt_bytes
    shard = (w_frozen + train) / n
    strategy = c.fsdp_sharding_strategy
    gathered = 2 * p if strategy == "SHARD_GRAD_OP" else 2 * 2 * body_layer + 4 * body_layer
    held = gathered + (0.0 if c.fsdp_cpu_offload else shard)
    return held, opt_bytes / n


def _activation_bytes(a: Arch, c: Any) -> float:
    """Bytes a token and layer that a transformers decoder layer saves: ``30h + 4kv + 8I`` under
    bf16 autocast, ``20h + 4kv + 8I`` in pure bf16 (counted, ``benchmarks/activation_bytes.py``);
    Liger's RMSNorm and SwiGLU ``8h + 2I`` fewer (their sources)."""
    h, i, kv = a.hidden, a.intermediate, a.kv
    per = (30 * h if c.precision == "mixed" else 20 * h) + 4 * kv + 8 * i
    if c.liger_kernel:
        per -= 8 * h + 2 * i
    return per


def _checkpointed_input(a: Arch, c: Any) -> float:
    """Bytes a token that a checkpointed layer keeps: its input, fp32 under autocast (the residual
    stream is in the weights' dtype), bf16 in pure bf16."""
    return (4 if c.precision == "mixed" else 2) * a.hidden


def memory_gib(a: Arch, g: Gpu, c: Any, w: Work, lora: bool) -> float:
    f = c.checkpoint_fraction if c.gradient_checkpointing else 0.0
    ctx = 0.75 * GIB + (0.6 * GIB if c.number_gpus > 1 else 0.0)
    states, _ = _states(a, c, lora)
    per = _activation_bytes(a, c)
    ck = round(f * a.layers)
    kept = a.layers - ck
    acts = (kept * per + ck * _checkpointed_input(a, c)) * w.tokens + (per * w.tokens if ck else 0.0)
    compile_ = getattr(c, "torch_compile", False)
    if compile_ and not c.liger_kernel:
        acts *= 0.85
    attn = 0.0
    if c.attn_implementation == "eager":
        attn = 6 * a.heads * w.dense * (kept + (1 if ck else 0)) + 4 * a.heads * w.dense + 2 * w.dense
    elif c.attn_implementation == "sdpa":
        attn = w.dense
    if c.liger_kernel and a.fused_loss:
        chunk = min(w.tokens, 2 ** math.ceil(math.log2(max(1.0, w.tokens / math.ceil(a.vocab / a.hidden)))))
        logits = 6 * chunk * a.vocab
    else:
        logits = 10 * w.tokens * a.vocab
    frag = (
        1.10
        if (c.distributed_backend == "FSDP" and c.fsdp_version == 1)
        else 1.03
        if c.fsdp_version == 2
        else 1.05
    )
    return (ctx + (states + acts + attn + logits) * frag) / GIB


def step_seconds(a: Arch, g: Gpu, c: Any, w: Work, lora: bool, used: float) -> float:
    f = c.checkpoint_fraction if c.gradient_checkpointing else 0.0
    n, h, t = c.number_gpus, a.hidden, w.tokens
    compile_ = bool(getattr(c, "torch_compile", False))
    eff = g.mfu_max * t / (t + 4e6 / h)
    base = 4 if lora else 6
    matmul = ((base + 2 * f) * a.body * t + base * h * a.vocab * t) / (g.peak * eff)
    kind = c.attn_implementation
    if kind == "flash_attention_2":
        attn = (7 + 2 * f) * h * w.flash * a.layers / (g.peak * g.flash)
    elif kind == "sdpa":
        attn = (14 + 4 * f) * h * w.dense * a.layers / (g.peak * g.flash * 0.6)
    else:
        attn = (14 + 4 * f) * h * w.dense * a.layers / (g.peak * eff * 0.5)
        attn += 24 * a.heads * w.dense * a.layers / g.hbm
    elementwise = 3 * _activation_bytes(a, c) * t * a.layers / g.hbm
    breaks = 0.0
    if c.liger_kernel:
        elementwise *= 0.6
    if compile_:
        if c.liger_kernel:
            breaks += 0.06
        if kind == "flash_attention_2":
            breaks += 0.15 if c.padding == "packed" else 0.10
        elementwise *= 0.8 if breaks else (0.55 if not c.liger_kernel else 1.0)
    fused_loss = c.liger_kernel and a.fused_loss
    loss = 0.0 if fused_loss else 2 * 10 * t * a.vocab / g.hbm
    trainable = a.lora_params(16) if lora else a.params
    casts = 0.0 if (c.precision == "pure_bf16" or lora) else 2 * 6 * a.params / g.hbm
    compute = (matmul + attn + elementwise + loss + casts) * (1 + breaks)
    if used > 0.9:
        compute *= 1 + 3 * (used - 0.9)
    _, opt_bytes = _states(a, c, lora)
    factor = (
        1.0
        if lora
        else {"adamw_torch": 1.3, "adamw_torch_fused": 1.0, "adamw_bnb_8bit": 1.2}.get(c.optim, 1.8)
    )
    optimizer = 2 * opt_bytes * factor / g.hbm
    comm = 0.0
    if n > 1:
        share = (n - 1) / n
        pure = c.precision == "pure_bf16"
        if c.distributed_backend == "DDP":
            comm, overlap = 2 * share * (2 if pure else 4) * trainable / g.bus, 0.8
        else:
            gathers = 2 if c.fsdp_sharding_strategy == "FULL_SHARD" else 1
            comm = (gathers * 2 * a.params + 2 * trainable) * share / g.bus
            overlap = 0.85 if c.fsdp_version == 2 else 0.7
        comm -= min(overlap * comm, 0.9 * compute)
    offload = 0.0
    if c.distributed_backend == "FSDP" and c.fsdp_cpu_offload:
        pure = c.precision == "pure_bf16"
        wb = 2 if (pure or lora) else 4
        offload = ((2 * wb * a.params + (2 if pure else 4) * trainable) / n) / g.pcie
        offload += trainable / n / 0.3e9
        optimizer = 0.0
    return compute + optimizer + comm + offload


def _noise(key: str) -> float:
    digest = hashlib.sha256(key.encode()).digest()
    u1, u2 = (int.from_bytes(digest[i : i + 8], "big") / 2**64 for i in (0, 8))
    z = math.sqrt(-2 * math.log(max(u1, 1e-300))) * math.cos(2 * math.pi * u2)
    return math.exp(0.02 * z)


COLUMNS = (
    "batch_size",
    "number_gpus",
    "model_max_length",
    "distributed_backend",
    "fsdp_version",
    "fsdp_sharding_strategy",
    "fsdp_cpu_offload",
    "gradient_checkpointing",
    "checkpoint_fraction",
    "padding",
    "attn_implementation",
    "precision",
    "liger_kernel",
    "optim",
    "torch_compile",
)


def worst_case_work(padding: str, b: int, s: int) -> Work:
    """The worst-case step's batch: ``b`` entries of ``s`` tokens (one row of ``b s`` when packed)."""
    return Work(b * s, b * s, b * s * s, (b * s) ** 2 if padding == "packed" else b * s * s)


def row_of(
    sc: Scenario, e: Entries, c: Any, works: dict[tuple[str, int, int], Work], certified: bool = False
) -> dict[str, Any]:
    a, g = ARCHS[sc.arch], GPUS[sc.gpu]
    lora = sc.method == "lora"
    at = (c.padding, c.per_device_batch_size, c.model_max_length)
    if at not in works:
        works[at] = work_of(e, *at)
    w = works[at]
    sampled = memory_gib(a, g, c, w, lora)  # the measured window's peak: what the step time sees
    worst = certified and c.padding != "max_length"
    mem = memory_gib(a, g, c, worst_case_work(*at), lora) if worst else sampled
    fits = mem <= g.capacity_gib
    step = step_seconds(a, g, c, w, lora, sampled / g.capacity_gib)
    clean = w.dataset / step
    compile_ = bool(getattr(c, "torch_compile", False))
    load = 15 + 2 * a.params / 1.5e9 + ((60 + 0.5 * a.layers) if compile_ else 0.0)
    fsdp = c.distributed_backend == "FSDP"
    row: dict[str, Any] = {"model_name": a.name, "gpu_model": g.name}
    for name in COLUMNS:
        if name not in sc.space:
            continue
        value = getattr(c, name)
        if name.startswith("fsdp_") and not fsdp:
            value = ""
        if name == "checkpoint_fraction" and not c.gradient_checkpointing:
            value = ""
        row[name] = value
    row |= {
        "dataset_tokens_per_second_per_gpu": round(clean * _noise(c.key()), 1) if fits else 0.0,
        "dataset_tokens_per_second_per_gpu_noise_free": round(clean, 1) if fits else 0.0,
        "peak_memory_gib": round(mem, 2) if fits else "",
        "wall_seconds": round(load + (25 if fits else 1) * step, 1),
        "is_valid": int(fits),
    }
    return row


# -- studies and tables --------------------------------------------------------------------------


def study_text(sc: Scenario) -> str:
    a, g = ARCHS[sc.arch], GPUS[sc.gpu]
    method = "{kind: lora, r: 16}" if sc.method == "lora" else "{kind: full}"
    params = "\n".join(f"    {k}: {_domain(k, v)}" for k, v in sc.space.items())
    return f"""# Written by benchmarks/knob_tables.py (issue 23): {sc.description}.
# Only ever replayed: benchmark-search gives --table benchmarks/results/tables/knobs-{sc.name}.csv.
name: knobs-{sc.name}
sampler: {{kind: tpe, seed: 0}}
n_trials: 40
workload:
  model:
    name: {a.name}
    architecture:
      model_type: {a.model_type}
      hidden_size: {a.hidden}
      intermediate_size: {a.intermediate}
      num_hidden_layers: {a.layers}
      num_attention_heads: {a.heads}
      num_key_value_heads: {a.kv_heads}
      vocab_size: {a.vocab}
  dataset: {{kind: synthetic, preset: {sc.preset}}}
  model_max_length: {max(sc.space["model_max_length"])}
  method: {method}
resources:
  gpus_per_node: {sc.gpus_per_node}
  gpu_model: {g.name}
  device: cuda
launcher: {{kind: ray}}
search_space:
  parameters:
{params}
"""


def _domain(name: str, values: list[Any]) -> str:
    text = ", ".join(str(v).lower() if isinstance(v, bool) else str(v) for v in values)
    ordered = name in ("batch_size", "number_gpus", "model_max_length")
    return f"{{values: [{text}]}}" if ordered else f"{{choices: [{text}]}}"


def table_rows(sc: Scenario, certified: bool = False) -> list[dict[str, Any]]:
    from explorer.study_file import load_study
    from explorer.validity import invalid_reason
    from explorer.worker._data import entry_length

    path = STUDIES / f"{sc.name}.yaml"
    loaded = load_study(path, check_model=False)
    spec = loaded.spec.workload.dataset
    e = Entries(tuple(sorted(entry_length(spec, i) for i in range(spec.entries))))
    works: dict[tuple[str, int, int], Work] = {}
    return [
        row_of(sc, e, c, works, certified)
        for c in loaded.space.enumerate()
        if invalid_reason(c, loaded.spec.resources) is None
    ]


def csv_text(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    clean = "dataset_tokens_per_second_per_gpu_noise_free"
    fit = [r for r in rows if r["is_valid"]]
    best = max(fit, key=lambda r: r[clean])
    near = sum(r[clean] >= 0.98 * best[clean] for r in fit)
    keys = [k for k in COLUMNS if k in best]
    return {
        "configurations": len(rows),
        "fit": len(fit),
        "best": best[clean],
        "within_2pct": near,
        "best_configuration": {k: best[k] for k in keys},
    }


def write(check: bool = False, certified: bool = False) -> dict[str, Any]:
    STUDIES.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {}
    hashes = CERTIFIED_HASHES if certified else HASHES
    for sc in (*SCENARIOS, *HELD_OUT):
        study = STUDIES / f"{sc.name}.yaml"
        if not check:
            study.write_text(study_text(sc))
        rows = table_rows(sc, certified)
        text = csv_text(rows)
        digest = hashlib.sha256(text.encode()).hexdigest()
        suffix = "-certified" if certified else ""
        path = TABLES / f"knobs-{sc.name}{suffix}.csv.gz"  # gzipped: every device call carries the tree
        if not check:
            path.write_bytes(gzip.compress(text.encode(), mtime=0))
        out[sc.name] = {"sha256": digest, "bytes": len(text)} | summary(rows)
        print(f"{sc.name}: {json.dumps(out[sc.name])}", flush=True)
    if check:
        recorded = json.loads(hashes.read_text())
        bad = [k for k, v in out.items() if recorded.get(k, {}).get("sha256") != v["sha256"]]
        if bad:
            print(f"differ from {hashes.name}: {', '.join(bad)}")
            return out
    else:
        hashes.write_text(json.dumps(out, indent=2) + "\n")
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true", help="recompute and compare with the recorded hashes")
    parser.add_argument(
        "--certified", action="store_true", help="the certified tables (peaks at the worst-case step)"
    )
    args = parser.parse_args()
    random.seed(0)
    write(check=args.check, certified=args.certified)
    return 0


if __name__ == "__main__":
    sys.exit(main())
