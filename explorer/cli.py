"""The ``explorer`` command line. Imports stay light until a command needs torch, Ray or Optuna."""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from explorer.errors import SpecError
from explorer.measurement import Measurement

if TYPE_CHECKING:
    import optuna

    from explorer.spec import LoadedStudy

__all__ = ["main"]

_STUDY_HELP = "the study file (YAML): workload, resources, search space, storage"
_STORAGE_HELP = "an SQLAlchemy URL (sqlite:///..., postgresql://...) instead of the study file's storage"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="explorer",
        description="Find the fastest way to run an LLM fine-tuning job on given hardware: an Optuna "
        "study over batch size, GPUs, sharding, checkpointing, padding and more, each trial a real "
        "Hugging Face fine-tuning benchmark, maximizing dataset tokens per second per GPU.",
        epilog="Start with `explorer validate STUDY.yaml`, then `explorer optimize STUDY.yaml`; "
        "`explorer COMMAND --help` describes each command.",
    )
    parser.add_argument("--version", action="version", version=f"explorer {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _optimize_arguments(sub)
    _measure_arguments(sub)
    _benchmark_search_arguments(sub)
    _export_arguments(sub)
    _report_arguments(sub)
    _utilization_arguments(sub)
    _status_arguments(sub)
    _dashboard_arguments(sub)
    _best_arguments(sub)
    _verify_arguments(sub)
    _plan_arguments(sub)
    _audit_arguments(sub)
    _validate_arguments(sub)
    _estimate_arguments(sub)
    _doctor_arguments(sub)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("explorer")
    except PackageNotFoundError:  # run from a source tree that was never installed
        from explorer import __version__

        return __version__


def _optimize_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    opt = sub.add_parser(
        "optimize",
        help="run (or resume) a study: Optuna proposes, Ray actors benchmark",
        description="Run the study in STUDY.yaml until n_trials trials are done. Running it again on "
        "the same storage continues the study; trials interrupted by a crash are re-run.",
    )
    opt.add_argument("study", metavar="STUDY.yaml", help=_STUDY_HELP)
    opt.add_argument("--storage", metavar="URL", help=_STORAGE_HELP)
    opt.add_argument("--n-trials", type=int, metavar="N", help="total trials; overrides the study file")
    opt.add_argument(
        "--reclaim-running",
        action="store_true",
        help="also re-run RUNNING trials of explorer processes on other hosts (only if they are dead)",
    )
    opt.add_argument(
        "--debug", action="store_true", help="on an error, print its traceback (secrets masked), not one line"
    )
    opt.add_argument(
        "--no-hub-check",
        action="store_true",
        help="do not require a hub model id to be cached or reachable from this machine (a cluster's "
        "workers may reach the hub where the driver cannot)",
    )


def _measure_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    mea = sub.add_parser(
        "measure",
        help="benchmark one configuration outside any study (the same code path as a trial)",
        description="Run one configuration of STUDY.yaml's workload and print every measured property. "
        "With --repeats K, also the stability of the configuration (f_gpu_oom, f_other_error, "
        "f_no_error) and the coefficient of variation of its throughput.",
    )
    mea.add_argument(
        "study", metavar="STUDY.yaml", help="the study file whose workload and resources are used"
    )
    mea.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", help="a configuration field (repeatable)"
    )
    mea.add_argument("--config", metavar="FILE", help="a YAML mapping of configuration fields")
    mea.add_argument(
        "--repeats", type=int, default=1, metavar="K", help="measure the configuration K times (default 1)"
    )
    mea.add_argument("--no-memory-cap", action="store_true", help="ignore the study's device_memory_gib")
    mea.add_argument("--json", metavar="PATH", help="also write every measurement as JSON lines")


