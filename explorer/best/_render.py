"""The files a user runs next: an accelerate config from ``launchers/accelerate``, and the
``torchrun`` / ``accelerate launch`` command lines; all from :mod:`explorer.settings`, the one
mapping of a configuration to every launcher's settings (re-exported here)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from explorer.settings import (
    MASTER_PORT,
    NODE_VARIABLES,
    TEMPLATES,
    accelerate_command,
    accelerate_values,
    mixed_precision,
    nodes_note,
    render_accelerate,
    template_for,
    torchrun_command,
    user_accelerate_command,
    user_torchrun_command,
)

if TYPE_CHECKING:
    from explorer.settings import LaunchSettings
    from explorer.trial_config import TrialConfig

__all__ = [
    "MASTER_PORT",
    "UserFiles",
    "NODE_VARIABLES",
    "TEMPLATES",
    "accelerate_command",
    "accelerate_values",
    "mixed_precision",
    "nodes_note",
    "render_accelerate",
    "render_user_files",
    "template_for",
    "torchrun_command",
    "user_accelerate_command",
    "user_torchrun_command",
]


@dataclass(frozen=True)
class UserFiles:
    """What a user's own run takes beside training_arguments.json and accelerate.yaml."""

    sft_config: Path
    """TRL's ``SFTConfig(**json.load(...))``."""
    run_settings: Path
    """What no Hugging Face setting holds, and the call that applies it."""
    torchrun: str
    """A plain Trainer under torchrun (``explorer.user_train``, or your script in its place)."""
    accelerate: str
    """The same under ``accelerate launch --config_file accelerate.yaml``."""
    sft: str
    """TRL's SFTTrainer under torchrun."""

    def paths(self) -> list[str]:
        """The files, as ``explorer best`` prints them."""
        return [
            f"TRL SFTConfig:      {self.sft_config}",
            f"run settings:       {self.run_settings} (what no Hugging Face setting holds: "
            "explorer.settings.RunSettings.load(it).prepare_model(model) / .data_collator())",
        ]

    def commands(self) -> list[str]:
        """The user commands, as ``explorer best`` prints them (after the check run's)."""
        return [
            "your own run, from these files alone (explorer.user_train, or your script in its place):",
            f"  {self.torchrun}",
            f"  {self.accelerate}",
            f"  {self.sft}",
        ]


def render_user_files(
    out_dir: Path, config: TrialConfig, settings: LaunchSettings, *, sft_config: dict[str, Any]
) -> tuple[UserFiles, dict[str, str]]:
    """``sft_config.json`` (``sft_config``: the chosen ``SFTConfig`` keywords) and
    ``run_settings.json`` (with the user commands) for ``out_dir``, the folder they will be in
    (the commands name it): their paths and commands, and their texts by name."""
    accelerate_yaml = out_dir / "accelerate.yaml"
    user = UserFiles(
        sft_config=out_dir / "sft_config.json",
        run_settings=out_dir / "run_settings.json",
        torchrun=user_torchrun_command(config, settings_dir=out_dir),
        accelerate=user_accelerate_command(config, config_file=accelerate_yaml, settings_dir=out_dir),
        sft=user_torchrun_command(config, settings_dir=out_dir, trainer="sft"),
    )
    run = {
        **settings.run.to_dict(),
        "commands": {"torchrun": user.torchrun, "accelerate": user.accelerate, "sft": user.sft},
    }
    texts = {
        user.sft_config.name: json.dumps(sft_config, indent=2) + "\n",
        user.run_settings.name: json.dumps(run, indent=2) + "\n",
    }
    return user, texts
