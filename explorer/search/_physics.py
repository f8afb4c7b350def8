"""First-principles estimates of a configuration's per-device memory and throughput: the priors of
the joint models (:mod:`explorer.search._surrogate`), before anything is measured.

Written from public accounting, not from any table the search is benchmarked on; every constant
says where it comes from. The estimates only have to *rank* configurations roughly and say roughly
what fits: the models learn each knob's real effect from the measured trials, on top of them.

Memory per device (bytes), for the parameters ``P`` (``T`` of them trainable):

* weights: 4 bytes each in mixed precision (fp32 master weights, bf16 autocast), 2 in pure bf16;
  gradients the same for the trainable ones; optimizer states for the trainable ones: AdamW (plain
  or fused, the same two moments) 2 x the weight bytes, 8-bit AdamW 2 bytes, Adafactor's factored
  second moment about nothing (ZeRO paper, Rajbhandari et al. 2020, section 3.1; bitsandbytes and
  Adafactor papers); the foreach AdamW's step one more weight-width copy as temporaries, where
  they exceed the activations and logits that the backward freed;
* sharding: FULL_SHARD and HYBRID_SHARD divide weights, gradients and states by the GPUs,
  SHARD_GRAD_OP gradients and states only; DDP keeps a second copy of the gradients in its
  buckets; FSDP's CPU offload leaves two layers' worth of weights on the device (PyTorch FSDP docs);
* activations: ``tokens x (hidden x ACTIVATION_BASE + intermediate x ACTIVATION_MLP)`` bytes per
  layer (Korthikanti et al. 2022, "Reducing activation recomputation", table 2, with the MLP's
  share growing with its width), the knobs' ``activation_bytes`` added to the base (pure bf16 10
  and Liger's RMSNorm 8 bytes fewer: counted, ``benchmarks/activation_bytes.py``, and read in
  Liger's source), times the knobs' ``activation_share`` (torch.compile's 0.74, fitted; void under
  Liger, whose fused kernels are the chains compile would recompute), plus
  ``5 x heads x length`` per token with eager attention, which stores the score matrix; a
  checkpointed layer keeps its input only (2 x hidden bytes a token); a packed batch is one row
  of every entry (``DataCollatorWithFlattening``), and under eager or sdpa transformers'
  block-diagonal mask covers that whole row's square (``row^2`` bytes, sdpa's boolean; eager's
  scores span the row too), which flash attention's variable-length kernels do without;
* logits: ``tokens x vocab x LOGIT_BYTES`` (the fp32 upcast and its gradient; fitted), which
  Liger's fused linear cross-entropy computes in chunks instead (Liger-Kernel paper, Hsu et al. 2024),
  except on the model types whose Liger patch replaces only torch's cross entropy (granite):
  ``LIGER_CE_LOGIT_BYTES`` there;
  Liger's SwiGLU saves three of a gated MLP's four intermediate-width tensors (its source);
* gradients: ``zero_grad(set_to_none=True)`` frees them after each step, so they fill only as the
  backward frees the activations and logits (and with the optimizer step's temporaries add what
  they exceed those by), except while micro-steps accumulate them and in DDP's buckets;
* the caching allocator's slack: ``RESERVED_SLACK`` of the activations and logits (fitted on peaks
  measured as reserved and as allocated);
* 1.5 GiB for the CUDA context, kernels and cuBLAS/NCCL workspaces.

A device may use the memory CUDA reports (``gpus.csv``'s ``cuda_total_gib``: 79.18 GiB on an H100
80GB), or a study's cap.

Memory is estimated on the full-length batch (``per-device batch x model_max_length``): the
worker certifies the worst case (:mod:`explorer.worker._worst_case`).

Throughput (dataset tokens a second per GPU) is ``dataset tokens a step / step time``:

* compute: the FLOPs of :class:`explorer.flops.FlopModel` on the tokens the step computes on
  (padding included; a packed batch is one row of its ``b`` entries as they are, ``b`` times the
  mean length), recomputation included, attention over each entry's length (a packed
  batch's whole row under eager or sdpa), at the data sheet's peak times an efficiency
  (:meth:`JobPhysics.efficiency`): ``MFU_REF``, lower on a GPU with more FLOPs per byte of memory
  bandwidth, for narrow models and for short steps; times the knobs' ``efficiency`` (torch.compile's
  1.16, from torchtitan's measured pair);
* communication: DDP all-reduces the gradients (2 x bytes), FSDP all-gathers the weights forward
  and backward and reduce-scatters the gradients (3 x, SHARD_GRAD_OP 2 x), over NVLink or PCIe by
  the GPU's link (:mod:`explorer.gpus`), across nodes at the network's speed, of which
  ``OVERLAP`` of the compute time hides, all but ``EXPOSED_SHARE`` of it at most
  (:mod:`explorer.search._calibrate`);
* offload: weights and gradients cross PCIe every step and the CPU steps the optimizer;
* the optimizer step: reading and writing the states at the GPU's memory bandwidth, and on a GPU
  a fixed ``STEP_OVERHEAD_S`` a step (kernel launches, Python, the data loader; measured).

The fitted constants come from ``benchmarks/physics_fit.py`` on the public measurements of
``benchmarks/evidence/measurements.csv`` (one part fitted, one held back; the figures are in
``docs/estimate.md``).

Small multipliers for kernels (flash over sdpa over eager, Liger, pure bf16; each knob's
``efficiency`` in the registry) are priors of a few percent each: the measured trials overturn
them where they are wrong (compile with graph breaks, say). Optimizer-state widths are the
optimizer knob's ``state_bytes`` there.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from explorer.errors import SpecError
from explorer.flops import FlopModel
from explorer.gpus import Gpu, gpu_figures, is_cpu_model, lookup, missing_figures
from explorer.hardware import CPU_MODEL
from explorer.knobs import LIGER_UNFUSED_LOSS_MODEL_TYPES, knobs
from explorer.search._calibrate import PhysicsParts, exposed
from explorer.spec import ResourcesSpec, WorkloadSpec
from explorer.trial_config import TrialConfig

__all__ = ["JobPhysics", "gpu_memory_gib", "physics_parts", "usable_gib"]

GIB = 2.0**30
CONTEXT_GIB = 1.5
"""CUDA context and cuBLAS/NCCL workspaces (PyTorch CUDA semantics docs: the context alone is
0.3-1 GiB); the caching allocator's slack is :data:`RESERVED_SLACK`."""
ACTIVATION_BASE = 28.4
"""Bytes of saved activations per token, layer and hidden unit outside the MLP's intermediate
(attention inputs and outputs, norms and their fp32 upcasts, residuals, the MLP's input) in 16-bit
eager training without attention scores. Korthikanti et al. 2022, table 2, count ``34`` a
token-layer-hidden unit for a 4h GeLU MLP, of which 15 outside the MLP (Megatron's fused kernels);
fitted here to the measured peaks of HF models and torchtitan (``benchmarks/physics_fit.py``)."""
ACTIVATION_MLP = 8.0
"""Bytes of saved activations per token, layer and *intermediate* unit of a gated MLP: the gate's
and the up projection's outputs, the activation's output and the product, four 16-bit tensors of
the intermediate width (what the backward of ``down(act(gate(x)) * up(x))`` reads). Sourced, not
fitted: activations grow with ``intermediate / hidden``, Llama-3-8B's 3.5 giving ``28.4 + 28 = 56``
bytes a token-layer-hidden unit eager, 42 compiled; IDRIS's Qwen2.5 logs (2.7 and 5.4 times the
hidden size) imply 8 a unit. An ungated MLP saves half."""
SCORE_BYTES = 5.0
"""Bytes per token, layer, head and key of eager attention's saved scores (Korthikanti et al.
2022, table 2)."""
LIGER_CE_LOGIT_BYTES = 8.0
"""Bytes per token and vocabulary entry of the logits where Liger replaces only torch's cross
entropy (:data:`explorer.knobs.LIGER_UNFUSED_LOSS_MODEL_TYPES`): the bf16 logits, their fp32
upcast, which Liger's kernel overwrites with its gradient in the forward, and the bf16 gradient
(2 + 4 + 2; Liger-Kernel src/liger_kernel/ops/cross_entropy.py)."""
LOGIT_BYTES = 12.0
"""Bytes per token and vocabulary entry of the logits of an HF model's own loss: the fp32 upcast and
its gradient (4 + 4) and part of the bf16 logits and log-softmax alive beside them; fitted from a
start of 8 (``benchmarks/physics_fit.py``: the project's H100 peaks and Liger's 4K-context OOM)."""
MFU_REF = 1.0
"""The compute efficiency (hardware FLOPs, recomputation included, over the bf16 peak) that a wide
model's long steps approach on a GPU of :data:`FLOPS_PER_BYTE_REF` (the A100 80GB); with the
width and step terms a 70B model at 16K tokens a step computes at 0.76 (and measures less, with
the step's fixed overhead and its communication), where llm-foundry's MPT-70B on A100 80GB
measures 0.71 HFU (0.53 MFU) and torchtitan's Llama 2/3 on A100 0.45-0.54 MFU (6N). Fitted
(``benchmarks/physics_fit.py``), at its bound: the peak."""
FLOPS_PER_BYTE_REF = 153.0
"""The A100 80GB's peak FLOP/s over its memory bandwidth (312 TFLOP/s / 2.039 TB/s)."""
MFU_ALPHA = 0.732
"""How the efficiency falls with a GPU's FLOPs per byte of bandwidth (``(ref / ratio)^alpha``):
a card with more compute per byte of memory waits more on the memory-bound parts of a step
(norms, activations, the optimizer): llm-foundry's H100 (295 FLOP/byte) reaches 0.35-0.46 where
the A100 80GB (153) reaches 0.50-0.64 and the A100 40GB (201) 0.47-0.59. Fitted."""
HALF_HIDDEN = 846.0
"""The hidden size at which the efficiency is half its large-model value (``h / (h + this)``):
narrow matrices underfill the tensor cores and the per-layer kernels that do not scale with the
width weigh more. Fitted."""
HALF_TOKENS = 3236.0
"""Tokens a device step at which the efficiency is half of its long-step value
(``t / (t + this)``): small steps underfill the GPU and the per-step overheads weigh more. Fitted
from the previous prior's 4096 (a fit started at 1024 stops near it, at a worse least-squares
loss)."""
NVLINK_BYTES_S = 150e9
"""Bus bandwidth of an all-reduce over NVLink (A100/H100 SXM: nccl-tests report 150-230 GB/s)."""
PCIE_BYTES_S = 12e9
"""Bus bandwidth of an all-reduce over PCIe 4.0 x16 without NVLink (nccl-tests: 10-20 GB/s)."""
INTER_NODE_BYTES_S = 25e9
"""The network between nodes per GPU, line rate, where the GPU table has no reference fabric for
the card (one 200 Gb/s InfiniBand or RoCE NIC a GPU; llm-foundry's A100 clusters have 1600 Gb/s a
node of 8, 25 GB/s a GPU). Sourced, not fitted. A collective that crosses nodes runs at the
node's whole network, this times the job's GPUs on a node (:meth:`JobPhysics.fabric_bus`), at
most at the node's own link."""
STEP_OVERHEAD_S = 0.0315
"""Seconds a device step spends on what neither its FLOPs nor its bytes account for (kernel
launches, Python, the data loader, the optimizer's many small kernels), the same for any model.
Measured, not fitted: TRL's SFTTrainer (an HF Trainer) on one H100, a 336k-parameter model whose
compute takes microseconds, 31.5 ms a step over 10 steps (+-10.7%;
``benchmarks/results/gpu/2026-11-27-3/trl-max_length.jsonl``). GPUs only: a CPU study's steps
carry none."""
HOST_LINK_BYTES_S = 20e9
"""Host-device copy bandwidth (PCIe 4.0/5.0 x16 pinned: 20-50 GB/s)."""
CPU_ADAM_PARAMS_S = 1e9
"""Parameters a second that a CPU Adam step updates (DeepSpeed's CPU Adam: about 1-2e9 on a
socket)."""
HBM_BYTES_S = 1.5e12
"""Device memory bandwidth for the optimizer step where the GPU's is unknown (a CPU study)."""
CPU_STAND_IN_FLOPS = 312e12
"""The peak a CPU study's processes (``CPU-logical``: not GPUs) are ranked at: a constant, not a
price (the measured trials calibrate its scale); the A100's, as before the GPU table existed."""
UNGATED_MODEL_TYPES = frozenset(
    {"gpt2", "gpt_neo", "gptj", "gpt_neox", "gpt_bigcode", "codegen", "bloom", "mpt", "falcon", "opt", "phi"}
)
"""HF ``model_type``s whose MLP is two matrices with an activation between (``intermediate_size``
their inner width), not gated: two thirds of a gated MLP's weights at the same width, and half its
saved activations (the activation's input and output)."""
RESERVED_SLACK = 0.107
"""What the caching allocator reserves beyond the activations and logits allocated (blocks split
and cached between the step's many short-lived tensors): the memory a step needs, the limit's
measure, is ``allocated + this x (activations + logits)``. Fitted with the activations
(``benchmarks/physics_fit.py``) on peaks measured as reserved, as allocated, and both (the
project's H100 runs: reserved 1.08-1.16x allocated)."""
CUDA_SHARE_HBM = 0.989
"""The share of the marketed memory that CUDA reports, for a card whose total is not in the table
and whose bandwidth is at least 1 TB/s (HBM): A100 80GB 79.14 / 80, H100 79.18 / 80
(``benchmarks/evidence/gpus.csv``)."""
CUDA_SHARE_GDDR = 0.925
"""The same for a slower (GDDR, ECC-reserving) card: L4 0.918, L40 and L40S 0.925, T4 0.922,
A10G 0.937 (``benchmarks/evidence/gpus.csv``)."""


