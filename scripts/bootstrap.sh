#!/usr/bin/env bash
# Create .venv (once) with the CPU build of torch and explorer installed in editable mode.
# The CPU wheel is installed first and pinned, so that no dependency pulls a multi-GB CUDA build.
# On a GPU machine, install your CUDA torch first and run: pip install -e '.[gpu,dashboard]'
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_SPEC=${EXPLORER_TORCH:-torch==2.13.0}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.explorer-installed
want="$(sha256sum pyproject.toml | cut -d' ' -f1) $TORCH_SPEC ${1:-}"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "$TORCH_SPEC"
  .venv/bin/python -m pip install -q -e ".${1:-[dashboard]}" "$TORCH_SPEC"
  echo "$want" > "$stamp"
fi