def _benchmark_search_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = sub.add_parser(
        "benchmark-search",
        help="replay a recorded table: how many trials each sampler needs to find its best",
        description="Run the study against TABLE (a CSV as `explorer export` writes it, or as ado, the "
        "orchestrator whose SFTTrainer benchmark explorer grew from, exports one) REPEATS times per "
        "variant (default: explorer's TPE with local search and OOM inference; no-inference: without "
        "inference; no-priors: without the memory and throughput priors; cover-start: without the "
        "frontier walk; tpe-every-3: TPE every third trial; no-local-search: without local search; "
        "random; optuna: Optuna's TPE defaults; gp: Optuna's GPSampler; model: the joint models of "
        "throughput and memory proposing instead of local search) "
        "and report the trials needed to reach 98% of the table's best.",
    )
    bench.add_argument("study", metavar="STUDY.yaml", help="the study whose space and sampler are replayed")
    bench.add_argument(
        "--table", required=True, metavar="CSV", help="the recorded table that answers every trial"
    )
    bench.add_argument(
        "--repeats", type=int, default=20, metavar="R", help="runs per variant, seeds 0..R-1 (default 20)"
    )
    bench.add_argument("--n-trials", type=int, default=60, metavar="N", help="counted trials per run")
    bench.add_argument(
        "--variants",
        default=None,
        metavar="LIST",
        help="comma-separated variants to run (default: all of them)",
    )
    bench.add_argument("--json", metavar="PATH", help="also write the figures as JSON")


def _export_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    exp = sub.add_parser(
        "export",
        help="write a study's trials as CSV or JSON (one row a trial; replayable)",
        description="Write every trial of the study, one row each: its configuration, status, measured "
        "properties and reason. The columns are those of ado's `show entities` export (ado: the "
        "orchestrator whose SFTTrainer benchmark explorer grew from), so the file can be replayed "
        "by `explorer benchmark-search --table` or read by ado's tools.",
    )
    exp.add_argument("study", metavar="STUDY.yaml", help=_STUDY_HELP)
    exp.add_argument("--storage", metavar="URL", help=_STORAGE_HELP)
    exp.add_argument("--format", choices=["csv", "json"], default="csv", help="file format (default csv)")
    exp.add_argument("--out", metavar="PATH", help="default: <output_dir>/<study name>.<format>")
    exp.add_argument("--csv", metavar="PATH", help="the same as --format csv --out PATH")


def _report_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rep = sub.add_parser(
        "report",
        help="figures of a study (PNG), an HTML page embedding them, and Optuna artifacts",
        description="Write DIR/index.html (default DIR: <output_dir>/report): the best configuration "
        "with its figures and the explorer best command, the top ten and why each lost to it; then "
        "figures: throughput by tokens per step, the throughput/peak-memory frontier, total throughput "
        "by GPU count, measured memory against the cap, time and cost by GPU count (a study file with a "
        "budget), the optimization history, the feasibility map, "
        "parameter importances and the Pareto front (multi-objective studies). The figures are also "
        "attached to the study as Optuna artifacts (<output_dir>/artifacts) for optuna-dashboard.",
    )
    rep.add_argument("study", metavar="STUDY.yaml", help=_STUDY_HELP)
    rep.add_argument("--storage", metavar="URL", help=_STORAGE_HELP)
    rep.add_argument("--out", metavar="DIR", help="the report folder (default: <output_dir>/report)")


def _utilization_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    use = sub.add_parser(
        "utilization",
        help="GPU-slot utilization of a study: GPU-seconds held by trials over the pool's",
        description="sum(gpus x (end - start)) / (G x (last end - first start)) over the stored "
        "trials, run by run (a replay study on its virtual clock, a Ray study on the wall clock).",
    )
    use.add_argument("study", metavar="STUDY.yaml", help=_STUDY_HELP)
    use.add_argument("--storage", metavar="URL", help=_STORAGE_HELP)


def _status_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sta = sub.add_parser(
        "status",
        help="a table of a study's trials; safe while the study runs (reads only)",
        description="Print every trial of the study: number, state, status, configuration, "
        "throughput, wall seconds and, for an infeasible or failed trial, the reason. The storage is "
        "opened read-only; nothing is created, and a running study is not disturbed.",
    )
    sta.add_argument("study", metavar="STUDY.yaml", help=_STUDY_HELP)
    sta.add_argument("--storage", metavar="URL", help=_STORAGE_HELP)


