"""Bytes of activations a decoder layer saves for the backward, counted, against the physics.

The physics (:mod:`explorer.search._physics`) prices a layer's saved activations at ``hidden x
ACTIVATION_BASE + intermediate x ACTIVATION_MLP`` bytes a token, fitted to published peaks, with
per-knob changes (pure bf16, Liger's RMSNorm and SwiGLU) taken from this count and Liger's source.
The one full fine-tune measured on a GPU (granite-3.1-2b on an H200, pure bf16 and Liger) peaked
22% under the estimate before those changes. This script counts instead of
fitting: it runs one forward and loss of an HF model built from a study's architecture (with
``--layers`` decoder layers) under ``torch.autograd.graph.saved_tensors_hooks`` and adds up the
storage of every tensor the autograd graph keeps, once each, by the decoder layer running when it
was saved. Parameters are left out, and so are autocast's bf16 copies of them (counted apart:
they are weights, 2 bytes a parameter, not activations).

Variants: ``mixed`` (fp32 weights under bf16 autocast, what the Trainer's ``bf16=True`` does) and
``pure_bf16`` (a bf16 model), each with and without Liger's kernels where Liger can run (CUDA and
the liger_kernel package), sdpa attention on full-length rows (no padding mask, so no score
matrix is kept).

    python3 benchmarks/activation_bytes.py --json OUT.json            # the granite study, CPU or CUDA
    python3 benchmarks/activation_bytes.py --study studies/X.yaml --layers 2 --batch 2 --seq 96
    python3 benchmarks/activation_bytes.py --reprice OUT.json        # the physics' figures only

One JSON object: the shape, then per variant the bytes a token each layer saved (``per_layer``,
their mean ``layer_bytes_per_token``, over ``hidden`` as ``per_hidden``), what was saved outside
the layers a token (embeddings, final norm, logits and loss), autocast's weight copies, and the
physics' estimate for the same configuration (``physics_layer_bytes_per_token``; ``ratio`` is
counted over estimated).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
STUDY = ROOT / "studies" / "granite-3.1-2b-full-1xh100-throughput.yaml"


def build(spec: Any, *, layers: int, precision: str, device: str) -> Any:
    """The study's model as a trial builds it (:func:`explorer.worker._model.build_model`), with
    ``layers`` decoder layers, random weights and sdpa attention, in training mode."""
    import torch

    from explorer.worker._model import build_model, load_config

    config = load_config(spec.workload.model, None)
    config.num_hidden_layers = layers
    dtype = torch.bfloat16 if precision == "pure_bf16" else torch.float32
    model = build_model(
        spec.workload.model,
        None,
        config,
        lora_r=None,
        method=spec.workload.method,
        init_device=torch.device(device),
        options={"attn_implementation": "sdpa"},
        dtype=dtype,
    )
    return model.train()


def count(model: Any, input_ids: Any, *, autocast: bool) -> dict[str, int]:
    """Bytes the forward and loss keep for the backward: by decoder layer, outside the layers,
    and autocast's weight copies (each storage once)."""
    import torch

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    layers = _decoder_layers(model)
    where = ["outside"]
    seen: set[int] = set()
    found: dict[str, int] = {"outside": 0, "weight_copies": 0, **{str(i): 0 for i in range(len(layers))}}

    def enter(i: int) -> Any:
        def hook(*_: Any) -> None:
            where[0] = str(i)

        return hook

    def leave(*_: Any) -> None:
        where[0] = "outside"

    handles = []
    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(enter(i)))
        handles.append(layer.register_forward_hook(leave))

    def pack(t: Any) -> Any:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in params or ptr in seen or storage.nbytes() == 0:
            return t
        seen.add(ptr)
        found["weight_copies" if _weight_copy(t) else where[0]] += storage.nbytes()
        return t

    try:
        with (
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
            torch.autocast(input_ids.device.type, dtype=torch.bfloat16, enabled=autocast),
        ):
            out = model(input_ids=input_ids, labels=input_ids)
        out.loss.backward()
    finally:
        for h in handles:
            h.remove()
    return found


def _weight_copy(t: Any) -> bool:
    """Whether ``t`` is a copy of one parameter (autocast's bf16 cast of a weight, or its
    transpose): its graph leads back through single-input steps to that parameter alone."""
    fn = t.grad_fn
    for _ in range(3):
        if fn is None:
            return False
        if type(fn).__name__ == "AccumulateGrad":
            return bool(fn.variable.numel() == t.numel())
        inputs = [f for f, _ in fn.next_functions if f is not None]
        if len(inputs) != 1:
            return False
        fn = inputs[0]
    return False


def _decoder_layers(model: Any) -> list[Any]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a LoRA study's
    return list(base.model.layers)


def physics_layer_bytes(spec: Any, *, precision: str, liger: bool, batch: int, seq: int) -> float:
    """The physics' saved activations a token and layer for this configuration, bytes."""
    from explorer.search._physics import GIB, JobPhysics
    from explorer.trial_config import TrialConfig

    job = JobPhysics(workload=spec.workload, resources=spec.resources)
    c = TrialConfig(
        batch_size=batch,
        number_gpus=1,
        gradient_checkpointing=False,
        model_max_length=seq,
        precision=precision,
        liger_kernel=liger,
        attn_implementation="sdpa",
        padding="max_length",
    )
    acts = job.memory_parts(c)[1] * GIB / job.slack
    return acts / (job.arch.layers * batch * seq)