_EFFICIENCY = [(k.name, k.efficiency) for k in knobs() if k.efficiency]
"""The knobs' multipliers of the compute efficiency (the registry's ``efficiency``)."""
_ACTIVATION_SHARE = [
    (k.name, k.activation_share, k.activation_share_unless) for k in knobs() if k.activation_share
]
"""The knobs' multipliers of the saved activations (the registry's ``activation_share``), each
with the knob that voids it when on (``activation_share_unless``)."""
_ACTIVATION_BYTES = [(k.name, k.activation_bytes) for k in knobs() if k.activation_bytes]
"""The knobs' bytes a token, layer and hidden unit added to :data:`ACTIVATION_BASE` (the registry's
``activation_bytes``: pure bf16's and Liger's RMSNorm's fewer saved tensors)."""
_MLP_SHARE = [(k.name, k.mlp_activation_share) for k in knobs() if k.mlp_activation_share]
"""The knobs' multipliers of a gated MLP's saved activations (the registry's
``mlp_activation_share``: Liger's SwiGLU keeps three of its four intermediate-width tensors)."""
_STEP_COPIES = [(k.name, k.step_copies) for k in knobs() if k.step_copies]
"""Copies of the trainable weights an optimizer step holds as temporaries (the registry's
``step_copies``): the foreach AdamW's tensorlist intermediates ("uses ~ sizeof(params) more peak
memory than the for-loop version", PyTorch's AdamW docs, ``foreach``). The step comes after the
backward has freed the activations and logits, so only what the temporaries exceed those by adds
to the peak; a full fine-tune of granite-3.1-2b in bf16 (seed 000) peaks at 10 bytes a parameter
where weights, gradients and two states count 8."""


