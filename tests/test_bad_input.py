"""The bad-input corpus (``tests/bad_inputs/``): every malformed study fails the real CLI cleanly.

Each case is a near-copy of ``studies/quickstart.yaml`` with one thing wrong. ``explorer optimize``
must exit with status 2, print exactly one line on stderr naming the file, the field and the
problem (as listed in ``tests/bad_inputs/expected.yaml``), print no traceback, and leave the
storage byte-for-byte untouched.

The corpus runs the CLI in this process (``explorer.cli.main``): a fresh interpreter per case
cost about a second each (two minutes for the corpus). An exception that escaped ``main`` fails
the test as a traceback would; ``test_real_process`` checks the real process boundary (the exit
status and stderr of ``python -m explorer``) on a few cases.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.builders import run_cli

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "bad_inputs"
EXPECTED: dict[str, dict[str, Any]] = yaml.safe_load((CORPUS / "expected.yaml").read_text())
CASES = sorted(p.name for p in CORPUS.glob("*.yaml") if p.name != "expected.yaml")
STORAGE_CASES = sorted(c for c in EXPECTED if EXPECTED[c].get("own_storage"))
REAL_PROCESS_CASES = [
    ("optimize", "arch_negative_hidden_size.yaml"),
    ("validate", "dup_key_architecture.yaml"),
]
"""The real ``python -m explorer`` runs these (the rest of the corpus runs in this process)."""
SUBPROCESS_TIMEOUT_S = 60
HANG_GUARD_S = 100
PROBED = ("postgres", "launcher_address")
"""Cases that reach for a server that does not answer. Each reach has its own timeout (10 s for
PostgreSQL, 3 s for Ray); without one, a TCP connect to a silent address waits about 130 s on
Linux. Two reaches (validate, then optimize) within HANG_GUARD_S show the timeouts work; the
bound guards against that hang, not against a slow machine."""


def _explorer(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the real CLI from the repository root (so the file names it prints are relative)."""
    return run_cli(*args, timeout=SUBPROCESS_TIMEOUT_S)


def _in_process(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    """``explorer ARGS`` in this process (``explorer.cli.main``), its output captured by ``capsys``."""
    from explorer.cli import main

    capsys.readouterr()
    code = main(list(args))
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), code, captured.out, captured.err)


@pytest.fixture
def in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run from the repository root (so the file names the CLI prints are relative)."""
    monkeypatch.chdir(REPO)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _assert_one_line_error(proc: subprocess.CompletedProcess[str], case: str) -> str:
    """Exit 2, one stderr line with the expected file, field and problem, no traceback."""
    want = EXPECTED[case]
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].strip(), proc.stderr
    line = lines[0]
    assert f"tests/bad_inputs/{want['file']}: " in line, line
    if want.get("field"):
        assert f": {want['field']}: " in line, line
    problems = want["problem"] if isinstance(want["problem"], list) else [want["problem"]]
    for word in problems:
        assert word in line, (word, line)
    for word in want.get("absent", []):
        assert word not in line, (word, line)
    return line


@pytest.fixture(scope="session")
def pristine_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An Optuna sqlite file holding an unrelated study ("other") and one created with another job
    ("stored-job"), made once per session."""
    import optuna

    from explorer.store import job_identity
    from explorer.study_file import load_study

    path = tmp_path_factory.mktemp("pristine") / "pristine.db"
    storage = optuna.storages.RDBStorage(f"sqlite:///{path}")
    optuna.create_study(study_name="other", storage=storage)
    # the study of identity_changed_sequence_length.yaml, as created with model_max_length 64
    stored = optuna.create_study(study_name="stored-job", storage=storage, direction="maximize")
    identity = job_identity(load_study(CORPUS / "identity_changed_sequence_length.yaml", check_model=False))
    stored.set_user_attr("identity", {**identity, "workload.model_max_length": 64})
    storage.engine.dispose()
    return path


@pytest.fixture
def storage_copy(tmp_path: Path, pristine_db: Path) -> tuple[Path, str]:
    """A fresh copy of the pristine storage in an otherwise empty folder, and its sha256."""
    db = tmp_path / "s.db"
    shutil.copyfile(pristine_db, db)
    return db, _sha256(db)


