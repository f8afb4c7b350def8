"""One mapping from a configuration to every launcher's settings: ``TrainingArguments``, the
accelerate config, TRL's ``SFTConfig``, the ``torchrun`` / ``accelerate launch`` commands, and
what no Hugging Face setting holds (``run_settings.json``, with the call that applies it). The
worker and ``explorer best`` both take them from here."""

from explorer.settings._accelerate import (
    TEMPLATES,
    accelerate_values,
    mixed_precision,
    render_accelerate,
    template_for,
)
from explorer.settings._commands import (
    MASTER_PORT,
    NODE_VARIABLES,
    accelerate_command,
    nodes_note,
    torchrun_command,
    user_accelerate_command,
    user_torchrun_command,
)
from explorer.settings._cpu import FsdpOnCpu, fsdp_on_cpu
from explorer.settings._data import PAD_ID, PaddingCollator, collator_for, pad_item
from explorer.settings._files import LaunchSettings, launch_settings
from explorer.settings._model import (
    apply_liger,
    apply_selective_checkpointing,
    checkpointed_layers,
    decoder_layers,
)
from explorer.settings._run import HOW, RunSettings, SettingsError, run_settings
from explorer.settings._training import (
    BENCHMARK_ONLY,
    checkpointing_field,
    fsdp_environment,
    lora_kwargs,
    model_kwargs,
    process_group_backend,
    selective_checkpointing,
    training_kwargs,
)
from explorer.settings._trl import sft_config_kwargs, trl_refusal

__all__ = [
    "BENCHMARK_ONLY",
    "HOW",
    "MASTER_PORT",
    "NODE_VARIABLES",
    "PAD_ID",
    "TEMPLATES",
    "FsdpOnCpu",
    "LaunchSettings",
    "PaddingCollator",
    "RunSettings",
    "SettingsError",
    "accelerate_command",
    "accelerate_values",
    "apply_liger",
    "apply_selective_checkpointing",
    "checkpointed_layers",
    "checkpointing_field",
    "collator_for",
    "decoder_layers",
    "fsdp_environment",
    "fsdp_on_cpu",
    "launch_settings",
    "lora_kwargs",
    "mixed_precision",
    "model_kwargs",
    "nodes_note",
    "pad_item",
    "process_group_backend",
    "render_accelerate",
    "run_settings",
    "selective_checkpointing",
    "sft_config_kwargs",
    "template_for",
    "torchrun_command",
    "training_kwargs",
    "trl_refusal",
    "user_accelerate_command",
    "user_torchrun_command",
]
