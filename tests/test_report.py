"""``explorer report``: PNG figures, an HTML page that links them, and Optuna artifacts on the study."""

from __future__ import annotations

import csv
import itertools
from pathlib import Path

import optuna
import pytest

from explorer.cli import main
from explorer.report import feasible_ranking, print_summary  # the summary API is unchanged
from explorer.report._canvas import HEIGHT_PX, WIDTH_PX
from explorer.study import OBJECTIVE, open_study, optimize
from explorer.study_file import load_study

SINGLE = [
    "throughput.png",
    "frontier.png",
    "gpus.png",
    "memory.png",
    "history.png",
    "feasibility.png",
    "importances.png",
]


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000, path
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def _table(path: Path) -> Path:
    """A made-up table: throughput falls with GPUs and checkpointing; 2048+ tokens a process
    without checkpointing (4096+ with it) run out of memory; one FSDP configuration is missing
    (its trial fails)."""
    rows = []
    for bs, gpus, backend, strategy, ckpt in itertools.product(
        (4, 8, 16, 32, 64), (1, 2), ("DDP", "FSDP"), ("FULL_SHARD", "SHARD_GRAD_OP"), (False, True)
    ):
        if gpus == 1 and (backend, strategy) != ("DDP", "FULL_SHARD"):
            continue
        if (bs, gpus, backend, strategy, ckpt) == (8, 2, "FSDP", "SHARD_GRAD_OP", True):
            continue
        tokens = bs // gpus * 64
        fits = tokens < (4096 if ckpt else 2048)
        tput = 1000.0 * (1 + bs / 64) * (0.8 if gpus == 2 else 1.0) * (0.7 if ckpt else 1.0)
        rows.append(
            dict(
                model_name="tiny-llama",
                gpu_model="CPU-logical",
                model_max_length=64,
                number_gpus=gpus,
                batch_size=bs,
                distributed_backend=backend if gpus > 1 else "",
                fsdp_version=1 if backend == "FSDP" and gpus > 1 else "",
                fsdp_sharding_strategy=strategy if backend == "FSDP" and gpus > 1 else "",
                gradient_checkpointing=ckpt,
                dataset_tokens_per_second_per_gpu=tput if fits else 0.0,
                peak_memory_gib=0.05 + tokens / (8192 if ckpt else 4096) if fits else "",
                is_valid=int(fits),
            )
        )
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _replayed_study(write_study, tmp_path: Path) -> Path:
    _table(tmp_path / "table.csv")
    return write_study(
        {
            "storage": f"sqlite:///{tmp_path}/s.db",
            "n_trials": 18,
            # random, so that the history has an invalid proposal (batch 3 on 2 GPUs) to draw:
            # the default sampler's own proposals are never invalid (batch 3 on 1 GPU is valid
            # and fails, absent from the table; a value no configuration can take is refused)
            "sampler": {"kind": "random", "seed": 0},
            "launcher": {"kind": "replay", "table": "table.csv", "max_retries": 0},
            "search_space": {
                "parameters": {
                    "batch_size": {"values": [3, 4, 8, 16, 32, 64]},
                    "number_gpus": {"values": [1, 2]},
                    "distributed_backend": {"choices": ["DDP", "FSDP"]},
                    "fsdp_version": 1,
                    "fsdp_sharding_strategy": {"choices": ["FULL_SHARD", "SHARD_GRAD_OP"]},
                    "gradient_checkpointing": {"choices": [False, True]},
                }
            },
        }
    )


def _check_report(folder: Path, names: list[str], study: optuna.Study, out: str) -> None:
    for name in names:
        assert _png_size(folder / name) == (WIDTH_PX, HEIGHT_PX), name
    page = (folder / "index.html").read_text()
    for name in names:
        assert f'<img src="{name}"' in page
    metas = optuna.artifacts.get_all_artifact_meta(study)
    assert sorted(m.filename for m in metas) == sorted(names)
    for meta in metas:
        assert meta.artifact_id in page and meta.artifact_id in out
        assert meta.mimetype == "image/png"
    assert f"report: {folder}" in out and f"html: {folder / 'index.html'}" in out