def test_corpus_matches_expected():
    assert len(CASES) >= 106
    assert sorted(EXPECTED) == CASES, "every case needs an entry in expected.yaml, and vice versa"
    assert len(STORAGE_CASES) >= 3
    for case, want in EXPECTED.items():
        assert (CORPUS / want["file"]).is_file(), (case, want["file"])
        assert want["problem"], case


@pytest.mark.parametrize("case", CASES)
def test_bad_input_fails_with_one_line(
    case: str, storage_copy: tuple[Path, str], in_repo: None, capsys: pytest.CaptureFixture[str]
):
    own_storage = bool(EXPECTED[case].get("own_storage"))
    if EXPECTED[case].get("no_gpu_only"):
        import torch

        if torch.cuda.is_available():
            pytest.skip("torch sees a CUDA GPU here: device: cuda is valid on this machine")
    db, digest = storage_copy
    args = ["optimize", f"tests/bad_inputs/{case}"]
    if not own_storage:
        args += ["--storage", f"sqlite:///{db}"]
    corpus_before = _tree(CORPUS)

    # `validate` first: it must refuse the case with the same line, and a case that had become a
    # valid study fails here instead of running its trials in this process under `optimize`.
    started = time.monotonic()
    if not EXPECTED[case].get("optimize_only"):
        _assert_one_line_error(_in_process(capsys, "validate", *args[1:]), case)
    proc = _in_process(capsys, *args)
    elapsed = time.monotonic() - started

    _assert_one_line_error(proc, case)
    # Nothing written: not the given storage (no WAL files either), not a default storage or
    # explorer-runs/ next to the study, not the missing folder of a bad sqlite URL.
    assert _sha256(db) == digest
    assert os.listdir(db.parent) == [db.name]
    assert _tree(CORPUS) == corpus_before
    if any(word in case for word in PROBED):
        assert elapsed < HANG_GUARD_S, f"an unreachable server took {elapsed:.1f} s to report twice"


@pytest.mark.parametrize(("command", "case"), REAL_PROCESS_CASES)
def test_real_process(command: str, case: str, storage_copy: tuple[Path, str]):
    """A real ``python -m explorer`` process exits with status 2 and prints one line, no traceback."""
    db, digest = storage_copy
    corpus_before = _tree(CORPUS)
    _assert_one_line_error(
        _explorer(command, f"tests/bad_inputs/{case}", "--storage", f"sqlite:///{db}"), case
    )
    assert _sha256(db) == digest
    assert os.listdir(db.parent) == [db.name]
    assert _tree(CORPUS) == corpus_before


# -- good inputs: the validator accepts the real quickstart and the corpus's baseline --------------


def test_quickstart_validates():
    studies_before = _tree(REPO / "studies")
    proc = _explorer("validate", "studies/quickstart.yaml")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("studies/quickstart.yaml: ok: study 'quickstart'"), proc.stdout
    assert "Traceback" not in proc.stderr
    assert _tree(REPO / "studies") == studies_before  # validate writes nothing (no default .db)


def test_quickstart_validates_with_storage_untouched(storage_copy: tuple[Path, str]):
    db, digest = storage_copy
    proc = _explorer("validate", "studies/quickstart.yaml", "--storage", f"sqlite:///{db}", "--n-trials", "3")
    assert proc.returncode == 0, proc.stderr
    assert "3 trials" in proc.stdout
    assert _sha256(db) == digest
    assert os.listdir(db.parent) == [db.name]


def test_corpus_baseline_validates(tmp_path: Path):
    """The quickstart pointed at ``bad_inputs/spaces/quickstart.yaml`` is valid: each case fails
    only because of its one change."""
    text = (REPO / "studies" / "quickstart.yaml").read_text()
    old = "search_space: ../search_spaces/quickstart.yaml"
    assert old in text
    study = tmp_path / "baseline.yaml"
    study.write_text(text.replace(old, f"search_space: {CORPUS / 'spaces' / 'quickstart.yaml'}"))
    proc = _explorer("validate", str(study), "--storage", f"sqlite:///{tmp_path / 'b.db'}")
    assert proc.returncode == 0, proc.stderr
    assert ": ok: study 'quickstart'" in proc.stdout
    assert not (tmp_path / "b.db").exists()
