"""Multi-node trials on Ray, and the per-node GPU accounting every Ray trial goes through.

A trial with ``number_nodes`` = N > 1 and ``number_gpus`` = G gets a placement group of N bundles
``{"GPU": g, ...}`` (g = G / N; ``...``: the GPU model's resources, :class:`ModelPlacement`) with strategy ``STRICT_SPREAD`` (each bundle on a
different node), and one :class:`~explorer.launch.TrialActor` per bundle. The actor of bundle 0
picks the rendezvous address (its node's IP and a free port); every actor then runs
``torchrun --nnodes N --node_rank r --nproc_per_node g --master_addr A --master_port P`` (static
rendezvous) on its node. Global rank 0, on node 0, writes the measurement.

The outcome follows the one-node rules (:func:`explorer.launch.collect`), across nodes: an OOM on
any node wins; else the first failure to come back; else node 0's measurement. After the first
failure the other nodes get :data:`PEER_GRACE_S` to report their own errors; then, and whenever the
trial ends, every actor of the trial is killed (their ranks exit with them) and the placement group
is removed.

Accounting (:func:`fits_on_nodes`), per GPU model: the launcher knows each alive node's GPUs of
the model (:meth:`ModelPlacement.capacity`: the smaller of its ``GPU`` and ``<gpu_model>``
resources for one model) and, for each part of a running trial (one actor), its node
once the actor has reported it. A part whose node is not known yet counts against every node. A
trial fits when N distinct nodes each have g GPUs free; a one-node trial is the case N = 1.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from explorer.gpus import lookup
from explorer.job import TrialJob
from explorer.measurement import Measurement, Outcome

__all__ = [
    "ACCELERATOR_PREFIX",
    "LOST",
    "PEER_GRACE_S",
    "ModelPlacement",
    "accelerator_type",
    "local_resources",
    "MultiNodeTrial",
    "Share",
    "combine_nodes",
    "fits_on_nodes",
    "node_capacity",
    "rank_nodes",
]

LOST = "actor_lost"
"""Key in a node's ``Measurement.extra``: its actor (or its node) died before it answered."""
PEER_GRACE_S = 10.0
"""After one node of a trial fails, the others get this long to report their own errors."""
SCHEDULE_GRACE_S = 120.0
"""A multi-node trial that has not answered ``trial_timeout_s`` plus this long after it was
submitted (its placement group never placed, an actor that never started) is killed and FAILED."""


@dataclass(frozen=True)
class Share:
    """GPUs one actor of a running trial holds, on ``node`` (``None``: not known yet)."""

    node: str | None
    gpus: int


ACCELERATOR_PREFIX = "accelerator_type:"
"""Ray's node resource naming the GPU type of a node (``accelerator_type:H100``: 1), which Ray
sets on each node with GPUs."""
TYPE_SLIVER = 0.001
"""What an actor or bundle asks of ``accelerator_type:<type>`` (as Ray's own ``accelerator_type``
option does): the node must have it; every GPU of the node can be asked by a trial."""
_NVIDIA_NAME = re.compile(r"\w+\s+((?:[A-Z]+\s+)*[A-Z0-9]*\d[A-Z0-9]*)")
"""Ray's pattern for an NVIDIA device name (``ray/_private/accelerators/nvidia_gpu.py``)."""


def accelerator_type(gpu_model: str) -> str:
    """Ray's accelerator type of a GPU model's name, derived as Ray derives it from the device
    name, hyphens read as spaces: ``NVIDIA-H100-80GB-HBM3`` -> ``H100``, ``NVIDIA-A100-SXM4-80GB``
    -> ``A100``; a name without a model number is its own type (``CPU-small``). A GPU the table
    knows (:mod:`explorer.gpus`) takes its row's type (the same, computed with Ray's own code)."""
    gpu = lookup(gpu_model)
    if gpu is not None:
        return gpu.ray_type
    name = re.sub(r"[-_\s]+", " ", gpu_model).strip()
    match = _NVIDIA_NAME.match(name)
    result = match.group(1).replace(" ", "-") if match else None
    if result and len(result) > 1:
        return result
    return re.sub(r"^NVIDIA\s+", "", name).replace(" ", "-") or gpu_model


