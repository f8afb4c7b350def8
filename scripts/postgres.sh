#!/usr/bin/env bash
# PostgreSQL server binaries for the test suite (tests/_postgres.py starts a throwaway server).
#   scripts/postgres.sh install   install Debian's `postgresql` package unless initdb is already there
#   scripts/postgres.sh bindir    print the folder holding initdb and pg_ctl (newest version)
# Idempotent and fast when the binaries exist; it never starts a server or touches a cluster.
set -euo pipefail

bindir() {
  local d
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then echo "$d"; return 0; fi
  done
  if command -v pg_config >/dev/null && [ -x "$(pg_config --bindir)/initdb" ]; then
    pg_config --bindir; return 0
  fi
  if command -v initdb >/dev/null && command -v pg_ctl >/dev/null; then
    dirname "$(command -v initdb)"; return 0
  fi
  return 1
}

case "${1:-}" in
  bindir)
    bindir || { echo "postgres.sh: no PostgreSQL server binaries (run: scripts/postgres.sh install)" >&2; exit 1; }
    ;;
  install)
    if dir=$(bindir); then
      echo "postgres.sh: PostgreSQL server binaries in $dir"
      exit 0
    fi
    if ! command -v apt-get >/dev/null; then
      echo "postgres.sh: no PostgreSQL server binaries and no apt-get; install PostgreSQL (initdb, pg_ctl)" >&2
      exit 1
    fi
    sudo=""
    if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    # the package's own cluster is not needed: the tests create theirs in a temporary folder
    $sudo apt-get install -y -qq --no-install-recommends postgresql >/dev/null
    dir=$(bindir)
    echo "postgres.sh: installed PostgreSQL server binaries in $dir"
    ;;
  *)
    echo "usage: scripts/postgres.sh install|bindir" >&2
    exit 2
    ;;
esac
