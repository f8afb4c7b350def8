#!/usr/bin/env bash
# Packs what a lent GPU machine lacks into three carries of the device tool that travel together in
# each call of the kit (docs/gpu.md), all three with the tracked working tree (about 22 MB) under
# the 64 MiB that one call may send:
#
#   .gpu/site/site.tar.xz       Ray core, Optuna, threadpoolctl and what they need (the machine has torch, transformers,
#                               accelerate, peft, nvidia-ml-py, triton, rich, psutil); Ray's Java
#                               jars, dashboard source maps and libraries (data, serve, train, tune,
#                               rllib, llm) dropped
#   .gpu/kernels/kernels.tar.xz liger-kernel and bitsandbytes (its CUDA 13 and CPU libraries only:
#                               the machine's torch is built for CUDA 13.0)
#   .gpu/trl/trl.tar.xz         TRL and datasets (dill, multiprocess) for the kit's trl step
#
# and records each carry's size and packages in benchmarks/results/gpu/carry.json (a test checks
# it). Run it here, in the repository root, where pip reaches PyPI:   bash scripts/gpu_pack.sh
# docs/gpu.md says how the kit then unpacks them on the machine.
set -euo pipefail
top=$(git rev-parse --show-toplevel)
cd "$top"
# .gpu/ is in .gitignore: the carries travel by `carry`, never committed
# the versions this project's own environment runs (.venv), so that the machine runs the same
SITE_PACKAGES="ray==2.60.0 optuna==5.0.0 sqlalchemy==2.1.9 alembic==1.20.1 colorlog==6.12.0 mako==1.4.3 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 threadpoolctl==3.8.0"
KERNEL_PACKAGES="liger-kernel==0.8.5 bitsandbytes==0.50.2"
TRL_PACKAGES="trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19"
LIMIT=$((64 * 1024 * 1024))
platforms="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
python=${PYTHON:-python3}

pack() {  # pack NAME PACKAGES...: download the wheels, unzip them, prune, tar.xz
  local name=$1; shift
  local tmp; tmp=$(mktemp -d)
  $python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    $platforms -d "$tmp/whl" "$@" 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
  mkdir -p "$tmp/site"
  for wheel in "$tmp"/whl/*.whl; do unzip -q -o "$wheel" -d "$tmp/site"; done
  rm -rf "$tmp/site/ray/jars"
  # Ray's libraries that explorer never imports (it runs Ray core's actors and placement groups)
  rm -rf "$tmp/site/ray/data" "$tmp/site/ray/serve" "$tmp/site/ray/train" "$tmp/site/ray/tune" \
    "$tmp/site/ray/rllib" "$tmp/site/ray/llm"
  find "$tmp/site" -name '*.map' -path '*dashboard*' -delete
  find "$tmp/site/bitsandbytes" -name 'libbitsandbytes_*.so' ! -name 'libbitsandbytes_cuda13*' \
    ! -name 'libbitsandbytes_cpu*' -delete 2>/dev/null || true
  rm -rf ".gpu/$name" && mkdir -p ".gpu/$name"
  tar -cJf ".gpu/$name/$name.tar.xz" -C "$tmp/site" .
  rm -rf "$tmp"
}

pack site $SITE_PACKAGES
pack kernels $KERNEL_PACKAGES
pack trl $TRL_PACKAGES
# the device tool counts more than the files' bytes (a call with 66.8 MB of files was refused):
# 1 KiB a file for a tar-like header and padding, counted here
tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
tree=$((tree + 1024 * $(git ls-files | wc -l)))
$python - "$tree" "$LIMIT" "$SITE_PACKAGES" "$KERNEL_PACKAGES" "$TRL_PACKAGES" <<'PY'
import json, os, sys
tree, limit = int(sys.argv[1]), int(sys.argv[2])
carries = {}
for name, packages in zip(("site", "kernels", "trl"), sys.argv[3:]):
    size = os.path.getsize(f".gpu/{name}/{name}.tar.xz")
    carries[f".gpu/{name}"] = {"bytes": size, "packages": packages.split()}
total = tree + sum(c["bytes"] for c in carries.values())
if total >= limit:
    sys.exit(f"gpu_pack: the carries and the tree ({total} bytes) exceed the {limit} bytes of one call")
os.makedirs("benchmarks/results/gpu", exist_ok=True)
record = {"limit_bytes": limit, "tree_bytes_when_packed": tree, "carries": carries}
open("benchmarks/results/gpu/carry.json", "w").write(json.dumps(record, indent=1) + "\n")
for path, c in carries.items():
    print(f"{path}: {c['bytes'] / 2**20:.1f} MiB")
print(f"with the tree ({tree / 2**20:.1f} MiB): {total / 2**20:.1f} MiB < 64 MiB")
PY
