"""``workload.trainer: trl``: each padding value reaches TRL's ``SFTTrainer`` as the batches the
trainer then trains on (row shapes, attention masks, position ids), a real trial counts the
dataset tokens the seeds' way (entries consumed, each cut at ``model_max_length``, padding never
counted) and records the trainer, validation refuses what TRL cannot express in one line, and the
``sft_config.json`` that ``explorer best`` writes loads in ``trl.SFTConfig(**json)`` and trains."""

from __future__ import annotations

import json
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
STUDY = REPO / "studies" / "local-jsonl-trl.yaml"
MODEL = REPO / "studies" / "local-model"
DATA = REPO / "studies" / "data" / "instructions.jsonl"
LENGTH = 128


def _token_counts() -> list[int]:
    """Tokens of every entry as TRL prepares it: the text with the EOS token appended, through
    the shipped tokenizer.json (which adds ``<s>`` and ``</s>`` itself, so an entry ends in two
    ``</s>``: what a user's SFTTrainer trains on)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    texts = [
        json.loads(line)["text"] + "</s>"
        for line in DATA.read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    return [len(e.ids) for e in tokenizer.encode_batch(texts)]


def _job(padding: str, *, batch: int = 4, gpus: int = 1, warmup: int = 1, steps: int = 2) -> TrialJob:
    loaded = with_measurement(
        load_study(STUDY, check_launcher=False), warmup_steps=warmup, measured_steps=steps, stop="steps"
    )
    sets = [f"padding={padding}", f"batch_size={batch}", f"number_gpus={gpus}", f"model_max_length={LENGTH}"]
    job = TrialJob.for_study(loaded, config_from_cli(loaded, sets=sets, config_file=None), trial_number=0)
    return replace(job, resources=job.resources.model_copy(update={"device_memory_gib": None}))


def _first_batch(job: TrialJob, tmp_path: Path) -> dict:
    """The first batch TRL's SFTTrainer (as the worker builds it) feeds its training step."""
    from explorer.worker._model import build_model, build_tokenizer, load_config
    from explorer.worker._trl import sft_arguments, sft_trainer

    config = load_config(job.workload.model, job.model_path)
    model = build_model(job.workload.model, job.model_path, config, lora_r=None, method=job.workload.method)
    args = sft_arguments(job, device_type="cpu", output_dir=str(tmp_path), layer_classes=None)
    tokenizer = build_tokenizer(job.workload.model, job.model_path)
    trainer = sft_trainer(job, model=model, args=args, callbacks=[], tokenizer=tokenizer)
    return next(iter(trainer.get_train_dataloader()))


@pytest.mark.parametrize("padding", ["max_length", "longest", "packed"])
def test_each_padding_reaches_trl_as_the_batches_it_trains(padding, tmp_path):
    job = _job(padding)
    batch = _first_batch(job, tmp_path)
    lengths = [min(n, LENGTH) for n in _token_counts()[:4]]  # the sequential sampler: entries 0-3
    ids = batch["input_ids"]
    if padding == "packed":  # one row, the entries back to back, positions restarting at each
        assert "attention_mask" not in batch
        assert tuple(ids.shape) == (1, sum(lengths))
        expected = [p for n in lengths for p in range(n)]
        assert batch["position_ids"][0].tolist() == expected
        return
    width = LENGTH if padding == "max_length" else max(lengths)
    assert tuple(ids.shape) == (4, width)
    assert "position_ids" not in batch
    assert batch["attention_mask"].sum(dim=1).tolist() == lengths
    assert (ids[batch["attention_mask"] == 0] == 0).all()  # the padding: <pad>


def _measured(padding: str, tmp_path: Path, **kwargs):
    job = _job(padding, **kwargs)
    m = run_trial(job, work_dir=tmp_path / padding, timeout_s=240)
    assert m.outcome is Outcome.OK, m.error or m.log_tail[-2000:]
    assert m.properties is not None
    return m


@pytest.mark.parametrize("padding", ["max_length", pytest.param("packed", marks=pytest.mark.slow)])
def test_a_trl_trial_counts_the_entries_it_consumed(padding, tmp_path):
    """One real trial (the worker under torchrun, one CPU process): the measured window's dataset
    tokens are those of its entries, each cut at model_max_length, whatever the padding; its rate
    recomputes from the per-step counts; the trial records TRL and its version."""
    import trl

    m = _measured(padding, tmp_path, batch=4, warmup=1, steps=2)
    p = m.properties
    window = range(1 * 4, 3 * 4)
    counts = _token_counts()
    expected = sum(min(counts[i], LENGTH) for i in window)
    assert p.measured_samples == len(window)
    assert p.measured_dataset_tokens == expected
    assert p.measured_train_tokens == (expected if padding == "packed" else len(window) * LENGTH)
    steps = m.extra["step_dataset_tokens"]
    assert sum(steps) == expected and len(steps) == p.measured_steps == 2
    rate = sum(steps) / sum(m.extra["step_times"])
    assert p.dataset_tokens_per_second == pytest.approx(rate, rel=0.01)
    record = m.extra["trainer"]
    assert record["name"] == "trl" and record["version"] == trl.__version__
    assert record["class"] == "SFTTrainer"
    assert record["padding_free"] is (padding == "packed")
    assert record["max_length"] == (None if padding == "packed" else LENGTH)


