"""The knobs: every tunable field of a trial's configuration, declared once, here.

The search space, its validation, ``explorer measure --set``, the replay table's columns, OOM
inference, the throughput prior, local search, the progress lines, status, report and export, and
the worker's ``TrainingArguments`` all derive from these declarations. To add a knob, declare it
in :data:`KNOBS` (and, if the run needs more than a ``TrainingArguments`` keyword or a model
option, map it in ``explorer/worker/_train.py``); see ``docs/architecture.md``.

The order is the reading order of a configuration (progress lines, ``describe``); the knobs that
shape the job (``asked_first``) are asked first, then the others in this order, so that the
sampler's draws stay those of earlier versions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

from explorer.knobs._knob import Axis, Condition, Config, Knob, Needs, Rule, fraction, one_of, positive

__all__ = [
    "ATTENTION",
    "BACKENDS",
    "LIGER_MODEL_TYPES",
    "LIGER_UNFUSED_LOSS_MODEL_TYPES",
    "OPTIMIZERS",
    "PADDINGS",
    "PRECISIONS",
    "FSDP_SHARDING_STRATEGIES",
    "FSDP_VERSIONS",
    "KNOBS",
    "SHARDING",
    "asking_order",
    "knob",
    "knobs",
    "reference",
    "register",
    "run_options",
]

BACKENDS: tuple[str, ...] = ("DDP", "FSDP")
FSDP_SHARDING_STRATEGIES: tuple[str, ...] = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD")
FSDP_VERSIONS: tuple[int, ...] = (1, 2)
PADDINGS: tuple[str, ...] = ("max_length", "longest", "packed")
ATTENTION: tuple[str, ...] = ("eager", "sdpa", "flash_attention_2", "flex_attention")
PRECISIONS: tuple[str, ...] = ("mixed", "pure_bf16")
OPTIMIZERS: tuple[str, ...] = ("adamw_torch", "adamw_torch_fused", "adamw_bnb_8bit", "adafactor")
LIGER_MODEL_TYPES = frozenset(
    [
        "deepseek_v3",
        "deepseek_v4",
        "exaone4",
        "falcon_h1",
        "gemma",
        "gemma2",
        "gemma3",
        "gemma3_text",
        "gemma4",
        "gemma4_text",
        "glm4",
        "glm4v",
        "glm4v_moe",
        "gpt_oss",
        "granite",
        "hunyuan_v1_dense",
        "hunyuan_v1_moe",
        "internvl",
        "llama",
        "llama4",
        "llama4_text",
        "llava",
        "ministral",
        "mistral",
        "mixtral",
        "mllama",
        "mllama_text_model",
        "muse_glimmer",
        "nemotron",
        "olmo2",
        "olmo3",
        "paligemma",
        "phi3",
        "pixtral",
        "qwen2",
        "qwen2_5_vl",
        "qwen2_5_vl_text",
        "qwen2_vl",
        "qwen2_vl_text",
        "qwen3",
        "qwen3_5",
        "qwen3_5_moe",
        "qwen3_5_moe_text",
        "qwen3_5_text",
        "qwen3_moe",
        "qwen3_next",
        "qwen3_vl",
        "qwen3_vl_moe",
        "qwen3_vl_moe_text",
        "qwen3_vl_text",
        "smollm3",
        "smolvlm",
    ]
)
"""The model types Liger Kernel patches (the keys of ``MODEL_TYPE_TO_APPLY_LIGER_FN`` in
liger-kernel's ``transformers/monkey_patch.py``, 2026-11): copied, because liger-kernel needs
triton and CUDA, so the machine that validates a study may not have it. The worker reads the
installed package's own table."""
LIGER_UNFUSED_LOSS_MODEL_TYPES = frozenset(["granite"])
"""The model types of :data:`LIGER_MODEL_TYPES` whose Liger patch replaces torch's cross entropy
but not the model's forward (``apply_liger_kernel_to_granite``'s ``fused_linear_cross_entropy``
defaults to False, granite scaling its logits): the logits are still built."""
SHARDING = Axis("ordered", ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"))
"""The sharding strategies by memory per device, least first (each step up gathers more);
HYBRID_SHARD is compared only with itself. By speed the order is the same: less sharding, fewer
gathers."""

MULTI_GPU = Condition(
    parent="number_gpus",
    test=lambda n: n is not None and n > 1,
    needs="number_gpus > 1",
    never="number_gpus is only 1",
    may="number_gpus can exceed 1",
)
ONE_GPU_OFFLOAD = ("fsdp_cpu_offload", True)
"""FSDP with CPU offload on one GPU (a common way to fit an 8B full fine-tune on one card):
parameters, gradients and optimizer states in host memory, the GPU holding the layers at work."""
BACKEND = Condition(
    parent="number_gpus",
    test=lambda n: n is not None and n > 1,
    needs="number_gpus > 1 (on one GPU: fsdp_cpu_offload true)",
    never="number_gpus is only 1 and fsdp_cpu_offload is never true",
    may="number_gpus can exceed 1",
    opened_by=ONE_GPU_OFFLOAD,
)
"""Where the backend applies: on several GPUs, and on one in a space that can offload (where
DDP is the single process, :func:`_one_process`, and FSDP is valid only with offload:
explorer/validity.py)."""
FSDP = Condition(
    parent="distributed_backend",
    test=lambda b: b == "FSDP",
    needs="distributed_backend FSDP",
    never="distributed_backend is never FSDP",
    may="distributed_backend can be FSDP",
)
CHECKPOINTING = Condition(
    parent="gradient_checkpointing",
    test=lambda on: bool(on),
    needs="gradient_checkpointing true",
    never="gradient_checkpointing is never true",
    may="gradient_checkpointing can be true",
)
LORA = Condition(
    parent="method",
    test=lambda m: m == "lora",
    needs="the workload's method lora",
    never="the workload's method is not lora",
    may="the workload's method is lora",
)


def _strategy(c: Config) -> str:
    return str(c.fsdp_sharding_strategy or "FULL_SHARD")


def _gpus_memory_order(a: Config, b: Config) -> bool:
    """Fewer GPUs need more memory only where parameters, gradients or optimizer state are
    sharded over them; DDP and one process replicate the model; HYBRID_SHARD: the same count."""
    if a.distributed_backend != "FSDP":
        return True
    if "HYBRID_SHARD" in (_strategy(a), _strategy(b)):
        return bool(a.number_gpus == b.number_gpus)
    return _strategy(a) == "NO_SHARD" or a.number_gpus <= b.number_gpus


_SHARDED = ("distributed_backend", "fsdp_sharding_strategy")
_gpus_memory = Rule(_gpus_memory_order, reads=("number_gpus", *_SHARDED))


def _sharding_memory_order(a: Config, b: Config) -> bool:
    return a.distributed_backend != "FSDP" or SHARDING.at_least(_strategy(a), _strategy(b))


_sharding_memory = Rule(_sharding_memory_order, reads=_SHARDED)


class _Context:
    """A test of a configuration's context (for :class:`_Depends`) and the fields it reads."""

    def __init__(self, test: Callable[[Config], bool], reads: tuple[str, ...]) -> None:
        self.test, self.reads = test, reads
        self.__doc__ = test.__doc__

    def __call__(self, c: Config) -> bool:
        return self.test(c)


def _reading(*fields: str) -> Callable[[Callable[[Config], bool]], _Context]:
    return lambda test: _Context(test, fields)


class _Depends(Rule):
    """An order that depends on other knobs: :meth:`axis_for` picks the :class:`Axis` a
    configuration's context calls for; two configurations compare along the axis of the first
    context (in ``axes`` order) that either of them is in, so a pair across contexts is compared
    only where both contexts' orders agree to (a value outside an axis equals only itself)."""

    def __init__(self, name: str, *axes: tuple[_Context, Axis]) -> None:
        super().__init__(
            self._compare, reads=tuple(dict.fromkeys([name, *(f for t, _ in axes for f in t.reads)]))
        )
        self.name = name
        self.axes = axes
        """(context test, axis) pairs; the last test should hold always."""

    def axis_for(self, c: Config) -> Axis:
        return next(axis for test, axis in self.axes if test(c))

    def _compare(self, a: Config, b: Config) -> bool:
        axis = next(axis for test, axis in self.axes if test(a) or test(b))
        return axis.at_least(getattr(a, self.name), getattr(b, self.name))


@_reading()
def _always(c: Config) -> bool:
    return True


@_reading("attn_implementation")
def _dense(c: Config) -> bool:
    """sdpa and eager attend over the whole padded or packed row (transformers' 4-D mask);
    flash_attention_2 (varlen, from the position ids) and flex_attention (a block-sparse mask)
    attend within each packed entry only."""
    return c.attn_implementation in ("sdpa", "eager")


@_reading("torch_compile")
def _compiled(c: Config) -> bool:
    return bool(c.torch_compile)


@_reading("distributed_backend", "fsdp_version")
def _fsdp1(c: Config) -> bool:
    return c.distributed_backend == "FSDP" and c.fsdp_version == 1


def _single_or_equal(name: str) -> Rule:
    """Speed: one GPU (one process, or FSDP on one) beats any backend; otherwise only the same
    value compares."""
    return Rule(
        lambda a, b: a.number_gpus == 1 or getattr(a, name) == getattr(b, name), reads=("number_gpus", name)
    )


def _sharding_speed_order(a: Config, b: Config) -> bool:
    if a.number_gpus == 1 or a.distributed_backend != "FSDP":
        return True
    return SHARDING.at_least(_strategy(a), _strategy(b))


_sharding_speed = Rule(_sharding_speed_order, reads=("number_gpus", *_SHARDED))


def _gpu_model_name(v: Any) -> str | None:
    return None if isinstance(v, str) and v.strip() else f"{v!r} must be a GPU model's name"


def _checkpointed(c: Config) -> str:
    fraction = getattr(c, "checkpoint_fraction", 1.0)
    return "on" if fraction == 1.0 else f"{fraction:g}"


def _one_process(value: Any, c: Any) -> Any:
    """DDP on one GPU is one plain process: the backend ``NONE``."""
    return "NONE" if value == "DDP" and c.get("number_gpus") == 1 else value


def _backend_label(value: str, c: Config) -> str:
    if c.number_gpus <= 1 and value != "FSDP":
        return "single"
    return f"FSDP{c.fsdp_version}/{c.fsdp_sharding_strategy}" if value == "FSDP" else value


_DECLARED = (
    Knob(
        name="batch_size",
        kind="int",
        required=True,
        check=positive,
        doc="global batch per optimizer micro-step, spread evenly over the GPUs",
        compare_as=lambda c: c.per_device_batch_size,
        memory=Axis("increasing"),
        feature="per_device_batch",
        label=lambda v, c: f"bs={v}",
    ),
    Knob(
        name="number_gpus",
        kind="int",
        required=True,
        check=positive,
        asked_first=True,
        doc="GPUs (processes) per trial",
        memory=_gpus_memory,
        speed=Axis("decreasing"),
        label=lambda v, c: f"gpus={v}",
    ),
    Knob(
        name="number_nodes",
        kind="int",
        default=1,
        check=positive,
        when=MULTI_GPU,
        inactive=1,
        asked_first=True,
        doc="nodes the GPUs are spread over (only when number_gpus > 1)",
        speed=Axis("decreasing"),
        feature=None,
        label=lambda v, c: f"nodes={v}" if v > 1 else None,
    ),
    Knob(
        name="distributed_backend",
        kind="str",
        required=True,
        measure_default="DDP",
        check=one_of(BACKENDS),
        when=BACKEND,
        inactive="NONE",
        settle=_one_process,
        asked_first=True,
        doc="DDP or FSDP (when number_gpus > 1; on one GPU FSDP with fsdp_cpu_offload, DDP is one process)",
        speed=_single_or_equal("distributed_backend"),
        feature="backend",
        label=_backend_label,
    ),
    Knob(
        name="fsdp_version",
        required=True,
        kind="int",
        measure_default=2,
        check=one_of(FSDP_VERSIONS),
        when=FSDP,
        doc="1 (FullyShardedDataParallel) or 2 (fully_shard) (only with FSDP)",
        speed=_single_or_equal("fsdp_version"),
        # FSDP2 (per-parameter sharding, no recordStream) against FSDP1's flat parameters: higher
        # MFU and 7% less peak memory on Llama-7B, 8 x H100 (torchtitan's docs/fsdp.md; the
        # torchtitan paper, Liang et al. 2024, section 2.1: about 1.5% more throughput)
        efficiency={2: 1.015},
        feature="backend",
        label=lambda v, c: None,
    ),
    Knob(
        name="fsdp_sharding_strategy",
        required=True,
        kind="str",
        measure_default="FULL_SHARD",
        check=one_of(FSDP_SHARDING_STRATEGIES),
        when=FSDP,
        doc="FSDP sharding strategy: FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD or NO_SHARD (only with FSDP)",
        memory=_sharding_memory,
        speed=_sharding_speed,
        trade=SHARDING,
        feature="backend",
        label=lambda v, c: None,
    ),
    Knob(
        name="gradient_checkpointing",
        kind="bool",
        required=True,
        measure_default=False,
        doc="activation checkpointing of every decoder layer",
        memory=Axis("decreasing"),
        speed=Axis("decreasing"),
        trade=True,
        feature="checkpointing",
        label=lambda v, c: f"ckpt={_checkpointed(c) if v else 'off'}",
    ),
    Knob(
        name="model_max_length",
        kind="int",
        required=True,
        default_from=lambda workload: workload.model_max_length,
        check=positive,
        doc="sequence length: truncated and padded to it (default: the workload's)",
        memory=Axis("increasing"),
        label=lambda v, c: f"len={v}",
    ),
    Knob(
        name="gradient_accumulation_steps",
        kind="int",
        default=1,
        check=positive,
        doc="micro-steps per optimizer step",
        feature=None,
        label=lambda v, c: f"ga={v}" if v != 1 else None,
        training_args="gradient_accumulation_steps",
    ),
    Knob(
        name="lora_r",
        kind="int",
        default_from=lambda workload: workload.method.r,
        check=positive,
        when=LORA,
        doc="LoRA rank (LoRA workloads only; default: the workload's)",
    ),
    Knob(
        name="optim",
        kind="str",
        default="adamw_torch",
        check=one_of(OPTIMIZERS),
        doc="the optimizer (TrainingArguments.optim): adamw_torch, adamw_torch_fused (one kernel for "
        "all parameters), adamw_bnb_8bit (8-bit states; CUDA and bitsandbytes) or adafactor "
        "(factored second moments, no first moment; not under FSDP2)",
        # adafactor's factored moments need 2-D weights: FSDP1's flat 1-D shards get full second
        # moments, more than 8-bit AdamW's two states (issue 27, item 5). adamw_torch_fused holds
        # the same two fp32 moments as adamw_torch but needs no more: adamw_torch is the foreach
        # implementation on CUDA, which "uses ~ sizeof(params) more peak memory than the for-loop
        # version due to the intermediates being a tensorlist" (PyTorch's torch.optim docs,
        # `foreach`; torch/optim/adam.py's _foreach_sqrt), the fused kernel none (issue 23): an
        # adamw_torch OOM says nothing of the fused one, a fused OOM implies adamw_torch's
        memory=_Depends(
            "optim",
            (_fsdp1, Axis("ordered", ("adamw_bnb_8bit", "adafactor", "adamw_torch_fused", "adamw_torch"))),
            (_always, Axis("ordered", ("adafactor", "adamw_bnb_8bit", "adamw_torch_fused", "adamw_torch"))),
        ),
        speed=Axis("ordered", ("adamw_torch", "adamw_torch_fused")),
        feature=None,
        # 8-bit AdamW: two 1-byte states (bitsandbytes, Dettmers et al. 2022); Adafactor: factored
        # second moments, rows + columns of each matrix (Shazeer and Stern 2018): about nothing
        state_bytes={"adamw_bnb_8bit": 2.0, "adafactor": 0.1},
        step_copies={"adamw_torch": 1.0},  # the foreach step's tensorlist intermediates (above)
        label=lambda v, c: None if v == "adamw_torch" else v,
        training_args="optim",
        needs={"adamw_bnb_8bit": Needs(cuda=True, module="bitsandbytes")},
    ),
    Knob(
        name="torch_compile",
        kind="bool",
        default=False,
        doc="torch.compile the model",
        feature="compile",
        # torchtitan's Llama-3.1-8B FSDP2 with selective checkpointing: 1.157x the tokens/s on 8
        # and 1.162x on 128 H100s (benchmarks/llama3_h100_202412_torchtitan.md; evidence rows)
        efficiency={True: 1.16},
        # inductor fuses the norms', activation function's and residuals' elementwise chains and
        # keeps fewer outputs: fitted by benchmarks/physics_fit.py (torchtitan's pair, 82.4 ->
        # 77.0 GiB; IDRIS's Qwen2.5 logs, 107.4 -> 82.1 GiB at 14B)
        activation_share={True: 0.74},
        # Liger's fused RMSNorm and SwiGLU are those chains already, as autograd Functions that
        # save their own few tensors and that the partitioner cannot cut: compile saves nothing
        # more there
        activation_share_unless="liger_kernel",
        label=lambda v, c: "compile" if v else None,
        training_args="torch_compile",
    ),
    Knob(
        name="padding",
        kind="str",
        default="max_length",
        check=one_of(PADDINGS),
        doc="max_length: every entry padded to model_max_length; longest: each batch to its longest "
        "entry; packed: padding-free, a batch's entries concatenated with their boundaries kept "
        "(position ids; no attention crosses an entry)",
        # packed with sdpa or eager: transformers builds a dense block-diagonal mask over the whole
        # packed row (length x length), and the kernel computes all of it (issue 27, item 5;
        # issue 23): more memory and work than padding each entry can be, so no order there.
        # With flash_attention_2 the packed entries go to FlashAttention's varlen kernel through
        # their position ids, and flex_attention masks blocks sparsely: packing needs least (HF
        # blog "Improving Hugging Face Training Efficiency Through Packing with Flash Attention
        # 2", 2024; transformers' DataCollatorWithFlattening docs)
        memory=_Depends(
            "padding",
            (_dense, Axis("ordered", ("longest", "max_length"))),
            (_always, Axis("ordered", ("packed", "longest", "max_length"))),
        ),
        speed=_Depends(
            "padding",
            (_dense, Axis("ordered", ("max_length", "longest"))),
            (_always, Axis("ordered", ("max_length", "longest", "packed"))),
        ),
        data_option="padding",
    ),
    Knob(
        name="attn_implementation",
        kind="str",
        default="sdpa",
        check=one_of(ATTENTION),
        doc="the attention kernel: eager (plain matmuls and softmax), sdpa (torch's "
        "scaled_dot_product_attention), flash_attention_2 (CUDA and the flash_attn package) or "
        "flex_attention (torch's FlexAttention, compiled block-sparse masks: padding-free packed rows "
        "without flash_attn; CUDA)",
        # sdpa holds a boolean mask of every row's square that flash never builds
        memory=Axis("ordered", ("flash_attention_2", "sdpa", "eager")),
        # under torch_compile flash attention's unpadding (data-dependent shapes) breaks the graph:
        # flash can lose to sdpa, so no order for it there (flash_attn's unpad_input calls
        # torch.nonzero, an output shape that depends on the data: a graph break in PyTorch's
        # torch.compile docs unless capture_dynamic_output_shape_ops; issue 23)
        # eager materialises the scores in memory; sdpa's and flash's fused kernels do not
        # (FlashAttention-2 paper: 2x over sdpa-era kernels on the attention alone, a few percent
        # of a whole step)
        efficiency={"eager": 0.85, "sdpa": 0.97, "flash_attention_2": 1.0, "flex_attention": 0.97},
        speed=_Depends(
            "attn_implementation",
            (_compiled, Axis("ordered", ("eager", "sdpa"))),
            (_always, Axis("ordered", ("eager", "sdpa", "flash_attention_2"))),
        ),
        label=lambda v, c: (
            None if v == "sdpa" else {"eager": "attn=eager", "flex_attention": "flex"}.get(v, "flash2")
        ),
        model_kwarg="attn_implementation",
        needs={
            "flash_attention_2": Needs(cuda=True, module="flash_attn"),
            "flex_attention": Needs(cuda=True, why="torch's FlexAttention has no backward on the CPU"),
        },
    ),
    Knob(
        name="precision",
        kind="str",
        default="mixed",
        check=one_of(PRECISIONS),
        doc="mixed: float32 weights, gradients and optimizer states, computed in the workload's "
        "torch_dtype on CUDA (float32 on the CPU); pure_bf16: bfloat16 weights, gradients and "
        "optimizer states",
        memory=Axis("ordered", ("pure_bf16", "mixed")),
        speed=Axis("ordered", ("mixed", "pure_bf16")),
        efficiency={"pure_bf16": 1.05},  # no fp32 master weights to cast every step
        # no fp32 residual stream and norm upcasts: a transformers layer keeps 10 bytes a token
        # and hidden unit fewer than under autocast (benchmarks/activation_bytes.py counts 53.1
        # against 63.1 on granite-3.1-2b's layer)
        activation_bytes={"pure_bf16": -10.0},
        label=lambda v, c: "bf16" if v == "pure_bf16" else None,
    ),
    Knob(
        name="liger_kernel",
        kind="bool",
        default=False,
        doc="Liger Kernel's fused Triton kernels (RMSNorm, RoPE, SwiGLU, cross entropy) patched into "
        "the model (CUDA, the liger_kernel package and a model type it supports)",
        memory=Axis("decreasing"),
        # under torch_compile Liger's autograd functions (Triton kernels) can break the graph, so
        # Liger can lose to no Liger (issue 23's report): no order there
        speed=_Depends("liger_kernel", (_compiled, Axis()), (_always, Axis("increasing"))),
        efficiency={True: 1.04},  # Liger-Kernel paper: about 20% on the fused ops, a few % a step
        # LigerSiLUMulFunction saves the gate and up projections and recomputes silu(gate) in the
        # backward (Liger-Kernel src/liger_kernel/ops/swiglu.py): three of the MLP's four saved
        # intermediate-width tensors (down_proj still saves its input)
        mlp_activation_share={True: 0.75},
        # LigerRMSNormFunction saves its 16-bit input and one fp32 rstd a row (Liger-Kernel
        # src/liger_kernel/ops/rms_norm.py), where transformers' RMSNorm keeps the fp32 upcast
        # and the normalized fp32 tensor: 8 bytes a token and hidden unit fewer
        activation_bytes={True: -8.0},
        label=lambda v, c: "liger" if v else None,
        needs={True: Needs(cuda=True, module="liger_kernel", model_types=LIGER_MODEL_TYPES)},
    ),
    Knob(
        name="checkpoint_fraction",
        kind="float",
        default=1.0,
        check=fraction,
        when=CHECKPOINTING,
        inactive=1.0,
        doc="the fraction of decoder layers checkpointed, spread evenly over the stack (selective "
        "activation checkpointing; only when gradient_checkpointing)",
        memory=Axis("decreasing"),
        speed=Axis("decreasing"),
        feature="checkpointing",
        label=lambda v, c: None,  # in gradient_checkpointing's: ckpt=0.5
    ),
    Knob(
        name="fsdp_cpu_offload",
        kind="bool",
        default=False,
        when=FSDP,
        inactive=False,
        doc="FSDP keeps parameters, gradients and optimizer states in host memory and the "
        "optimizer steps on the CPU (only with FSDP; on one GPU too, where FSDP needs it)",
        memory=Axis("decreasing"),
        speed=Axis("decreasing"),
        feature="backend",
        label=lambda v, c: "offload" if v else None,
        # accelerate's offload policy moves states between host and an accelerator: on the CPU
        # it fails ("Cannot access accelerator device when none is available")
        needs={True: Needs(cuda=True)},
    ),
    Knob(
        name="gpu_model",
        kind="str",
        check=_gpu_model_name,
        asked_first=True,
        doc="the GPU model a trial runs on, one of resources.gpu_models (default: the study's "
        "resources.gpu_model); Ray places the trial on GPUs of that model only",
        # memory and speed: EQUAL (the default), so that OOM inference, the throughput prior and
        # local search never compare two GPU models; its own feature in the neighbour model
        label=lambda v, c: None if v is None else str(v),
    ),
)

KNOBS: dict[str, Knob] = {k.name: k for k in _DECLARED}
"""Every knob by name, in registry order. Read it through :func:`knobs`; add to it with
:func:`register` (a test's or a plugin's knob), never by assignment."""


def knobs() -> tuple[Knob, ...]:
    """Every knob, in registry order."""
    return tuple(KNOBS.values())


def knob(name: str) -> Knob:
    """The knob called ``name`` (``KeyError``: none)."""
    return KNOBS[name]


def asking_order() -> tuple[Knob, ...]:
    """The order in which a sampler is asked: the knobs that shape the job first."""
    return tuple(k for k in knobs() if k.asked_first) + tuple(k for k in knobs() if not k.asked_first)


def run_options(
    config: Config, target: Literal["training_args", "model_kwarg", "data_option"]
) -> dict[str, Any]:
    """The keywords the knobs hand to the run: ``{keyword: value}`` of every knob that declares
    one for ``target`` (``TrainingArguments`` or the model's constructor) and has a value."""
    out: dict[str, Any] = {}
    for k in knobs():
        keyword = getattr(k, target)
        value = getattr(config, k.name, None)
        if keyword is not None and value is not None:
            out[keyword] = value
    return out


@contextmanager
def register(*new: Knob) -> Iterator[None]:
    """Add knobs for the length of a ``with`` block (tests, plugins); removed again after it."""
    for k in new:
        if k.name in KNOBS:
            raise ValueError(f"knob {k.name!r} is declared already")
        if k.when is not None and k.when.parent in {n.name for n in new} - set(KNOBS):
            raise ValueError(f"knob {k.name!r}: its condition's parent comes after it")
    KNOBS.update({k.name: k for k in new})
    try:
        yield
    finally:
        for k in new:
            KNOBS.pop(k.name, None)


REFERENCE_HEAD = """# The knobs

Every tunable field of a trial's configuration, as declared in `explorer/knobs/_registry.py`
(this page is generated from it: `.venv/bin/python -m explorer.knobs > docs/knobs.md`; a test
checks that it is up to date). A search space names knobs under `parameters:`; `explorer measure
--set NAME=VALUE` takes the same names. *memory*: the direction OOM inference assumes (`equal`:
unknown, compared only at the same value; `by configuration`: it depends on other knobs, e.g.
GPUs matter only under sharding). How to add one: [architecture.md](architecture.md).

"""


def reference() -> str:
    """The knobs as a Markdown page (``docs/knobs.md`` is this, checked by a test)."""
    rows = [
        "| knob | kind | default | applies | memory | reaches the run as | needs | what it is |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for k in knobs():
        default = "required" if k.required and k.default_from is None else _shown(k)
        applies = "always" if k.when is None else f"when {k.when.needs}"
        memory = k.memory.kind if isinstance(k.memory, Axis) else "by configuration"
        reach = (
            f"`TrainingArguments.{k.training_args}`"
            if k.training_args
            else f"model `{k.model_kwarg}`"
            if k.model_kwarg
            else f"data `{k.data_option}`"
            if k.data_option
            else "the worker"
        )
        needs = "; ".join(f"`{v}`: {_needs_text(n)}" for v, n in k.needs.items()) or "-"
        rows.append(
            f"| `{k.name}` | {k.kind} | {default} | {applies} | {memory} | {reach} | {needs} | {k.doc} |"
        )
    return REFERENCE_HEAD + "\n".join(rows) + "\n"


def _needs_text(n: Needs) -> str:
    parts = ["CUDA"] if n.cuda else []
    parts += [f"the `{n.module}` package"] if n.module else []
    parts += ["a model type it supports"] if n.model_types is not None else []
    return ", ".join(parts)


def _shown(k: Knob) -> str:
    if k.default_from is not None:
        return "the workload's"
    return "none" if k.default is None else f"`{k.default}`"
