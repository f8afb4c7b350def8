"""One BLAS thread for the search's own linear algebra.

The joint models (:mod:`explorer.search._surrogate`) multiply and solve small matrices (a few
hundred trials by ~15,000 configurations). OpenBLAS splits such calls over every core, and its
threads then spin for a while waiting for more work: on the 2-core machine the optimize loop ran
at 128 ms a trial with two BLAS threads and at 84 ms with one (``benchmarks/optuna_overhead.py
--search default``, issue 23), the storage's commits and the Optuna calls between proposals
slowed down by the spinning threads. threadpoolctl sets the limit in every BLAS that numpy and
scipy loaded, for the length of a ``with`` block only.
"""

from __future__ import annotations

import functools
from contextlib import AbstractContextManager
from typing import Any

__all__ = ["one_blas_thread"]


@functools.cache
def _controller() -> Any:
    import scipy.linalg  # noqa: F401 - loads scipy's own BLAS, so that the controller sees it
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def one_blas_thread() -> AbstractContextManager[Any]:
    """A ``with`` block in which numpy's and scipy's BLAS run on one thread."""
    return _controller().limit(limits=1, user_api="blas")
