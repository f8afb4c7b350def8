"""One contract for every registered launcher kind (:data:`explorer.launch.LAUNCHERS`).

Each kind runs the same three trials through the same driver loop on a pool of 2 GPUs: Ray with a
real local Ray and logical GPUs training the tiny model on the CPU (real processes), and replay
from a recorded table on its virtual clock. Trial 1 crashes (the study's ``faults.schedule``,
exit status 17). The contract: each submitted trial comes back exactly once; the pool is never
oversubscribed (``fits`` refuses a full pool, and no two slots overlap beyond it); the crash is a
failure, not an OOM; and shutdown leaves no process of this one behind.
"""

from __future__ import annotations

import collections
import contextlib
import csv
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from explorer.errors import SpecError
from explorer.fault import pick_fault
from explorer.job import TrialJob
from explorer.launch import LAUNCHERS, GpuSlot, Launcher, launcher_for, launcher_kind
from explorer.measurement import Measurement, Outcome
from explorer.spec import LAUNCHER_CONFIGS
from explorer.study_file import load_study
from explorer.trial_config import TrialConfig

POOL = 2
CRASH = 1
BATCHES = (4, 8, 4)
"""Trial n's batch size: three one-GPU trials, the third asked once the pool is full."""


def _table(path: Path) -> Path:
    """A recorded table with every configuration the trials ask for."""
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(
            ["model_name", "number_gpus", "batch_size", "distributed_backend"]
            + ["dataset_tokens_per_second_per_gpu", "is_valid"]
        )
        writer.writerows(["tiny-llama", 1, bs, "NONE", 1000.0 + bs, 1] for bs in (4, 8))
    return path


def _launcher_section(kind: str, tmp_path: Path) -> dict[str, Any]:
    if kind == "ray":
        return {"kind": "ray", "max_retries": 0}
    if kind == "replay":
        durations = {"ok_s": 100.0, "oom_s": 20.0, "failed_s": 30.0, "jitter": 0.3}
        return {"kind": "replay", "table": str(_table(tmp_path / "table.csv")), "durations": durations}
    raise AssertionError(f"no contract study for launcher kind {kind!r}: add one here")


@pytest.fixture(  # the real local Ray's run (about a minute) goes with the slow suite
    params=[pytest.param(k, marks=pytest.mark.slow) if k == "ray" else k for k in sorted(LAUNCHERS)]
)
def contract_study(request, write_study, tmp_path):
    """The same study for each launcher kind: the tiny model on a pool of 2 (logical) GPUs."""
    return load_study(
        write_study(
            {
                "sampler": {"kind": "random", "seed": 0},
                "resources": {"gpus_per_node": POOL},
                "launcher": _launcher_section(request.param, tmp_path),
                "faults": {"schedule": {CRASH: "crash"}, "at_step": 0},
                "search_space": {
                    "parameters": {
                        "batch_size": {"values": [4, 8]},
                        "number_gpus": 1,
                        "gradient_checkpointing": False,
                    }
                },
            }
        )
    )


def _jobs(loaded) -> list[TrialJob]:
    jobs = []
    for n, batch in enumerate(BATCHES):
        config = TrialConfig(
            batch_size=batch,
            number_gpus=1,
            distributed_backend="NONE",
            gradient_checkpointing=False,
            model_max_length=loaded.spec.workload.model_max_length,
        )
        fault = pick_fault(loaded.spec.faults, trial_number=n, attempt=0, launch=n)
        jobs.append(TrialJob.for_study(loaded, config, trial_number=n, fault=fault))
    return jobs


def _drive(
    launcher: Launcher, jobs: list[TrialJob], timeout_s: float = 300.0
) -> list[tuple[int, Measurement]]:
    """The study loop's part: submit what ``fits`` admits, wait, until every trial is back."""
    pending, held, back = list(jobs), {}, []
    deadline = time.monotonic() + timeout_s
    while pending or held:
        while pending and launcher.fits(pending[0].config.number_gpus):
            job = pending.pop(0)
            launcher.submit(job)
            held[job.trial_number] = job.config.number_gpus
            assert sum(held.values()) <= POOL, f"admitted {held} on a pool of {POOL}"
        if sum(held.values()) == POOL:
            assert not launcher.fits(1), "a full pool admitted one more GPU"
        for number, measurement in launcher.wait(timeout_s=1.0):
            back.append((number, measurement))
            held.pop(number, None)
        assert time.monotonic() < deadline, f"still out after {timeout_s} s: {sorted(held)}"
    assert launcher.wait(timeout_s=0.5) == [], "a trial came back after every trial had"
    return back


