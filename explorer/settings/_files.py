"""Every launcher's settings of one configuration at once (what ``explorer best`` writes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from explorer.settings._accelerate import render_accelerate
from explorer.settings._run import RunSettings, run_settings
from explorer.settings._training import training_kwargs
from explorer.settings._trl import sft_config_kwargs

if TYPE_CHECKING:
    from explorer.job import TrialJob

__all__ = ["LaunchSettings", "launch_settings"]


@dataclass(frozen=True)
class LaunchSettings:
    """One configuration's settings for each launcher."""

    training_arguments: dict[str, Any]
    """``TrainingArguments`` keywords (but ``output_dir`` and ``max_steps``)."""
    sft_config: dict[str, Any]
    """TRL's ``SFTConfig`` keywords: the above and TRL's padding and truncation."""
    accelerate: str
    """The accelerate config (YAML text)."""
    run: RunSettings
    """What no Hugging Face setting holds, and the call that applies it."""


def launch_settings(
    job: TrialJob, *, device_type: str, layer_classes: list[str] | None, header: tuple[str, ...] = ()
) -> LaunchSettings:
    """The settings of ``job.config`` for a plain ``Trainer`` (under ``torchrun`` or ``accelerate
    launch``) and TRL's ``SFTTrainer``.

    Args:
        job: The configuration, with its workload.
        device_type: ``cuda`` or ``cpu``.
        layer_classes: FSDP: the decoder layer classes to wrap.
        header: Comment lines heading the accelerate config.
    """
    training = training_kwargs(job, device_type=device_type, layer_classes=layer_classes)
    return LaunchSettings(
        training_arguments=training,
        sft_config=sft_config_kwargs(job.config, training),
        accelerate=render_accelerate(
            job.config,
            device_type=device_type,
            torch_dtype=job.workload.torch_dtype,
            layer_classes=layer_classes,
            header=header,
        ),
        run=run_settings(job.config, job.workload.method),
    )
