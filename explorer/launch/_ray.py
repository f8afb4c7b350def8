"""Ray GPU actors: each trial reserves ``number_gpus`` GPUs (plus the GPU model as a custom resource).

With no address, a local Ray starts with *logical* GPUs from the study's resources, so a "2-GPU"
trial on a CPU machine runs as two CPU processes. ``RAY_ADDRESS`` or the launcher's ``address``
joins an existing cluster instead. A trial on more than one node is a placement group with an
actor per node (:mod:`explorer.launch._placement`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from explorer.fault import LAUNCHER_FAULTS, InjectedFault
from explorer.job import TrialJob
from explorer.launch._contract import launcher_section
from explorer.launch._placement import (
    SCHEDULE_GRACE_S,
    ModelPlacement,
    MultiNodeTrial,
    Share,
    fits_on_nodes,
    local_resources,
    node_capacity,
    rank_nodes,
)
from explorer.launch._ray_health import RayLost, dead_process, kill_leftovers, leftovers
from explorer.launch._ray_messages import RayMessages, error_line
from explorer.launch._slot import GpuSlot, new_run_id
from explorer.measurement import Measurement, Outcome
from explorer.spec import RayLauncherSpec, ResourcesSpec, StudySpec

__all__ = ["RayLauncher", "TrialActor", "ZygoteHost", "loopback_only"]


class TrialActor:
    """Runs one trial (or one node's part of a multi-node trial) on the node Ray placed it on.

    The actor holds the trial's GPUs on that node.
    """

    def where(self) -> dict[str, str]:
        """This actor's node: Ray node id, IP, hostname, and the pid of the node's raylet."""
        import ray

        return {
            "ray_node": ray.get_runtime_context().get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname(),
            "raylet_pid": os.environ.get("RAY_RAYLET_PID", ""),
        }

    def rendezvous(self) -> tuple[str, int]:
        """Node 0 of a multi-node trial: the address the other nodes meet it at (IP, free port)."""
        import ray

        from explorer.launch._command import free_port

        return ray.util.get_node_ip_address(), free_port("")

    def run(
        self,
        job_json: str,
        work_dir: str,
        runner: str,
        timeout_s: float,
        zygote_prefix: str | None,
        rendezvous: tuple[str, int] | None = None,
        node_rank: int = 0,
    ) -> Measurement:
        """Run the trial's processes on this node; ``rendezvous`` (node 0's address) for one
        node of a multi-node trial, which always starts cold."""
        from explorer.launch._command import Rendezvous
        from explorer.launch._run import run_trial

        job = TrialJob.from_json(job_json)
        where = self.where()
        zygote = _node_zygote(zygote_prefix, where["ray_node"]) if zygote_prefix else None
        meet = (
            Rendezvous(rendezvous[0], int(rendezvous[1]), node_rank, job.config.number_nodes)
            if rendezvous is not None
            else None
        )
        measurement = run_trial(
            job,
            work_dir=Path(work_dir),
            runner=runner,
            timeout_s=timeout_s,
            warm_start=zygote is not None,
            zygote=zygote,
            rendezvous=meet,
            node_env={"EXPLORER_RAY_NODE": where["ray_node"], "EXPLORER_RAYLET_PID": where["raylet_pid"]},
        )

        import ray

        gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        node_extra: dict[str, Any] = {
            "cuda_visible_devices": gpus,
            "ray_resources": dict(ray.get_runtime_context().get_assigned_resources()),
            **where,
            "rank_nodes": rank_nodes(measurement.extra.get("ranks", [])),
        }
        if meet is not None:
            node_extra["node_rank"] = node_rank
        return Measurement(
            outcome=measurement.outcome,
            properties=measurement.properties,
            error=measurement.error,
            wall_seconds=measurement.wall_seconds,
            log_tail=measurement.log_tail,
            extra={**measurement.extra, **node_extra},
        )


class ZygoteHost:
    """Owns one node's warm-start zygote (a Ray actor per node, created by the driver).

    The zygote is this actor's child, so it dies with the actor, and the actor with the driver.
    It cannot belong to a trial's actor: Ray kills an actor's child processes when it exits.
    """

    def __init__(self, driver: tuple[str, int]) -> None:
        self.driver = driver

    def socket(self) -> str | None:
        """The zygote's socket; ``None`` when it cannot fork ranks (they start cold)."""
        from explorer.launch._command import zygote_environment
        from explorer.launch._warm import ensure_zygote

        # on the driver's host the zygote dies with the driver, even a SIGKILLed one (Ray's actors
        # linger for seconds after that); elsewhere it dies with this actor
        owner = self.driver[1] if self.driver[0] == socket.gethostname() else os.getpid()
        sock = ensure_zygote(owner_pid=owner, env=zygote_environment(cpu_count=os.cpu_count() or 1))
        return None if sock is None else str(sock)


