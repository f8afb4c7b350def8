"""``explorer status``: a table of a study's trials, read without disturbing a running study.

The storage is opened for reading only: an sqlite file through a ``mode=ro`` URI (so no table,
study or version row can be written, whatever Optuna's storage does when it opens), never created
if absent; any other database without Optuna's table creation. A busy database ("database is
locked") is retried briefly. optuna-dashboard issue #545 is the failure this avoids: a reader that
writes to, or locks, a study's sqlite file makes the running study fail.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from explorer.record import Key, Status, TrialRecord
from explorer.study import check_same_job, load_readonly, readonly_url
from explorer.study._storage import _BUSY, RETRIES

if TYPE_CHECKING:
    import optuna

    from explorer.spec import LoadedStudy

__all__ = ["format_status", "load_readonly", "print_status", "readonly_url"]

REASON_CHARS = 80


def _one_line(text: str, limit: int = REASON_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _reason(trial: optuna.trial.FrozenTrial) -> str:
    """Why a trial has no value (its error), or where its answer came from."""
    record = TrialRecord.of(trial)
    if record.reused_from is not None:
        how = f"reused trial {record.reused_from}"
        return f"{how}: {_one_line(str(record[Key.ERROR]))}" if record.status == Status.FAILED else how
    if record.inferred_from is not None:
        return f"inferred from OOM trial {record.inferred_from}"
    if (src := record.reused_from_store) is not None:
        return f"from the store: study {src.get('study')!r} trial {src.get('trial')}"
    error = record.error
    return _one_line(error) if error else ""


def _placement(trial: optuna.trial.FrozenTrial) -> str | None:
    """Where each rank of a multi-node trial ran (``None`` for a trial on one node)."""
    record = TrialRecord.of(trial)
    nodes, ranks = record.nodes, record.ranks
    if nodes is None or not ranks:
        return None
    where = ", ".join(
        f"rank {r.get('rank')} on node rank {r.get('node_rank')} (Ray node {str(r.get('ray_node'))[:12]}, "
        f"host {r.get('hostname')})"
        for r in ranks
        if isinstance(r, dict)
    )
    return f"trial {trial.number} ranks: {where}"


def _table_lines(rows: list[tuple[str, ...]]) -> list[str]:
    """The trial table as plain lines (rich's table, no borders, no colour, no wrapping)."""
    import io

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(box=None, pad_edge=False, show_edge=False)
    for name, justify in _COLUMNS:
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for row in rows:
        table.add_row(*map(escape, row))  # an error's "[rank0]:" is text, not rich markup
    console = Console(file=io.StringIO(), width=400, color_system=None, highlight=False)
    console.print(table)
    return [line.rstrip() for line in console.file.getvalue().splitlines()]  # type: ignore[attr-defined]


_COLUMNS = (
    ("trial", "right"),
    ("state", "left"),
    ("status", "left"),
    ("configuration", "left"),
    ("tok/s/gpu", "right"),
    ("95% CI", "right"),
    ("wall s", "right"),
    ("reason", "left"),
)


def format_status(study: optuna.Study) -> list[str]:
    """The lines of the trial table, then a summary line (and the log file of each failure)."""
    from explorer.study import OBJECTIVE, config_of, describe

    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    rows: list[tuple[str, ...]] = []
    counts: dict[str, int] = {}
    logs: list[str] = []
    best: tuple[int, float] | None = None
    for t in trials:
        record = TrialRecord.of(t)
        status = record.status or "-"
        counts[status] = counts.get(status, 0) + 1
        try:
            config = describe(config_of(t)) if record.config_key is not None else "-"
        except Exception:  # a trial asked but not yet tagged with its configuration
            config = "-"
        value = record.per_gpu if status == Status.OK else None
        throughput = f"{value:.1f}" if value is not None else "-"
        ci = record.step_time_rel_ci if value is not None else None
        ci_txt = f"+-{100 * ci:.1f}%" if ci is not None else "-"  # the interval of the mean step time
        wall = record.wall_seconds
        wall_txt = f"{wall:.1f}" if wall is not None else "-"
        rows.append((str(t.number), t.state.name, status, config, throughput, ci_txt, wall_txt, _reason(t)))
        placed = _placement(t)
        if placed:
            logs.append(placed)
        if status in (Status.FAILED, Status.RETRY) and record.log_file is not None:
            logs.append(f"trial {t.number} log: {record.log_file}")
        if value is not None and (best is None or value > best[1]):
            best = (t.number, value)
    summary = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    best_txt = f"best: trial {best[0]}: {best[1]:.1f} {OBJECTIVE}" if best else "best: -"
    return [
        *_table_lines(rows),
        f"{len(trials)} trials ({summary or 'none yet'}); {best_txt}",
        *logs,
    ]


def print_status(loaded: LoadedStudy, printer: Callable[[str], None] = print) -> None:
    """Print the trial table of ``loaded``'s study (read-only; see the module docstring).

    Raises:
        SpecError: no such study, or its storage cannot be read.
    """
    import sqlalchemy

    study = load_readonly(loaded)
    check_same_job(study, loaded)
    for attempt in range(RETRIES):
        try:
            lines = format_status(study)
            break
        except sqlalchemy.exc.OperationalError as exc:
            if not any(m in str(exc) for m in _BUSY) or attempt == RETRIES - 1:
                raise
            time.sleep(0.2 * (attempt + 1))
    for line in lines:
        printer(line)
