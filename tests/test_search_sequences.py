"""A refactoring of the space, the search or the optimize loop walks the same trials.

``benchmarks/results/search_sequences.json`` holds, for the project's own tables, every trial that
``explorer benchmark-search`` ran for each variant and seed (configuration key and how it was
answered), recorded before the knob registry existed. The same seeds must walk the same
sequences now: the suggestion order, the conditional structure, OOM inference, the priors and the
configuration keys all show in them.
"""

from __future__ import annotations

import json

import pytest

from tests.test_benchmark_results import ROOT, _bench

RECORDED = json.loads((ROOT / "benchmarks" / "results" / "search_sequences.json").read_text())


@pytest.mark.parametrize("study", sorted(RECORDED["sequences"]))
def test_benchmark_search_walks_the_recorded_trials(study):
    bench = _bench("search_sequences")
    assert RECORDED["n_trials"] == bench.N_TRIALS
    now = bench.record([study])[study]
    recorded = RECORDED["sequences"][study]
    assert set(now) == set(recorded)
    for run, sequence in recorded.items():
        assert now[run] == sequence, f"{study} {run}: the trial sequence changed"