def test_report_of_a_replayed_study_writes_figures_page_and_artifacts(write_study, tmp_path, capsys):
    path = _replayed_study(write_study, tmp_path)
    loaded = load_study(path)
    optimize(loaded, printer=lambda _: None)
    study = open_study(loaded, create=False)
    statuses = {t.user_attrs.get("status") for t in study.get_trials()}
    assert {"ok", "oom", "invalid"} <= statuses, statuses  # every marker of the history is drawn
    capsys.readouterr()

    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    folder = loaded.output_dir / "report"
    _check_report(folder, SINGLE, study, out)
    assert not (folder / "pareto.png").exists()  # one objective: no Pareto front
    store = loaded.output_dir / "artifacts"
    ids = {m.artifact_id for m in optuna.artifacts.get_all_artifact_meta(study)}
    assert {p.name for p in store.iterdir()} == ids

    # Again, elsewhere: the artifacts are replaced under their ids, not piled up.
    assert main(["report", str(path), "--out", str(tmp_path / "again")]) == 0
    _check_report(tmp_path / "again", SINGLE, study, capsys.readouterr().out)
    assert {m.artifact_id for m in optuna.artifacts.get_all_artifact_meta(study)} == ids
    assert feasible_ranking(study) and callable(print_summary)


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_multi_objective_study_gets_a_pareto_front(write_study, tmp_path, capsys):
    """A hand-made 2-objective study (throughput up, memory down) in sqlite, reported as it is."""
    db = f"sqlite:///{tmp_path}/mo.db"
    path = write_study({"name": "mo", "storage": db})
    study = optuna.create_study(study_name="mo", storage=db, directions=["maximize", "minimize"])
    study.set_metric_names([OBJECTIVE, "peak_memory_gib"])
    dist = {"log2_batch_size": optuna.distributions.IntDistribution(2, 6)}
    for e, ckpt in itertools.product(range(2, 7), (False, True)):
        bs = 2**e
        fits = bs * 64 < (4096 if ckpt else 2048)
        tput, mem = (100.0 * bs * (0.7 if ckpt else 1.0), bs / (64 if ckpt else 32)) if fits else (0.0, 0.0)
        attrs = dict(
            status="ok" if fits else "oom",
            batch_size=bs,
            number_gpus=1,
            distributed_backend="NONE",
            gradient_checkpointing=ckpt,
            model_max_length=64,
        )
        if fits:
            attrs |= {OBJECTIVE: tput, "peak_memory_gib": mem}
        study.add_trial(
            optuna.trial.create_trial(
                params={"log2_batch_size": e},
                distributions=dist,
                values=[tput, mem],
                user_attrs=attrs,
                system_attrs={"constraints": [0.0 if fits else 1.0]},
            )
        )
    assert len(study.best_trials) >= 2  # checkpointing trades memory for speed
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    loaded = load_study(path)
    _check_report(loaded.output_dir / "report", [*SINGLE, "pareto.png"], study, out)


@pytest.mark.parametrize("database", ["missing", "other study"])
def test_report_of_a_study_that_does_not_exist_is_one_line_and_writes_nothing(
    write_study, tmp_path, capsys, database
):
    db = tmp_path / "s.db"
    if database == "other study":
        optuna.create_study(study_name="someone-else", storage=f"sqlite:///{db}")
    before = sorted(p.name for p in tmp_path.iterdir())
    path = write_study({"name": "nope", "storage": f"sqlite:///{db}"})
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("explorer: error:") and "no study 'nope'" in err[0]
    # (opening an existing sqlite file leaves its WAL side files; no report, no artifacts, no db)
    after = [p.name for p in tmp_path.iterdir() if not p.name.endswith(("-wal", "-shm"))]
    assert sorted(after) == sorted([*before, "study.yaml"])
