"""Build the model to fine-tune: from an architecture (random weights) or a path/hub id."""

from __future__ import annotations

from typing import Any

import torch

from explorer.settings import lora_kwargs
from explorer.spec import MethodSpec, ModelSpec

__all__ = ["build_model", "build_tokenizer", "decoder_layer_classes", "load_config"]


def load_config(spec: ModelSpec, path: str | None) -> Any:
    """The model's transformers config (cheap: no weights are built or read)."""
    from transformers import AutoConfig

    if spec.architecture is not None:
        arch = dict(spec.architecture)
        return AutoConfig.for_model(arch.pop("model_type"), **arch)
    return AutoConfig.from_pretrained(str(path), trust_remote_code=spec.trust_remote_code)


def build_model(
    spec: ModelSpec,
    path: str | None,
    config: Any,
    *,
    lora_r: int | None,
    method: MethodSpec,
    init_device: torch.device | None = None,
    options: dict[str, Any] | None = None,
    dtype: torch.dtype = torch.float32,
) -> Any:
    """A causal LM, its weights in ``dtype``: float32 for mixed precision (which the Trainer
    applies), bfloat16 for pure bf16 training.

    Args:
        init_device: build random weights directly there (a GPU initialises a few hundred million
            parameters in milliseconds, a CPU takes seconds); ``None``: on the CPU, where FSDP wants
            the model before it shards it.
        options: more keywords of ``from_pretrained``/``from_config``: the knobs that declare a
            ``model_kwarg`` (:func:`explorer.knobs.run_options`).
    """
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    if spec.weights == "pretrained":
        model: Any = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=dtype, trust_remote_code=spec.trust_remote_code, **(options or {})
        )
    else:
        with torch.device(init_device or "cpu"):
            model = AutoModelForCausalLM.from_config(
                config, dtype=dtype, trust_remote_code=spec.trust_remote_code, **(options or {})
            )
    # training keeps no KV cache: it would only cost memory, and with one a packed row's attention
    # mask is not built from its position ids (entries would attend across their boundaries)
    model.config.use_cache = False
    lora = lora_kwargs(lora_r, method)  # as a user's run applies it (run_settings.json)
    if lora is not None:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(**lora))
    return model


def build_tokenizer(spec: ModelSpec, path: str | None) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=spec.trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def decoder_layer_classes(config: Any) -> list[str]:
    """Names of the transformer block classes FSDP wraps one by one (from the model class)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    model_cls = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    names = list(getattr(model_cls, "_no_split_modules", None) or [])
    if not names:
        raise ValueError(f"{model_cls!r} declares no _no_split_modules; cannot auto-wrap for FSDP")
    return names
