"""Ray GPU actors: each trial reserves ``number_gpus`` GPUs (plus the GPU model as a custom resource).

With no address, a local Ray starts with *logical* GPUs from the study's resources, so a "2-GPU"
trial on a CPU machine runs as two CPU processes. ``RAY_ADDRESS`` or the launcher's ``address``
joins an existing cluster instead.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from explorer.fault import LAUNCHER_FAULTS, InjectedFault
from explorer.job import TrialJob
from explorer.launch._slot import SLOT_ATTR, GpuSlot, new_run_id
from explorer.measurement import Measurement, Outcome
from explorer.spec import ResourcesSpec, StudySpec

__all__ = ["RayLauncher", "TrialActor", "ZygoteHost"]


class TrialActor:
    """Runs one trial on the node Ray placed it on (the actor holds the trial's GPUs)."""

    def run(
        self,
        job_json: str,
        work_dir: str,
        runner: str,
        timeout_s: float,
        zygote_prefix: str | None,
    ) -> Measurement:
        import ray

        from explorer.launch._run import run_trial

        node = ray.get_runtime_context().get_node_id()
        zygote = _node_zygote(zygote_prefix, node) if zygote_prefix else None
        measurement = run_trial(
            TrialJob.from_json(job_json),
            work_dir=Path(work_dir),
            runner=runner,
            timeout_s=timeout_s,
            warm_start=zygote is not None,
            zygote=zygote,
        )

        gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        return Measurement(
            outcome=measurement.outcome,
            properties=measurement.properties,
            error=measurement.error,
            wall_seconds=measurement.wall_seconds,
            log_tail=measurement.log_tail,
            extra={**measurement.extra, "ray_node": node, "cuda_visible_devices": gpus},
        )


class ZygoteHost:
    """Owns one node's warm-start zygote (a Ray actor per node, created by the driver).

    The zygote is this actor's child, so it dies with the actor, and the actor with the driver.
    It cannot belong to a trial's actor: Ray kills an actor's child processes when it exits.
    """

    def __init__(self, driver: tuple[str, int]) -> None:
        self.driver = driver

    def socket(self) -> str:
        from explorer.launch._command import zygote_environment
        from explorer.launch._warm import ensure_zygote

        # on the driver's host the zygote dies with the driver, even a SIGKILLed one (Ray's actors
        # linger for seconds after that); elsewhere it dies with this actor
        owner = self.driver[1] if self.driver[0] == socket.gethostname() else os.getpid()
        sock = ensure_zygote(owner_pid=owner, env=zygote_environment(cpu_count=os.cpu_count() or 1))
        return str(sock)


def _zygote_name(prefix: str, node_id: str) -> str:
    return f"{prefix}-{node_id[:16]}"


def _node_zygote(prefix: str, node_id: str) -> Path | None:
    """The socket of this node's zygote, or ``None`` (no host here: the trial starts cold)."""
    import ray

    try:
        host = ray.get_actor(_zygote_name(prefix, node_id))
    except ValueError:
        return None
    sock: Any = ray.get(host.socket.remote())
    return Path(str(sock))


@dataclass
class _Running:
    trial_number: int
    gpus: int
    actor: Any
    ref: Any
    started: float
    """Unix time when the actor was asked for (its GPUs are the trial's from then on)."""
    fault: InjectedFault | None = None
    """An injected launcher fault still to strike (``actor_kill``, ``node_restart``)."""


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
        warm_start: bool = True,
    ) -> None:
        self.total_gpus = total_gpus
        self.gpu_model = gpu_model
        self.address = address or os.environ.get("RAY_ADDRESS")
        self.runner = runner
        self.warm_start = warm_start
        self.timeout_s = timeout_s
        self.output_dir = output_dir
        self._running: dict[Any, _Running] = {}
        self._started_ray = False
        self._zygote_prefix = f"explorer-zygote-{uuid.uuid4().hex[:12]}"
        self._zygote_hosts: list[Any] = []
        self.run_id = new_run_id()

    @classmethod
    def for_study(
        cls, spec: StudySpec, *, output_dir: Path, resources: ResourcesSpec | None = None
    ) -> RayLauncher:
        """The launcher a study file asks for (``resources`` overrides the study's)."""
        resources = resources or spec.resources
        return cls(
            total_gpus=resources.total_gpus,
            gpu_model=resources.gpu_model,
            address=spec.launcher.address,
            runner=spec.launcher.runner,
            timeout_s=spec.measurement.trial_timeout_s,
            output_dir=output_dir,
            warm_start=spec.launcher.warm_start,
        )

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        import ray

        if ray.is_initialized():  # someone else's Ray (a test, a notebook): use it as it is
            if self.warm_start and not self._zygote_hosts:
                self._start_zygote_hosts()
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
        if self.warm_start:
            self._start_zygote_hosts()

    def _start_zygote_hosts(self) -> None:
        """One :class:`ZygoteHost` per node with GPUs; each starts importing torch right away."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        host_cls = ray.remote(ZygoteHost)
        for node in ray.nodes():
            if not node.get("Alive") or not node.get("Resources", {}).get("GPU"):
                continue
            host = host_cls.options(
                name=_zygote_name(self._zygote_prefix, node["NodeID"]),
                num_cpus=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
            ).remote((socket.gethostname(), os.getpid()))
            host.socket.remote()  # type: ignore[attr-defined]  # warm up now, while the first trial is being asked for
            self._zygote_hosts.append(host)

    def shutdown(self) -> None:
        import ray

        for running in list(self._running.values()):
            ray.kill(running.actor, no_restart=True)
        self._running.clear()
        for host in self._zygote_hosts:
            ray.kill(host, no_restart=True)
        self._zygote_hosts.clear()
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
        zygotes = self._zygote_prefix if self.warm_start else None
        ref = run.remote(job.to_json(), str(work_dir), self.runner, self.timeout_s, zygotes)
        fault = job.fault if job.fault is not None and job.fault.kind in LAUNCHER_FAULTS else None
        self._running[ref] = _Running(job.trial_number, n, actor, ref, started=time.time(), fault=fault)

    def _strike_faults(self) -> list[tuple[int, Measurement]]:
        """Injected launcher faults that are due: kill an actor, or restart the local Ray.

        Returns:
            The trials a node restart lost (an actor kill shows up in :meth:`wait` as the actor's
            death, like any other).
        """
        import ray

        now = time.time()
        for running in list(self._running.values()):
            fault = running.fault
            if fault is None or now - running.started < fault.kill_after_s:
                continue
            running.fault = None
            if fault.kind == "actor_kill":
                ray.kill(running.actor, no_restart=True)
            elif fault.kind == "node_restart":
                return self._restart_node()
        return []

    def _restart_node(self) -> list[tuple[int, Measurement]]:
        """Shut the local Ray down and start it again; every running trial is lost (FAILED)."""
        import ray

        if not self._started_ray:
            raise RuntimeError("node_restart needs the Ray this launcher started (no launcher.address)")
        lost = [
            (
                running.trial_number,
                Measurement(
                    outcome=Outcome.FAILED, error="Ray: the node restarted; every trial on it was lost"
                ),
                running,
            )
            for running in self._running.values()
        ]
        self._running.clear()
        self._zygote_hosts.clear()
        ray.shutdown()
        self._started_ray = False
        self.start()
        return [(number, self._with_slot(m, running)) for number, m, running in lost]

    def _with_slot(self, measurement: Measurement, running: _Running) -> Measurement:
        slot = GpuSlot(
            run=self.run_id,
            clock="wall",
            pool=self.total_gpus,
            gpus=running.gpus,
            start=running.started,
            end=max(time.time(), running.started),
        )
        return dataclasses.replace(measurement, extra={**measurement.extra, SLOT_ATTR: slot.to_attr()})

    def wait(self, timeout_s: float) -> list[tuple[int, Measurement]]:
        """Measurements of the trials that finished within ``timeout_s`` (possibly none)."""
        import ray
        from ray.exceptions import RayError

        if not self._running:
            return []
        lost = self._strike_faults()
        if lost:
            return lost
        ready, _ = ray.wait(list(self._running), num_returns=1, timeout=timeout_s)
        done: list[tuple[int, Measurement]] = []
        for ref in ready:
            running = self._running.pop(ref)
            try:
                measurement = ray.get(ref)
            except RayError as exc:  # the actor or its node died
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                measurement = Measurement(
                    outcome=Outcome.FAILED, error=f"Ray: {first}", wall_seconds=time.time() - running.started
                )
            ray.kill(running.actor, no_restart=True)
            done.append((running.trial_number, self._with_slot(measurement, running)))
        return done
