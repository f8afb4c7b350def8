"""Real faults in real trials (Ray actors, torchrun/zygote ranks on the CPU): the injected crash,
hang, actor kill, OOM, segfault and node restart each end as defined, and the audit holds."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from explorer.launch import SLOT_ATTR
from explorer.study import audit, open_study, optimize, status_of
from explorer.study_file import load_study
from tests.builders import run_cli

REPO = Path(__file__).resolve().parents[1]


def _audit(path: Path, storage: str | None = None):
    loaded = load_study(path, storage=storage)
    spec = loaded.spec
    return audit(
        open_study(loaded, create=False),
        n_trials=spec.n_trials,
        max_retries=spec.launcher.max_retries,
        output_dir=loaded.output_dir,
    )


@pytest.mark.slow  # a real multi-trial study: in `make test-slow` (CI runs it after `make test`)
def test_the_quickstart_with_a_crash_a_hang_and_an_actor_kill(tmp_path):
    """``studies/quickstart-faults.yaml`` through the real CLI (a copy, with its output here)."""
    data = yaml.safe_load((REPO / "studies" / "quickstart-faults.yaml").read_text())
    data["search_space"] = str(REPO / "search_spaces" / "quickstart.yaml")
    study_file = tmp_path / "quickstart-faults.yaml"
    study_file.write_text(yaml.safe_dump(data, sort_keys=False))
    storage = f"sqlite:///{tmp_path}/qf.db"
    proc = run_cli("optimize", str(study_file), "--storage", storage, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    trials = {t.number: t for t in open_study(load_study(study_file, storage=storage), create=False).trials}
    plan = data["faults"]["schedule"]
    words = {"crash": "exit status 17", "hang": "timed out after 30 s", "actor_kill": "actor died"}
    for number, kind in plan.items():
        t = trials[number]
        assert t.user_attrs["injected_fault"] == kind
        assert status_of(t) == "retry" and words[kind] in t.user_attrs["error"], (number, t.user_attrs)
        retry = next(r for r in trials.values() if r.user_attrs.get("requeued_from") == number)
        assert retry.params == t.params and status_of(retry) in ("ok", "oom"), retry.user_attrs
    assert trials[3].user_attrs["wall_seconds"] >= 30  # the hang held on until the timeout
    found = _audit(study_file, storage)
    assert found.ok, found.describe()
    assert found.counted == 14 and found.bookkeeping["retry"] == 3
    launched = [t for t in trials.values() if SLOT_ATTR in t.user_attrs]
    assert found.measurements_on_disk == len(launched) >= 14 + 3 - 2  # at most 2 invalid, never launched
    audited = run_cli("audit", str(study_file), "--storage", storage, timeout=120)
    assert audited.returncode == 0 and "accounting: ok" in audited.stdout, audited.stdout + audited.stderr


@pytest.mark.slow_postgresql
def test_a_real_oom_segfault_and_node_restart(write_study, tmp_path, storage_url):
    """Trial 0 runs out of memory (a real allocator failure), trial 1's rank 0 segfaults, and
    trial 3's local Ray node is shut down and started again 1 s in, losing what ran on it."""
    path = write_study(
        {
            "storage": storage_url,
            "sampler": {"kind": "random", "seed": 0},
            "n_trials": 4,
            "measurement": {"warmup_steps": 1, "measured_steps": 3, "trial_timeout_s": 120},
            "launcher": {"kind": "ray", "max_retries": 1},
            "faults": {
                "schedule": {0: "oom", 1: "segfault", 3: "node_restart"},
                "kill_after_s": 1.0,
                "at_step": 0,
            },
        }
    )
    lines: list[str] = []
    optimize(load_study(path), printer=lines.append)
    trials = {t.number: t for t in open_study(load_study(path), create=False).trials}
    assert status_of(trials[0]) == "oom" and "can't allocate memory" in trials[0].user_attrs["error"]
    assert "1152921504606846976 bytes" in trials[0].user_attrs["error"]  # the injected allocation
    assert status_of(trials[1]) == "retry" and "killed by signal 11" in trials[1].user_attrs["error"]
    assert status_of(trials[3]) == "retry" and "node restarted" in trials[3].user_attrs["error"], lines
    found = _audit(path)
    assert found.ok, found.describe()
    assert found.counted == 4 and found.bookkeeping["retry"] == 2
    assert dict(found.faults["node_restart"]) == {"retry": 1}
