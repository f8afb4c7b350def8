"""The joint models of explorer/search/_surrogate.py (the default search after the frontier
walk), with either prior: the registry's orders (a model without a known architecture) or the
first-principles estimates of explorer/search/_physics.py; and the corrected registry orders, on
one of the issue-23 tables' spaces."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from explorer.search._inference import memory_dominates
from explorer.search._neighbours import LocalSearch
from explorer.search._surrogate import Surrogate
from explorer.study_file import load_study

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", params=["orders", "physics"])
def local(request):
    loaded = load_study(
        ROOT / "benchmarks/search_studies/knobs/llama-8b-a100-40x2-full.yaml", check_model=False
    )
    workload = loaded.spec.workload if request.param == "physics" else None
    return LocalSearch(space=loaded.space, resources=loaded.spec.resources, surrogate=True, workload=workload)


def _pick(local, **want):
    return next(c for c in local.valid() if all(getattr(c, k) == v for k, v in want.items()))


def test_a_measured_effect_carries_to_configurations_never_tried(local):
    """Slow eager trials and fast flash ones: an untried flash configuration is predicted faster
    than an untried eager one (the effect is joint, not a per-value mean of the same rows)."""
    import numpy as np

    enc = local.encoding()
    flash = [c for c in local.valid() if c.attn_implementation == "flash_attention_2"][:40:8]
    eager = [c.replace(attn_implementation="eager") for c in flash]
    feasible = [(c, 100.0) for c in flash] + [(c, 10.0) for c in eager]
    model = Surrogate.fit(enc, feasible=feasible, ooms=[])
    assert model.speed is not None
    new_flash = next(c for c in local.valid()[500:] if c.attn_implementation == "flash_attention_2")
    new_eager = new_flash.replace(attn_implementation="eager")
    mean, _ = model.speed.predict(np.array([enc.index[new_flash], enc.index[new_eager]]))
    assert mean[0] - mean[1] > 0.5 * math.log(10)


def test_an_oom_lowers_the_chance_to_fit_of_its_hungrier_neighbours(local):
    import numpy as np
    from scipy.stats import norm

    enc = local.encoding()
    oom = _pick(local, number_gpus=1, batch_size=16, precision="mixed", gradient_checkpointing=False)
    hungrier = oom.replace(batch_size=32)
    fitted = Surrogate.fit(enc, feasible=[], ooms=[], fitted=[oom])
    failed = Surrogate.fit(enc, feasible=[], ooms=[oom])
    rows = np.array([enc.index[hungrier]])
    chances = []
    for model in (fitted, failed):
        assert model.memory is not None
        mu, sd = model.memory.predict(rows)
        chances.append(norm.cdf(-mu / sd)[0])
    assert chances[1] < 0.5 * chances[0]


def test_the_proposal_is_open_and_not_inferred_oom(local):
    oom = _pick(local, number_gpus=1, batch_size=8, precision="mixed")
    fit = _pick(local, number_gpus=2, precision="pure_bf16", fsdp_sharding_strategy="FULL_SHARD")
    chosen = local.modelled_next(
        feasible=[(fit, 100.0)], answered={fit.key(), oom.key()}, ooms=[(0, oom)], peaks=[(fit, 30.0)]
    )
    assert chosen is not None and chosen.key() not in {fit.key(), oom.key()}
    assert not memory_dominates(chosen, oom)


def test_corrected_orders(local):
    """Fused AdamW needs no more than plain (foreach) AdamW, not the reverse (issue 23);
    adafactor sits above 8-bit AdamW under FSDP1 only; packed rows are ordered against padded
    ones only with flash (or flex) attention."""
    c = _pick(local, number_gpus=2, distributed_backend="FSDP", fsdp_version=1, padding="longest")
    fused, plain = c.replace(optim="adamw_torch_fused"), c.replace(optim="adamw_torch")
    assert memory_dominates(plain, fused) and not memory_dominates(fused, plain)
    ada, bnb = c.replace(optim="adafactor"), c.replace(optim="adamw_bnb_8bit")
    assert memory_dominates(ada, bnb) and not memory_dominates(bnb, ada)
    single = _pick(local, number_gpus=1, padding="longest", optim="adamw_torch")
    assert memory_dominates(single.replace(optim="adamw_bnb_8bit"), single.replace(optim="adafactor"))
    for attn, ordered in (
        ("flash_attention_2", True),
        ("flex_attention", True),
        ("sdpa", False),
        ("eager", False),
    ):
        d = single.replace(attn_implementation=attn)
        assert memory_dominates(d.replace(padding="max_length"), d.replace(padding="packed")) is ordered


def test_the_joint_models_run_their_linear_algebra_on_one_blas_thread(local, monkeypatch):
    """OpenBLAS's second thread spins between the models' small products and slows the whole
    loop on a small machine (docs/benchmarks.md, issue 23's orchestration): a proposal fits and
    scores under a one-thread limit, and the limit ends with it."""
    from threadpoolctl import threadpool_info

    from explorer.search import _neighbours

    def blas_threads() -> set[int]:
        return {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}

    seen: list[set[int]] = []
    fit = _neighbours.Surrogate.fit

    def watched(*args, **kwargs):
        seen.append(blas_threads())
        return fit(*args, **kwargs)

    monkeypatch.setattr(_neighbours.Surrogate, "fit", watched)
    before = blas_threads()
    first = local.valid()[0]
    proposed = local.modelled_next(feasible=[(first, 100.0)], answered={first.key()}, ooms=[])
    assert proposed is not None and proposed != first
    assert seen == [{1}]
    assert blas_threads() == before