def _product(tables: list[tuple[str, Any]], c: TrialConfig, start: float = 1.0) -> float:
    """``start`` times each knob's table entry for ``c``'s value (unlisted: 1)."""
    for name, table in tables:
        start *= table.get(getattr(c, name, None), 1.0)
    return start


def _sum(tables: list[tuple[str, Any]], c: TrialConfig) -> float:
    """The sum of each knob's table entry for ``c``'s value (unlisted: 0)."""
    return sum(table.get(getattr(c, name, None), 0.0) for name, table in tables)


def _activation_share(c: TrialConfig) -> float:
    """The product of the knobs' multipliers of the saved activations for ``c``, each left out
    where the knob that voids it is on."""
    share = 1.0
    for name, table, unless in _ACTIVATION_SHARE:
        if unless is None or not getattr(c, unless, False):
            share *= table.get(getattr(c, name, None), 1.0)
    return share


def _state_bytes(c: TrialConfig, default: float) -> float:
    """Optimizer-state bytes per trainable parameter of ``c`` (the registry's ``state_bytes``)."""
    for k in knobs():
        if k.state_bytes:
            return k.state_bytes.get(getattr(c, k.name, None), default)
    return default


def gpu_memory_gib(gpu_model: str | None) -> float | None:
    """The memory of a GPU model from the table of GPUs (:mod:`explorer.gpus`; ``None``: not a
    GPU it knows)."""
    gpu = lookup(gpu_model)
    return gpu.memory_gb if gpu is not None else None


