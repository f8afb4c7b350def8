"""The hub-loading path (model `path`, pretrained weights, tokenizer, JSONL data) on local files."""

from __future__ import annotations

import json

import pytest

from explorer.launch import run_trial
from explorer.measurement import Outcome

from .conftest import TINY_ARCH

WORDS = [f"w{i}" for i in range(200)]


@pytest.fixture
def local_model(tmp_path):
    """A tiny Llama and a word-level tokenizer saved with save_pretrained, as a hub snapshot is."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "[EOS]": 2} | {w: i + 3 for i, w in enumerate(WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="[EOS]")
    arch = dict(TINY_ARCH)
    config = AutoConfig.for_model(arch.pop("model_type"), **arch)
    model = AutoModelForCausalLM.from_config(config)
    path = tmp_path / "tiny-llama"
    model.save_pretrained(path)
    fast.save_pretrained(path)
    data = tmp_path / "data.jsonl"
    with data.open("w") as fh:
        for i in range(64):
            fh.write(
                json.dumps({"output": " ".join(WORDS[(i * 7 + k) % 200] for k in range(10 + i % 50))}) + "\n"
            )
    return path, data


@pytest.mark.parametrize("weights", ["pretrained", "random"])
def test_local_checkpoint_and_jsonl_dataset(weights, local_model, make_job, tmp_path):
    path, data = local_model
    job = make_job(
        {
            "workload": {
                "model": {"name": "tiny-local", "architecture": None, "path": str(path), "weights": weights},
                "dataset": {
                    "kind": "jsonl",
                    "path": str(data),
                    "text_field": "output",
                    "entries": None,
                    "min_tokens": None,
                    "max_tokens": None,
                    "seed": None,
                },
            }
        },
        batch_size=4,
        number_gpus=1,
        distributed_backend="NONE",
    )
    assert job.model_path == str(path) and job.dataset_path == str(data)
    m = run_trial(job, work_dir=tmp_path / "trial", timeout_s=240)
    assert m.outcome is Outcome.OK, m.error or m.log_tail[-2000:]
    p = m.properties
    assert p is not None and p.measured_samples == 12
    # entries hold 10..59 words (+ nothing else): the dataset tokens of samples 4..15, cut at 64
    lengths = [min(10 + i % 50, 64) for i in range(4, 16)]
    assert p.measured_dataset_tokens == sum(lengths)
