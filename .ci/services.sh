#!/usr/bin/env bash
# Services the tests need that pip cannot install: Debian's PostgreSQL server, and
# Debian's Chromium (tests/integration/test_ui_links.py renders the MLflow UI headless).
#
# tests/infra/test_shared_server.py starts its own throwaway cluster (initdb +
# pg_ctl in a temp folder, on a free port of 127.0.0.1, removed afterwards), so
# nothing is left running here: this script only makes sure the server binaries
# exist. Idempotent and quick once installed. Needs root (or sudo) on a fresh
# Debian/Ubuntu machine; `apt-get update` runs only when the package lists lack
# postgresql. Prints where the binaries are.
set -euo pipefail

pg_bin_dir() {
  local d
  if command -v initdb >/dev/null && command -v pg_ctl >/dev/null; then
    dirname "$(readlink -f "$(command -v initdb)")"
    return 0
  fi
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then
      echo "$d"
      return 0
    fi
  done
  return 1
}

# `apt_for PACKAGE`: sets `sudo` and `apt` (the apt-get command line) to install it, after
# `apt-get update` when the package lists lack it; exits naming it where that cannot be done.
apt_for() {
  if [ "$(id -u)" -eq 0 ]; then
    sudo=()
  elif command -v sudo >/dev/null; then
    sudo=(sudo)
  else
    echo "services: $1 is missing and this is not root: run as root or install $1" >&2
    exit 1
  fi
  if ! command -v apt-get >/dev/null; then
    echo "services: no apt-get here: install $1 another way" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt=("${sudo[@]}" apt-get -y -q -o Dpkg::Use-Pty=0)
  if ! apt-cache policy "$1" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    "${apt[@]}" update
  fi
}

if ! bin_dir=$(pg_bin_dir); then
  apt_for postgresql
  # No default cluster on port 5432: the tests start their own (the way the
  # official postgres images install it).
  "${apt[@]}" install --no-install-recommends postgresql-common
  "${sudo[@]}" sed -ri 's/^#?\s*create_main_cluster\s*=.*/create_main_cluster = false/' \
    /etc/postgresql-common/createcluster.conf
  "${apt[@]}" install --no-install-recommends postgresql
  bin_dir=$(pg_bin_dir)
fi

echo "services: $("$bin_dir/postgres" --version) server binaries in $bin_dir" \
  "(tests start their own cluster on 127.0.0.1)"

if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
  apt_for chromium
  "${apt[@]}" install --no-install-recommends chromium
fi
echo "services: $(chromium --version 2>/dev/null || chromium-browser --version) (headless UI checks)"
