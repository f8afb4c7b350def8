"""``explorer verify``: a trial's written files launched the way a user would (``explorer.user_train``
under torchrun, real processes on gloo, the study's data and memory cap), its throughput and peak
beside the study's, the ratio and the noise; files edited away from the trial are flagged.

The default suite checks the parts on real written files and a real one-process training
(``explorer.user_train`` measures the benchmark's way); the ``slow`` tests run a real quickstart
study of 2 trials, then ``explorer verify`` on its best, then on ``explorer best``'s files edited to
another batch size.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from explorer.best import write_config
from explorer.cli import main
from explorer.study_file import load_study
from explorer.trial_config import TrialConfig
from explorer.verify import Launch, Study, file_differences, judge, launch_command

ROOT = Path(__file__).resolve().parents[1]
CONFIG = dict(
    batch_size=4, number_gpus=2, distributed_backend="DDP", gradient_checkpointing=False, model_max_length=64
)
LINE = re.compile(
    r"verify: trial (\d+): ([\d,]+) tok/s/GPU in your launch vs ([\d,]+) in the study "
    r"\(x([\d.]+), (within|outside) the noise \+-([\d.]+)%"
)


def _files(write_study, folder: Path, **change: Any) -> Path:
    loaded = load_study(write_study())
    config = TrialConfig(**(CONFIG | change))
    write_config(loaded, config, folder, steps=3, trial_number=3, device_type="cpu", title="trial 3")
    return folder


def _launch(tokens: float, *, ci: float | None = 0.01, peak: float = 0.2, error: str | None = None) -> Launch:
    measurement = {
        "dataset_tokens_per_second_per_gpu": tokens,
        "step_time_rel_ci": ci,
        "peak_memory_gib": peak,
    }
    facts: dict[str, Any] = {"rank": 0, "measurement": measurement}
    if error is not None:
        facts = {"rank": 0, "error": error}
    return Launch(returncode=0 if error is None else 1, output="", facts=[facts])


STUDY = Study(number=7, tokens_per_gpu=5480.0, rel_ci=0.02, peak_gib=0.30, cap_gib=0.5, measured_steps=12)


# ---- the judgement, on figures ----


def test_within_the_noise_passes_with_the_ratio_line():
    verdict = judge(STUDY, _launch(5616.0, ci=0.021), differences=[])
    assert verdict.ok and verdict.causes == []
    found = LINE.match(verdict.line)
    assert found is not None, verdict.line
    assert found.group(1) == "7" and found.group(2) == "5,616" and found.group(3) == "5,480"
    assert float(found.group(4)) == pytest.approx(5616 / 5480, abs=0.005)
    assert found.group(5) == "within" and float(found.group(6)) == pytest.approx(4.1, abs=0.05)
    assert "peak 0.20 GiB vs 0.30 GiB" in verdict.line


def test_outside_the_noise_fails_with_a_cause():
    slower = judge(STUDY, _launch(4000.0, ci=0.01), differences=[], load="load average 0.1 on 2 CPUs")
    assert not slower.ok and "outside the noise +-3.0%" in slower.line
    assert "slower outside the benchmark's worker" in slower.causes[0]
    busy = judge(STUDY, _launch(4000.0, ci=0.2), differences=[], load="load average 9.0 on 2 CPUs")
    assert not busy.ok and "a busy machine" in busy.causes[0] and "+-20.0%" in busy.causes[0]
    unknown = judge(
        Study(number=7, tokens_per_gpu=5480.0, rel_ci=None, peak_gib=0.3, cap_gib=0.5, measured_steps=1),
        _launch(4000.0),
        differences=[],
    )
    assert not unknown.ok and "noise is unknown: it measured 1 step" in unknown.causes[0]


def test_the_noise_has_a_floor():
    tight = Study(number=7, tokens_per_gpu=1000.0, rel_ci=0.001, peak_gib=0.3, cap_gib=0.5)
    assert judge(tight, _launch(1019.0, ci=0.001), differences=[]).ok  # 1.9% < MIN_TOLERANCE
    assert not judge(tight, _launch(1021.0, ci=0.001), differences=[]).ok


def test_files_that_differ_fail_even_within_the_noise():
    diff = "training_arguments.json: per_device_train_batch_size 8 (the trial's: 4)"
    verdict = judge(STUDY, _launch(5480.0), differences=[diff])
    assert not verdict.ok and "within the noise" in verdict.line
    assert verdict.causes == [f"the files differ from trial 7's: {diff}"]


def test_out_of_memory_is_named_with_the_cap():
    error = "MemoryError: the model alone exceeds the memory cap of 0.50 GiB (DefaultCPUAllocator: can't allocate memory)"
    verdict = judge(STUDY, _launch(0.0, error=error), differences=[])
    assert not verdict.ok
    assert verdict.line.startswith(
        "verify: trial 7: out of memory in your launch under the study's cap of 0.5 GiB"
    )
    over = judge(STUDY, _launch(5480.0, peak=0.6), differences=[])
    assert not over.ok and "exceeds the study's cap of 0.5 GiB" in over.causes[0]
    failed = judge(STUDY, Launch(returncode=None, output="", facts=[]), differences=[])
    assert not failed.ok and failed.line.endswith("your launch failed: did not finish before the timeout")


# ---- the files and the command, on real written files ----


def test_an_edited_batch_size_is_named(write_study, tmp_path):
    reference = _files(write_study, tmp_path / "ref")
    assert file_differences(reference, _files(write_study, tmp_path / "same")) == []
    edited = _files(write_study, tmp_path / "edited")
    args = json.loads((edited / "training_arguments.json").read_text())
    args["per_device_train_batch_size"] = 4
    (edited / "training_arguments.json").write_text(json.dumps(args))
    job = json.loads((edited / "job.json").read_text())
    job["config"]["batch_size"] = 8
    (edited / "job.json").write_text(json.dumps(job))
    assert file_differences(reference, edited) == [
        "training_arguments.json: per_device_train_batch_size 4 (the trial's: 2)",
        "job.json: config.batch_size 8 (the trial's: 4)",
    ]
    other = _files(write_study, tmp_path / "other", model_max_length=32)
    assert "run_settings.json: model_max_length 32 (the trial's: 64)" in file_differences(reference, other)


def test_the_command_trains_the_folder_given(write_study, tmp_path):
    """A copied folder launches itself, not the folder the commands were written in; FSDP1's
    environment stays on the torchrun line."""
    written = _files(
        write_study,
        tmp_path / "best",
        distributed_backend="FSDP",
        fsdp_version=1,
        fsdp_sharding_strategy="SHARD_GRAD_OP",
    )
    copy = tmp_path / "copy"
    shutil.copytree(written, copy)
    command = launch_command(copy, "torchrun", extra=["--steps", "5"])
    assert command.startswith(
        "FSDP_SHARDING_STRATEGY=SHARD_GRAD_OP torchrun --standalone --nproc_per_node 2 "
    )
    assert f"--settings {copy} --trainer plain --steps 5" in command and str(written) not in command
    accelerate = launch_command(copy, "accelerate", extra=[])
    assert f"--config_file {copy / 'accelerate.yaml'}" in accelerate and str(written) not in accelerate


def test_user_train_measures_the_benchmarks_way(write_study, tmp_path, monkeypatch):
    """One real process of the stock script: the job's warmup excluded, the dataset tokens of the
    entries fed (all of one length: so many per step), padding apart, every step's tokens."""
    from accelerate.state import AcceleratorState, PartialState

    from explorer.user_train import main as user_main

    files = _files(write_study, tmp_path / "best", number_gpus=1, distributed_backend="NONE")
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"input_ids": [5 + i % 50] * 40}) + "\n" for i in range(64)))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    try:
        assert (
            user_main(
                [
                    "--settings",
                    str(files),
                    "--steps",
                    "5",
                    "--data",
                    str(data),
                    "--out",
                    str(tmp_path / "run"),
                ]
            )
            == 0
        )
    finally:
        AcceleratorState._reset_state(True)
        PartialState._reset_state()
    m = json.loads((tmp_path / "run" / "facts-rank0.json").read_text())["measurement"]
    assert (
        m["warmup_steps"] == 1 and m["measured_steps"] == 4 and len(m["step_times"]) == 4
    )  # the job's warmup: 1
    assert m["dataset_tokens_by_step"] == [4 * 40] * 5  # batch 4, 40 tokens each
    assert m["measured_dataset_tokens"] == 4 * 4 * 40 and m["measured_train_tokens"] == 4 * 4 * 64
    assert m["dataset_tokens_per_second_per_gpu"] == pytest.approx(
        4 * 4 * 40 / sum(m["step_times"]), rel=1e-3
    )
    assert m["processes"] == 1 and m["peak_memory_gib"] > 0 and m["memory_cap_gib"] is None