def _dashboard_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    das = sub.add_parser(
        "dashboard",
        help="serve optuna-dashboard on the study's storage and artifact store",
        description="Start optuna-dashboard on the study's storage, with the artifact store in "
        "<output_dir>/artifacts; bound to 127.0.0.1 unless --host says otherwise. Ctrl-C stops it.",
    )
    das.add_argument("study", metavar="STUDY.yaml", help=_STUDY_HELP)
    das.add_argument("--storage", metavar="URL", help=_STORAGE_HELP)
    das.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    das.add_argument("--port", type=int, default=8080, metavar="N", help="default 8080")
    das.add_argument(
        "--allow-writes",
        action="store_true",
        help="let the dashboard change the study (delete or rename it, tell trials, edit notes); "
        "without it every such request is refused (403)",
    )


def _best_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    best = sub.add_parser(
        "best",
        help="the best feasible configuration as an accelerate config, TrainingArguments and commands",
        description="Write the study's best feasible configuration as an accelerate config (from "
        "launchers/accelerate), its TrainingArguments and a job file, print its measured figures, the "
        "runners-up within noise, and the torchrun / accelerate launch commands that train it.",
    )
    best.add_argument("study", metavar="STUDY.yaml", help=_STUDY_HELP)
    best.add_argument("--storage", metavar="URL", help=_STORAGE_HELP)
    best.add_argument("--out", metavar="DIR", help="folder for the files (default: <output_dir>/best)")
    best.add_argument(
        "--steps", type=int, default=20, metavar="N", help="measured steps the printed commands train for"
    )


def _verify_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ver = sub.add_parser(
        "verify",
        help="launch a trial's written files as a user would; compare its throughput with the study's",
        description="Launch the trial's files (default: the best; written afresh into "
        "<output_dir>/verify/trial-N/files, or --files DIR such as <output_dir>/best) with the user "
        "command run_settings.json holds (a stock Trainer, real processes), on the study's data and "
        "under its device_memory_gib; print its tokens/s per GPU and peak memory beside the trial's, "
        "the ratio and whether it is within the trial's noise. Exit 1 on out-of-memory, a failed "
        "launch, a result outside the noise or files that differ from the trial's, with the likely cause.",
    )
    ver.add_argument("study", metavar="STUDY.yaml", help=_STUDY_HELP)
    ver.add_argument("--storage", metavar="URL", help=_STORAGE_HELP)
    ver.add_argument(
        "--trial", type=int, metavar="N", help="the trial (default: the files' trial, else the best)"
    )
    ver.add_argument("--steps", type=int, default=20, metavar="N", help="measured steps after the warmup")
    ver.add_argument("--files", metavar="DIR", help="launch this folder of explorer best's files instead")
    ver.add_argument(
        "--launch",
        choices=("torchrun", "accelerate", "sft"),
        default="torchrun",
        help="which of run_settings.json's user commands (default torchrun)",
    )
    ver.add_argument(
        "--timeout", type=float, default=600.0, metavar="S", help="seconds before the launch is killed"
    )


def _plan_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    plan = sub.add_parser(
        "plan",
        help="how long and how much the real run takes: the fastest, the cheapest, and the cheapest "
        "that meets a deadline",
        description="Read finished studies of one workload (one per GPU model, or one) and print, for "
        "each GPU model and GPU count, the best configuration with its predicted wall-clock time, "
        "GPU-hours, cost and whether it meets the deadline. GPU counts above the largest measured one "
        "(up to --max-gpus) come from a per-strategy scaling fit, marked as extrapolated with its band; "
        "the fit's error on measured points held back from it is printed too. Writes explorer best's "
        "files for the cheapest run that meets the deadline (else the cheapest). Each value may also "
        "come from the study file's budget and prices sections.",
    )
    plan.add_argument(
        "study",
        metavar="STUDY.yaml",
        nargs="+",
        help=_STUDY_HELP + "; several: one workload on other GPU models",
    )
    plan.add_argument("--storage", metavar="URL", help=_STORAGE_HELP + " (every study's)")
    plan.add_argument("--tokens", metavar="N", help="dataset tokens in one epoch (2e9, 2B, 500M)")
    plan.add_argument("--epochs", metavar="E", help="passes over the dataset (default 1)")
    plan.add_argument("--deadline", metavar="TIME", help="wall-clock limit: 36h, 1.5d, 90m, or hours")
    plan.add_argument(
        "--max-gpus", type=int, metavar="G", help="most GPUs the run may hold (default: the most measured)"
    )
    plan.add_argument(
        "--global-batch",
        type=int,
        metavar="B",
        help="samples per optimizer step that the run's recipe fixes (the batch over all GPUs times "
        "gradient accumulation): plan only configurations that keep it",
    )
    plan.add_argument(
        "--price",
        action="append",
        default=[],
        metavar="MODEL=USD",
        help="USD per GPU-hour of a GPU model (repeat per model; overrides the study file's prices)",
    )
    plan.add_argument(
        "--out", metavar="DIR", help="folder for the chosen run's files (default: <output_dir>/plan)"
    )
    plan.add_argument(
        "--steps", type=int, default=20, metavar="N", help="measured steps the printed commands train for"
    )