@dataclass(frozen=True, kw_only=True)
class ModelPlacement:
    """The Ray resources that place a trial of one GPU model, and count that model's GPUs per node.

    * one GPU model (``resources.gpu_model`` alone): ``count`` is its name, a custom resource each
      GPU node declares (as many as its GPUs); no ``node_type``;
    * several models on a cluster: ``node_type`` is Ray's ``accelerator_type:<type>``, set by Ray on
      each GPU node, asked as a sliver; no ``count``;
    * several models on the local Ray (logical GPUs, one node): both, declared at ``ray.init``: the
      per-model count keeps a trial of model A off model B's GPUs on the one node.
    """

    gpu_model: str
    count: str | None = None
    """A resource counted per GPU of the model (``None``: none)."""
    node_type: str | None = None
    """A resource the model's nodes have (``None``: none)."""

    @classmethod
    def single(cls, gpu_model: str) -> ModelPlacement:
        return cls(gpu_model=gpu_model, count=gpu_model)

    @classmethod
    def typed(cls, gpu_model: str, *, local: bool) -> ModelPlacement:
        node_type = ACCELERATOR_PREFIX + accelerator_type(gpu_model)
        return cls(gpu_model=gpu_model, count=gpu_model if local else None, node_type=node_type)

    def request(self, gpus: int) -> dict[str, float]:
        """The resources besides ``GPU`` an actor or a bundle of ``gpus`` GPUs asks for."""
        out: dict[str, float] = {}
        if self.count is not None:
            out[self.count] = gpus
        if self.node_type is not None:
            out[self.node_type] = TYPE_SLIVER
        return out

    def capacity(self, resources: Mapping[str, float]) -> int:
        """The GPUs of this model on a node with ``resources``."""
        gpus = resources.get("GPU", 0)
        if self.count is not None:
            gpus = min(gpus, resources.get(self.count, 0))
        if self.node_type is not None and resources.get(self.node_type, 0) <= 0:
            return 0
        return int(gpus)


def local_resources(placements: Iterable[ModelPlacement], gpus: Mapping[str, int]) -> dict[str, float]:
    """The custom resources a local Ray declares at ``ray.init`` so that ``placements`` place and
    count its logical GPUs (``gpus``: the GPUs of each model)."""
    out: dict[str, float] = {}
    for p in placements:
        if p.count is not None:
            out[p.count] = out.get(p.count, 0) + gpus[p.gpu_model]
        if p.node_type is not None:
            out[p.node_type] = 1
    return out


def node_capacity(placement: ModelPlacement | str) -> dict[str, int]:
    """GPUs of one model per alive Ray node (:meth:`ModelPlacement.capacity`; a name: one model,
    the smaller of the node's ``GPU`` and ``<name>`` resources). A node without the model's
    resources cannot run its trials."""
    import ray

    if isinstance(placement, str):
        placement = ModelPlacement.single(placement)
    capacity: dict[str, int] = {}
    for node in ray.nodes():
        gpus = placement.capacity(node.get("Resources", {}))
        if node.get("Alive") and gpus > 0:
            capacity[str(node["NodeID"])] = gpus
    return capacity


def fits_on_nodes(
    capacity: Mapping[str, int], held: Iterable[Share], *, number_gpus: int, number_nodes: int
) -> bool:
    """Whether ``number_nodes`` distinct nodes each have ``number_gpus / number_nodes`` GPUs free.

    A share on an unknown node is taken from every node (it may be on any), so the answer is never
    yes when Ray could not place the trial.
    """
    per_node = number_gpus // number_nodes
    used: Counter[str] = Counter()
    unknown = 0
    for share in held:
        if share.node is None:
            unknown += share.gpus
        else:
            used[share.node] += share.gpus
    free = [gpus - used[node] - unknown for node, gpus in capacity.items()]
    return sum(f >= per_node for f in free) >= number_nodes


