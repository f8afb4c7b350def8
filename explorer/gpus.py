"""The one table of GPU facts (peak, memory, bandwidth, link, Ray type), each with its public source.

Every other module asks this one: the FLOPs peaks (:mod:`explorer.flops`), the physics' memory limit
and link (:mod:`explorer.search._physics`), ``explorer estimate``. The numbers are those of
``benchmarks/evidence/gpus.csv`` (``tests/test_gpus.py`` checks that they are equal and that each
carries the CSV's source). A card the table does not know is never priced as another: the study
declares its figures (``resources.gpu``), or the answer says which figures are missing
(:func:`missing_figures`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from explorer.spec import ResourcesSpec

__all__ = [
    "FIGURES",
    "GPUS",
    "Gpu",
    "describe_measured",
    "gpu_figures",
    "is_cpu_model",
    "lookup",
    "missing_figures",
    "study_figures",
]

FIGURES = ("bf16_tflops", "memory_gib", "bandwidth_tbs", "link_gbs")
"""The figures a study declares for a GPU the table does not know (``resources.gpu``)."""
DECLARED = "declared in the study file (resources.gpu)"
MEASURED = "measured on the node by explorer doctor (the study's record)"
_MEASURED_AS = {
    "bf16_tflops": "matmul_tflops",
    "memory_gib": "allocatable_gib",
    "bandwidth_tbs": "memory_bandwidth_tbs",
    "link_gbs": "allreduce_busbw_gbs",
}
"""The figure each of ``explorer doctor``'s measurements stands for (``docs/doctor.md``)."""


@dataclass(frozen=True, kw_only=True)
class Gpu:
    """One GPU model's data-sheet figures."""

    label: str
    """The NVML name hyphenated, as the studies, Kubernetes and Ray's custom resources write it."""
    nvml_name: str
    """What NVML, ``nvidia-smi`` and ``torch.cuda.get_device_name()`` return."""
    ray_type: str
    """Ray's accelerator type, as Ray derives it from the NVML name (``accelerator_type:<type>``)."""
    keys: tuple[str, ...]
    """The name parts that pick this row: every one of them is a part of the name (between
    hyphens or spaces); the row with the most characters of keys wins."""
    bf16_tflops: float | None
    """Dense bf16 tensor-core peak, TFLOP/s (no 2:4 sparsity); ``None``: no bf16 tensor cores."""
    fp16_tflops: float | None
    """The fp16 tensor peak of a card without bf16 (T4, V100), which prices its mixed precision."""
    memory_gb: float
    """Memory as marketed, GB."""
    cuda_gib: float | None
    """Total memory CUDA reports (``torch.cuda.get_device_properties().total_memory``), GiB;
    ``None``: not found in a public source."""
    bandwidth_tbs: float
    """Peak memory bandwidth, TB/s."""
    link: str
    """The GPU-to-GPU link inside a node: ``nvlink`` or ``pcie``."""
    link_gbs: float
    """That link's bandwidth per GPU, GB/s, both directions (NVIDIA's convention)."""
    sources: Mapping[str, str] = field(default_factory=dict)
    """Where each figure comes from (a URL or a repository path), by the field's name."""
    busbw_gbs: float | None = None
    """The all-reduce bus bandwidth ``explorer doctor`` measured between the node's devices
    (nccl-tests' convention), GB/s; ``None``: not measured (the physics assumes one by the link)."""
    inter_node_gbs: float | None = None
    """The all-reduce bus bandwidth ``explorer doctor`` measured between two nodes of a Ray
    cluster, GB/s; ``None``: not measured (the physics assumes a fabric)."""
    fabric_gbs: float | None = None
    """The compute fabric between nodes, per GPU, of NVIDIA's reference node for the card (DGX),
    GB/s line rate, one direction; ``None``: no reference (the physics assumes a fabric)."""

    @property
    def peak_flops(self) -> float:
        """The tensor peak that prices bf16 (fp16 on a card without bf16), FLOP/s."""
        return float(self.bf16_tflops or self.fp16_tflops or 0.0) * 1e12

    @property
    def nvlink(self) -> bool:
        """Whether the GPUs of a node talk over NVLink (else PCIe)."""
        return self.link == "nvlink"