def _audit_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    aud = sub.add_parser(
        "audit",
        help="check that every trial is accounted for (after faults, kills and resumes)",
        description="Check the study's accounting: every counted trial feasible, infeasible with a "
        "reason, or failed with its error after its retries; every other trial a retry, an interrupted "
        "attempt or a reused answer that leads to one; nothing RUNNING or left waiting; no measurement "
        "written ahead on disk missing from the storage; no configuration measured twice; n_trials "
        "honoured; injected faults ended as defined. Exit status 1 if anything is wrong.",
    )
    aud.add_argument("study", metavar="STUDY.yaml", help=_STUDY_HELP)
    aud.add_argument("--storage", metavar="URL", help=_STORAGE_HELP)
    aud.add_argument("--json", action="store_true", help="print the audit as JSON")


def _validate_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    val = sub.add_parser(
        "validate",
        help="check a study file and its search space; write nothing",
        description="Check STUDY.yaml and its search space as `optimize` would (every field, every "
        "parameter and each searched value that no valid configuration can take, the model and dataset "
        "files, a hub model id, the storage URL and its driver, the Ray address, a local CUDA GPU) and list each "
        "parameter with its values. Nothing is created or written; a problem is one line naming the "
        "file and field, with exit status 2.",
    )
    val.add_argument("study", metavar="STUDY.yaml", help="the study file to check")
    val.add_argument("--storage", metavar="URL", help=_STORAGE_HELP)
    val.add_argument(
        "--n-trials", type=int, metavar="N", help="check with this n_trials instead of the file's"
    )
    val.add_argument(
        "--offline",
        action="store_true",
        help="check a study meant for another machine: do not probe the Ray cluster (launcher.address / "
        "RAY_ADDRESS), the Hugging Face hub (a model id) nor this machine's GPU (device: cuda)",
    )


def _estimate_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    est = sub.add_parser(
        "estimate",
        help="predict each configuration's tokens/s per GPU and peak memory, before or after trials",
        description="Rank STUDY.yaml's valid configurations by predicted dataset tokens/s per GPU, "
        "each with its predicted peak memory, whether it fits and a band: the physics alone before any "
        "trial, calibrated to the study's measured trials after. No GPU, Ray or hub access needed "
        "(the model's architecture in the study file). A GPU the table does not know: exit 2 naming "
        "the resources.gpu figures to declare.",
    )
    est.add_argument("study", metavar="STUDY.yaml", help=_STUDY_HELP)
    est.add_argument("--storage", metavar="URL", help=_STORAGE_HELP)
    est.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="only the configurations with this knob value (repeat; every knob set: one configuration)",
    )
    est.add_argument("--top", type=int, default=10, metavar="N", help="print the N best (default 10)")
    est.add_argument("--json", action="store_true", help="one JSON object per configuration")


