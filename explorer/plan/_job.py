"""The real run ``explorer plan`` prices: its tokens, epochs, deadline, GPU limit, global batch and
GPU prices.

Each value comes from the command line, else from the study file's ``budget`` and ``prices``
(the first study's, when several are planned together; every study's prices are merged).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from explorer.errors import SpecError
from explorer.spec import parse_amount, parse_hours
from explorer.trial_config import TrialConfig

if TYPE_CHECKING:
    from explorer.spec import StudySpec

__all__ = ["PlanJob", "parse_prices", "plan_job"]


@dataclass(frozen=True, kw_only=True)
class PlanJob:
    """What the real fine-tune needs, and what its GPUs cost."""

    tokens: float
    """Dataset tokens in one epoch."""
    epochs: float = 1.0
    """Passes over the dataset."""
    deadline_hours: float | None = None
    """Hours the run must finish in (``None``: no deadline)."""
    max_gpus: int | None = None
    """Most GPUs the run may hold (``None``: the largest measured count)."""
    global_batch: int | None = None
    """Samples per optimizer step that the run's recipe fixes (:attr:`TrialConfig.global_batch`):
    only configurations that keep it are planned, measured or extrapolated. ``None``: any."""
    prices: Mapping[str, float] = field(default_factory=dict)
    """USD per GPU-hour, by GPU model."""

    def __post_init__(self) -> None:
        if not self.tokens > 0 or not self.epochs > 0:
            raise ValueError("tokens and epochs must be positive")
        if self.global_batch is not None and self.global_batch < 1:
            raise ValueError("global_batch must be at least 1")

    def keeps(self, config: TrialConfig) -> bool:
        """Whether ``config`` trains with the run's global batch (any, without one)."""
        return self.global_batch is None or config.global_batch == self.global_batch

    @property
    def total_tokens(self) -> float:
        """Dataset tokens over every epoch: what the run must process."""
        return self.tokens * self.epochs

    def hours(self, tokens_per_second: float) -> float:
        """Wall-clock hours to process :attr:`total_tokens` at ``tokens_per_second`` (all GPUs)."""
        return self.total_tokens / tokens_per_second / 3600.0


def parse_prices(pairs: Sequence[str]) -> dict[str, float]:
    """``["H100=4.1", "A100=2.2"]`` as ``{"H100": 4.1, "A100": 2.2}`` (``--price``)."""
    prices = {}
    for pair in pairs:
        model, sep, usd = pair.partition("=")
        try:
            if not sep or not model.strip():
                raise ValueError("give MODEL=USD_PER_GPU_HOUR")
            prices[model.strip()] = parse_amount(usd, units={"": 1.0})
        except ValueError as exc:
            raise SpecError(file="--price", field=pair, problem=str(exc)) from None
    return prices


def _option(value: str | None, parse: Callable[[object], float], *, option: str) -> float | None:
    if value is None:
        return None
    try:
        return parse(value)
    except ValueError as exc:
        raise SpecError(file=option, field="", problem=str(exc)) from None


def plan_job(
    specs: Sequence[StudySpec],
    *,
    tokens: str | None = None,
    epochs: str | None = None,
    deadline: str | None = None,
    max_gpus: int | None = None,
    global_batch: int | None = None,
    prices: Sequence[str] = (),
    file: str,
) -> PlanJob:
    """The run to plan: the command line's values over the first study's ``budget``.

    Raises:
        SpecError: a value that does not parse, or no token count anywhere.
    """
    budget = specs[0].budget
    merged: dict[str, float] = {}
    for spec in specs:
        merged.update(spec.prices)
    merged.update(parse_prices(prices))
    total = _option(tokens, parse_amount, option="--tokens") or (budget.tokens if budget else None)
    if total is None:
        raise SpecError(file=file, field="budget.tokens", problem="no token count: give --tokens N")
    if max_gpus is not None and max_gpus < 1:
        raise SpecError(file="--max-gpus", field="", problem=f"{max_gpus} must be at least 1")
    if global_batch is not None and global_batch < 1:
        raise SpecError(file="--global-batch", field="", problem=f"{global_batch} must be at least 1")
    return PlanJob(
        tokens=total,
        epochs=_option(epochs, parse_amount, option="--epochs") or (budget.epochs if budget else 1.0),
        deadline_hours=_option(deadline, parse_hours, option="--deadline")
        or (budget.deadline_hours if budget else None),
        max_gpus=max_gpus or (budget.max_gpus if budget else None),
        global_batch=global_batch or (budget.global_batch if budget else None),
        prices=merged,
    )
