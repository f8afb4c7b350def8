"""The default search's cost a proposal (issue 23): the joint models around the physics priors
(LocalSearch.modelled_proposal) on the granite knob table with 20, 50 and 100 sampled trials answered,
CPU time, min and median of five.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/search_model_overhead.py
"""

import random
import time

from explorer.measurement import Outcome
from explorer.search._neighbours import LocalSearch
from explorer.study_file import load_study

name = "granite-2b-h100x8-short"
loaded = load_study(
    f"benchmarks/search_studies/knobs/{name}.yaml", replay_table=f"benchmarks/results/tables/knobs-{name}.csv"
)
t = loaded.replay_table
ls = LocalSearch(space=loaded.space, resources=loaded.spec.resources, workload=loaded.spec.workload)
t0 = time.process_time()
valid = ls.valid()
t1 = time.process_time()
enc = ls.encoding()
t2 = time.process_time()
print(
    f"{len(valid)} valid configurations: enumerate+validity {t1 - t0:.2f} s, encode {t2 - t1:.2f} s (once a study)"
)
rng = random.Random(0)
for n in (20, 50, 100):
    sample = rng.sample(valid, n)
    feas, ooms, peaks = [], [], []
    for c in sample:
        m = t.measurement(c)
        if m.outcome is Outcome.OK:
            feas.append((c, m.properties.dataset_tokens_per_second_per_gpu))
            peaks.append((c, m.properties.peak_memory_gib))
        else:
            ooms.append((len(ooms), c))
    answered = {c.key() for c in sample}
    times = []
    for _ in range(5):
        s = time.process_time()
        ls.modelled_proposal(
            feasible=feas, answered=answered, ooms=ooms, peaks=peaks, fitted=[c for c, _ in feas]
        )
        times.append(time.process_time() - s)
    print(
        f"{n} trials answered ({len(feas)} feasible, {len(ooms)} OOM): propose {min(times) * 1000:.0f} ms (min of 5), median {sorted(times)[2] * 1000:.0f} ms"
    )