def _doctor_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    doc = sub.add_parser(
        "doctor",
        help="check this node: device, packages, and one smoke step of every knob value of the study",
        description="Report this node's device, GPUs (NVML), torch/CUDA/NCCL versions and optional "
        "packages; measure its matmul TFLOP/s, allocatable memory and the bus bandwidth of "
        "all-reduce and all-gather (gloo on the CPU, NCCL on GPUs, and between two nodes of the "
        "study's Ray cluster); then run one short smoke step (the study's model, the smallest batch) for each "
        "value of each knob in STUDY.yaml's space that the node can take: ran, failed (first error "
        "line) or not applicable (why). Values this node cannot run are recorded with the study: "
        "`optimize` records them invalid before launch; the measured figures too: `estimate` "
        "prices the study with them. Exit status 1 when a value failed.",
    )
    doc.add_argument("study", metavar="STUDY.yaml", help=_STUDY_HELP)
    doc.add_argument("--storage", metavar="URL", help=_STORAGE_HELP)
    doc.add_argument("--json", action="store_true", help="print the findings as JSON instead of a table")
    doc.add_argument(
        "--no-record",
        action="store_true",
        help="do not record the findings with the study (write nothing there)",
    )
    doc.add_argument(
        "--resume",
        action="store_true",
        help="go on where an earlier doctor of this study stopped: the values it found are kept "
        "(its rows.jsonl in the run folder), and the node's figures recorded on the study are reused",
    )
    doc.add_argument(
        "--node-only",
        action="store_true",
        help="probe and measure the node only, no smoke runs (seconds, not minutes); the figures "
        "and the values the node cannot run at all (a package or CUDA missing) are recorded with "
        "the study, beside the values an earlier doctor found",
    )


_CANNOT_WRITE = frozenset({errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EFBIG})
"""A write refused by the filesystem (read-only, full, over quota, not permitted): the writing
verbs (``export``, ``report``, ``best``, ``plan --out``) say it in one line, not a traceback."""


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from explorer.errors import library_log_lines

    library_log_lines()
    try:
        if args.command == "optimize":
            return _optimize(args)
        if args.command == "validate":
            return _validate(args)
        if args.command == "estimate":
            from explorer.estimate import run

            return run(args.study, storage=args.storage, sets=args.set, top=args.top, as_json=args.json)
        if args.command == "measure":
            return _measure(args)
        if args.command == "benchmark-search":
            return _benchmark_search(args)
        if args.command == "export":
            return _export(args)
        if args.command == "utilization":
            return _utilization(args)
        if args.command == "report":
            return _report(args)
        if args.command == "status":
            return _status(args)
        if args.command == "dashboard":
            return _dashboard(args)
        if args.command == "best":
            return _best(args)
        if args.command == "verify":
            return _verify(args)
        if args.command == "plan":
            return _plan(args)
        if args.command == "audit":
            return _audit(args)
        if args.command == "doctor":
            return _doctor(args)
    except SpecError as exc:
        print(f"explorer: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C; SIGTERM, SIGHUP too in ``optimize`` (its Interrupted)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except OSError:  # a hung-up terminal (EIO): Python's last flush would make the status 120
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, stream.fileno())
                os.close(devnull)
        return 128 + int(getattr(exc, "signum", signal.SIGINT))  # as a shell reports a process it ended
    except BrokenPipeError:  # `explorer status ... | head`: the reader has all it wanted
        sys.stderr.close()
        return 0
    except Exception as exc:  # a storage failing mid-command, or a bug: printed with no secret in it
        from explorer.errors import crash_text, run_error_line

        if isinstance(exc, OSError) and exc.errno in _CANNOT_WRITE and args.command != "optimize":
            where = f"{exc.filename}: " if exc.filename else ""
            print(f"explorer: error: cannot write {where}{exc.strerror or exc}", file=sys.stderr)
            return 1

        one_line = args.command == "optimize" and not args.debug  # its trials are marked by then
        sys.stderr.write(run_error_line(exc) if one_line else crash_text(exc))
        return 1
    finally:
        storages = sys.modules.get("explorer.study._storage")  # not imported: none was opened
        if storages is not None:
            storages.close_opened()
    raise AssertionError(args.command)


