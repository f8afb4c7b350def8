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
    proposal = local.modelled_proposal(
        feasible=[(fit, 100.0)], answered={fit.key(), oom.key()}, ooms=[(0, oom)], peaks=[(fit, 30.0)]
    )
    assert proposal is not None
    chosen = proposal[0]
    assert chosen.key() not in {fit.key(), oom.key()}
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
    proposed = local.modelled_proposal(feasible=[(first, 100.0)], answered={first.key()}, ooms=[])
    assert proposed is not None and proposed[0] != first
    assert seen == [{1}]
    assert blas_threads() == before


def test_the_memory_kernel_s_amplitude_is_the_likeliest_for_the_residuals():
    """Type-II maximum likelihood over the amplitudes: residuals drawn at a quarter of the kernel's
    variance pick 0.25, residuals drawn at its full variance pick 1."""
    import numpy as np

    from explorer.search._surrogate import PHYSICS_MEMORY_KERNEL, _most_likely

    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 6))
    k = 0.05 * (x @ x.T)  # positive semi-definite, of the kernel's order of magnitude
    noise = PHYSICS_MEMORY_KERNEL[4]
    for amplitude in (0.25, 1.0):
        cov = amplitude * k + noise * np.eye(40)
        resid = np.linalg.cholesky(cov) @ rng.normal(size=40)
        assert _most_likely(k, resid, noise, (0.25, 0.5, 1.0)) == amplitude


def test_peaks_the_calibrated_physics_explains_narrow_the_memory_residual(monkeypatch):
    """Peaks measured as the physics prices them: the likeliest amplitude is the smallest, and a
    configuration the physics puts about 10% under the limit gets a higher chance to fit than under
    the fixed kernel (0.74 against 0.63 here)."""
    import numpy as np
    from scipy.special import ndtr

    from explorer.search import _surrogate

    loaded = load_study(
        ROOT / "benchmarks/search_studies/knobs/llama-8b-h100x4-lora-long.yaml", check_model=False
    )
    local = LocalSearch(
        space=loaded.space, resources=loaded.spec.resources, surrogate=True, workload=loaded.spec.workload
    )
    enc = local.encoding()
    assert enc.limit_gib is not None
    gib = enc.limit_gib * np.exp(enc.memory_prior)
    measured = [int(i) for i in np.flatnonzero(gib < 0.6 * enc.limit_gib)[::997][:8]]
    near = int(np.flatnonzero((gib > 0.88 * enc.limit_gib) & (gib < 0.92 * enc.limit_gib))[0])
    peaks = [(enc.configs[i], float(gib[i])) for i in measured]
    feasible = [(c, 1000.0) for c, _ in peaks]

    def chance(amplitudes: tuple[float, ...]) -> tuple[float, float]:
        monkeypatch.setattr(_surrogate, "MEMORY_AMPLITUDES", amplitudes)
        model = Surrogate.fit(enc, feasible=feasible, ooms=[], peaks=peaks)
        assert model.memory is not None
        mu, sd = model.memory.predict(np.array([near]))
        return float(ndtr(-mu / sd)[0]), model.memory.kernel[1]

    default = _surrogate.MEMORY_AMPLITUDES
    fixed, _ = chance((1.0,))
    learned, a1 = chance(default)
    assert a1 == pytest.approx(0.25 * _surrogate.PHYSICS_MEMORY_KERNEL[1])
    assert learned > fixed + 0.08