def test_bad_input_is_one_line_exit_2(write_study, capsys):
    path = write_study()
    assert main(["verify", str(path), "--steps", "0"]) == 2
    assert capsys.readouterr().err.strip() == "explorer: error: --steps: 0 must be above 0"
    assert main(["verify", str(path)]) == 2  # no study stored yet
    err = capsys.readouterr().err.strip()
    assert err.startswith("explorer: error:") and "\n" not in err


# ---- a real study, verified (slow) ----


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory) -> Path:
    """A copy of the quickstart, 2 real trials (about 2 minutes on 2 busy cores)."""
    root = tmp_path_factory.mktemp("quickstart")
    for rel in ("studies/quickstart.yaml", "search_spaces/quickstart.yaml"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, root / rel)
    path = root / "studies" / "quickstart.yaml"
    assert main(["optimize", str(path), "--n-trials", "2"]) == 0
    return path


@pytest.mark.slow
def test_verify_on_the_quickstarts_best_prints_the_ratio(quickstart, capsys):
    from explorer.best import select_best
    from explorer.study import open_existing_study

    loaded = load_study(quickstart, check_model=False)
    best = select_best(open_existing_study(loaded))
    assert best is not None
    trial = best.best.user_attrs
    steps = max(6, int(trial["measured_steps"]))  # the launch covers the trial's window
    capsys.readouterr()
    status = main(["verify", str(quickstart), "--steps", str(steps)])
    out = capsys.readouterr().out
    assert "the study's cap of 0.5 GiB per process (RLIMIT_AS on the CPU)" in out
    found = next(m for m in map(LINE.match, out.splitlines()) if m)
    run = loaded.output_dir / "verify" / f"trial-{best.best.number}" / "run"
    m = json.loads((run / "facts-rank0.json").read_text())["measurement"]
    assert int(found.group(1)) == best.best.number
    assert float(found.group(4)) == pytest.approx(
        m["dataset_tokens_per_second_per_gpu"] / trial["dataset_tokens_per_second_per_gpu"], abs=0.006
    )
    assert status == (0 if found.group(5) == "within" else 1)
    assert m["measured_steps"] + m["warmup_steps"] == loaded.spec.measurement.warmup_steps + steps
    # the study's data: the launch trained the trial's batches (its window's dataset tokens, exactly)
    start, measured = int(trial["warmup_steps"]), int(trial["measured_steps"])
    assert sum(m["dataset_tokens_by_step"][start : start + measured]) == trial["measured_dataset_tokens"]


@pytest.mark.slow
def test_best_files_edited_to_another_batch_size_are_flagged(quickstart, capsys):
    assert main(["best", str(quickstart), "--steps", "2"]) == 0
    loaded = load_study(quickstart, check_model=False)
    best = loaded.output_dir / "best"
    args = json.loads((best / "training_arguments.json").read_text())
    trial_batch = args["per_device_train_batch_size"]
    args["per_device_train_batch_size"] = trial_batch // 2
    (best / "training_arguments.json").write_text(json.dumps(args, indent=2))
    capsys.readouterr()
    assert main(["verify", str(quickstart), "--files", str(best), "--steps", "2"]) == 1
    out = capsys.readouterr().out
    assert (
        f"likely cause: the files differ from trial {json.loads((best / 'job.json').read_text())['trial_number']}'s: "
        f"training_arguments.json: per_device_train_batch_size {trial_batch // 2} (the trial's: {trial_batch})"
    ) in out
    assert f"--settings {best} " in out  # the edited folder itself was launched