def _parts(name: str) -> set[str]:
    """The parts of a device name between hyphens, spaces and underscores, upper case."""
    return {p for p in re.split(r"[-\s_/]+", name.strip().upper()) if p}


def is_cpu_model(name: str | None) -> bool:
    """A CPU study's stand-in model (``CPU-logical``, ``CPU-small``): processes, not GPUs."""
    return bool(name) and str(name).upper().startswith("CPU")


def lookup(name: str | None) -> Gpu | None:
    """The table's row for a GPU name (``NVIDIA-H100-80GB-HBM3``, ``NVIDIA H100 80GB HBM3``,
    ``H100``), or ``None``: not a card the table knows. The row whose keys are all parts of the
    name and cover the most characters wins (``NVIDIA-GH200-480GB`` is the GH200, not the H200)."""
    if not name or is_cpu_model(name):
        return None
    parts = _parts(name)
    best: tuple[int, Gpu] | None = None
    for gpu in GPUS:
        if all(k in parts for k in gpu.keys):
            score = sum(len(k) for k in gpu.keys)
            if best is None or score > best[0]:
                best = (score, gpu)
    return best[1] if best else None


def _declared(declared: Any) -> dict[str, float]:
    """The figures a study declares (``resources.gpu``: a mapping or an object), the unset left out."""
    if declared is None:
        return {}
    get = declared.get if isinstance(declared, Mapping) else lambda k: getattr(declared, k, None)
    return {k: float(v) for k in FIGURES if (v := get(k)) is not None}


def _measured(node: Mapping[str, Any] | None) -> dict[str, float]:
    """The figures ``explorer doctor`` measured on a node (its record's ``matmul_tflops``,
    ``allocatable_gib``, ...), as the table's figures; those it did not measure left out."""
    if not node or node.get("error"):
        return {}
    found = {k: node.get(m) for k, m in _MEASURED_AS.items()}
    return {
        k: float(v)
        for k, v in found.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and v > 0
    }


def gpu_figures(
    name: str | None, declared: Any = None, measured: Mapping[str, Any] | None = None
) -> Gpu | None:
    """The figures of a GPU: the table's row, the figures ``explorer doctor`` measured on the node
    over it (``measured``: its record), the study's declared figures over both (a power-capped or
    unlisted card: the user's explicit word wins); ``None``: none of them knows them all
    (:func:`missing_figures`). A measured all-reduce bus bandwidth stands for the link of a device
    the table does not know (a CPU's processes), and prices the collectives (:attr:`Gpu.busbw_gbs`)."""
    row, given, found = lookup(name), _declared(declared), _measured(measured)
    if row is not None:  # the table's link is NVIDIA's per-GPU figure, not a bus bandwidth
        found.pop("link_gbs", None)
    if row is None and len({**found, **given}) < len(FIGURES):
        return None
    base: dict[str, Any] = (
        {
            "bf16_tflops": row.bf16_tflops or row.fp16_tflops,
            "memory_gib": row.memory_gb,
            "bandwidth_tbs": row.bandwidth_tbs,
            "link_gbs": row.link_gbs,
        }
        if row
        else {}
    )
    if not given and not found and not (measured or {}).get("inter_node"):
        return row
    figures = {**base, **found, **given}
    if row and "link_gbs" not in given:
        link = row.link
    elif "link_gbs" in given:
        link = "nvlink" if figures["link_gbs"] >= 300 else "pcie"
    else:  # a device the table does not know, its link measured: the collectives' backend
        link = str((measured or {}).get("backend") or "measured")
    sources = dict(row.sources) if row else {}
    sources.update({_FIELD[k]: MEASURED for k in found})
    sources.update({_FIELD[k]: DECLARED for k in given})
    memory = {**found, **given}.get("memory_gib")
    busbw = _measured(measured).get("link_gbs")
    between = _measured((measured or {}).get("inter_node")).get("link_gbs")
    return Gpu(
        label=row.label if row else str(name),
        nvml_name=row.nvml_name if row else str(name),
        ray_type=row.ray_type if row else str(name),
        keys=row.keys if row else (),
        bf16_tflops=figures["bf16_tflops"],
        fp16_tflops=None,
        memory_gb=figures["memory_gib"],
        cuda_gib=memory if memory is not None else row.cuda_gib if row else None,
        bandwidth_tbs=figures["bandwidth_tbs"],
        link=link,
        link_gbs=figures["link_gbs"],
        sources=sources,
        busbw_gbs=busbw,
        inter_node_gbs=between,
        fabric_gbs=row.fabric_gbs if row else None,
    )