def usable_gib(figures: Gpu) -> float:
    """The memory CUDA gives a process on this GPU, GiB: the table's (or the study's declared)
    CUDA total, else the marketed memory times :data:`CUDA_SHARE_HBM` or :data:`CUDA_SHARE_GDDR`."""
    if figures.cuda_gib is not None:
        return figures.cuda_gib
    return figures.memory_gb * (CUDA_SHARE_HBM if figures.bandwidth_tbs >= 1.0 else CUDA_SHARE_GDDR)


def _figures(resources: ResourcesSpec) -> Gpu | None:
    """The study's GPU figures (the table's, the declared ones over them); ``None``: a CPU study.

    Raises:
        SpecError: a CUDA study on a GPU that neither the table knows nor the study declares.
    """
    gpu = resources.gpu_model or ""
    if resources.device == "cpu" or not gpu or gpu == "unknown" or is_cpu_model(gpu):
        return None
    figures = gpu_figures(gpu, resources.gpu)
    if figures is None:
        raise SpecError(file="study", field="resources.gpu", problem=str(missing_figures(gpu, resources.gpu)))
    return figures


@dataclass(frozen=True, kw_only=True)
class _Arch:
    gated: bool
    """A gated MLP (gate and up projections: Llama, Mistral, Qwen, Granite), else two matrices
    with an activation between (GPT-2, GPT-NeoX, BLOOM, MPT, Falcon, OPT, Phi)."""
    hidden: int
    layers: int
    heads: int
    intermediate: int
    kv: int
    vocab: int
    tied: bool
    fused_liger_loss: bool
    """Whether Liger's patch of this model type fuses the LM head into the loss (no logits)."""

    @classmethod
    def of(cls, arch: dict[str, Any]) -> _Arch:
        hidden = int(arch.get("hidden_size", 4096))
        heads = int(arch.get("num_attention_heads", max(1, hidden // 128)))
        return cls(
            gated=str(arch.get("model_type", "llama")) not in UNGATED_MODEL_TYPES,
            hidden=hidden,
            layers=int(arch.get("num_hidden_layers", 32)),
            heads=heads,
            intermediate=int(arch.get("intermediate_size", 4 * hidden)),
            kv=int(arch.get("num_key_value_heads", heads)),
            vocab=int(arch.get("vocab_size", 32000)),
            tied=bool(arch.get("tie_word_embeddings", False)),
            fused_liger_loss=str(arch.get("model_type", "llama")) not in LIGER_UNFUSED_LOSS_MODEL_TYPES,
        )

    @property
    def layer_params(self) -> int:
        h, d = self.hidden, self.hidden // self.heads
        return 2 * h * h + 2 * h * self.kv * d + (3 if self.gated else 2) * h * self.intermediate

    @property
    def linear(self) -> int:
        """Weights in linear layers, the LM head included."""
        return self.layers * self.layer_params + self.vocab * self.hidden

    @property
    def total(self) -> int:
        return self.linear + (0 if self.tied else self.vocab * self.hidden)


class JobPhysics:
    """The estimates for one job (a workload on a GPU model)."""

    def __init__(
        self, *, workload: WorkloadSpec, resources: ResourcesSpec, figures: Gpu | None = None
    ) -> None:
        self.arch = _Arch.of(workload.model.architecture or {})
        method = workload.method
        self.lora = method.kind == "lora"
        h, d = self.arch.hidden, self.arch.hidden // self.arch.heads
        per_module = {
            "q_proj": 2 * h,
            "o_proj": 2 * h,
            "k_proj": h + self.arch.kv * d,
            "v_proj": h + self.arch.kv * d,
        }
        adapters = sum(per_module.get(m, 2 * h) for m in method.target_modules) * method.r * self.arch.layers
        self.trainable = adapters if self.lora else self.arch.total
        self.lengths = _lengths(workload)
        gpu = resources.gpu_model or ""
        figures = figures or _figures(resources)  # given: with the node's measured ones (explorer.estimate)
        self.peak = figures.peak_flops if figures is not None else CPU_STAND_IN_FLOPS
        self.bandwidth = figures.bandwidth_tbs * 1e12 if figures is not None else HBM_BYTES_S
        self.link = NVLINK_BYTES_S if figures is not None and figures.nvlink else PCIE_BYTES_S
        if figures is not None and figures.busbw_gbs:  # measured on the node by explorer doctor
            self.link = figures.busbw_gbs * 1e9
        self.fabric = (
            figures.fabric_gbs * 1e9 if figures is not None and figures.fabric_gbs else INTER_NODE_BYTES_S
        )
        """The network between nodes, bytes/s: per GPU (the card's reference fabric in the GPU
        table, else :data:`INTER_NODE_BYTES_S`), or the bus bandwidth explorer doctor measured
        between two nodes (:attr:`fabric_measured`)."""
        self.fabric_measured = bool(figures is not None and figures.inter_node_gbs)
        """Whether :attr:`fabric` is a measured bus bandwidth (used as it is) rather than a line
        rate a GPU (times the GPUs a node, :meth:`fabric_bus`)."""
        if figures is not None and figures.inter_node_gbs:
            self.fabric = figures.inter_node_gbs * 1e9
        self.on_cpu = resources.device == "cpu" or gpu == CPU_MODEL
        """A CPU study: no CUDA context, and no GPU step's fixed overhead (:data:`STEP_OVERHEAD_S`)."""
        self.context_gib = 0.0 if self.on_cpu else CONTEXT_GIB
        self.slack = 1.0 if self.on_cpu else 1.0 + RESERVED_SLACK
        """The reserved memory over the allocated activations and logits (no CUDA caching
        allocator on a CPU study: its processes' peaks are their tensors')."""
        cap = resources.device_memory_gib
        self.limit_gib = cap if cap is not None else usable_gib(figures) if figures is not None else None
        """The memory a device may use, GiB (``None``: unknown, the models estimate it)."""

    def _tokens(self, c: TrialConfig) -> tuple[float, float]:
        """(dataset tokens, computed tokens) a device step, on average."""
        b, s = c.per_device_batch_size, c.model_max_length
        mean, longest = self._clipped(b, s)
        if c.padding == "packed":  # one row of b entries as they are (DataCollatorWithFlattening)
            return b * mean, b * mean
        return b * mean, b * (longest if c.padding == "longest" else s)

    @functools.lru_cache(maxsize=256)  # noqa: B019 (one instance a study, a few (b, s) pairs)
    def _clipped(self, b: int, s: int) -> tuple[float, float]:
        """(the mean entry length, the expected longest of ``b`` entries), truncated at ``s``."""
        clipped = [min(n, s) for n in self.lengths]
        return sum(clipped) / len(clipped), _expected_longest(clipped, b)

    def memory_parts(self, c: TrialConfig) -> tuple[float, float, float, float]:
        """Peak memory of one device on a full-length step, GiB, in parts that the measured peaks
        calibrate one scale each: (weights, gradients and optimizer states; saved activations;
        logits; the CUDA context)."""
        a, n = self.arch, max(1, c.number_gpus)
        width = 2.0 if c.precision == "pure_bf16" else 4.0
        weights, grads = width * a.total, width * self.trainable
        states = full_states = _state_bytes(c, 2 * width) * self.trainable
        fsdp = c.distributed_backend == "FSDP"
        if fsdp and c.fsdp_cpu_offload:
            weights, grads, states = 2 * width * a.layer_params, 0.0, 0.0
        elif fsdp and c.fsdp_sharding_strategy == "SHARD_GRAD_OP":
            grads, states = grads / n, states / n
        elif fsdp and c.fsdp_sharding_strategy != "NO_SHARD":
            weights, grads, states = weights / n + 2 * width * a.layer_params, grads / n, states / n
        # zero_grad(set_to_none=True) frees the gradients after each step: they live through the
        # forward only while micro-steps accumulate them, and DDP's buckets (one more copy) always
        accumulating = int(c.gradient_accumulation_steps or 1) > 1
        kept = grads if accumulating else 0.0
        transient = 0.0 if accumulating else grads
        if c.distributed_backend == "DDP":
            kept += grads
        tokens, s = c.per_device_batch_size * c.model_max_length, c.model_max_length
        mlp = ACTIVATION_MLP * _product(_MLP_SHARE, c) if a.gated else ACTIVATION_MLP / 2  # two of four
        base = ACTIVATION_BASE + _sum(_ACTIVATION_BYTES, c)
        per_layer = tokens * (a.hidden * base + a.intermediate * mlp)
        per_layer *= _activation_share(c)
        row = tokens if _dense_packed(c) else s  # a packed batch is one row, which dense kernels see whole
        if c.attn_implementation == "eager":
            per_layer += tokens * a.heads * row * SCORE_BYTES
        fraction = float(c.checkpoint_fraction) if c.gradient_checkpointing else 0.0
        acts = (
            a.layers * ((1 - fraction) * per_layer + fraction * tokens * a.hidden * 2) + fraction * per_layer
        )
        if _dense_packed(c):
            acts += row * row * (1.0 if c.attn_implementation == "sdpa" else 2.0)
        # Liger's fused linear cross entropy builds them a chunk at a time; its plain one keeps them
        logit_bytes = (
            LOGIT_BYTES if not c.liger_kernel else 0.0 if a.fused_liger_loss else LIGER_CE_LOGIT_BYTES
        )
        logits = tokens * a.vocab * logit_bytes
        # the gradients fill as the backward frees the activations and logits, and the foreach
        # step's temporaries come after it: only what they exceed those by adds to the peak
        copies = _sum(_STEP_COPIES, c)
        held = states / full_states if full_states else 0.0  # the share of the states on this device
        temporaries = copies * width * self.trainable * held  # weight-width copies, sharded as the states
        exposed = max(0.0, transient + temporaries - acts - logits)
        slack = self.slack  # the allocator's cached blocks between the step's tensors
        fixed = weights + states + kept + exposed
        return fixed / GIB, slack * acts / GIB, slack * logits / GIB, self.context_gib

    def memory_gib(self, c: TrialConfig) -> float:
        """Peak memory of one device on a full-length step, GiB (the parts' sum): what CUDA must
        give the process (reserved by the caching allocator, and the CUDA context)."""
        return sum(self.memory_parts(c))

    def allocated_gib(self, c: TrialConfig) -> float:
        """The peak of the tensors alone, GiB (``torch.cuda.max_memory_allocated``): the estimate
        without the allocator's slack and the CUDA context."""
        state, acts, logits, _ = self.memory_parts(c)
        return state + (acts + logits) / self.slack

    def fabric_bus(self, c: TrialConfig) -> float:
        """Bus bandwidth of a collective across ``c``'s nodes, bytes/s: a ring that crosses nodes
        spreads its channels over every NIC of a node, so its bus bandwidth is the node's whole
        network (NCCL's maintainers: on 3+ nodes a ring's bus bandwidth "is going to reflect
        exactly what's going through the NICs", 80 GB/s from four NICs, nccl-tests issue 160; 95
        GB/s from four 200 Gb/s NICs, issue 252; 46-48 GB/s a 400 Gb/s NIC, issue 290). A bus
        bandwidth explorer doctor measured (:attr:`fabric_measured`) is used as it is: measured
        with one GPU a node, it is the node's whole network where the GPUs share one NIC (a slow
        Ethernet link, where multiplying would price the network far too fast), and low by up to
        the GPUs a node where each GPU has its own, which the calibration's multiplier of the
        communication across nodes corrects from the first trials over several nodes."""
        if self.fabric_measured:
            return self.fabric
        return self.fabric * max(1, math.ceil(c.number_gpus / max(1, int(c.number_nodes))))

    def efficiency(self, tokens: float) -> float:
        """The share of the peak that a device step of ``tokens`` computes at (hardware FLOPs,
        recomputation included), before the knobs' multipliers: :data:`MFU_REF` at the A100's
        FLOPs per byte, lower on a card with more (:data:`MFU_ALPHA`), for narrow models
        (:data:`HALF_HIDDEN`) and short steps (:data:`HALF_TOKENS`)."""
        card = (FLOPS_PER_BYTE_REF / (self.peak / self.bandwidth)) ** MFU_ALPHA
        h = self.arch.hidden
        return MFU_REF * card * h / (h + HALF_HIDDEN) * tokens / (tokens + HALF_TOKENS)

    def time_parts(self, c: TrialConfig) -> tuple[float, float, float, float, float]:
        """(dataset tokens a device step; seconds of compute, of collective communication, of
        host offload, of the optimizer step and the fixed overhead), which the measured trials calibrate one scale each
        (the exposed communication: :func:`explorer.search._calibrate.exposed`)."""
        a, n = self.arch, max(1, c.number_gpus)
        data, computed = self._tokens(c)
        fraction = float(c.checkpoint_fraction) if c.gradient_checkpointing else 0.0
        flops = FlopModel(
            n_linear=a.linear,
            n_trainable_linear=self.trainable if self.lora else a.linear,
            layers=a.layers,
            hidden=a.hidden,
            seq_len=c.model_max_length
            if c.padding == "max_length"
            else int(computed if _dense_packed(c) else computed / c.per_device_batch_size),
            lora=self.lora,
            checkpointing=fraction,
        ).hardware_flops_per_token
        speed = _product(_EFFICIENCY, c, self.efficiency(computed))
        compute = flops * computed / (self.peak * speed)
        width = 2.0  # collectives move bf16 weights and gradients
        comm = offload = 0.0
        link = self.link if int(c.number_nodes) <= 1 else min(self.link, self.fabric_bus(c))
        if n > 1 and c.distributed_backend == "DDP":
            comm = 2 * width * self.trainable * (n - 1) / n / link
        elif n > 1 and c.distributed_backend == "FSDP":
            rounds = 2 if c.fsdp_sharding_strategy == "SHARD_GRAD_OP" else 3
            comm = rounds * width * a.total * (n - 1) / n / link
        if c.distributed_backend == "FSDP" and c.fsdp_cpu_offload:
            offload = 2 * width * a.total / n / HOST_LINK_BYTES_S + self.trainable / n / CPU_ADAM_PARAMS_S
            optimizer = 0.0
        else:
            state_width = _state_bytes(c, 8.0)
            shards = n if c.distributed_backend == "FSDP" else 1
            optimizer = 2 * (state_width + 8.0) * self.trainable / shards / self.bandwidth
        return max(data, 1.0), compute, comm, offload, optimizer + (0.0 if self.on_cpu else STEP_OVERHEAD_S)

    def log_throughput(self, c: TrialConfig) -> float:
        """The log of the estimated dataset tokens a second per GPU."""
        data, compute, comm, offload, optimizer = self.time_parts(c)
        return math.log(data / (compute + exposed(comm, compute) + offload + optimizer))


def _dense_packed(c: TrialConfig) -> bool:
    """A packed batch (one row of every entry, transformers' ``DataCollatorWithFlattening``) under
    a dense attention kernel: eager or sdpa compute and mask the whole row's square, the
    block-diagonal mask that transformers' ``masking_utils`` builds from the position ids."""
    return c.padding == "packed" and c.attn_implementation in ("eager", "sdpa")


def _lengths(workload: WorkloadSpec) -> list[int]:
    """The entries' lengths, from the synthetic dataset's distribution (quantiles, no sampling);
    a JSONL dataset's are unknown here: every entry full length."""
    ds = workload.dataset
    if ds.kind != "synthetic":
        return [workload.model_max_length]
    lo, hi = ds.resolved_min_tokens, ds.resolved_max_tokens
    qs = [(i + 0.5) / 512 for i in range(512)]
    if ds.lengths == "lognormal" and ds.median_tokens and ds.sigma:
        from statistics import NormalDist

        z = NormalDist()
        return [min(hi, max(lo, round(ds.median_tokens * math.exp(ds.sigma * z.inv_cdf(q))))) for q in qs]
    return [round(lo + (hi - lo) * q) for q in qs]


def _expected_longest(lengths: list[int], b: int) -> float:
    """The expected longest of ``b`` entries drawn from ``lengths`` (order statistics of the
    empirical distribution: ``P(max <= x) = F(x)^b``)."""
    ranked = sorted(lengths)
    n = len(ranked)
    return sum(x * (((i + 1) / n) ** b - (i / n) ** b) for i, x in enumerate(ranked))


def physics_parts(physics: JobPhysics, configs: list[TrialConfig]) -> PhysicsParts:
    """Every configuration's estimates in parts, as arrays (:class:`PhysicsParts`)."""
    import numpy as np

    time = np.array([physics.time_parts(c) for c in configs], dtype=float)
    return PhysicsParts(
        memory=np.array([physics.memory_parts(c) for c in configs], dtype=float),
        data=time[:, 0],
        time=time[:, 1:],
    )
