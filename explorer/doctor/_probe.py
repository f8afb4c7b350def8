"""What a node offers the trials: its device, GPUs (NVML), torch, CUDA and NCCL versions, and each
optional package a knob's value needs, with its version or why it does not import.

It runs in a child process with the environment the trials' ranks get (``python -m
explorer.doctor._probe``): a package that a trial's environment cannot import (a ``PYTHONPATH``
that differs, a broken CUDA library) shows here as it would in the trial, and the driver never
imports torch or touches CUDA.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["optional_modules", "probe", "probe_in_child"]

GIB = 2**30


def optional_modules() -> tuple[str, ...]:
    """Every Python module a knob's value needs (``flash_attn``, ``liger_kernel``, ...), as the
    knobs declare them (:attr:`explorer.knobs.Knob.needs`)."""
    from explorer.knobs import knobs

    found = {n.module for k in knobs() for n in k.needs.values() if n.module}
    return tuple(sorted(found))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip().rstrip(":")


def _package(module: str) -> dict[str, str | None]:
    """``{"version": ..., "error": None}`` when ``module`` imports, else its first error line."""
    from importlib.metadata import PackageNotFoundError, packages_distributions, version

    try:
        imported = importlib.import_module(module)
    except BaseException as exc:  # an ImportError, or a CUDA library failing as it loads
        return {"version": None, "error": _first_line(exc)}
    found = getattr(imported, "__version__", None)
    for dist in packages_distributions().get(module.split(".")[0], []):
        try:
            found = version(dist)
            break
        except PackageNotFoundError:
            continue
    return {"version": str(found) if found else "unknown", "error": None}


def _gpus() -> tuple[list[dict[str, Any]], str | None]:
    """The node's GPUs by NVML (name, memory in GiB) and the driver's version."""
    from explorer.worker._metrics import load_nvml

    nvml = load_nvml()
    if nvml is None:
        return [], None
    gpus = []
    for i in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        name = nvml.nvmlDeviceGetName(handle)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle).total
        gpus.append(
            {"name": name.decode() if isinstance(name, bytes) else str(name), "memory_gib": memory / GIB}
        )
    driver = nvml.nvmlSystemGetDriverVersion()
    return gpus, driver.decode() if isinstance(driver, bytes) else str(driver)


def probe(modules: Sequence[str]) -> dict[str, Any]:
    """This process's view of the node (a plain JSON mapping)."""
    from importlib.metadata import version

    import torch

    cuda = torch.cuda.is_available()
    gpus, driver = _gpus()
    nccl = None
    if cuda and torch.distributed.is_nccl_available():
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    return {
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count() or 0,
        "cuda_available": cuda,
        "visible_gpus": torch.cuda.device_count() if cuda else 0,
        "gpus": gpus,
        "driver": driver,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "transformers": version("transformers"),
        "trl": _package("trl"),  # workload.trainer: trl (the optional extra explorer[trl])
        "packages": {m: _package(m) for m in modules},
    }


def probe_in_child(env: dict[str, str], *, timeout_s: float = 300.0) -> dict[str, Any]:
    """:func:`probe` in a fresh interpreter with environment ``env`` (the trials' own)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="explorer-doctor-") as tmp:
        out = Path(tmp) / "probe.json"
        cmd = [sys.executable, "-m", "explorer.doctor._probe", "--out", str(out), *optional_modules()]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0 or not out.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()
            raise RuntimeError(f"the node probe failed: {tail[-1] if tail else proc.returncode}")
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m explorer.doctor._probe")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("modules", nargs="*")
    ns = parser.parse_args(argv)
    ns.out.write_text(json.dumps(probe(ns.modules)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