def rank_nodes(ranks: Iterable[Mapping[str, Any]]) -> str:
    """``"<rank>@<ray node id>"`` for each rank record, space-separated (a flat value for exports)."""
    return " ".join(f"{rec.get('rank')}@{rec.get('ray_node')}" for rec in ranks)


def combine_nodes(
    parts: Mapping[int, Measurement], *, number_nodes: int, arrival: list[int], missing_error: str
) -> Measurement:
    """One trial's measurement from its nodes' (``parts``: node rank -> measurement).

    Args:
        parts: the measurements that came back, by node rank.
        number_nodes: nodes the trial ran on.
        arrival: node ranks in the order their answers came back (the first failure is usually
            the cause, the others its consequence).
        missing_error: the error for a node that never answered (it was killed).

    Returns:
        OOM if any node ran out of memory; else FAILED with a node whose actor died (``extra[LOST]``,
        its peers then fail for want of it) or else the first failure to come back (or
        ``missing_error``); else node 0's measurement. ``extra`` holds every rank's record
        (``ranks``), one record per node (``nodes``), and the ids of the Ray nodes by rank
        (``rank_nodes``, a string, for exports).
    """
    order = [r for r in arrival if r in parts] + [r for r in sorted(parts) if r not in arrival]
    # a node whose actor died is the cause; its peers' errors ("gloo: connection closed") follow
    order.sort(key=lambda r: not parts[r].extra.get(LOST, False))
    oom = [r for r in order if parts[r].outcome is Outcome.OOM]
    failed = [r for r in order if parts[r].outcome is Outcome.FAILED]
    missing = [r for r in range(number_nodes) if r not in parts]
    ranks = sorted(
        (rec for r in sorted(parts) for rec in parts[r].extra.get("ranks", [])),
        key=lambda rec: int(rec.get("rank", 0)),
    )
    nodes = [
        {
            "node_rank": r,
            **{k: parts[r].extra.get(k) for k in ("ray_node", "ip", "hostname", "raylet_pid", "log_file")},
            "outcome": parts[r].outcome.value,
            **({"error": parts[r].error} if parts[r].error else {}),
        }
        for r in sorted(parts)
    ]
    head = parts.get(0)
    extra: dict[str, Any] = dict(head.extra) if head is not None else {}
    extra.update(
        ranks=ranks,
        nodes=nodes,
        rank_nodes=rank_nodes(ranks),
    )
    wall = max((m.wall_seconds for m in parts.values()), default=0.0)

    def result(outcome: Outcome, error: str | None, source: Measurement | None) -> Measurement:
        src_extra = source.extra if source is not None else {}
        if "phases" in src_extra:
            extra["phases"] = src_extra["phases"]  # where the failing node's time went
        return Measurement(
            outcome=outcome,
            properties=source.properties if outcome is Outcome.OK and source is not None else None,
            error=error,
            wall_seconds=wall,
            log_tail=source.log_tail if source is not None else "",
            extra=extra,
        )

    if oom:
        return result(Outcome.OOM, f"node {oom[0]}: {parts[oom[0]].error}", parts[oom[0]])
    if failed:
        return result(Outcome.FAILED, f"node {failed[0]}: {parts[failed[0]].error}", parts[failed[0]])
    if missing:
        return result(Outcome.FAILED, f"node {missing[0]}: {missing_error}", head)
    if head is None or head.properties is None:
        return result(Outcome.FAILED, "node 0 reported no measurement", head)
    return result(Outcome.OK, None, head)


