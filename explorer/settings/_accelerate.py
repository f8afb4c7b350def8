"""A configuration's accelerate config: a template of ``launchers/accelerate`` with its
``${NAME}`` placeholders filled (what ``accelerate launch --config_file`` reads)."""

from __future__ import annotations

import re
import string
from pathlib import Path

import yaml

from explorer.settings._training import selective_checkpointing
from explorer.trial_config import TrialConfig

__all__ = [
    "TEMPLATES",
    "accelerate_values",
    "mixed_precision",
    "render_accelerate",
    "template_for",
]


def _templates() -> Path:
    """``launchers/accelerate``: in the source tree, or inside an installed package (the wheel
    ships ``launchers/`` as ``explorer/launchers``)."""
    package = Path(__file__).resolve().parents[1]
    installed = package / "launchers" / "accelerate"
    return installed if installed.is_dir() else package.parent / "launchers" / "accelerate"


TEMPLATES = _templates()
"""The accelerate config templates (``${NAME}`` placeholders)."""

_PLACEHOLDER = re.compile(r"\$\{([A-Z_]+)\}")
_DYNAMIC_SHAPES = """\
dynamo_config:                  # padding: {padding}: batches change shape from step to step
  dynamo_use_dynamic: true      # torch.compile(dynamic=True) from the first step: one compile
"""


def template_for(config: TrialConfig) -> str:
    """The template file name for ``config``: ``fsdp1.yaml``, ``fsdp2.yaml`` or ``ddp.yaml``
    (DDP, and one process, which renders ``ddp.yaml`` with ``distributed_type: NO``)."""
    if config.distributed_backend == "FSDP":
        return f"fsdp{config.fsdp_version or 1}.yaml"
    return "ddp.yaml"


def mixed_precision(device_type: str, torch_dtype: str) -> str:
    """accelerate's ``mixed_precision``: the workload's dtype on CUDA, ``no`` on the CPU (the worker
    trains in float32 there)."""
    if device_type != "cuda":
        return "no"
    return {"bfloat16": "bf16", "float16": "fp16"}.get(torch_dtype, "no")


def accelerate_values(
    config: TrialConfig, *, device_type: str, torch_dtype: str, layer_classes: list[str] | None
) -> dict[str, str]:
    """The template's placeholder values for ``config``, as YAML scalars.

    Args:
        config: The configuration to run.
        device_type: ``cuda`` or ``cpu``.
        torch_dtype: The workload's ``torch_dtype``.
        layer_classes: FSDP: the decoder layer classes to wrap (from the model class).

    Raises:
        ValueError: FSDP without ``layer_classes``.
    """
    yes_no = {True: "true", False: "false"}
    values = {
        "NUMBER_GPUS": str(config.number_gpus),
        "NUMBER_NODES": str(config.number_nodes or 1),
        # quoted: YAML 1.1 (accelerate's loader) reads a bare no as false
        "MIXED_PRECISION": f'"{mixed_precision(device_type, torch_dtype)}"',
        # FSDP on one GPU too (with CPU offload): accelerate's FSDP type, a world of one process
        "DISTRIBUTED_TYPE": "FSDP"
        if config.distributed_backend == "FSDP"
        else "MULTI_GPU"
        if config.number_gpus > 1
        else '"NO"',  # not false
        # as training_arguments.json's use_cpu, but where accelerate would then start one process
        # only: a CPU run of several processes (see render_accelerate's note)
        "USE_CPU": yes_no[device_type == "cpu" and config.number_gpus == 1],
    }
    if config.distributed_backend == "FSDP":
        if not layer_classes:
            raise ValueError("FSDP needs the decoder layer classes to wrap")
        values.update(
            DECODER_LAYER_CLASS=",".join(layer_classes),
            SHARDING_STRATEGY=config.fsdp_sharding_strategy or "FULL_SHARD",
            RESHARD_AFTER_FORWARD=yes_no[config.fsdp_sharding_strategy == "FULL_SHARD"],
            OFFLOAD_PARAMS=yes_no[bool(config.fsdp_cpu_offload)],
            # every layer only: a fraction of them is apply_selective_checkpointing's (run_settings.json)
            ACTIVATION_CHECKPOINTING=yes_no[
                bool(config.gradient_checkpointing) and not selective_checkpointing(config)
            ],
            # as the worker: accelerate's sync_module_states needs an accelerator
            SYNC_MODULE_STATES=yes_no[device_type == "cuda"],
            # accelerate refuses cpu_ram_efficient_loading without sync_module_states
            CPU_RAM_EFFICIENT_LOADING=yes_no[device_type == "cuda"],
        )
    return values


def render_accelerate(
    config: TrialConfig,
    *,
    device_type: str,
    torch_dtype: str,
    layer_classes: list[str] | None,
    header: tuple[str, ...] = (),
    templates: Path = TEMPLATES,
) -> str:
    """The accelerate config YAML for ``config``: its template with every placeholder filled.

    Args:
        config: The configuration to run.
        device_type: ``cuda`` or ``cpu``.
        torch_dtype: The workload's ``torch_dtype``.
        layer_classes: FSDP: the decoder layer classes to wrap.
        header: Comment lines (without ``#``) put before the template.
        templates: The folder of ``ddp.yaml``, ``fsdp1.yaml`` and ``fsdp2.yaml``.

    Raises:
        FileNotFoundError: The templates are not there.
        ValueError: A placeholder is left, or the result is not a YAML mapping.
    """
    path = templates / template_for(config)
    if not path.is_file():
        raise FileNotFoundError(f"accelerate template {path} not found")
    values = accelerate_values(
        config, device_type=device_type, torch_dtype=torch_dtype, layer_classes=layer_classes
    )
    text = string.Template(path.read_text()).safe_substitute(values)
    left = sorted(set(_PLACEHOLDER.findall(text)))
    if left:
        raise ValueError(f"{path}: placeholders left after rendering: {', '.join(left)}")
    notes = list(header)
    if device_type != "cuda" and config.number_gpus > 1:
        # accelerate starts a single process when use_cpu is true; the Trainer's use_cpu (in the
        # training arguments) is what puts the ranks on the CPU.
        notes.append(
            "CPU: use_cpu stays false here, while training_arguments.json has use_cpu: true: with it "
            "accelerate would start one process, not every rank (the ranks run on the CPU with gloo)."
        )
    if config.compiles_dynamic:  # as the worker compiles it (accelerate launch tells the Trainer)
        text = text.rstrip() + "\n" + _DYNAMIC_SHAPES.format(padding=config.padding)
    rendered = "\n".join([*(f"# {line}".rstrip() for line in notes), text.rstrip()]) + "\n"
    if not isinstance(yaml.safe_load(rendered), dict):
        raise ValueError(f"{path}: the rendered config is not a mapping")
    return rendered