_KEPT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def signals_kept(signals: tuple[signal.Signals, ...] = _KEPT_SIGNALS) -> Iterator[None]:
    """Keep this process's handlers of ``signals`` through the block (``ray.init``); one of the
    signals arriving within it ends the block at once and then goes to its handler.

    ``ray.init`` takes SIGTERM in the driver twice over. In Python: its own handler
    (``sys.exit(15)``: a SIGTERM while Ray started ended the driver with status 15, 30 s later),
    then the local node's (kill the node, exit 1). In C++: the driver's core worker installs
    Abseil's failure signal handler, which on SIGTERM writes a stack dump to the terminal
    ("*** SIGTERM received at time=...", "PC: @ ..." and the same again through Ray's log) and
    aborts the process 3 s later (status 134), whatever the Python handler does.

    Within the block neither is set: ``ray._private.utils.set_sigterm_handler``, which both Python
    handlers go through, does nothing, and ``ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER``
    (what ``RAY_DISABLE_FAILURE_SIGNAL_HANDLER=1`` sets) is on while the driver's core worker is
    made, so this process gets no Abseil handler: setting the handlers back after ``ray.init``
    alone left a second or so of ``ray.init`` in which a SIGTERM still printed the dump and
    aborted. Ray's worker processes and raylet keep theirs; their output goes to Ray's log files.
    The handlers are set back at the end all the same. A signal within the block raises
    ``KeyboardInterrupt`` at once (a ``kill -TERM`` of the whole process group, as Slurm sends,
    also kills the Ray processes being started, and ``ray.init`` would wait a minute for them);
    after the block it is raised again for the handler it had (explorer's ``StopRequest`` records
    it; the default ends the process), and the block ends in ``KeyboardInterrupt``, whatever the
    interrupted ``ray.init`` raised.
    """
    if threading.current_thread() is not threading.main_thread():  # only the main thread sets them
        yield
        return
    import ray

    came: list[int] = []

    def during(signum: int, frame: FrameType | None) -> None:
        if not came:
            came.append(signum)
            raise KeyboardInterrupt

    utils = getattr(getattr(ray, "_private", None), "utils", None)
    setter = getattr(utils, "set_sigterm_handler", None)
    constants = getattr(getattr(ray, "_private", None), "ray_constants", None)
    no_abseil = getattr(constants, "RAY_DISABLE_FAILURE_SIGNAL_HANDLER", None)
    saved = {signum: signal.getsignal(signum) for signum in signals}
    for signum, handler in saved.items():
        if handler is not signal.SIG_IGN:
            signal.signal(signum, during)
    if setter is not None:
        utils.set_sigterm_handler = _leave_sigterm_alone  # type: ignore[union-attr]
    if no_abseil is not None:
        constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True  # type: ignore[union-attr]
    try:
        yield
    except BaseException:  # after a signal, what an interrupted ray.init raises is its consequence
        if not came:
            raise
    finally:
        if setter is not None:
            utils.set_sigterm_handler = setter  # type: ignore[union-attr]
        if no_abseil is not None:
            constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = no_abseil  # type: ignore[union-attr]
        for signum, handler in saved.items():  # None: set outside Python; the default then
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
    if came:
        signal.raise_signal(came[0])  # to the handler it had: explorer's records it, the default ends us
        raise KeyboardInterrupt


_CLUSTER_VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray's switch (read when it is imported) for a node that others can reach; off, a node's address
is 127.0.0.1, as Ray's own default on macOS and Windows."""


