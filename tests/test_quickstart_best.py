"""The quickstart's best configuration runs with the command ``explorer best`` prints.

Issue 22: the quickstart's best trial had peaked at 0.542 GiB under its 0.5 GiB cap, was called
best, and its ``launch.sh`` ran out of memory 3 times out of 3. Now a peak over the limit is an
OOM, the CPU cap counts the same address space under the trial and under ``torchrun``, and the
best trial's printed command trains.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from explorer.cli import main
from explorer.report import feasible_ranking, trial_memory
from explorer.study import open_existing_study
from explorer.study_file import load_study

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # the whole quickstart (14 real trials, 2-3 min on 2 busy cores), then its best
def test_the_quickstarts_best_trains_with_the_command_best_prints(tmp_path: Path, capsys) -> None:
    for rel in ("studies/quickstart.yaml", "search_spaces/quickstart.yaml"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    path = tmp_path / "studies" / "quickstart.yaml"
    assert main(["optimize", str(path)]) == 0
    loaded = load_study(path, check_model=False)
    cap = loaded.spec.resources.device_memory_gib
    ranking = feasible_ranking(open_existing_study(loaded))
    assert ranking
    for trial in ranking:  # every ranked trial fitted: its raw stored peak within its stored limit
        peak, limit = trial_memory(trial)
        assert peak is not None and limit == pytest.approx(cap) and peak <= limit
        assert trial.user_attrs["memory_headroom"] == pytest.approx(1 - peak / limit, abs=1e-9)

    capsys.readouterr()
    assert main(["best", str(path), "--steps", "3"]) == 0
    printed = capsys.readouterr().out
    torchrun = next(line.strip() for line in printed.splitlines() if line.strip().startswith("torchrun "))
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    done = subprocess.run(
        shlex.split(torchrun), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    warmup = loaded.spec.measurement.warmup_steps
    assert f"trained {warmup + 3} steps ({warmup} warmup, 3 measured)" in done.stdout
    result = json.loads((loaded.output_dir / "best" / "run" / "result.json").read_text())
    assert result["outcome"] == "ok" and result["properties"]["peak_memory_gib"] <= cap
