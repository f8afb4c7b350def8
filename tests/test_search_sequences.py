"""A refactoring of the space, the search or the optimize loop walks the same trials.

``benchmarks/results/search_sequences.json`` holds, for the project's own tables, every trial that
``explorer benchmark-search`` ran for each variant and seed (configuration key and how it was
answered), recorded before the knob registry existed (the ``cpu-quickstart`` runs again when the
quickstart space dropped ``number_gpus: 3``, a value that can never run on its 2-GPU node and
that validation refuses since issue 22), and again when issue 23 made the joint models the default
(its ``walk`` runs walk what ``default`` walked before: checked when it was re-recorded). The
same seeds must walk the same
sequences now: the suggestion order, the conditional structure, OOM inference, the priors and the
configuration keys all show in them.

TPE's choices rest on floating-point densities, and numpy picks its vectorised ``exp``/``log``
by the CPU's instruction set, so a near-tie between two categorical values can fall the other way
on another machine. The recording machine and an AMD EPYC one differ in 5 of 96 runs, first at
trial index 11 to 20 and each time in the FSDP2 sharding strategy TPE picked; the commit that
recorded the file walks the same 5 runs there, so the code did not change them. So every run must walk the recorded trials up to ``EXACT_PREFIX``, and all but
``MAY_DIFFER`` of the runs must walk them to the end: a refactoring that changes the search
changes far more than that.
"""

from __future__ import annotations

import json

import pytest

from tests.test_benchmark_results import ROOT, _bench

RECORDED = json.loads((ROOT / "benchmarks" / "results" / "search_sequences.json").read_text())
EXACT_PREFIX = 10
"""Every run's first trials, identical on every machine."""
MAY_DIFFER = 0.10
"""The share of a study's runs that may leave the recorded walk after ``EXACT_PREFIX``."""


@pytest.mark.parametrize("study", sorted(RECORDED["sequences"]))
def test_benchmark_search_walks_the_recorded_trials(study):
    bench = _bench("search_sequences")
    assert RECORDED["n_trials"] == bench.N_TRIALS
    now = bench.record([study])[study]
    recorded = RECORDED["sequences"][study]
    assert set(now) == set(recorded)
    differ = []
    for run, sequence in recorded.items():
        assert len(now[run]) >= EXACT_PREFIX, run
        assert now[run][:EXACT_PREFIX] == sequence[:EXACT_PREFIX], f"{study} {run}: the first trials changed"
        if now[run] != sequence:
            differ.append(run)
    assert len(differ) <= MAY_DIFFER * len(recorded), f"{study}: these runs changed: {differ}"
