"""A configuration's ``TrainingArguments``: sharding, checkpointing, precision, the knobs' own
keywords, and the environment FSDP1 needs beside them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from explorer.knobs import run_options

if TYPE_CHECKING:
    from explorer.job import TrialJob
    from explorer.spec import MethodSpec
    from explorer.trial_config import TrialConfig

__all__ = [
    "BENCHMARK_ONLY",
    "checkpointing_field",
    "fsdp_environment",
    "lora_kwargs",
    "model_kwargs",
    "process_group_backend",
    "selective_checkpointing",
    "training_kwargs",
]

BENCHMARK_ONLY: dict[str, Any] = dict(
    learning_rate=1e-5,
    weight_decay=0.0,
    lr_scheduler_type="constant",
    train_sampling_strategy="sequential",
    dataloader_num_workers=0,
    save_strategy="no",
    logging_strategy="no",
    report_to="none",
    disable_tqdm=True,
    seed=0,
)
"""TrainingArguments the benchmark sets for itself, whatever the configuration: no study chose them,
and the real run sets its own (a study's ``workload.training_arguments`` overrides them)."""


def selective_checkpointing(c: TrialConfig) -> bool:
    """Whether only some decoder layers are checkpointed (``checkpoint_fraction`` below 1): no
    Hugging Face setting does that; :func:`explorer.settings.apply_selective_checkpointing` does."""
    return bool(c.gradient_checkpointing) and c.checkpoint_fraction < 1.0


def checkpointing_field() -> str:
    """The ``TrainingArguments`` field of checkpointing: transformers renamed
    ``gradient_checkpointing`` to ``activation_checkpointing`` during 5.x (5.17 knows only the
    old name, 5.23 warns about it)."""
    from transformers import TrainingArguments

    fields = TrainingArguments.__dataclass_fields__
    return "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"


def fsdp_environment(c: TrialConfig) -> dict[str, str]:
    """What the environment must hold beside the ``TrainingArguments`` (FSDP1 only).

    accelerate (1.15) gives FSDP1 ``sharding_strategy`` (defaulting to ``FSDP_SHARDING_STRATEGY``,
    else FULL_SHARD) precedence over ``reshard_after_forward``, where transformers puts the
    strategy: without the variable every FSDP1 run is FULL_SHARD, on GPUs too. ``accelerate
    launch`` sets it from the accelerate config; a plain ``torchrun`` needs it on its command line.
    """
    if c.distributed_backend == "FSDP" and c.fsdp_version == 1:
        return {"FSDP_SHARDING_STRATEGY": (c.fsdp_sharding_strategy or "FULL_SHARD").upper()}
    return {}


def model_kwargs(c: TrialConfig) -> dict[str, Any]:
    """The model constructor's keywords (``from_pretrained`` / ``from_config``): each knob's
    ``model_kwarg``, and the weights' dtype (``float32`` master weights for mixed precision,
    ``bfloat16`` for pure bf16)."""
    return {**run_options(c, "model_kwarg"), "dtype": "bfloat16" if c.precision == "pure_bf16" else "float32"}


def lora_kwargs(lora_r: int | None, method: MethodSpec | None) -> dict[str, Any] | None:
    """peft's ``LoraConfig`` keywords of a LoRA configuration (rank ``lora_r``, the rest from the
    workload's method); ``None`` for full fine-tuning."""
    if lora_r is None or method is None or method.kind != "lora":
        return None
    return {
        "r": int(lora_r),
        "lora_alpha": method.alpha,
        "lora_dropout": method.dropout,
        "target_modules": list(method.target_modules),
        "task_type": "CAUSAL_LM",
    }


def training_kwargs(
    job: TrialJob, *, device_type: str, layer_classes: list[str] | None, liger_in_trainer: bool = True
) -> dict[str, Any]:
    """The keyword arguments of ``TrainingArguments`` for ``job.config``, but ``output_dir`` and
    ``max_steps``: plain JSON values (``explorer best`` writes them out as they are).

    Args:
        job: The trial.
        device_type: ``cuda`` or ``cpu``, the device the ranks train on.
        layer_classes: FSDP only: the decoder layer classes to wrap one by one.
        liger_in_trainer: Liger Kernel through ``use_liger_kernel`` (the Trainer patches the
            model); the worker patches it itself, to record what changed.
    """
    c: TrialConfig = job.config
    kwargs: dict[str, Any] = {}
    cuda = device_type == "cuda"
    if cuda:
        # mixed precision autocasts float32 weights; pure bf16 weights need no autocast
        mixed = c.precision == "mixed"
        kwargs["bf16"] = mixed and job.workload.torch_dtype == "bfloat16"
        kwargs["fp16"] = mixed and job.workload.torch_dtype == "float16"
    else:
        kwargs["use_cpu"] = True
    kwargs["ddp_backend"] = process_group_backend(c, device_type=device_type)
    if c.distributed_backend == "DDP":
        # every parameter that requires a gradient gets one each step (LoRA's frozen base needs
        # none): DDP's search for unused parameters only costs time, and warned in every log
        kwargs["ddp_find_unused_parameters"] = False
    every_layer = bool(c.gradient_checkpointing) and not selective_checkpointing(c)
    if c.distributed_backend == "FSDP":
        kwargs["fsdp"] = True
        kwargs["fsdp_config"] = _fsdp_config(c, cuda=cuda, layer_classes=layer_classes)
        gradient_checkpointing = False  # FSDP checkpoints through activation_checkpointing
    else:  # some layers only: apply_selective_checkpointing, layer by layer
        gradient_checkpointing = every_layer
    ckpt = checkpointing_field()
    kwargs[ckpt] = gradient_checkpointing
    kwargs[f"{ckpt}_kwargs"] = {"use_reentrant": False} if gradient_checkpointing else None
    if liger_in_trainer and c.liger_kernel:
        kwargs["use_liger_kernel"] = True
    out: dict[str, Any] = dict(per_device_train_batch_size=c.per_device_batch_size, **BENCHMARK_ONLY)
    out.update(job.workload.training_arguments)  # the study's own (never a field explorer decides)
    return {**out, **run_options(c, "training_args"), **kwargs}


def _fsdp_config(c: TrialConfig, *, cuda: bool, layer_classes: list[str] | None) -> dict[str, Any]:
    """``TrainingArguments.fsdp_config`` of an FSDP configuration."""
    strategy = (c.fsdp_sharding_strategy or "FULL_SHARD").lower()
    return {
        "version": c.fsdp_version,
        "transformer_layer_cls_to_wrap": layer_classes,
        # every layer: FSDP's checkpoint wrappers; some layers: apply_selective_checkpointing
        "activation_checkpointing": bool(c.gradient_checkpointing) and not selective_checkpointing(c),
        "cpu_offload": c.fsdp_cpu_offload,
        # accelerate's sync_module_states needs an accelerator; every rank builds the same
        # seeded model anyway.
        "sync_module_states": cuda,
        # FSDP2 only knows "reshard after forward" (FULL_SHARD) or not (SHARD_GRAD_OP); FSDP1 takes
        # the strategy's name (and FSDP_SHARDING_STRATEGY: fsdp_environment). The legacy
        # `fsdp="full_shard auto_wrap"` strings are deprecated.
        "reshard_after_forward": c.fsdp_sharding_strategy == "FULL_SHARD"
        if c.fsdp_version == 2
        else strategy,
    }


def process_group_backend(c: TrialConfig, *, device_type: str) -> str | None:
    """The backends of the trial's process group (``None``: no group, one plain process).

    FSDP's CPU offload keeps gradients on the host, so its gradient clipping all-reduces a CPU
    tensor: an NCCL-only group fails there ("No backend type associated with device type cpu",
    pytorch#148532). accelerate adds ``cpu:gloo`` only when ``ACCELERATE_USE_FSDP`` and
    ``FSDP_OFFLOAD_PARAMS`` are in the environment; transformers passes offload as a plugin
    argument instead, so both backends are named here.
    """
    if not c.process_group:
        return None
    if device_type != "cuda":
        return "gloo"
    return "cuda:nccl,cpu:gloo" if c.sharded and c.fsdp_cpu_offload else "nccl"