def _validate(args: argparse.Namespace) -> int:
    from explorer.study_file import load_study

    loaded = load_study(
        args.study, storage=args.storage, n_trials=args.n_trials, check_launcher=not args.offline
    )
    from explorer.hardware import check_priced
    from explorer.study import check_writable

    check_priced(loaded.spec, args.study)  # a GPU the table of GPUs does not know, undeclared
    check_writable(loaded)  # the storage and run folder optimize writes
    print(
        f"{args.study}: ok: study {loaded.spec.name!r}, {len(loaded.space.domains)} parameters, "
        f"at most {loaded.space.size} configurations, {loaded.spec.n_trials} trials"
        + (" (the Ray address, the hub and the GPU were not probed)" if args.offline else "")
    )
    for name, domain in loaded.space.domains.items():  # every knob the study sets, searched or fixed
        how = "fixed" if len(domain.values) == 1 else "searched"
        print(f"  {name}: {', '.join(map(str, domain.values))} ({how})")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from explorer.doctor import FAILED, record_findings, render_table, run_doctor
    from explorer.estimate import recorded_node
    from explorer.launch import launcher_kind
    from explorer.study_file import load_study

    loaded = load_study(args.study, storage=args.storage)
    nothing_runs = launcher_kind(loaded.spec).runs_nothing(loaded.spec)
    if nothing_runs is not None:
        raise SpecError(file=args.study, field="launcher.kind", problem=nothing_runs)
    report = run_doctor(
        loaded,
        on_row=lambda r: print(f"  {r.knob}={r.value}: {r.status}", file=sys.stderr, flush=True),
        smoke_runs=not args.node_only,
        resume=args.resume,
        measured=recorded_node(loaded) if args.resume else None,
    )
    print(report.to_json() if args.json else render_table(report))
    if not args.no_record:
        recorded = record_findings(loaded, report, node_only=args.node_only)
        n = sum(len(v) for v in recorded["invalid"].get(report.gpu_model, {}).values())
        what = "the node's figures; " if args.node_only else ""
        print(
            f"recorded with study {loaded.spec.name!r}: {what}optimize records {n} values invalid "
            f"on {report.gpu_model}",
            file=sys.stderr,
        )
    return 1 if any(r.status == FAILED for r in report.rows) else 0


def _measure(args: argparse.Namespace) -> int:
    from explorer.measure import config_from_cli, measure, none_measured
    from explorer.stability import summarize
    from explorer.study_file import load_study
    from explorer.validity import invalid_reason

    if args.repeats < 1:
        raise SpecError(file="--repeats", field="", problem=f"{args.repeats} must be at least 1")
    loaded = load_study(args.study)
    config = config_from_cli(loaded, sets=args.set, config_file=args.config)
    reason = invalid_reason(config, loaded.spec.resources)
    if reason:
        raise SpecError(file="--set", field="", problem=f"invalid configuration: {reason}")
    print(f"measuring {config.key()} x{args.repeats}")
    sink = open(args.json, "w") if args.json else None  # noqa: SIM115 - closed below

    def show(i: int, m: Measurement) -> None:
        print(
            f"repeat {i + 1}: {m.outcome.value} ({m.wall_seconds:.1f} s){': ' + m.error if m.error else ''}"
        )
        if m.properties is not None and args.repeats == 1:
            for key, value in m.properties.to_dict().items():
                print(f"  {key:38} {value}")
            for key in ("wrapper", "checkpointing", "fingerprint"):
                print(f"  {key:38} {m.extra.get(key)}")
        elif m.properties is not None:
            p = m.properties
            print(
                f"  dataset_tokens_per_second_per_gpu {p.dataset_tokens_per_second_per_gpu:.1f}"
                f"  steps {p.measured_steps}  rel_ci {p.step_time_rel_ci}  stop {p.stop_reason}"
            )
        imprecise = m.properties.imprecise(loaded.spec.measurement.target_rel_ci) if m.properties else None
        if imprecise:
            print(f"  warning: {imprecise}")
        if sink is not None:
            sink.write(m.to_json() + "\n")
            sink.flush()

    try:
        results = measure(
            loaded,
            config,
            repeats=args.repeats,
            memory_cap_gib=None if args.no_memory_cap else "study",
            on_result=show,
        )
    finally:
        if sink is not None:
            sink.close()
    if args.repeats > 1:
        s = summarize(results)
        print(
            f"stability over {s.n}: f_gpu_oom {s.f_gpu_oom:.2f}  f_other_error {s.f_other_error:.2f}  "
            f"f_no_error {s.f_no_error:.2f}  mean {s.mean:.1f} tok/s/gpu  CV {100 * s.cv:.1f}%"
        )
    failed = none_measured(results)
    if failed:
        print(f"explorer: {failed}", file=sys.stderr)
        return 1
    return 0


