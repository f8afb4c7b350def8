"""The ``explorer`` command line. Imports stay light until a command needs torch, Ray or Optuna."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from explorer.errors import SpecError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="explorer",
        description="Find the fastest way to run an LLM fine-tuning job on given hardware.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    opt = sub.add_parser(
        "optimize",
        help="run (or resume) a study: Optuna proposes, Ray actors benchmark",
        description="Run the study in STUDY.yaml until n_trials trials are done. Running it again on "
        "the same storage continues the study; trials interrupted by a crash are re-run.",
    )
    opt.add_argument("study", metavar="STUDY.yaml")
    opt.add_argument("--storage", metavar="URL", help="SQLAlchemy URL; overrides the study file")
    opt.add_argument("--n-trials", type=int, metavar="N", help="total trials; overrides the study file")
    opt.add_argument(
        "--reclaim-running",
        action="store_true",
        help="also re-run RUNNING trials of explorer processes on other hosts (only if they are dead)",
    )

    val = sub.add_parser("validate", help="check a study file and its search space; write nothing")
    val.add_argument("study", metavar="STUDY.yaml")
    val.add_argument("--storage", metavar="URL")
    val.add_argument("--n-trials", type=int, metavar="N")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "optimize":
            return _optimize(args)
        if args.command == "validate":
            return _validate(args)
    except SpecError as exc:
        print(f"explorer: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    raise AssertionError(args.command)


def _validate(args: argparse.Namespace) -> int:
    from explorer.spec import load_study

    loaded = load_study(args.study, storage=args.storage, n_trials=args.n_trials)
    print(
        f"{args.study}: ok: study {loaded.spec.name!r}, {len(loaded.space.domains)} parameters, "
        f"at most {loaded.space.size} configurations, {loaded.spec.n_trials} trials"
    )
    return 0


def _optimize(args: argparse.Namespace) -> int:
    from explorer.report import print_summary
    from explorer.spec import load_study
    from explorer.study import optimize

    loaded = load_study(args.study, storage=args.storage, n_trials=args.n_trials)
    result = optimize(loaded, reclaim_all=args.reclaim_running)
    print_summary(loaded, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