_FIELD = {
    "bf16_tflops": "bf16_tflops",
    "memory_gib": "memory_gb",
    "bandwidth_tbs": "bandwidth_tbs",
    "link_gbs": "link_gbs",
}
"""The table's field that each declared figure stands for."""


def missing_figures(
    name: str | None, declared: Any = None, measured: Mapping[str, Any] | None = None
) -> str | None:
    """One line saying which ``resources.gpu`` figures a study on an unknown GPU must declare,
    or ``None``: the table knows the card, it is a CPU stand-in, or the study declares (or
    ``explorer doctor`` measured) them all."""
    if not name or is_cpu_model(name) or gpu_figures(name, declared, measured) is not None:
        return None
    given = {**_measured(measured), **_declared(declared)}
    need = ", ".join(k for k in FIGURES if k not in given)
    return (
        f"{name} is not a GPU the table knows (explorer/gpus.py), so it is not priced: declare "
        f"resources.gpu: {{{need}}} from its data sheet (memory_gib: the total that "
        "torch.cuda.get_device_properties reports on the node)"
    )


GPUS: tuple[Gpu, ...] = (
    Gpu(
        label="NVIDIA-A100-SXM4-40GB",
        nvml_name="NVIDIA A100-SXM4-40GB",
        ray_type="A100",
        keys=("A100", "40GB"),
        bf16_tflops=312.0,
        fp16_tflops=None,
        memory_gb=40.0,
        cuda_gib=39.5,
        bandwidth_tbs=1.555,
        link="nvlink",
        link_gbs=600.0,
        sources={
            "bf16_tflops": "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
            "memory_gb": "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
            "bandwidth_tbs": "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
            "link_gbs": "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
            "cuda_gib": "https://github.com/TianheWu/CoSeR/issues/10 (OOM message on 'one A100', 40 GB variant implied by the total; SXM/PCIe not stated)",
        },
    ),
    Gpu(
        label="NVIDIA-A100-PCIE-40GB",
        nvml_name="NVIDIA A100-PCIE-40GB",
        ray_type="A100",
        keys=("A100", "40GB", "PCIE"),
        bf16_tflops=312.0,
        fp16_tflops=None,
        memory_gb=40.0,
        cuda_gib=None,
        bandwidth_tbs=1.555,
        link="pcie",
        link_gbs=64.0,
        sources={
            "bf16_tflops": "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
            "memory_gb": "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
            "bandwidth_tbs": "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
            "link_gbs": "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
        },
    ),
    Gpu(
        label="NVIDIA-A100-SXM4-80GB",
        nvml_name="NVIDIA A100-SXM4-80GB",
        ray_type="A100",
        keys=("A100", "80GB"),
        bf16_tflops=312.0,
        fp16_tflops=None,
        memory_gb=80.0,
        cuda_gib=79.14,
        bandwidth_tbs=2.039,
        link="nvlink",
        link_gbs=600.0,
        sources={
            "bf16_tflops": "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
            "memory_gb": "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
            "bandwidth_tbs": "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
            "link_gbs": "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
            "cuda_gib": "https://github.com/lianqi1008/Control-GIC/issues/6 (2025, 'single NVIDIA A100 ... 80GB'; variant not stated). Other reports: 79.25 GiB https://github.com/levihsu/OOTDiffusion/issues/235 ; A800-80G 79.33 GiB https://github.com/hahnyuan/PB-LLM/issues/3",
        },
    ),
    Gpu(
        label="NVIDIA-A100-80GB-PCIe",
        nvml_name="NVIDIA A100 80GB PCIe",
        ray_type="A100",
        keys=("A100", "80GB", "PCIE"),
        bf16_tflops=312.0,
        fp16_tflops=None,
        memory_gb=80.0,
        cuda_gib=None,
        bandwidth_tbs=1.935,
        link="pcie",
        link_gbs=64.0,
        sources={
            "bf16_tflops": "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
            "memory_gb": "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
            "bandwidth_tbs": "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
            "link_gbs": "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
        },
    ),
    Gpu(
        label="NVIDIA-H100-80GB-HBM3",
        nvml_name="NVIDIA H100 80GB HBM3",
        ray_type="H100",
        keys=("H100",),
        bf16_tflops=989.0,
        fp16_tflops=None,
        memory_gb=80.0,
        cuda_gib=79.18,
        bandwidth_tbs=3.35,
        link="nvlink",
        link_gbs=900.0,
        fabric_gbs=50.0,
        sources={
            "fabric_gbs": "https://docs.nvidia.com/dgx-basepod/reference-architecture-infrastructure-foundation-enterprise-ai/latest/core-components.html (DGX H100: eight single-port ConnectX-7, up to 400 Gb/s each, for eight GPUs)",
            "bf16_tflops": "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet (1,979 with sparsity; dense = half)",
            "memory_gb": "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
            "bandwidth_tbs": "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
            "link_gbs": "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
            "cuda_gib": "benchmarks/results/gpu_check.h100.jsonl (project's own H100 run: OOM message 'GPU 0 has a total capacity of 79.18 GiB'; driver 580.159.04, torch 2.11.0+cu130)",
        },
    ),
    Gpu(
        label="NVIDIA-H100-PCIe",
        nvml_name="NVIDIA H100 PCIe",
        ray_type="H100",
        keys=("H100", "PCIE"),
        bf16_tflops=756.0,
        fp16_tflops=None,
        memory_gb=80.0,
        cuda_gib=None,
        bandwidth_tbs=2.0,
        link="pcie",
        link_gbs=128.0,
        sources={
            "bf16_tflops": "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet (older revision listing H100 PCIe: 1,513 sparse)",
            "memory_gb": "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
            "bandwidth_tbs": "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet (older revision)",
            "link_gbs": "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet (older revision)",
        },
    ),
    Gpu(
        label="NVIDIA-H100-NVL",
        nvml_name="NVIDIA H100 NVL",
        ray_type="H100",
        keys=("H100", "NVL"),
        bf16_tflops=835.0,
        fp16_tflops=None,
        memory_gb=94.0,
        cuda_gib=None,
        bandwidth_tbs=3.9,
        link="nvlink",
        link_gbs=600.0,
        sources={
            "bf16_tflops": "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet (1,671 with sparsity)",
            "memory_gb": "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
            "bandwidth_tbs": "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
            "link_gbs": "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
        },
    ),
    Gpu(
        label="NVIDIA-H200",
        nvml_name="NVIDIA H200",
        ray_type="H200",
        keys=("H200",),
        bf16_tflops=989.0,
        fp16_tflops=None,
        memory_gb=141.0,
        cuda_gib=139.8,
        bandwidth_tbs=4.8,
        link="nvlink",
        link_gbs=900.0,
        fabric_gbs=50.0,
        sources={
            "fabric_gbs": "https://docs.nvidia.com/dgx-basepod/reference-architecture-infrastructure-foundation-enterprise-ai/latest/core-components.html (DGX H200: eight single-port ConnectX-7, up to 400 Gb/s each, for eight GPUs)",
            "cuda_gib": "benchmarks/results/gpu/2026-11-28/measure-default.jsonl (project's own H200 run: OOM message 'GPU 0 has a total capacity of 139.80 GiB')",
            "bf16_tflops": "https://www.nvidia.com/en-us/data-center/h200/ (1,979 with sparsity)",
            "memory_gb": "https://www.nvidia.com/en-us/data-center/h200/",
            "bandwidth_tbs": "https://www.nvidia.com/en-us/data-center/h200/",
            "link_gbs": "https://www.nvidia.com/en-us/data-center/h200/",
        },
    ),
    Gpu(
        label="NVIDIA-H200-NVL",
        nvml_name="NVIDIA H200 NVL",
        ray_type="H200",
        keys=("H200", "NVL"),
        bf16_tflops=835.0,
        fp16_tflops=None,
        memory_gb=141.0,
        cuda_gib=None,
        bandwidth_tbs=4.8,
        link="nvlink",
        link_gbs=900.0,
        sources={
            "bf16_tflops": "https://www.nvidia.com/en-us/data-center/h200/ (1,671 with sparsity)",
            "memory_gb": "https://www.nvidia.com/en-us/data-center/h200/",
            "bandwidth_tbs": "https://www.nvidia.com/en-us/data-center/h200/",
            "link_gbs": "https://www.nvidia.com/en-us/data-center/h200/",
        },
    ),
    Gpu(
        label="NVIDIA-GH200-480GB",
        nvml_name="NVIDIA GH200 480GB",
        ray_type="GH200",
        keys=("GH200",),
        bf16_tflops=989.0,
        fp16_tflops=None,
        memory_gb=96.0,
        cuda_gib=None,
        bandwidth_tbs=4.0,
        link="nvlink",
        link_gbs=900.0,
        sources={
            "bf16_tflops": "https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/ (Hopper GPU of H100-SXM class; GH200 materials quote ~1,979 sparse = ~989 dense BF16; exact value varies with the module power, not confirmed from a datasheet here)",
            "memory_gb": "https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/",
            "bandwidth_tbs": "https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/",
            "link_gbs": "https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/",
        },
    ),
    Gpu(
        label="NVIDIA-B200",
        nvml_name="NVIDIA B200",
        ray_type="B200",
        keys=("B200",),
        bf16_tflops=2250.0,
        fp16_tflops=None,
        memory_gb=180.0,
        cuda_gib=None,
        bandwidth_tbs=8.0,
        link="nvlink",
        link_gbs=1800.0,
        fabric_gbs=50.0,
        sources={
            "fabric_gbs": "https://docs.nvidia.com/dgx-basepod/reference-architecture-infrastructure-foundation-enterprise-ai/latest/core-components.html (DGX B200: 8x single-port ConnectX-7, up to 400 Gb/s each, for eight GPUs)",
            "bf16_tflops": "https://glennklockwood.com/garden/processors/B200 (HGX B200 at 1,000 W: BF16 2,250 dense / 4,500 sparse; DGX B200 72 PFLOPS FP8 training per 8 GPUs is consistent) ; https://www.nvidia.com/en-us/data-center/dgx-b200/",
            "memory_gb": "https://www.nvidia.com/en-us/data-center/dgx-b200/ (1,440 GB total per 8 GPUs; launch material said 192 GB)",
            "bandwidth_tbs": "https://www.nvidia.com/en-us/data-center/dgx-b200/ (64 TB/s per 8 GPUs); HGX page lists up to 7.7 TB/s",
            "link_gbs": "https://www.nvidia.com/en-us/data-center/hgx/",
        },
    ),
    Gpu(
        label="NVIDIA-GB200",
        nvml_name="NVIDIA GB200",
        ray_type="GB200",
        keys=("GB200",),
        bf16_tflops=2500.0,
        fp16_tflops=None,
        memory_gb=186.0,
        cuda_gib=184.31,
        bandwidth_tbs=8.0,
        link="nvlink",
        link_gbs=1800.0,
        sources={
            "bf16_tflops": "https://www.nvidia.com/en-us/data-center/gb200-nvl72/ (NVL72: 360 PFLOPS FP16/BF16 with sparsity per 72 GPUs -> 5,000 sparse / 2,500 dense per GPU); https://glennklockwood.com/garden/processors/B200",
            "memory_gb": "https://www.nvidia.com/en-us/data-center/gb200-nvl72/ (up to 13.4 TB HBM3e per 72 GPUs); seed 004 calls it GB200-186GB / 192 GB",
            "cuda_gib": "https://github.com/vllm-project/vllm/issues/43951 (OOM message on 4x NVIDIA GB200: 'GPU 3 has a total capacity of 184.31 GiB'); the same figure on GB200 in https://github.com/vllm-project/vllm/issues/52511",
            "bandwidth_tbs": "https://www.nvidia.com/en-us/data-center/gb200-nvl72/ (576 TB/s per 72 GPUs)",
            "link_gbs": "https://www.nvidia.com/en-us/data-center/gb200-nvl72/",
        },
    ),
    Gpu(
        label="NVIDIA-L4",
        nvml_name="NVIDIA L4",
        ray_type="L4",
        keys=("L4",),
        bf16_tflops=121.0,
        fp16_tflops=None,
        memory_gb=24.0,
        cuda_gib=22.03,
        bandwidth_tbs=0.3,
        link="pcie",
        link_gbs=64.0,
        sources={
            "bf16_tflops": "https://www.nvidia.com/en-us/data-center/l4/ (242 with sparsity)",
            "memory_gb": "https://www.nvidia.com/en-us/data-center/l4/",
            "bandwidth_tbs": "https://www.nvidia.com/en-us/data-center/l4/",
            "link_gbs": "https://www.nvidia.com/en-us/data-center/l4/",
            "cuda_gib": "https://github.com/ArcInstitute/evo2/issues/190 (OOM on an L4)",
        },
    ),
    Gpu(
        label="NVIDIA-L40",
        nvml_name="NVIDIA L40",
        ray_type="L40",
        keys=("L40",),
        bf16_tflops=181.0,
        fp16_tflops=None,
        memory_gb=48.0,
        cuda_gib=44.4,
        bandwidth_tbs=0.864,
        link="pcie",
        link_gbs=64.0,
        sources={
            "bf16_tflops": "https://www.nvidia.com/en-us/data-center/l40/ (362 with sparsity)",
            "memory_gb": "https://www.nvidia.com/en-us/data-center/l40/",
            "bandwidth_tbs": "https://www.nvidia.com/en-us/data-center/l40/",
            "link_gbs": "https://www.nvidia.com/en-us/data-center/l40/",
            "cuda_gib": "https://github.com/QwenLM/Qwen3-VL/issues/2097 (OOM on a single L40)",
        },
    ),
    Gpu(
        label="NVIDIA-L40S",
        nvml_name="NVIDIA L40S",
        ray_type="L40S",
        keys=("L40S",),
        bf16_tflops=362.0,
        fp16_tflops=None,
        memory_gb=48.0,
        cuda_gib=44.42,
        bandwidth_tbs=0.864,
        link="pcie",
        link_gbs=64.0,
        sources={
            "bf16_tflops": "https://www.nvidia.com/en-us/data-center/l40s/ (733 with sparsity)",
            "memory_gb": "https://www.nvidia.com/en-us/data-center/l40s/",
            "bandwidth_tbs": "https://www.nvidia.com/en-us/data-center/l40s/",
            "link_gbs": "https://www.nvidia.com/en-us/data-center/l40s/",
            "cuda_gib": "https://github.com/stepfun-ai/Step-Video-T2V/issues/8 (OOM on 8x L40S)",
        },
    ),
    Gpu(
        label="NVIDIA-A10",
        nvml_name="NVIDIA A10",
        ray_type="A10",
        keys=("A10",),
        bf16_tflops=125.0,
        fp16_tflops=None,
        memory_gb=24.0,
        cuda_gib=None,
        bandwidth_tbs=0.6,
        link="pcie",
        link_gbs=64.0,
        sources={
            "bf16_tflops": "https://www.nvidia.com/en-us/data-center/products/a10-gpu/ (250 with sparsity)",
            "memory_gb": "https://www.nvidia.com/en-us/data-center/products/a10-gpu/",
            "bandwidth_tbs": "https://www.nvidia.com/en-us/data-center/products/a10-gpu/",
            "link_gbs": "https://www.nvidia.com/en-us/data-center/products/a10-gpu/",
        },
    ),
    Gpu(
        label="NVIDIA-A10G",
        nvml_name="NVIDIA A10G",
        ray_type="A10G",
        keys=("A10G",),
        bf16_tflops=70.0,
        fp16_tflops=None,
        memory_gb=24.0,
        cuda_gib=22.49,
        bandwidth_tbs=0.6,
        link="pcie",
        link_gbs=64.0,
        sources={
            "bf16_tflops": "https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/ (secondary source; NVIDIA publishes no A10G datasheet) -- treat as weakly sourced",
            "memory_gb": "https://aws.amazon.com/ec2/instance-types/g5/",
            "bandwidth_tbs": "https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/",
            "link_gbs": "unsourced (PCIe Gen4 assumed from A10 silicon)",
            "cuda_gib": "https://github.com/AUTOMATIC1111/stable-diffusion-webui/issues/1259 (2022, older driver)",
        },
    ),
    Gpu(
        label="NVIDIA-RTX-A6000",
        nvml_name="NVIDIA RTX A6000",
        ray_type="RTX-A6000",
        keys=("RTX", "A6000"),
        bf16_tflops=154.8,
        fp16_tflops=None,
        memory_gb=48.0,
        cuda_gib=None,
        bandwidth_tbs=0.768,
        link="pcie",
        link_gbs=64.0,
        sources={
            "bf16_tflops": "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf (Peak BF16 Tensor TFLOPS with FP32 accumulate 154.8 / 309.7 sparse)",
            "memory_gb": "https://www.nvidia.com/en-us/design-visualization/rtx-a6000/",
            "bandwidth_tbs": "https://www.nvidia.com/en-us/design-visualization/rtx-a6000/",
            "link_gbs": "https://www.nvidia.com/en-us/design-visualization/rtx-a6000/",
        },
    ),
    Gpu(
        label="NVIDIA-GeForce-RTX-4090",
        nvml_name="NVIDIA GeForce RTX 4090",
        ray_type="GeForce-RTX-4090",
        keys=("RTX", "4090"),
        bf16_tflops=165.2,
        fp16_tflops=None,
        memory_gb=24.0,
        cuda_gib=23.64,
        bandwidth_tbs=1.008,
        link="pcie",
        link_gbs=64.0,
        sources={
            "bf16_tflops": "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf (Peak BF16 Tensor TFLOPS with FP32 accumulate 165.2 / 330.4 sparse; FP16-accumulate is 330.3 dense)",
            "memory_gb": "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf",
            "bandwidth_tbs": "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf",
            "link_gbs": "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf",
            "cuda_gib": "https://github.com/3DTopia/Phidias-Diffusion/issues/8 (2025); 23.68 GiB in https://github.com/zai-org/CogVideo/issues/36 (2023)",
        },
    ),
    Gpu(
        label="Tesla-T4",
        nvml_name="Tesla T4",
        ray_type="T4",
        keys=("T4",),
        bf16_tflops=None,
        fp16_tflops=65.0,
        memory_gb=16.0,
        cuda_gib=14.75,
        bandwidth_tbs=0.32,
        link="pcie",
        link_gbs=32.0,
        sources={
            "bf16_tflops": "no BF16 tensor cores (Turing, sm_75); FP16 mixed-precision 65 TFLOP/s per https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf",
            "memory_gb": "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf",
            "bandwidth_tbs": "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf",
            "link_gbs": "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf",
            "cuda_gib": "https://github.com/hpcaitech/Open-Sora/issues/697 (Colab T4)",
        },
    ),
    Gpu(
        label="Tesla-V100-SXM2-16GB",
        nvml_name="Tesla V100-SXM2-16GB",
        ray_type="V100",
        keys=("V100", "16GB"),
        bf16_tflops=None,
        fp16_tflops=125.0,
        memory_gb=16.0,
        cuda_gib=None,
        bandwidth_tbs=0.9,
        link="nvlink",
        link_gbs=300.0,
        sources={
            "bf16_tflops": "no BF16 (Volta); FP16 tensor 125 TFLOP/s (SXM2), 112 (PCIe) per https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf",
            "memory_gb": "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf",
            "bandwidth_tbs": "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf",
            "link_gbs": "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf",
        },
    ),
    Gpu(
        label="Tesla-V100-SXM2-32GB",
        nvml_name="Tesla V100-SXM2-32GB",
        ray_type="V100",
        keys=("V100", "32GB"),
        bf16_tflops=None,
        fp16_tflops=125.0,
        memory_gb=32.0,
        cuda_gib=None,
        bandwidth_tbs=0.9,
        link="nvlink",
        link_gbs=300.0,
        sources={
            "bf16_tflops": "no BF16 (Volta); FP16 tensor 125 TFLOP/s (SXM2), 112 (PCIe) per https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf",
            "memory_gb": "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf",
            "bandwidth_tbs": "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf",
            "link_gbs": "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf",
        },
    ),
    Gpu(
        label="NVIDIA-A40",
        nvml_name="NVIDIA A40",
        ray_type="A40",
        keys=("A40",),
        bf16_tflops=149.7,
        fp16_tflops=None,
        memory_gb=48.0,
        cuda_gib=None,
        bandwidth_tbs=0.696,
        link="pcie",
        link_gbs=64.0,
        sources={
            "bf16_tflops": "https://images.nvidia.com/content/Solutions/data-center/a40/nvidia-a40-datasheet.pdf (299.4 with sparsity)",
            "memory_gb": "https://images.nvidia.com/content/Solutions/data-center/a40/nvidia-a40-datasheet.pdf",
            "bandwidth_tbs": "https://images.nvidia.com/content/Solutions/data-center/a40/nvidia-a40-datasheet.pdf",
            "link_gbs": "https://images.nvidia.com/content/Solutions/data-center/a40/nvidia-a40-datasheet.pdf",
        },
    ),
    Gpu(
        label="NVIDIA-RTX-6000-Ada-Generation",
        nvml_name="NVIDIA RTX 6000 Ada Generation",
        ray_type="RTX-6000",
        keys=("RTX", "6000", "ADA"),
        bf16_tflops=364.2,
        fp16_tflops=None,
        memory_gb=48.0,
        cuda_gib=None,
        bandwidth_tbs=0.96,
        link="pcie",
        link_gbs=64.0,
        sources={
            "bf16_tflops": "derived: https://www.nvidia.com/en-us/design-visualization/rtx-6000/ lists 1,457 TFLOP/s FP8 with sparsity; BF16 dense = /4 (Ada ratio). Not directly quoted -> weakly sourced",
            "memory_gb": "https://www.nvidia.com/en-us/design-visualization/rtx-6000/",
            "bandwidth_tbs": "https://www.nvidia.com/en-us/design-visualization/rtx-6000/",
            "link_gbs": "https://www.nvidia.com/en-us/design-visualization/rtx-6000/",
        },
    ),
)
"""The cards, one row each (V100: its 16 and 32 GB parts), from ``benchmarks/evidence/gpus.csv``."""


