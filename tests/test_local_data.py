"""The local model folder, tokenizer and JSONL dataset shipped with the project
(``studies/local-model``, ``studies/data/instructions.jsonl``, ``studies/local-jsonl.yaml``): the
committed files are what ``scripts/build_local_data.py`` builds, they load offline, the data
looks like instruction data, and a trial on them counts its dataset tokens right in every padding
mode (packing, which drops the padding, gives more dataset tokens per second)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from explorer.job import TrialJob
from explorer.launch import run_trial
from explorer.measure import config_from_cli, with_measurement
from explorer.measurement import Outcome
from explorer.study_file import load_study

REPO = Path(__file__).resolve().parents[1]
STUDY = REPO / "studies" / "local-jsonl.yaml"
MODEL = REPO / "studies" / "local-model"
DATA = REPO / "studies" / "data" / "instructions.jsonl"
SCRIPT = REPO / "scripts" / "build_local_data.py"


def _texts() -> list[str]:
    return [
        json.loads(line)["text"] for line in DATA.read_text(encoding="utf-8").splitlines() if line.strip()
    ]


def _token_counts() -> list[int]:
    """Tokens of every entry, through the shipped tokenizer.json (``<s>`` and ``</s>`` included)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    return [len(e.ids) for e in tokenizer.encode_batch(_texts())]


def test_committed_files_are_what_the_script_builds(tmp_path):
    subprocess.run([sys.executable, str(SCRIPT), "--out-dir", str(tmp_path)], check=True, timeout=120)
    for name in ("data/instructions.jsonl", "local-model/config.json", "local-model/tokenizer_config.json"):
        assert (tmp_path / name).read_bytes() == (REPO / "studies" / name).read_bytes(), name
    built = json.loads((tmp_path / "local-model" / "tokenizer.json").read_text())
    shipped = json.loads((MODEL / "tokenizer.json").read_text())
    for part in ("model", "pre_tokenizer", "post_processor", "added_tokens"):
        assert built[part] == shipped[part], part
    assert sum(f.stat().st_size for f in MODEL.iterdir()) < 200_000
    assert DATA.stat().st_size < 200_000


def test_tokenizer_and_config_load_offline(tmp_path):
    """``AutoTokenizer`` and ``AutoConfig`` read the folder with the hub unreachable and an empty
    cache; the tokenizer agrees with tokenizer.json and with the model's vocabulary."""
    code = """
import json, sys
from transformers import AutoConfig, AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
cfg = AutoConfig.from_pretrained(sys.argv[1])
ids = tok("### Instruction:\\nBrew good coffee.", add_special_tokens=True)["input_ids"]
print(json.dumps({"len": len(tok), "vocab_size": cfg.vocab_size, "model_type": cfg.model_type,
  "special": [tok.pad_token_id, tok.bos_token_id, tok.eos_token_id],
  "config_special": [cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id], "ids": ids}))
"""
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    proc = subprocess.run(
        [sys.executable, "-c", code, str(MODEL)], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["model_type"] == "llama" and out["len"] == out["vocab_size"] == 2048
    assert out["special"] == out["config_special"] == [0, 1, 2]
    from tokenizers import Tokenizer

    expected = (
        Tokenizer.from_file(str(MODEL / "tokenizer.json")).encode("### Instruction:\nBrew good coffee.").ids
    )
    assert out["ids"] == expected and expected[0] == 1 and expected[-1] == 2


def test_dataset_looks_like_instruction_data():
    texts = _texts()
    assert len(texts) == 320
    assert all(t.startswith("### Instruction:\n") and "\n\n### Response:\n" in t for t in texts)
    counts = sorted(_token_counts())
    deciles = statistics.quantiles(counts, n=10)
    assert counts[0] >= 30 and 70 <= statistics.median(counts) <= 130
    assert deciles[-1] / deciles[0] > 3  # a wide spread, most entries short
    assert 0 < sum(c > 512 for c in counts) < 10  # a few truncated at model_max_length 512


def test_local_jsonl_study_validates(monkeypatch, capsys):
    from explorer.cli import main

    monkeypatch.chdir(REPO)
    assert main(["validate", "studies/local-jsonl.yaml"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("studies/local-jsonl.yaml: ok: study 'local-jsonl'")
    assert "padding: max_length, packed (searched)" in out


def _measured(padding: str, tmp_path: Path, *, batch: int, length: int, warmup: int, steps: int):
    """One trial of the study's workload (the real worker, one CPU process) and the entries whose
    tokens its measured window counts."""
    loaded = with_measurement(
        load_study(STUDY, check_launcher=False), warmup_steps=warmup, measured_steps=steps, stop="steps"
    )
    sets = [f"padding={padding}", f"batch_size={batch}", "number_gpus=1", f"model_max_length={length}"]
    job = TrialJob.for_study(loaded, config_from_cli(loaded, sets=sets, config_file=None), trial_number=0)
    job = replace(job, resources=job.resources.model_copy(update={"device_memory_gib": None}))
    m = run_trial(job, work_dir=tmp_path / padding, timeout_s=240)
    assert m.outcome is Outcome.OK, m.error or m.log_tail[-2000:]
    assert m.properties is not None
    return m.properties, range(warmup * batch, (warmup + steps) * batch)


def test_packed_trial_counts_the_dataset_tokens(tmp_path):
    """Entries are read in order; the measured window's dataset tokens are those of its entries,
    each cut at model_max_length, and a packed batch trains on exactly them."""
    p, window = _measured("packed", tmp_path, batch=4, length=128, warmup=1, steps=2)
    counts = _token_counts()
    assert p.measured_samples == len(window)
    assert p.measured_dataset_tokens == p.measured_train_tokens == sum(min(counts[i], 128) for i in window)


@pytest.mark.slow
def test_packed_trains_the_same_dataset_tokens_in_a_third_of_the_trained_tokens(tmp_path):
    """At model_max_length 512 about three quarters of a max_length batch is padding: packing the
    same entries gives the same dataset tokens in under 35% of the trained tokens. What that is
    worth a second is machine speed, measured in benchmarks/results/padding_jsonl.json (2.3x,
    recomputed by tests/test_benchmark_results.py), not here."""
    (full, window), (packed, _) = (
        _measured(mode, tmp_path / mode, batch=8, length=512, warmup=2, steps=4)
        for mode in ("max_length", "packed")
    )
    expected = sum(min(c, 512) for c in (_token_counts()[i] for i in window))
    assert full.measured_dataset_tokens == packed.measured_dataset_tokens == expected
    assert full.measured_train_tokens == len(window) * 512 and packed.measured_train_tokens == expected
    assert expected < 0.35 * len(window) * 512
