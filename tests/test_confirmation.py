"""Confirming the best before it is named (:mod:`explorer.study._confirm`), on real replayed studies.

The studies are the CPU quickstart (and a knob table) answered by the replay launcher, with and
without its log-normal noise: a real Optuna study in sqlite, the real optimize loop, the real
``best`` and ``audit`` commands.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from explorer.cli import main
from explorer.record import StudyRecord
from explorer.study import audit, config_of, counted_trials, named_best, open_study, optimize, verdict_lines
from explorer.study._confirm import CONFIRM_JOB_BASE, candidates, ranking
from explorer.study_file import load_study

ROOT = Path(__file__).resolve().parents[1]
TABLES = ROOT / "benchmarks" / "results" / "tables"


def _quickstart(tmp_path: Path, file: str = "quickstart.yaml", **changes: Any) -> Path:
    """studies/quickstart.yaml answered from the CPU quickstart table, its storage in tmp_path;
    ``launcher`` changes merge into the replay launcher's section, the rest into the file."""
    data = yaml.safe_load((ROOT / "studies" / "quickstart.yaml").read_text())
    launcher = {"kind": "replay", "table": str(TABLES / "cpu-quickstart.csv"), **changes.pop("launcher", {})}
    data.update(
        storage=f"sqlite:///{tmp_path}/{Path(file).stem}.db",
        search_space=str(ROOT / "search_spaces" / "quickstart.yaml"),
        launcher=launcher,
        **changes,
    )
    path = tmp_path / file
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _sequence(study: optuna.Study) -> list[tuple[str, str | None]]:
    return [(config_of(t).key(), t.user_attrs.get("status")) for t in study.get_trials(deepcopy=False)]