def liger_runs(device: str) -> bool:
    """Whether Liger's kernels can run here (CUDA and the liger_kernel package)."""
    import importlib.util

    return device == "cuda" and importlib.util.find_spec("liger_kernel") is not None


def variant(
    spec: Any,
    *,
    precision: str,
    liger: bool,
    layers: int,
    batch: int,
    seq: int,
    device: str,
) -> dict[str, Any]:
    """One variant's count, beside the physics' estimate."""
    import torch

    from explorer.settings import apply_liger
    from explorer.trial_config import TrialConfig

    arch = dict(spec.workload.model.architecture)
    model = build(spec, layers=layers, precision=precision, device=device)
    if liger:
        config = TrialConfig(
            batch_size=batch, number_gpus=1, gradient_checkpointing=False, model_max_length=seq
        )
        apply_liger(model, config.replace(liger_kernel=True))
    ids = torch.randint(0, int(arch["vocab_size"]), (batch, seq), device=device)
    found = count(model, ids, autocast=precision == "mixed")
    tokens = batch * seq
    per_layer = [found[str(i)] / tokens for i in range(layers)]
    mean = sum(per_layer) / layers
    estimate = physics_layer_bytes(spec, precision=precision, liger=liger, batch=batch, seq=seq)
    return {
        "per_layer": per_layer,
        "layer_bytes_per_token": mean,
        "per_hidden": mean / int(arch["hidden_size"]),
        "outside_bytes_per_token": found["outside"] / tokens,
        "weight_copy_bytes": found["weight_copies"],
        "physics_layer_bytes_per_token": estimate,
        "ratio": mean / estimate,
    }


def run(
    study: Path, *, layers: int, batch: int, seq: int, device: str, out_path: Path | None = None
) -> dict[str, Any]:
    """Every variant that runs here, the H200 run's (pure bf16 with Liger) first; the result is
    written to ``out_path`` after each (a cut run keeps what it counted). A variant that fails
    records its error's first line."""
    import torch

    from explorer.study_file import load_study

    spec = load_study(study, check_model=False, check_launcher=False, check_hub=False).spec
    arch = dict(spec.workload.model.architecture or {})
    out: dict[str, Any] = {
        "study": str(study.relative_to(ROOT)) if study.is_relative_to(ROOT) else str(study),
        "device": device,
        "torch": torch.__version__,
        "layers": layers,
        "batch": batch,
        "seq": seq,
        "hidden": arch.get("hidden_size"),
        "intermediate": arch.get("intermediate_size"),
        "kv": int(arch["hidden_size"]) // int(arch["num_attention_heads"]) * int(arch["num_key_value_heads"]),
        "variants": {},
    }
    for liger in (True, False) if liger_runs(device) else (False,):
        for precision in ("pure_bf16", "mixed"):
            name = f"{precision}{'+liger' if liger else ''}"
            try:
                out["variants"][name] = variant(
                    spec,
                    precision=precision,
                    liger=liger,
                    layers=layers,
                    batch=batch,
                    seq=seq,
                    device=device,
                )
            except Exception as exc:  # one variant's failure (a kernel, a dtype) is recorded, the rest run
                out["variants"][name] = {
                    "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                }
            if out_path is not None:
                out_path.write_text(json.dumps(out, indent=1) + "\n")
    return out


def reprice(path: Path) -> dict[str, Any]:
    """A recorded count (``--json``'s file) priced again by the package's physics as it is now:
    only each variant's ``physics_layer_bytes_per_token`` and ``ratio`` change, so a change of the
    physics needs no new count (granite's layers in bf16 take over half an hour on a CPU without
    bf16 instructions)."""
    from explorer.study_file import load_study

    out = json.loads(path.read_text())
    spec = load_study(ROOT / out["study"], check_model=False, check_launcher=False, check_hub=False).spec
    for name, v in out["variants"].items():
        if "per_layer" not in v:
            continue
        precision, _, liger = name.partition("+")
        estimate = physics_layer_bytes(
            spec, precision=precision, liger=bool(liger), batch=out["batch"], seq=out["seq"]
        )
        v["physics_layer_bytes_per_token"] = estimate
        v["ratio"] = v["layer_bytes_per_token"] / estimate
    path.write_text(json.dumps(out, indent=1) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", type=Path, default=STUDY)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=1000, help="tokens a row (not a weight's dimension)")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--json", type=Path, help="write the result here too")
    ap.add_argument("--reprice", type=Path, help="price a recorded count again with the physics as it is")
    args = ap.parse_args(argv)
    if args.reprice is not None:
        print(json.dumps(reprice(args.reprice), indent=1))
        return 0
    import torch

    device = args.device if args.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
    out = run(
        args.study, layers=args.layers, batch=args.batch, seq=args.seq, device=device, out_path=args.json
    )
    print(json.dumps(out, indent=1))
    return 1 if any("error" in v for v in out["variants"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