def study_figures(resources: ResourcesSpec, node: dict[str, Any] | None) -> Gpu | None:
    """The figures that price a study (:func:`explorer.gpus.gpu_figures`: the table's, the
    node's measured ones over them, the declared ones over both); ``None``: a CPU study without
    measured figures (ranked at the physics' stand-in, not priced). A CPU node's memory is shared
    by its processes: each gets the measured allocatable memory over ``gpus_per_node``."""
    cpu = resources.device == "cpu" or is_cpu_model(resources.gpu_model)
    if node and node.get("device") == "cpu" and node.get("allocatable_gib"):
        node = {**node, "allocatable_gib": node["allocatable_gib"] / resources.gpus_per_node}
    if cpu and not node:
        return None
    return gpu_figures(resources.gpu_model, resources.gpu, node)


def describe_measured(gpu: Gpu, node: dict[str, Any]) -> str:
    """The figures that price the study, where ``explorer doctor`` measured the node."""
    dtype = node.get("matmul_dtype") if gpu.sources.get("bf16_tflops") == MEASURED else "bf16"
    bus = f", all-reduce bus {gpu.busbw_gbs:.4g} GB/s" if gpu.busbw_gbs else ""
    if gpu.inter_node_gbs:
        bus += f", between nodes {gpu.inter_node_gbs:.4g} GB/s"
    return (
        f"{gpu.peak_flops / 1e12:.4g} TFLOP/s {dtype}, {gpu.memory_gb:.4g} GiB, {gpu.link} "
        f"{gpu.link_gbs:.4g} GB/s{bus}; measured by explorer doctor"
    )
