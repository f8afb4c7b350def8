"""`explorer measure` end to end: one configuration through Ray, every property printed."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.builders import run_cli


def _measure(*args: str, timeout: int) -> subprocess.CompletedProcess[str]:
    return run_cli("measure", *args, timeout=timeout)


@pytest.mark.slow  # five real repeats: in `make test-slow`
def test_measure_prints_every_property_and_stability(write_study, tmp_path):
    study = write_study(
        {"measurement": {"stop": "steady", "warmup_steps": 1, "min_steps": 3, "max_steps": 6}}
    )
    out = tmp_path / "runs.jsonl"
    proc = _measure(
        str(study),
        "--set",
        "batch_size=4",
        "--set",
        "number_gpus=1",
        "--repeats",
        "2",
        "--json",
        str(out),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "stability over 2: f_gpu_oom 0.00  f_other_error 0.00  f_no_error 1.00" in proc.stdout
    runs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(runs) == 2 and all(r["outcome"] == "ok" for r in runs)
    p = runs[0]["properties"]
    assert 3 <= p["measured_steps"] <= 6 and p["stop_reason"] in ("stable", "max_steps")
    assert p["system"]["cpu_compute_utilization"] > 0 and p["system"]["gpu_power_watts_avg"] == 0.0
    assert 0 < p["mfu"] < 1
    assert runs[0]["extra"]["fingerprint"]["torch"].startswith("2.")
    assert len(runs[0]["extra"]["step_times"]) == p["measured_steps"]


def test_measure_refuses_an_invalid_configuration(write_study):
    study = write_study()
    proc = _measure(str(study), "--set", "batch_size=3", "--set", "number_gpus=2", timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "not divisible by number_gpus" in proc.stderr


def test_measure_exits_1_when_no_repeat_measured(write_study):
    """A batch far beyond the 0.5 GiB memory cap runs out of memory on its first step: the one
    repeat measured nothing, so ``measure`` says so in one line and exits 1 (not 0)."""
    study = write_study()
    proc = _measure(str(study), "--set", "batch_size=512", "--set", "number_gpus=1", timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "repeat 1: oom" in proc.stdout
    ours = [line for line in proc.stderr.splitlines() if line.startswith("explorer:")]
    assert ours == ["explorer: no measurement: 1 repeat ended 1 oom"], proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow  # a real measure run: in `make test-slow`
def test_measure_warns_when_the_measurement_misses_its_precision_target(write_study):
    """No CPU holds its step times within 0.01% over four steps: the figure is flagged."""
    study = write_study({"measurement": {"measured_steps": 4, "target_rel_ci": 0.0001}})
    proc = _measure(str(study), "--set", "batch_size=4", "--set", "number_gpus=1", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (line,) = [x for x in proc.stdout.splitlines() if "warning: imprecise" in x]
    assert "misses the +-0.01% target" in line


def test_a_precise_enough_measurement_is_not_flagged():
    import dataclasses

    from tests.builders import properties

    p = properties(1000.0)
    assert p.imprecise(0.02) is None or p.step_time_rel_ci > 0.02
    wide = dataclasses.replace(p, step_time_rel_ci=0.15, stop_reason="max_steps")
    assert "+-15.0%" in (wide.imprecise(0.02) or "") and wide.imprecise(0.2) is None
    assert dataclasses.replace(p, step_time_rel_ci=None).imprecise(0.02) is None
    # the advice names what lengthens the window under the stop rule that ended it
    assert (wide.imprecise(0.02) or "").endswith("measure again or raise max_steps")
    steps = dataclasses.replace(wide, stop_reason="steps").imprecise(0.02) or ""
    assert steps.endswith("measure again or raise measured_steps") and "max_steps" not in steps
    timed = dataclasses.replace(wide, stop_reason="stop_after_seconds").imprecise(0.02) or ""
    assert timed.endswith("raise stop_after_seconds") and "max_steps" not in timed
