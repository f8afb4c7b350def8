#!/usr/bin/env bash
# Slurm and MUNGE for the test suite (tests/test_slurm.py starts a throwaway one-node Slurm).
#   scripts/slurm.sh install   install Debian's `slurm-wlm` and `munge` unless slurmctld is already there
# Idempotent and fast when the binaries exist; it never starts a daemon (the package's own services
# are not used: the test writes its own slurm.conf and MUNGE key and starts the daemons itself).
set -euo pipefail

have() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
    && command -v munged >/dev/null
}

case "${1:-}" in
  install)
    if have; then
      echo "slurm.sh: Slurm in $(dirname "$(command -v slurmctld)"), $(slurmctld -V)"
      exit 0
    fi
    if ! command -v apt-get >/dev/null; then
      echo "slurm.sh: no Slurm and no apt-get; install slurmctld, slurmd, sbatch and munged" >&2
      exit 1
    fi
    sudo=""
    if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    # policy-rc.d: the packages' own services stay stopped (no init system to start them anyway)
    $sudo apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
    have || { echo "slurm.sh: slurm-wlm installed but slurmctld/slurmd/sbatch/munged not found" >&2; exit 1; }
    echo "slurm.sh: installed $(slurmctld -V)"
    ;;
  *)
    echo "usage: scripts/slurm.sh install" >&2
    exit 2
    ;;
esac