def _benchmark_search(args: argparse.Namespace) -> int:
    from pathlib import Path

    from explorer.search_benchmark import VARIANTS, benchmark_search, format_table, to_json
    from explorer.study_file import load_study

    variants = (
        VARIANTS if args.variants is None else tuple(v.strip() for v in args.variants.split(",") if v.strip())
    )
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        raise SpecError(
            file="--variants", field="", problem=f"{unknown or 'none'}; known: {', '.join(VARIANTS)}"
        )
    for name in ("repeats", "n_trials"):
        if getattr(args, name) < 1:
            raise SpecError(file=f"--{name.replace('_', '-')}", field="", problem="must be at least 1")
    loaded = load_study(args.study, replay_table=args.table)
    result = benchmark_search(loaded, repeats=args.repeats, n_trials=args.n_trials, variants=variants)
    print(format_table(result))
    if args.json:
        Path(args.json).write_text(to_json(result))
    return 0


def _export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from explorer.export import write_export
    from explorer.paths import claim_out, inside
    from explorer.study import open_existing_study, recorded_run_folder
    from explorer.study_file import load_study

    loaded = load_study(args.study, storage=args.storage, check_model=False)
    loaded = recorded_run_folder(open_existing_study(loaded), loaded)  # where its files live
    fmt = "csv" if args.csv else args.format
    path = Path(args.csv or args.out or loaded.output_dir / f"{loaded.spec.name}.{fmt}")
    if not (args.csv or args.out):
        inside(loaded.output_dir, [path], file=args.study)
    else:
        claim_out(path.parent, [path.name], field="--csv" if args.csv else "--out")
    n = write_export(loaded, path, fmt=fmt)
    print(f"{path}: {n} trials")
    return 0


def _report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from explorer.plan import time_and_cost
    from explorer.report import write_report
    from explorer.study_file import load_study

    loaded = load_study(args.study, storage=args.storage, check_model=False)
    report = write_report(loaded, Path(args.out) if args.out else None, time_and_cost=time_and_cost)
    print(f"report: {report.folder}")
    print(f"html: {report.html}")
    for line in report.memory_flag:
        print(line)
    for line in report.verdict:  # confirmed, tied (and the one recommended), or how to confirm
        print(line)
    print(f"artifacts: {report.artifact_dir}")
    for name, artifact_id in report.artifact_ids.items():
        print(f"  {name:18} {artifact_id}")
    return 0


def _optimize(args: argparse.Namespace) -> int:
    from explorer.progress import terminal_progress
    from explorer.report import print_summary
    from explorer.study import open_study, optimize, study_utilization
    from explorer.study_file import load_study

    loaded = load_study(
        args.study,
        storage=args.storage,
        n_trials=args.n_trials,
        check_hub=False if args.no_hub_check else None,
    )
    live = terminal_progress()
    if live is None:  # not a terminal: the plain lines
        result = optimize(loaded, reclaim_all=args.reclaim_running)
    else:
        try:
            with live:
                result = optimize(loaded, reclaim_all=args.reclaim_running, printer=live.print, progress=live)
        except OSError as exc:  # the footer not taken down after a hang-up (SIGHUP): the terminal is gone
            if isinstance(exc.__context__, KeyboardInterrupt):
                raise exc.__context__ from None
            raise
    study = open_study(loaded, create=False)  # its connections close at the end of main
    print_summary(loaded, result, study)
    used = study_utilization(study)
    if used is not None:
        print(used.describe())
    if result.measured_nothing:  # every trial of this run crashed: not a success
        print(f"explorer: {result.measured_nothing}", file=sys.stderr)
        return 1
    return 0


def _status(args: argparse.Namespace) -> int:
    from explorer.status import print_status
    from explorer.study_file import load_study

    print_status(load_study(args.study, storage=args.storage, check_model=False))
    return 0


def _dashboard(args: argparse.Namespace) -> int:
    from explorer.dashboard import serve
    from explorer.study_file import load_study

    if not 0 < args.port < 65536:
        raise SpecError(file="--port", field="", problem=f"{args.port} is not a port number")
    loaded = load_study(args.study, storage=args.storage, check_model=False)
    serve(
        loaded,
        host=args.host,
        port=args.port,
        allow_writes=args.allow_writes,
        printer=lambda line: print(line, flush=True),
    )
    return 0


def _open_existing(args: argparse.Namespace) -> tuple[LoadedStudy, optuna.Study]:
    """The study file and its stored study; a missing study is a one-line error."""
    from explorer.study import open_existing_study, recorded_run_folder
    from explorer.study_file import load_study

    loaded = load_study(args.study, storage=args.storage, check_model=False)
    study = open_existing_study(loaded)
    return recorded_run_folder(study, loaded), study


