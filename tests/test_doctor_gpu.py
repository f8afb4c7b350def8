"""``explorer doctor`` on a CUDA node (``pytest -m gpu``; the GPU evidence kit runs it): the
probe reads the GPU by NVML and NCCL's version, and each value of a small CUDA space either runs
or names its missing package. Never run in this project's CI."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import yaml

from explorer.doctor import NOT_APPLICABLE, RAN, run_doctor
from tests.test_gpu_knobs import CUDA_STUDY

pytestmark = pytest.mark.gpu

SPACE = {
    "parameters": {
        "batch_size": {"values": [4, 8]},
        "number_gpus": 1,
        "gradient_checkpointing": {"choices": [False, True]},
        "padding": {"choices": ["max_length", "packed"]},
        "attn_implementation": {"choices": ["sdpa", "flash_attention_2", "flex_attention"]},
        "liger_kernel": {"choices": [False, True]},
        "optim": {"choices": ["adamw_torch", "adamw_bnb_8bit"]},
    }
}
PACKAGES = {
    ("attn_implementation", "flash_attention_2"): "flash_attn",
    ("liger_kernel", True): "liger_kernel",
}
PACKAGES[("optim", "adamw_bnb_8bit")] = "bitsandbytes"


def test_the_doctor_on_a_cuda_node(tmp_path):
    from explorer.study_file import load_study

    assert torch.cuda.is_available(), "pytest -m gpu needs a CUDA device"
    study = {
        **CUDA_STUDY,
        "name": "doctor-gpu",
        "search_space": SPACE,
        "storage": f"sqlite:///{tmp_path}/s.db",
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    report = run_doctor(load_study(path, check_launcher=False))
    assert report.device == "cuda" and report.node["gpus"] and report.node["nccl"]
    assert report.node["gpus"][0]["memory_gib"] > 10
    for row in report.rows:
        module = PACKAGES.get((row.knob, row.value))
        if module is not None and importlib.util.find_spec(module) is None:
            assert row.status == NOT_APPLICABLE and module in row.detail, row
        elif row.knob == "batch_size" and row.value == 8:
            assert row.status == NOT_APPLICABLE
        else:
            assert row.status == RAN, row
