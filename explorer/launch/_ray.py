"""Ray GPU actors: each trial reserves ``number_gpus`` GPUs (plus the GPU model as a custom resource).

With no address, a local Ray starts with *logical* GPUs from the study's resources, so a "2-GPU"
trial on a CPU machine runs as two CPU processes. ``RAY_ADDRESS`` or the launcher's ``address``
joins an existing cluster instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from explorer.job import TrialJob
from explorer.measurement import Measurement, Outcome

__all__ = ["RayLauncher", "TrialActor"]


class TrialActor:
    """Runs one trial on the node Ray placed it on (the actor holds the trial's GPUs)."""

    def run(self, job_json: str, work_dir: str, runner: str, timeout_s: float) -> Measurement:
        from explorer.launch._run import run_trial

        measurement = run_trial(
            TrialJob.from_json(job_json), work_dir=Path(work_dir), runner=runner, timeout_s=timeout_s
        )
        import ray

        node = ray.get_runtime_context().get_node_id()
        gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        return Measurement(
            outcome=measurement.outcome,
            properties=measurement.properties,
            error=measurement.error,
            wall_seconds=measurement.wall_seconds,
            log_tail=measurement.log_tail,
            extra={**measurement.extra, "ray_node": node, "cuda_visible_devices": gpus},
        )


@dataclass
class _Running:
    trial_number: int
    gpus: int
    actor: Any
    ref: Any


class RayLauncher:
    """Dispatches trial jobs to Ray actors and hands back their measurements."""

    def __init__(
        self,
        *,
        total_gpus: int,
        gpu_model: str,
        address: str | None,
        runner: str,
        timeout_s: float,
        output_dir: Path,
    ) -> None:
        self.total_gpus = total_gpus
        self.gpu_model = gpu_model
        self.address = address or os.environ.get("RAY_ADDRESS")
        self.runner = runner
        self.timeout_s = timeout_s
        self.output_dir = output_dir
        self._running: dict[Any, _Running] = {}
        self._started_ray = False

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        import ray

        if ray.is_initialized():
            return
        common: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
        if self.address:
            ray.init(address=self.address, **common)
        else:
            ray.init(
                num_gpus=self.total_gpus,
                resources={self.gpu_model: self.total_gpus},
                runtime_env={"env_vars": {"RAY_DEDUP_LOGS": "0"}},
                **common,
            )
        self._started_ray = True

    def shutdown(self) -> None:
        import ray

        for running in list(self._running.values()):
            ray.kill(running.actor, no_restart=True)
        self._running.clear()
        if self._started_ray and ray.is_initialized():
            ray.shutdown()

    # -- trials ---------------------------------------------------------------------------------

    @property
    def gpus_in_use(self) -> int:
        return sum(r.gpus for r in self._running.values())

    @property
    def in_flight(self) -> int:
        return len(self._running)

    def fits(self, number_gpus: int) -> bool:
        """Whether a trial of ``number_gpus`` can start now without waiting for others."""
        return self.gpus_in_use + number_gpus <= self.total_gpus

    def submit(self, job: TrialJob) -> None:
        import ray

        n = job.config.number_gpus
        actor_cls = ray.remote(TrialActor)
        actor = actor_cls.options(
            num_gpus=n,
            num_cpus=0,
            resources={self.gpu_model: n},
            max_restarts=0,
            name=None,
        ).remote()
        work_dir = self.output_dir / f"trial-{job.trial_number:05d}"
        run: Any = actor.run
        ref = run.remote(job.to_json(), str(work_dir), self.runner, self.timeout_s)
        self._running[ref] = _Running(job.trial_number, n, actor, ref)

    def wait(self, timeout_s: float) -> list[tuple[int, Measurement]]:
        """Measurements of the trials that finished within ``timeout_s`` (possibly none)."""
        import ray
        from ray.exceptions import RayError

        if not self._running:
            return []
        ready, _ = ray.wait(list(self._running), num_returns=1, timeout=timeout_s)
        done: list[tuple[int, Measurement]] = []
        for ref in ready:
            running = self._running.pop(ref)
            try:
                measurement = ray.get(ref)
            except RayError as exc:  # the actor or its node died
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                measurement = Measurement(outcome=Outcome.FAILED, error=f"Ray: {first}")
            ray.kill(running.actor, no_restart=True)
            done.append((running.trial_number, measurement))
        return done