def test_a_noisy_study_is_confirmed_without_counting_or_changing_the_search(tmp_path: Path, capsys) -> None:
    noisy = {"noise": 0.1, "noise_seed": 3}
    path = _quickstart(tmp_path, launcher=noisy, sampler={"kind": "tpe", "seed": 3, "n_startup_trials": 6})
    lines: list[str] = []
    optimize(load_study(path), printer=lines.append)
    loaded = load_study(path)
    study = open_study(loaded, create=False)
    verdict = StudyRecord.of(study).confirmation
    assert verdict is not None and verdict["verdict"] in ("confirmed", "tied")
    assert any(line.startswith("confirming: ") for line in lines), lines
    # re-measured interleaved: round after round, every candidate once in the same order
    measured = [m["trial"] for m in verdict["measurements"]]
    first = min(len(measured), len(verdict["candidates"]))
    assert verdict["rounds"] >= 1 and first >= 2 and measured[:first] == verdict["candidates"][:first]
    assert [m["job"] for m in verdict["measurements"]] == list(
        range(CONFIRM_JOB_BASE + 1, CONFIRM_JOB_BASE + 1 + len(measured))
    )
    spent = sum(m["gpu_seconds"] for m in verdict["measurements"])
    assert verdict["gpu_seconds"] == pytest.approx(spent) and spent <= verdict["budget_gpu_s"] + 1e-9
    # never counted, never a trial: the study holds its n_trials and audit accounts for them
    assert len(counted_trials(study)) == loaded.spec.n_trials
    result = audit(study, n_trials=loaded.spec.n_trials, max_retries=1, output_dir=None)
    assert result.ok, result.problems
    assert result.confirmations == len(measured) and "not counted" in result.describe()
    # the same search without confirmation: the same trials in the same order
    plain = _quickstart(
        tmp_path,
        "plain.yaml",
        name="plain",
        launcher=noisy,
        confirm_budget_gpu_s=0,
        sampler={"kind": "tpe", "seed": 3, "n_startup_trials": 6},
    )
    optimize(load_study(plain), printer=lambda _: None)
    plain_study = open_study(load_study(plain), create=False)
    assert _sequence(plain_study) == _sequence(study)
    assert StudyRecord.of(plain_study).confirmation is None
    # best names the verdict's trial and says the verdict
    chosen = verdict.get("recommended", verdict["best"])
    assert named_best(study) == (chosen, False)
    capsys.readouterr()
    assert main(["best", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"best: trial {chosen} of study"), out[:300]
    if verdict["verdict"] == "tied":
        assert (
            f"recommended: trial {chosen} (" in out and f"tied: these {len(verdict['tied'])} within " in out
        )
    else:
        assert f"confirmed: trial {chosen} is the best" in out
    assert main(["audit", str(path)]) == 0
    # report and plan say the same verdict
    capsys.readouterr()
    assert main(["report", str(path), "--out", str(tmp_path / "report")]) == 0
    said = verdict_lines(study, str(path))
    reported = capsys.readouterr().out
    assert all(line in reported for line in said), reported
    assert main(["plan", str(path), "--tokens", "1e9", "--out", str(tmp_path / "plan")]) == 0
    planned = capsys.readouterr().out
    assert all(f"quickstart: {line}" in planned for line in said), planned[-2000:]


def test_an_unconfirmed_lead_inside_the_interval_is_not_named_best(tmp_path: Path, capsys) -> None:
    """confirm_budget_gpu_s 0: nothing re-measured, and best says the lead is not confirmed."""
    path = _quickstart(tmp_path, launcher={"noise": 0.1, "noise_seed": 1}, confirm_budget_gpu_s=0)
    optimize(load_study(path), printer=lambda _: None)
    study = open_study(load_study(path), create=False)
    ranked = ranking(study)
    assert len(candidates(ranked)) > 1  # +-19.6% intervals: the lead is within noise
    assert named_best(study) == (None, True)
    capsys.readouterr()
    assert main(["best", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"leading (not confirmed): trial {ranked[0].number} of study"), out[:300]
    assert f"`explorer optimize {path}` re-measures them and confirms" in out


def test_a_noise_free_table_costs_nothing_to_confirm(tmp_path: Path) -> None:
    """A knob table (one exact value per configuration, no interval): nothing is within noise."""
    import dataclasses

    loaded = load_study(
        ROOT / "benchmarks/search_studies/knobs/llama-8b-h100x4-lora-long.yaml",
        replay_table=TABLES / "knobs-llama-8b-h100x4-lora-long.csv.gz",
    )
    from explorer.spec import SamplerSpec

    spec = loaded.spec.model_copy(update={"n_trials": 8, "sampler": SamplerSpec(seed=0, strategy="random")})
    run = dataclasses.replace(loaded, spec=spec)
    storage = optuna.storages.InMemoryStorage()
    lines: list[str] = []
    optimize(run, printer=lines.append, storage=storage, write_ahead=False)
    verdict = StudyRecord.of(open_study(run, create=False, storage=storage)).confirmation
    assert verdict is not None and verdict["verdict"] == "confirmed"
    assert (
        verdict["gpu_seconds"] == 0.0
        and verdict["measurements"] == []
        and verdict["candidates"] == [verdict["best"]]
    )
    assert not any(line.startswith("confirming: ") for line in lines)


def test_a_quickstart_run_prints_at_most_one_imprecise_line(tmp_path: Path) -> None:
    """The CPU quickstart's rows carry the intervals its real trials measured (some +-10% and
    wider): the run says so once, at its end, with the field that tightens them."""
    path = _quickstart(tmp_path, confirm_budget_gpu_s=0)
    lines: list[str] = []
    optimize(load_study(path), printer=lines.append)
    imprecise = [line for line in lines if "imprecise" in line]
    assert len(imprecise) == 1, imprecise
    assert "missed the +-2% step-time target" in imprecise[0] and "measurement.max_seconds" in imprecise[0]
    assert lines[-1] == imprecise[0]  # at the end of the run


def test_a_plain_optimize_after_a_larger_n_trials_keeps_the_larger_count(tmp_path: Path, capsys) -> None:
    path = _quickstart(tmp_path, n_trials=4, confirm_budget_gpu_s=0)
    optimize(load_study(path, n_trials=5), printer=lambda _: None)
    optimize(load_study(path), printer=lambda _: None)  # the file says 4
    study = open_study(load_study(path), create=False)
    assert len(counted_trials(study)) == 5 and StudyRecord.of(study).n_trials == 5
    assert audit(study, n_trials=4, max_retries=1, output_dir=None).ok
    assert main(["audit", str(path)]) == 0


NOISE_LABEL = {"noisy": "10% log-normal", "noise_free": "none"}
BUDGET_LABEL = {"default": "default (1/4 of the search)", "large": "the search's GPU-seconds"}


def benchmark_row(name: str, kind: str, budget: str, s: dict[str, Any]) -> str:
    """A row of docs/benchmarks.md's confirmation table."""
    return (
        f"| {name} | {NOISE_LABEL[kind]} | {BUDGET_LABEL[budget]} | {s['runs']} | "
        f"{100 * s['hit_without']:.0f}% | {100 * s['hit_with']:.0f}% | "
        f"{100 * s['crowned_without']:.0f}% | {100 * s['crowned_with']:.0f}% | "
        f"{s['mean_without']:.3f} ({s['worst_without']:.3f}) | {s['mean_with']:.3f} ({s['worst_with']:.3f}) | "
        f"{s['confirm_gpu_s_mean']:.0f} | {100 * s['confirm_share']:.1f}% |"
    )


def test_the_benchmark_figures_are_the_ones_in_the_docs() -> None:
    """benchmarks/confirmation.py's summaries follow from its runs, and docs/benchmarks.md and the
    README quote them."""
    data = json.loads((ROOT / "benchmarks" / "results" / "confirmation.json").read_text())
    docs = (ROOT / "docs" / "benchmarks.md").read_text()
    readme = (ROOT / "README.md").read_text()
    within = data["within"]
    for name, parts in data["studies"].items():
        for kind, part in parts.items():
            runs = part["runs"]
            for budget, summary in part["summary"].items():
                without = [r["without"] / r["true_best"] for r in runs]
                with_ = [r[budget]["with"] / r["true_best"] for r in runs]
                assert summary["hit_without"] == pytest.approx(
                    sum(x >= 1 - within for x in without) / len(runs)
                )
                assert summary["hit_with"] == pytest.approx(sum(x >= 1 - within for x in with_) / len(runs))
                assert summary["mean_with"] == pytest.approx(sum(with_) / len(runs))
                crowned = data["crowned"]
                assert summary["crowned_without"] == pytest.approx(
                    sum(x < 1 - crowned for x in without) / len(runs)
                )
                assert summary["crowned_with"] == pytest.approx(
                    sum(x < 1 - crowned for x in with_) / len(runs)
                )
                assert summary["worst_with"] == pytest.approx(min(with_))
                extra = [r[budget]["confirm_gpu_s"] for r in runs]
                assert summary["confirm_gpu_s_mean"] == pytest.approx(sum(extra) / len(runs))
                assert summary["confirm_share"] == pytest.approx(
                    sum(extra) / sum(r["study_gpu_s"] for r in runs)
                )
                row = benchmark_row(name, kind, budget, summary)
                assert row in docs, row
        noisy = parts["noisy"]["summary"]
        quoted = (
            f"{100 * noisy['default']['hit_without']:.0f}% -> {100 * noisy['default']['hit_with']:.0f}% "
            f"({100 * noisy['large']['hit_with']:.0f}%"
        )
        assert quoted in readme, quoted
    knob_free = data["studies"]["llama-8b-h100x4-lora-long"]["noise_free"]["summary"]["default"]
    assert knob_free["confirm_gpu_s_max"] == 0.0 and knob_free["hit_with"] == knob_free["hit_without"]