@pytest.mark.slow  # a real trial under the plain Trainer (the default suite has the TRL one)
def test_the_transformers_trainer_records_itself(tmp_path):
    import transformers

    loaded = with_measurement(
        load_study(REPO / "studies" / "local-jsonl.yaml", check_launcher=False),
        warmup_steps=1,
        measured_steps=1,
        stop="steps",
    )
    sets = ["padding=packed", "batch_size=2", "number_gpus=1", f"model_max_length={LENGTH}"]
    job = TrialJob.for_study(loaded, config_from_cli(loaded, sets=sets, config_file=None), trial_number=0)
    job = replace(job, resources=job.resources.model_copy(update={"device_memory_gib": None}))
    m = run_trial(job, work_dir=tmp_path, timeout_s=240)
    assert m.outcome is Outcome.OK, m.error or m.log_tail[-2000:]
    assert m.extra["trainer"] == {
        "name": "transformers",
        "version": transformers.__version__,
        "class": "Trainer",
    }


def _validate(tmp_path: Path, study: str, space: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "space.yaml").write_text(space)
    (tmp_path / "study.yaml").write_text(study)
    return subprocess.run(
        [sys.executable, "-m", "explorer", "validate", str(tmp_path / "study.yaml")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )


def _trl_study(tmp_path: Path, **workload: str) -> str:
    text = STUDY.read_text(encoding="utf-8")
    text = text.replace("./local-model", str(MODEL)).replace("./data/instructions.jsonl", str(DATA))
    text = text.replace("../search_spaces/local-jsonl-trl.yaml", "space.yaml")
    for old, new in workload.items():
        text = text.replace(old, new)
    return text


SPACE = (REPO / "search_spaces" / "local-jsonl-trl.yaml").read_text(encoding="utf-8")


def test_validation_refuses_a_value_trl_cannot_express_in_one_line(tmp_path):
    space = SPACE.replace(
        "gradient_checkpointing: false",
        "gradient_checkpointing: true\n  checkpoint_fraction: {choices: [0.5, 1.0]}",
    )
    r = _validate(tmp_path, _trl_study(tmp_path), space)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert "parameters.checkpoint_fraction" in lines[0] and "TRL's SFTConfig" in lines[0]
    ok = _validate(tmp_path, _trl_study(tmp_path), space.replace("[0.5, 1.0]", "[1.0]"))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    plain = _validate(tmp_path, _trl_study(tmp_path, **{"  trainer: trl\n": ""}), space)
    assert plain.returncode == 0, plain.stdout + plain.stderr  # the transformers trainer can


def test_validation_refuses_trl_on_synthetic_tokens_in_one_line(tmp_path):
    study = _trl_study(
        tmp_path,
        **{
            f"dataset: {{kind: jsonl, path: {DATA}, text_field: text}}": "dataset: {kind: synthetic, entries: 8}"
        },
    )
    r = _validate(tmp_path, study, SPACE)
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "trainer trl" in r.stderr


@pytest.mark.parametrize("padding", [pytest.param("longest", marks=pytest.mark.slow), "packed"])
def test_the_sft_config_best_writes_loads_in_sft_config_and_trains(padding, tmp_path):
    """``explorer best``'s files for a configuration: ``SFTConfig(**sft_config.json)`` (with the
    benchmark-only arguments and a step budget), a stock ``SFTTrainer`` over the JSONL text
    (truncated to ``model_max_length`` as run_settings.json says), trains two steps."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from explorer.best import write_config
    from explorer.worker._model import build_model, build_tokenizer, load_config

    loaded = load_study(STUDY, check_launcher=False)
    sets = [f"padding={padding}", "batch_size=2", "number_gpus=1", f"model_max_length={LENGTH}"]
    config = config_from_cli(loaded, sets=sets, config_file=None)
    out = tmp_path / "best"
    write_config(loaded, config, out, steps=2, trial_number=0, device_type="cpu", title="test")
    chosen = json.loads((out / "sft_config.json").read_text())
    assert chosen["padding_free"] is (padding == "packed")
    bench = json.loads((out / "benchmark_arguments.json").read_text())
    args = SFTConfig(**{**bench, **chosen}, output_dir=str(tmp_path / "run"), max_steps=2)
    tokenizer = build_tokenizer(loaded.spec.workload.model, str(MODEL))
    texts = [json.loads(line)["text"] for line in DATA.read_text(encoding="utf-8").splitlines()[:8]]
    ids = [tokenizer(t)["input_ids"][:LENGTH] for t in texts]
    model_config = load_config(loaded.spec.workload.model, str(MODEL))
    model = build_model(
        loaded.spec.workload.model, str(MODEL), model_config, lora_r=None, method=loaded.spec.workload.method
    )
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_dict({"input_ids": ids}),
        processing_class=tokenizer,
    )
    result = trainer.train()
    assert trainer.state.global_step == 2 and result.training_loss > 0


def test_the_doctor_probe_and_table_name_trls_version():
    """The node probe (as the doctor runs it) holds TRL's version; the table's node line says it."""
    import trl

    from explorer.doctor import DoctorReport, probe, render_table

    node = probe([])
    assert node["trl"] == {"version": trl.__version__, "error": None}
    text = render_table(DoctorReport(study="s", gpu_model="CPU-logical", node=node, device="cpu"))
    assert f"TRL {trl.__version__}" in text
    missing = {**node, "trl": {"version": None, "error": "ModuleNotFoundError: No module named 'trl'"}}
    text = render_table(DoctorReport(study="s", gpu_model="CPU-logical", node=missing, device="cpu"))
    assert "TRL does not import: ModuleNotFoundError" in text


@pytest.mark.slow  # three smoke trials under TRL (about a minute on 2 busy cores)
def test_doctor_reports_trl_and_runs_its_padding_values(tmp_path):
    """``explorer doctor`` on a ``trl`` study: the node's TRL version (the probe, and a line of
    the table), and each padding value run by a smoke trial of TRL's SFTTrainer."""
    import trl
    import yaml

    from explorer.doctor import DoctorReport, render_table
    from tests.builders import run_cli

    data = yaml.safe_load(STUDY.read_text())
    data["workload"]["model"]["path"] = str(MODEL)
    data["workload"]["dataset"]["path"] = str(DATA)
    data["workload"]["model_max_length"] = LENGTH
    data.update(storage=f"sqlite:///{tmp_path / 's.db'}", output_dir=str(tmp_path / "runs"))
    data["search_space"] = {
        "parameters": {
            "batch_size": 2,
            "number_gpus": 1,
            "gradient_checkpointing": False,
            "padding": {"choices": ["max_length", "longest", "packed"]},
        }
    }
    study = tmp_path / "trl.yaml"
    study.write_text(yaml.safe_dump(data, sort_keys=False))
    proc = run_cli("doctor", str(study), "--json", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = json.loads(proc.stdout)
    assert table["node"]["trl"] == {"version": trl.__version__, "error": None}
    padding = {r["value"]: r["status"] for r in table["rows"] if r["knob"] == "padding"}
    assert padding == {"max_length": "ran", "longest": "ran", "packed": "ran"}, table["rows"]
    results = [json.loads(p.read_text()) for p in (tmp_path / "runs" / "doctor").rglob("result.json")]
    assert results and all(r["extra"]["trainer"]["name"] == "trl" for r in results)
    report = DoctorReport(study="s", gpu_model="CPU-logical", node=table["node"], device="cpu")
    assert f"TRL {trl.__version__}" in render_table(report)


@pytest.mark.slow  # a real 3-trial CPU study under TRL from a fresh clone (a few minutes on 2 busy cores)
def test_a_trl_study_runs_from_a_fresh_clone_and_its_rates_recompute(tmp_path):
    """``git clone`` of the committed tree, then ``explorer optimize`` on the shipped
    ``studies/local-jsonl-trl.yaml`` (3 trials, padding searched, its cap raised to 2 GiB): every measured trial records
    TRL as its trainer, and its dataset tokens per second recompute from its raw per-step counts
    (tokens and seconds of each measured step) within 1%; ``explorer best`` writes an
    ``sft_config.json`` that ``trl.SFTConfig(**json)`` loads."""
    import os

    import trl

    from explorer.study import open_existing_study

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=120)
    env = {**os.environ, "PYTHONPATH": str(clone), "HF_HUB_OFFLINE": "1"}
    study = "studies/local-jsonl-trl.yaml"
    # the study's 1 GiB cap is RLIMIT_AS on the CPU: under load a 0.34 GiB configuration's address
    # space crossed it (oneDNN "could not create a primitive", then an OOM), leaving no feasible
    # trial; this test is about the trainer and its rates, so the clone's copy gets 2 GiB
    shipped = (clone / study).read_text()
    assert "device_memory_gib: 1.0" in shipped
    (clone / study).write_text(shipped.replace("device_memory_gib: 1.0", "device_memory_gib: 2.0"))
    for args in (["optimize", study, "--n-trials", "3"], ["best", study, "--steps", "2"]):
        proc = subprocess.run(
            [sys.executable, "-m", "explorer", *args],
            cwd=clone,
            env=env,
            capture_output=True,
            text=True,
            timeout=1500,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = load_study(clone / study, check_model=False)
    trials = [
        t
        for t in open_existing_study(loaded).get_trials(deepcopy=False)
        if t.user_attrs.get("status") == "ok"
    ]
    assert trials
    for t in trials:
        a = t.user_attrs
        assert a["trainer"]["name"] == "trl" and a["trainer"]["version"] == trl.__version__
        rate = sum(a["step_dataset_tokens"]) / sum(a["step_times"])
        assert a["dataset_tokens_per_second"] == pytest.approx(rate, rel=0.01)
    chosen = json.loads((loaded.output_dir / "best" / "sft_config.json").read_text())
    assert trl.SFTConfig(**chosen, output_dir=str(tmp_path / "out")).max_length in (None, 512)


RESULTS = REPO / "benchmarks" / "results" / "trl_padding.json"


def test_the_trl_padding_benchmark_recomputes_from_its_runs():
    """``benchmarks/results/trl_padding.json`` (``benchmarks/trl_padding.py``): each run's rate
    recomputes from its per-step counts within 1%, the paddings of a trainer consumed the same
    dataset tokens, the medians and ratios recompute, packing under TRL is at least 2x padding to
    max_length, and docs/benchmarks.md quotes these figures."""
    import statistics

    result = json.loads(RESULTS.read_text())
    rates: dict[str, list[float]] = {}
    consumed: dict[str, set[int]] = {}
    for run in result["runs"]:
        assert sum(run["step_dataset_tokens"]) == run["measured_dataset_tokens"]
        assert sum(run["step_times"]) == pytest.approx(run["measured_seconds"], rel=1e-3)
        rate = sum(run["step_dataset_tokens"]) / sum(run["step_times"])
        assert run["dataset_tokens_per_second"] == pytest.approx(rate, rel=0.01)
        assert run["trainer_record"]["name"] == run["trainer"]
        rates.setdefault(f"{run['trainer']}/{run['padding']}", []).append(rate)
        consumed.setdefault(run["trainer"], set()).add(run["measured_dataset_tokens"])
    assert all(len(tokens) == 1 for tokens in consumed.values()), consumed
    medians = {key: statistics.median(values) for key, values in rates.items()}
    assert medians == pytest.approx(result["median_dataset_tokens_per_second"])
    ratios = {t: medians[f"{t}/packed"] / medians[f"{t}/max_length"] for t in ("transformers", "trl")}
    assert ratios == pytest.approx(result["packed_over_max_length"])
    assert ratios["trl"] >= 2.0
    doc = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    for key, value in medians.items():
        assert f"{value:,.0f}" in doc, key
    for ratio in ratios.values():
        assert f"{ratio:.1f}x" in doc


def test_chat_messages_go_through_the_tokenizers_chat_template(tmp_path):
    """A JSONL file of chat ``messages`` (no text field): TRL applies the tokenizer's chat
    template; the batch holds exactly the templated conversations' tokens."""
    from explorer.worker._model import build_model, build_tokenizer, load_config
    from explorer.worker._trl import jsonl_rows, sft_arguments, sft_trainer

    chats = [
        [
            {"role": "user", "content": f"question {i} " * (i + 1)},
            {"role": "assistant", "content": f"answer {i}"},
        ]
        for i in range(4)
    ]
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": c}) + "\n" for c in chats))
    assert jsonl_rows(data, text_field="text") == [{"messages": c} for c in chats]
    job = replace(_job("longest"), dataset_path=str(data))
    tokenizer = build_tokenizer(job.workload.model, job.model_path)
    tokenizer.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    config = load_config(job.workload.model, job.model_path)
    model = build_model(job.workload.model, job.model_path, config, lora_r=None, method=job.workload.method)
    args = sft_arguments(job, device_type="cpu", output_dir=str(tmp_path / "out"), layer_classes=None)
    trainer = sft_trainer(job, model=model, args=args, callbacks=[], tokenizer=tokenizer)
    batch = next(iter(trainer.get_train_dataloader()))
    expected = [tokenizer.apply_chat_template(c, tokenize=True, return_dict=True)["input_ids"] for c in chats]
    rows = [
        ids[: int(n)].tolist()
        for ids, n in zip(batch["input_ids"], batch["attention_mask"].sum(dim=1), strict=True)
    ]
    assert rows == [e[:LENGTH] for e in expected]
