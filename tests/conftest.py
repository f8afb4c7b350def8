"""Shared fixtures: a real tiny study on the CPU (2 logical GPUs, gloo), and real sqlite storage."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]

TINY_ARCH = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 4096,
    "max_position_embeddings": 256,
}

BASE_STUDY: dict[str, Any] = {
    "name": "test",
    "sampler": {"kind": "tpe", "seed": 0},
    "n_trials": 4,
    "workload": {
        "model": {"name": "tiny-llama", "architecture": TINY_ARCH},
        "dataset": {"kind": "synthetic", "entries": 512, "min_tokens": 16, "max_tokens": 96, "seed": 1},
        "model_max_length": 64,
    },
    "measurement": {"warmup_steps": 1, "measured_steps": 3, "trial_timeout_s": 240},
    "resources": {"gpus_per_node": 2, "gpu_model": "CPU-logical", "device": "cpu", "device_memory_gib": 0.5},
    "search_space": {
        "parameters": {
            "batch_size": {"values": [4, 8]},
            "number_gpus": {"values": [1, 2]},
            "distributed_backend": {"choices": ["DDP", "FSDP"]},
            "fsdp_version": {"choices": [1, 2]},
            "fsdp_sharding_strategy": {"choices": ["FULL_SHARD", "SHARD_GRAD_OP"]},
            "gradient_checkpointing": {"choices": [False, True]},
        }
    },
}


def merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``patch`` into a copy of ``base`` (a value of ``None`` deletes the key)."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@pytest.fixture
def write_study(tmp_path: Path):
    """Write a study file (``BASE_STUDY`` patched) into tmp_path; returns its path."""

    def _write(patch: dict[str, Any] | None = None, name: str = "study.yaml") -> Path:
        """A search_space in ``patch`` replaces the base one instead of merging into it."""
        patch = patch or {}
        base = merge(BASE_STUDY, {"search_space": None}) if "search_space" in patch else BASE_STUDY
        data = merge(base, patch)
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return _write


@pytest.fixture
def ray_local():
    """A local Ray with 2 logical GPUs, shut down after the test."""
    import ray

    ray.init(
        num_gpus=2,
        resources={"CPU-logical": 2},
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture
def make_job(write_study):
    """Build a TrialJob for ``config`` fields on the tiny workload (optionally patching the study)."""
    from explorer.job import TrialJob
    from explorer.spec import load_study
    from explorer.trial_config import TrialConfig

    def _make(study_patch: dict[str, Any] | None = None, **config: Any) -> TrialJob:
        loaded = load_study(write_study(study_patch or {}))
        fields = {"gradient_checkpointing": False, "model_max_length": loaded.spec.workload.model_max_length}
        fields.update(config)
        if loaded.spec.workload.method.kind == "lora":
            fields.setdefault("lora_r", loaded.spec.workload.method.r)
        return TrialJob.for_study(loaded, TrialConfig(**fields), trial_number=0)

    return _make