@dataclass
class MultiNodeTrial:
    """One trial's placement group, its actors (one per node) and their answers."""

    trial_number: int
    gpu_model: str
    """The GPU model the trial runs on."""
    number_nodes: int
    gpus_per_node: int
    started: float
    """Unix time when the placement group was asked for (the trial's GPUs are held from then)."""
    deadline: float
    pg: Any
    actors: list[Any]
    refs: dict[Any, int]
    """Pending ``run`` results: object ref -> node rank."""
    where: dict[Any, int]
    """Pending node reports (``TrialActor.where``): object ref -> node rank."""
    nodes: dict[int, str] = field(default_factory=dict)
    parts: dict[int, Measurement] = field(default_factory=dict)
    arrival: list[int] = field(default_factory=list)
    grace_until: float | None = None
    """Once a node failed: when the others are killed if they have not answered."""

    @classmethod
    def submit(
        cls,
        job: TrialJob,
        *,
        actor_cls: Any,
        placement: ModelPlacement,
        work_dir: Path,
        runner: str,
        timeout_s: float,
    ) -> MultiNodeTrial:
        """Ask Ray for the placement group and start one actor per bundle (returns at once)."""
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        n = job.config.number_nodes
        g = job.config.number_gpus // n
        pg = placement_group([{"GPU": g, **placement.request(g)}] * n, strategy="STRICT_SPREAD")
        actors = [
            actor_cls.options(
                num_gpus=g,
                num_cpus=0,
                resources=placement.request(g),
                max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=r),
            ).remote()
            for r in range(n)
        ]
        # node 0 picks the address; Ray hands its answer to every node's run() (a top-level ref)
        address = actors[0].rendezvous.remote()
        job_json = job.to_json()
        refs = {
            actor.run.remote(job_json, str(work_dir / f"node-{r}"), runner, timeout_s, None, address, r): r
            for r, actor in enumerate(actors)
        }
        where = {actor.where.remote(): r for r, actor in enumerate(actors)}
        now = time.time()
        return cls(
            trial_number=job.trial_number,
            gpu_model=placement.gpu_model,
            number_nodes=n,
            gpus_per_node=g,
            started=now,
            deadline=now + timeout_s + SCHEDULE_GRACE_S,
            pg=pg,
            actors=actors,
            refs=refs,
            where=where,
        )

    @property
    def gpus(self) -> int:
        return self.number_nodes * self.gpus_per_node

    def shares(self) -> list[Share]:
        """The GPUs this trial holds, per node (``None`` where an actor has not reported yet)."""
        return [Share(self.nodes.get(r), self.gpus_per_node) for r in range(self.number_nodes)]

    def pending_refs(self) -> list[Any]:
        return list(self.refs)

    def learn_nodes(self) -> None:
        """Take in the node reports that have arrived (never blocks)."""
        import ray

        if not self.where:
            return
        ready, _ = ray.wait(list(self.where), num_returns=len(self.where), timeout=0)
        for ref in ready:
            rank = self.where.pop(ref)
            try:
                self.nodes[rank] = str(ray.get(ref)["ray_node"])
            except ray.exceptions.RayError:  # the actor died before reporting: its run() says why
                continue

    def receive(self, ref: Any) -> None:
        """Take in one node's answer (``ref`` is one of :meth:`pending_refs`, and ready)."""
        import ray
        from ray.exceptions import RayError

        from explorer.launch._ray_messages import error_line

        rank = self.refs.pop(ref)
        try:
            part: Measurement = ray.get(ref)
        except RayError as exc:  # the actor, its node, or node 0's rendezvous died
            part = Measurement(outcome=Outcome.FAILED, error=f"Ray: {error_line(exc)}", extra={LOST: True})
        self.parts[rank] = part
        self.arrival.append(rank)
        if part.outcome is not Outcome.OK and self.grace_until is None:
            self.grace_until = time.time() + PEER_GRACE_S

    def next_event(self) -> float:
        """The Unix time by which :meth:`finished` may change without an answer arriving."""
        return min(self.deadline, self.grace_until or self.deadline)

    def finished(self, now: float) -> Measurement | None:
        """The trial's measurement once every node answered, or the grace or deadline ran out."""
        if self.refs and now < self.next_event():
            return None
        if self.refs:
            why = (
                f"killed {PEER_GRACE_S:.0f} s after another node failed"
                if self.grace_until is not None and now >= self.grace_until
                else f"no answer within {self.deadline - self.started:.0f} s (placement or start)"
            )
        else:
            why = "no answer"
        return combine_nodes(
            self.parts, number_nodes=self.number_nodes, arrival=self.arrival, missing_error=why
        )

    def release(self) -> None:
        """Kill every actor of the trial (their ranks exit with them) and remove the placement group."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.refs.clear()
        self.where.clear()
        remove_placement_group(self.pg)