@contextlib.contextmanager
def loopback_only() -> Iterator[None]:
    """The local Ray started within the block serves on 127.0.0.1 only: its GCS, raylet, agents
    (the dashboard agent's HTTP and Prometheus metrics), workers and autoscaler monitor.

    Ray binds each server to its node's address; the address of a node that ``ray.init`` starts is
    the machine's outward one (every interface for the servers, ``::``), unless Ray's
    ``ENABLE_RAY_CLUSTER`` switch is off, when it is 127.0.0.1 (``_node_ip_address="127.0.0.1"``
    alone is turned back into the outward address). The switch is read at import time in this
    process, and from the environment in the processes Ray starts (which keep the environment
    they started with): both are set for the block, and put back after it.
    """
    from ray._private import ray_constants

    saved_env = os.environ.get(_CLUSTER_VAR)
    saved = ray_constants.ENABLE_RAY_CLUSTER
    os.environ[_CLUSTER_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved
        if saved_env is None:
            os.environ.pop(_CLUSTER_VAR, None)
        else:
            os.environ[_CLUSTER_VAR] = saved_env


def _leave_sigterm_alone(handler: Any) -> None:
    """Ray's SIGTERM handler, not set: the driver's own stays (:func:`signals_kept`)."""


class _TokenNotice(logging.Filter):
    """Drops Ray's notice that it turned token authentication on for the local cluster it starts
    (Ray 2.5x's default; explorer keeps it on). It printed on every run and asked nothing of the user."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Token authentication is enabled for this Ray cluster")


def quiet_token_notice() -> None:
    """Silence :class:`_TokenNotice`'s message (once per process)."""
    log = logging.getLogger("ray._private.authentication.authentication_token_setup")
    if not any(isinstance(f, _TokenNotice) for f in log.filters):
        log.addFilter(_TokenNotice())


def _kill_ray_children() -> None:
    """SIGKILL the Ray processes among this process's descendants (GCS, raylet, its agents and
    workers): what an interrupted ``ray.init`` started. Ray's exit hook stops only the ones it
    started itself; the raylet's dashboard and runtime-env agents, stuck waiting for a GCS that
    was gone, outlived the driver by a minute, deaf to SIGTERM."""
    import psutil
    import ray

    home = os.path.dirname(ray.__file__)
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cmd = proc.cmdline()
            if cmd and (cmd[0].startswith("ray::") or any(home in arg for arg in cmd)):
                proc.kill()


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
    return None if sock is None else Path(str(sock))


@dataclass
class _Running:
    trial_number: int
    gpus: int
    gpu_model: str
    actor: Any
    ref: Any
    started: float
    """Unix time when the actor was asked for (its GPUs are the trial's from then on)."""
    deadline: float = float("inf")
    """Unix time by which the actor must have answered (the trial's timeout plus the grace)."""
    fault: InjectedFault | None = None
    """An injected launcher fault still to strike (``actor_kill``, ``node_restart``)."""
    where: Any = None
    """The actor's pending node report (``TrialActor.where``); ``None`` once ``node`` is known."""
    node: str | None = None


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
        gpu_models: dict[str, int] | None = None,
        grace_s: float = SCHEDULE_GRACE_S,
    ) -> None:
        self.total_gpus = total_gpus
        self.gpu_model = gpu_model
        self.address = address or os.environ.get("RAY_ADDRESS")
        self.gpu_models = dict(gpu_models) if gpu_models else {gpu_model: total_gpus}
        """The GPUs of each model the study may use at once."""
        self.placements = {
            m: ModelPlacement.typed(m, local=not self.address) if gpu_models else ModelPlacement.single(m)
            for m in self.gpu_models
        }
        """How a trial of each model is placed and counted (:class:`ModelPlacement`)."""
        self.runner = runner
        self.warm_start = warm_start
        self.timeout_s = timeout_s
        self.grace_s = grace_s
        """A trial's actor that has not answered ``timeout_s`` plus this long after it was asked
        for (hung, stopped, never placed) is killed and the trial FAILED."""
        self.output_dir = output_dir
        self._running: dict[Any, _Running] = {}
        self._multi: list[MultiNodeTrial] = []
        self._rejected: list[tuple[int, Measurement]] = []
        self._capacity: dict[str, dict[str, int]] = {}
        self._capacity_at: dict[str, float] = {}
        self._started_ray = False
        self._lost: str | None = None
        """What of the local Ray died, once the launcher saw it (:class:`RayLost`)."""
        self._messages = RayMessages(log_path=output_dir / "ray-messages.log", lost=self._dead)
        """Ray's error messages (a lost node's raylet log) go to the run folder, not the terminal."""
        self._zygote_prefix = f"explorer-zygote-{uuid.uuid4().hex[:12]}"
        self._zygote_hosts: list[Any] = []
        self.run_id = new_run_id()

    @classmethod
    def for_study(
        cls, spec: StudySpec, *, output_dir: Path, resources: ResourcesSpec | None = None
    ) -> RayLauncher:
        """The launcher a study file asks for (``resources`` overrides the study's)."""
        resources = resources or spec.resources
        config = launcher_section(spec, RayLauncherSpec)
        return cls(
            total_gpus=resources.total_gpus,
            gpu_model=resources.model,
            address=config.address,
            runner=config.runner,
            timeout_s=spec.measurement.trial_timeout_s,
            output_dir=output_dir,
            warm_start=config.warm_start,
            gpu_models=resources.gpu_models,
        )

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        import ray

        if ray.is_initialized():  # someone else's Ray (a test, a notebook): use it as it is
            if self.warm_start and not self._zygote_hosts:
                self._start_zygote_hosts()
            return
        common: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
        quiet_token_notice()
        try:
            with signals_kept():
                if self.address:
                    ray.init(address=self.address, **common)
                else:
                    with loopback_only():
                        ray.init(
                            num_gpus=self.total_gpus,
                            resources=local_resources(self.placements.values(), self.gpu_models),
                            runtime_env={"env_vars": {"RAY_DEDUP_LOGS": "0"}},
                            **common,
                        )
        except KeyboardInterrupt:  # a stop signal while Ray started: take down what did start
            if ray.is_initialized():
                ray.shutdown()
            else:  # stopped inside ray.init: no Ray to shut down, only the processes it started
                _kill_ray_children()
            raise
        self._started_ray = True
        self._messages.install()
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

    def _dead(self) -> str | None:
        """What of the Ray this launcher started has died (``None``: nothing, or not ours)."""
        if self._lost is None and self._started_ray:
            self._lost = dead_process()
        return self._lost

    def _check_alive(self) -> None:
        """Raise :class:`RayLost` once the Ray this launcher started has lost its GCS or raylet."""
        lost = self._dead()
        if lost is not None:
            raise RayLost(f"{lost}: the run cannot go on without it")

    def shutdown(self) -> None:
        import ray

        left = leftovers() if self._dead() is not None else []  # found while Ray can still tell
        for running in list(self._running.values()):
            ray.kill(running.actor, no_restart=True)
        self._running.clear()
        for multi in self._multi:
            multi.release()
        self._multi.clear()
        for host in self._zygote_hosts:
            ray.kill(host, no_restart=True)
        self._zygote_hosts.clear()
        if self._started_ray and ray.is_initialized():
            ray.shutdown()
        kill_leftovers(left)  # a dead raylet's workers and agents, or a live one's without its GCS
        self._messages.restore()

    # -- trials ---------------------------------------------------------------------------------

    @property
    def gpus_in_use(self) -> int:
        return sum(r.gpus for r in self._running.values()) + sum(m.gpus for m in self._multi)

    def _in_use(self, gpu_model: str) -> int:
        """The GPUs of ``gpu_model`` the running trials hold."""
        running = sum(r.gpus for r in self._running.values() if r.gpu_model == gpu_model)
        return running + sum(m.gpus for m in self._multi if m.gpu_model == gpu_model)

    @property
    def in_flight(self) -> int:
        return len(self._running) + len(self._multi) + len(self._rejected)

    def fits(self, number_gpus: int, number_nodes: int = 1, gpu_model: str | None = None) -> bool:
        """Whether a trial of ``number_gpus`` of ``gpu_model`` on ``number_nodes`` can start now
        without waiting (``gpu_model`` ``None``: of any model the study has).

        The study's GPUs of that model in all, and ``number_nodes`` Ray nodes with ``number_gpus /
        number_nodes`` GPUs of it free each (see :mod:`explorer.launch._placement`). A trial that
        no node set of the cluster could ever hold fits (it is submitted, and fails at once).
        """
        self._check_alive()
        models = [gpu_model or self.gpu_model] if gpu_model or len(self.gpu_models) == 1 else self.gpu_models
        return any(self._fits(number_gpus, number_nodes, m) for m in models)

    def _fits(self, number_gpus: int, number_nodes: int, gpu_model: str) -> bool:
        if self._in_use(gpu_model) + number_gpus > self.gpu_models.get(gpu_model, 0):
            return gpu_model not in self.gpu_models  # not declared: submit() fails it at once
        if not self._running and not self._multi:
            return True  # every GPU is free (and Ray may not be started yet); submit() checks the rest
        capacity = self._node_capacity(gpu_model)
        if not fits_on_nodes(capacity, [], number_gpus=number_gpus, number_nodes=number_nodes):
            return True  # never: submit() answers it FAILED with the reason
        shares = self._shares(gpu_model)
        return fits_on_nodes(capacity, shares, number_gpus=number_gpus, number_nodes=number_nodes)

    def _node_capacity(self, gpu_model: str, *, refresh: bool = False) -> dict[str, int]:
        """GPUs of ``gpu_model`` per alive node that has them, read from Ray at most every 10 s."""
        placement = self.placements.get(gpu_model)
        if placement is None:
            return {}
        stale = time.monotonic() - self._capacity_at.get(gpu_model, 0.0) > 10.0
        if refresh or not self._capacity.get(gpu_model) or stale:
            self._capacity[gpu_model] = node_capacity(placement)
            self._capacity_at[gpu_model] = time.monotonic()
        return self._capacity[gpu_model]

    def _shares(self, gpu_model: str) -> list[Share]:
        """Where the running trials' GPUs of ``gpu_model`` are, per actor (learning the nodes
        reported so far). Another model's GPUs are other GPUs: on a node of their own on a
        cluster, or the local Ray's own per-model count."""
        import ray

        waiting = [r for r in self._running.values() if r.where is not None]
        if waiting:
            ready, _ = ray.wait([r.where for r in waiting], num_returns=len(waiting), timeout=0)
            reported = set(ready)
            for running in waiting:
                if running.where in reported:
                    try:
                        report: dict[str, str] = ray.get(running.where)
                    except ray.exceptions.RayError:  # died before reporting: its run() says why,
                        report = {}  # and its GPUs count against every node until then
                    running.node = report.get("ray_node")
                    running.where = None
        shares = [Share(r.node, r.gpus) for r in self._running.values() if r.gpu_model == gpu_model]
        for multi in self._multi:
            multi.learn_nodes()
            shares += multi.shares() if multi.gpu_model == gpu_model else []
        return shares

    def submit(self, job: TrialJob) -> None:
        import ray

        self._check_alive()
        n = job.config.number_gpus
        nodes = job.config.number_nodes
        model = job.config.gpu_model or self.gpu_model
        capacity = self._node_capacity(model, refresh=True)
        if not fits_on_nodes(capacity, [], number_gpus=n, number_nodes=nodes):
            self._rejected.append((job.trial_number, self._cannot_place(n, nodes, model)))
            return
        placement = self.placements[model]
        actor_cls = ray.remote(TrialActor)
        work_dir = self.output_dir / f"trial-{job.trial_number:05d}"
        if nodes > 1:
            self._multi.append(
                MultiNodeTrial.submit(
                    job,
                    actor_cls=actor_cls,
                    placement=placement,
                    work_dir=work_dir,
                    runner=self.runner,
                    timeout_s=self.timeout_s,
                )
            )
            return
        actor = actor_cls.options(
            num_gpus=n,
            num_cpus=0,
            resources=placement.request(n),
            max_restarts=0,
            name=None,
        ).remote()
        run: Any = actor.run
        zygotes = self._zygote_prefix if self.warm_start else None
        ref = run.remote(job.to_json(), str(work_dir), self.runner, self.timeout_s, zygotes)
        where: Any = actor.where
        fault = job.fault if job.fault is not None and job.fault.kind in LAUNCHER_FAULTS else None
        now = time.time()
        self._running[ref] = _Running(
            job.trial_number,
            n,
            model,
            actor,
            ref,
            started=now,
            deadline=now + self.timeout_s + self.grace_s,
            fault=fault,
            where=where.remote(),
        )

    def _cannot_place(self, number_gpus: int, number_nodes: int, gpu_model: str) -> Measurement:
        per_node = number_gpus // number_nodes
        capacity = sorted(self._capacity.get(gpu_model, {}).values(), reverse=True)
        return Measurement(
            outcome=Outcome.FAILED,
            error=(
                f"the Ray cluster cannot place {number_nodes} x {per_node} GPUs of {gpu_model!r}: "
                f"its nodes have {capacity or 'no'} such GPUs"
            ),
        )

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
        error = "Ray: the node restarted; every trial on it was lost"
        lost = [(r.trial_number, r.gpus, r.started) for r in self._running.values()]
        lost += [(m.trial_number, m.gpus, m.started) for m in self._multi]
        for multi in self._multi:
            multi.release()
        self._running.clear()
        self._multi.clear()
        self._zygote_hosts.clear()
        self._started_ray = False  # the processes this shutdown ends are no loss of the Ray (_dead)
        ray.shutdown()
        self.start()
        failed = Measurement(outcome=Outcome.FAILED, error=error)
        return [(number, self._with_slot(failed, gpus, started)) for number, gpus, started in lost]

    def wait(self, timeout_s: float) -> list[tuple[int, Measurement]]:
        """Measurements of the trials that finished within ``timeout_s`` (possibly none)."""
        import ray
        from ray.exceptions import RayError

        self._check_alive()
        done: list[tuple[int, Measurement]] = self._rejected
        self._rejected = []
        lost = self._strike_faults()
        if lost:
            return done + lost
        done += self._overdue()
        refs = list(self._running) + [ref for multi in self._multi for ref in multi.pending_refs()]
        if not refs:
            return done
        if done:
            timeout_s = 0.0
        # wake up for a deadline or a multi-node grace period that runs out
        events = [r.deadline for r in self._running.values()] + [m.next_event() for m in self._multi]
        timeout_s = max(0.0, min(timeout_s, min(events) - time.time()))
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout_s)
        for ref in ready:
            running = self._running.pop(ref, None)
            if running is None:
                next(m for m in self._multi if ref in m.refs).receive(ref)
                continue
            try:
                measurement = ray.get(ref)
            except RayError as exc:  # the actor or its node died: the trial's failure, unless Ray's own
                self._running[ref] = running  # still in flight: interrupted, if the run ends here
                self._check_alive()
                del self._running[ref]
                measurement = Measurement(
                    outcome=Outcome.FAILED,
                    error=f"Ray: {error_line(exc)}",
                    wall_seconds=time.time() - running.started,
                )
            ray.kill(running.actor, no_restart=True)
            done.append((running.trial_number, self._with_slot(measurement, running.gpus, running.started)))
        now = time.time()
        for multi in list(self._multi):
            measurement_or_none = multi.finished(now)
            if measurement_or_none is None:
                continue
            multi.release()
            self._multi.remove(multi)
            done.append((multi.trial_number, self._with_slot(measurement_or_none, multi.gpus, multi.started)))
        return done

    def _overdue(self) -> list[tuple[int, Measurement]]:
        """The one-node trials whose actor has not answered by its deadline (hung, stopped, never
        placed): the actor killed, the trial FAILED."""
        import ray

        now = time.time()
        done = []
        for ref, running in list(self._running.items()):
            if now < running.deadline:
                continue
            del self._running[ref]
            ray.kill(running.actor, no_restart=True)
            failed = Measurement(
                outcome=Outcome.FAILED,
                error=(
                    f"no answer within {self.timeout_s:.0f} s (the trial's timeout) + {self.grace_s:.0f} s:"
                    " its Ray actor was killed"
                ),
                wall_seconds=now - running.started,
            )
            done.append((running.trial_number, self._with_slot(failed, running.gpus, running.started)))
        return done

    def _with_slot(self, measurement: Measurement, gpus: int, started: float) -> Measurement:
        slot = GpuSlot(
            run=self.run_id,
            clock="wall",
            pool=self.total_gpus,
            gpus=gpus,
            start=started,
            end=max(time.time(), started),
        )
        return slot.stamp(measurement)