def _audit(args: argparse.Namespace) -> int:
    import json

    from explorer.study import audit

    loaded, study = _open_existing(args)
    spec = loaded.spec
    found = audit(
        study, n_trials=spec.n_trials, max_retries=spec.launcher.max_retries, output_dir=loaded.output_dir
    )
    if args.json:
        print(json.dumps(found.to_dict(), indent=2))
    else:
        print(found.describe())
    return 0 if found.ok else 1


def _utilization(args: argparse.Namespace) -> int:
    from explorer.study import study_utilization

    _, study = _open_existing(args)
    used = study_utilization(study)
    print(used.describe() if used is not None else "GPU-slot utilization: - (no trial held GPUs)")
    return 0


def _best(args: argparse.Namespace) -> int:
    from pathlib import Path

    from explorer.best import select_best, summary_lines, write_best
    from explorer.paths import inside
    from explorer.report import pareto_lines
    from explorer.secrets import mask_url

    if args.steps < 1:
        raise SpecError(file="--steps", field="", problem=f"{args.steps} must be at least 1")
    loaded, study = _open_existing(args)
    spec = loaded.spec
    selection = select_best(
        study,
        margin=spec.memory_margin,
        cap_gib=spec.resources.device_memory_gib,
        space=loaded.space,
        file=args.study,
    )
    if selection is None:
        raise SpecError(
            file=args.study,
            field="",
            problem=f"no feasible trial in study {loaded.spec.name!r} ({mask_url(loaded.storage_url)}); "
            "nothing written",
        )
    out = Path(args.out) if args.out else loaded.output_dir / "best"
    if not args.out:
        inside(loaded.output_dir, [out], file=args.study)
    files = write_best(loaded, selection, out, steps=args.steps, claim=bool(args.out))
    for line in summary_lines(loaded, selection, files):
        print(line)
    for line in pareto_lines(study):  # a multi-objective study: every trade-off, not one best
        print(line)
    return 0


def _verify(args: argparse.Namespace) -> int:
    from pathlib import Path

    from explorer.verify import verify

    for flag, value in (("--steps", args.steps), ("--timeout", args.timeout)):
        if value <= 0:
            raise SpecError(file=flag, field="", problem=f"{value} must be above 0")
    loaded, study = _open_existing(args)
    return verify(
        loaded,
        study,
        trial=args.trial,
        steps=args.steps,
        files=Path(args.files) if args.files else None,
        which=args.launch,
        timeout_s=args.timeout,
        file=args.study,
    )


def _plan(args: argparse.Namespace) -> int:
    from pathlib import Path

    from explorer.plan import make_plan, plan_job, plan_lines, same_workload, sbatch_lines, write_chosen
    from explorer.study import open_existing_study, recorded_run_folder, verdict_lines
    from explorer.study_file import load_study

    loaded = [load_study(f, storage=args.storage, check_model=False) for f in args.study]
    same_workload(loaded)
    job = plan_job(
        [lo.spec for lo in loaded],
        tokens=args.tokens,
        epochs=args.epochs,
        deadline=args.deadline,
        max_gpus=args.max_gpus,
        global_batch=args.global_batch,
        prices=args.price,
        file=args.study[0],
    )
    studies = []
    for lo in loaded:
        study = open_existing_study(lo)
        studies.append((recorded_run_folder(study, lo), study))
    plan = make_plan(studies, job)
    for line in plan_lines(plan):
        print(line)
    for lo, study in studies:  # each study's best: confirmed, tied, or how to confirm it
        for line in verdict_lines(study, str(lo.file)):
            print(f"{lo.spec.name}: {line}")
    written = write_chosen(plan, studies, Path(args.out) if args.out else None, steps=args.steps)
    if written is not None:
        row, files = written
        print(f"files for the chosen run ({row.number_gpus} x {row.gpu_model}): {files.job.parent}")
        print(f"  {files.torchrun}")
        spec = next(lo.spec for lo, _ in studies if lo.spec.name == row.study)
        for line in sbatch_lines(row, plan.job, torchrun=files.torchrun, gpus=spec.resources.device != "cpu"):
            print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
