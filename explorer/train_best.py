"""Train a study's workload with one configuration for a fixed number of steps.

``explorer best`` prints this as the command to run next::

    torchrun --standalone --nproc_per_node N -m explorer.train_best --job best/job.json --steps 20
    accelerate launch --config_file best/accelerate.yaml -m explorer.train_best --job best/job.json

Each process is one rank of the worker that measured the trial (``explorer.worker``: the same
model, data, TrainingArguments and Trainer), with the stop rule replaced by ``steps``: the job's
warmup steps, then ``--steps`` measured ones. Rank 0 writes ``result.json`` into ``--out`` and
prints the steps trained and the throughput. It is a check run of the benchmark itself; a plain
user script trained from the written files alone is :mod:`explorer.user_train`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from explorer.job import TrialJob
from explorer.measurement import Measurement
from explorer.spec import MeasurementSpec

__all__ = ["fixed_steps", "main"]


def fixed_steps(job: TrialJob, *, steps: int, memory_cap: bool = True) -> TrialJob:
    """``job`` with the ``steps`` stop rule: its warmup steps, then ``steps`` measured steps.

    Args:
        job: The job ``explorer best`` wrote.
        steps: Measured optimizer steps after the warmup.
        memory_cap: Keep the study's ``device_memory_gib`` cap (the trial ran under it).
    """
    m = job.measurement
    measurement = MeasurementSpec(
        stop="steps",
        warmup_steps=m.warmup_steps,
        measured_steps=steps,
        trial_timeout_s=m.trial_timeout_s,
    )
    resources = job.resources if memory_cap else job.resources.model_copy(update={"device_memory_gib": None})
    return dataclasses.replace(job, measurement=measurement, resources=resources)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one rank; rank 0 prints ``trained N steps ...``. Returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m explorer.train_best", description=__doc__.split("\n")[0])
    parser.add_argument("--job", required=True, metavar="JOB.json", help="the job.json `explorer best` wrote")
    parser.add_argument("--steps", type=int, default=20, metavar="N", help="measured steps after warmup")
    parser.add_argument("--out", metavar="DIR", help="folder for result.json (default: run/ beside the job)")
    parser.add_argument("--no-memory-cap", action="store_true", help="ignore the study's device_memory_gib")
    ns = parser.parse_args(argv)
    if ns.steps < 1:
        parser.error("--steps must be at least 1")
    job_file = Path(ns.job)
    job = fixed_steps(
        TrialJob.from_json(job_file.read_text()), steps=ns.steps, memory_cap=not ns.no_memory_cap
    )
    out = Path(ns.out) if ns.out else job_file.parent / "run"
    out.mkdir(parents=True, exist_ok=True)

    from explorer.worker._train import main as worker_main

    status = worker_main(["--job", job.to_json(), "--out", str(out)])  # a failed rank exits there
    if status == 0 and int(os.environ.get("RANK", "0")) == 0:
        result = Measurement.from_json((out / "result.json").read_text())
        p = result.properties
        assert p is not None  # rank 0 writes result.json only for a measured run
        print(
            f"trained {p.warmup_steps + p.measured_steps} steps ({p.warmup_steps} warmup, "
            f"{p.measured_steps} measured) on {job.config.number_gpus} process(es) as "
            f"{result.extra.get('wrapper')}: {p.dataset_tokens_per_second_per_gpu:.1f} dataset tok/s/gpu, "
            f"peak memory {p.peak_memory_gib:.3f} GiB; result: {out / 'result.json'}",
            flush=True,
        )
    return status


if __name__ == "__main__":
    sys.exit(main())
