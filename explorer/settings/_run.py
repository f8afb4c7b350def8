"""``run_settings.json``: what a configuration needs that no Hugging Face file holds, and the one
public call that applies it (:meth:`RunSettings.prepare_model`, :meth:`RunSettings.data_collator`)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from explorer.settings._training import fsdp_environment, lora_kwargs, model_kwargs, selective_checkpointing

if TYPE_CHECKING:
    from explorer.settings._data import PaddingCollator
    from explorer.spec import MethodSpec
    from explorer.trial_config import TrialConfig

__all__ = ["HOW", "RunSettings", "SettingsError", "run_settings"]

HOW = {
    "model": "explorer.settings.RunSettings.load(PATH).prepare_model(model), before the Trainer is made: "
    "sets `environment` where unset and checkpoints checkpoint_fraction of the decoder layers",
    "data_collator": "a plain Trainer's data_collator=explorer.settings.RunSettings.load(PATH).data_collator() "
    "(padding; TRL's SFTTrainer makes its own from sft_config.json)",
    "model_kwargs": "keywords of AutoModelForCausalLM.from_pretrained / from_config (dtype by name)",
    "lora": "peft's LoraConfig keywords (null: full fine-tuning): get_peft_model(model, "
    "RunSettings.load(PATH).peft_config()) before prepare_model, or SFTTrainer(peft_config=...)",
    "cpu": "on the CPU only, FSDP needs explorer.settings.FsdpOnCpu before the Trainer class "
    "(class T(FsdpOnCpu, Trainer)): accelerate ignores FSDP there",
}
"""How each entry of ``run_settings.json`` reaches a user's run (written beside them)."""


class SettingsError(ValueError):
    """A ``run_settings.json`` that cannot be read: its message is one line (file, field, problem)."""


@dataclass(frozen=True)
class RunSettings:
    """What a configuration needs beside ``training_arguments.json`` / ``sft_config.json`` /
    ``accelerate.yaml``."""

    model_max_length: int
    """Entries are truncated to it (the benchmark's sequence length)."""
    padding: str
    """``max_length``, ``longest`` or ``packed`` (padding-free)."""
    checkpoint_fraction: float | None
    """Some decoder layers checkpointed (``None``: none, or every one through the Trainer or FSDP)."""
    liger_kernel: bool
    """Liger Kernel (``use_liger_kernel`` in the Trainer's arguments: written there too)."""
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, str] = field(default_factory=dict)
    """Variables the launch needs (FSDP1's strategy): the written torchrun command sets them."""
    lora: dict[str, Any] | None = None
    """peft's ``LoraConfig`` keywords (``None``: full fine-tuning)."""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "how": HOW}

    @classmethod
    def load(cls, path: str | Path) -> RunSettings:
        """Read ``run_settings.json`` (or the folder holding it).

        Raises:
            SettingsError: not there, not JSON, or a field missing or of the wrong type.
        """
        p = Path(path)
        p = p / "run_settings.json" if p.is_dir() else p
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError) as exc:
            raise SettingsError(f"{p}: cannot be read: {exc}") from None
        if not isinstance(data, dict):
            raise SettingsError(f"{p}: not a JSON object")
        return cls._checked(data, p)

    @classmethod
    def _checked(cls, data: dict[str, Any], p: Path) -> RunSettings:
        types: dict[str, Any] = {
            "model_max_length": int,
            "padding": str,
            "checkpoint_fraction": (float, int, type(None)),
            "liger_kernel": bool,
            "model_kwargs": dict,
            "environment": dict,
        }
        for name, kind in types.items():
            if name not in data:
                raise SettingsError(f"{p}: field {name}: missing")
            if not isinstance(data[name], kind):
                raise SettingsError(f"{p}: field {name}: wrong type {type(data[name]).__name__}")
        if data["padding"] not in ("max_length", "longest", "packed"):
            raise SettingsError(
                f"{p}: field padding: {data['padding']!r} is not max_length, longest or packed"
            )
        lora = data.get("lora")
        if lora is not None and not isinstance(lora, dict):
            raise SettingsError(f"{p}: field lora: wrong type {type(lora).__name__}")
        return cls(**{k: data[k] for k in types}, lora=lora)

    def apply_environment(self) -> dict[str, str]:
        """Set :attr:`environment`'s variables that are unset; returns those it set."""
        missing = {k: v for k, v in self.environment.items() if k not in os.environ}
        os.environ.update(missing)
        return missing

    def prepare_model(self, model: Any) -> dict[str, Any]:
        """Apply what the Trainer's arguments cannot to ``model`` (before the Trainer is made): the
        environment, and :attr:`checkpoint_fraction` of the decoder layers checkpointed. Returns
        what it did: ``{"environment": {...}, "checkpointed_layers": [indices]}``."""
        from explorer.settings._model import apply_selective_checkpointing, decoder_layers

        done: dict[str, Any] = {"environment": self.apply_environment(), "checkpointed_layers": []}
        if self.checkpoint_fraction is not None:
            apply_selective_checkpointing(model, self.checkpoint_fraction)
            layers = decoder_layers(model)
            done["checkpointed_layers"] = [i for i, m in enumerate(layers) if m.gradient_checkpointing]
        return done

    def peft_config(self) -> Any:
        """peft's ``LoraConfig`` of a LoRA configuration (``None``: full fine-tuning)."""
        if self.lora is None:
            return None
        from peft import LoraConfig

        return LoraConfig(**self.lora)

    def data_collator(self) -> PaddingCollator:
        """A plain ``Trainer``'s ``data_collator`` for :attr:`padding` (packing has no
        ``TrainingArguments`` field)."""
        from explorer.settings._data import PaddingCollator

        return PaddingCollator(self.padding, self.model_max_length)


def run_settings(c: TrialConfig, method: MethodSpec | None = None) -> RunSettings:
    """The :class:`RunSettings` of configuration ``c`` (``method``: the workload's, for LoRA)."""
    return RunSettings(
        model_max_length=int(c.model_max_length),
        padding=str(c.padding),
        checkpoint_fraction=float(c.checkpoint_fraction) if selective_checkpointing(c) else None,
        liger_kernel=bool(c.liger_kernel),
        model_kwargs=model_kwargs(c),
        environment=fsdp_environment(c),
        lora=lora_kwargs(c.lora_r, method),
    )