def _most_gpus_at_once(slots: list[GpuSlot]) -> int:
    """The largest sum of GPUs over slots that overlap in time (an end frees before a start)."""
    events = sorted([(s.start, 1, s.gpus) for s in slots] + [(s.end, 0, -s.gpus) for s in slots])
    most = held = 0
    for _, _, change in events:
        held += change
        most = max(most, held)
    return most


def _live_children() -> list[psutil.Process]:
    alive = []
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
    return alive


def test_every_launcher_keeps_the_contract(contract_study, tmp_path):
    before = {p.pid for p in _live_children()}
    launcher = launcher_for(contract_study, output_dir=tmp_path / "runs")
    launcher.start()
    try:
        back = _drive(launcher, _jobs(contract_study))
    finally:
        started = [p for p in _live_children() if p.pid not in before]
        launcher.shutdown()
    counts = collections.Counter(number for number, _ in back)
    assert counts == {n: 1 for n in range(len(BATCHES))}, counts
    answers = dict(back)
    crash = answers[CRASH]
    assert crash.outcome is Outcome.FAILED and "exit status 17" in (crash.error or ""), crash
    for n in set(answers) - {CRASH}:
        assert answers[n].outcome is Outcome.OK, (n, answers[n].error, answers[n].log_tail[-2000:])
    slots = [GpuSlot.from_attr(m.extra["slot"]) for m in answers.values()]
    assert all(s.pool == POOL and s.gpus == 1 for s in slots), slots
    assert _most_gpus_at_once(slots) == POOL, slots  # the pool filled, and never more
    runs = launcher_kind(contract_study.spec).runs_nothing(contract_study.spec) is None
    assert bool(started) == runs, started  # a launcher that runs trials started processes here
    _, alive = psutil.wait_procs(started, timeout=30)
    left = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, [(p.pid, p.name()) for p in left]
    assert not [p for p in _live_children() if p.pid not in before]


def test_every_kind_has_its_config_and_answers_for_itself(contract_study):
    """The registry and the study file declare the same kinds; each kind's section is its own."""
    assert set(LAUNCHERS) == set(LAUNCHER_CONFIGS)
    kind = launcher_kind(contract_study.spec)
    assert LAUNCHERS[kind.name] is kind and isinstance(contract_study.spec.launcher, kind.config)
    assert kind.summary and kind.describe(contract_study).startswith(kind.name)
    assert not kind.local(contract_study.spec) or kind.runs_nothing(contract_study.spec) is None


def test_an_unknown_kind_is_one_line_naming_every_kind(write_study):
    with pytest.raises(SpecError) as err:
        load_study(write_study({"launcher": {"kind": "slurm"}}))
    names = " or ".join(f"'{name}'" for name in sorted(LAUNCHERS))
    assert err.value.field == "launcher.kind" and names in err.value.problem, err.value


@pytest.mark.parametrize(
    ("launcher", "field", "problem"),
    [
        (
            {"kind": "replay", "table": "t.csv", "address": "10.0.0.1:6379"},
            "launcher",
            "address is only for kind: ray",
        ),
        ({"kind": "ray", "table": "t.csv"}, "launcher", "table is only for kind: replay"),
        ({"kind": "replay"}, "launcher", "kind: replay needs a table"),
        ({"kind": "replay", "table": "t.csv", "runer": "x"}, "launcher.runer", "unknown key"),
        ({"warm_strat": True}, "launcher.warm_strat", "did you mean warm_start"),
    ],
)
def test_a_field_belongs_to_its_kind(write_study, tmp_path, launcher, field, problem):
    (tmp_path / "t.csv").write_text("number_gpus,dataset_tokens_per_second_per_gpu\n1,1.0\n")
    with pytest.raises(SpecError) as err:
        load_study(write_study({"launcher": launcher}))
    assert err.value.field == field and problem in err.value.problem, err.value
