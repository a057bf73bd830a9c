#!/usr/bin/env bash
# Installs everything softrdma needs on a fresh Debian (12) machine and builds
# the interop guest (a Linux VM with kernel soft-iWARP and rdma-core's rping).
#
#   scripts/setup.sh          # as root; idempotent; quick when all is there
#
# - Debian packages: etcd (the store's etcd coordinator is tested against a
#   real one; building needs no protoc: the coordinator speaks etcd's JSON
#   gateway), tshark (wire checks in the interop tests), fio, redis,
#   iproute2, ucx-utils, hyperfine (side-by-side peers), build-essential
#   (the linker Rust needs), mount (losetup: the storage tests put a store
#   on a loop device), rdma-core's headers (guest test programs).
# - Rust via rustup, only when no cargo is found (Debian's cargo is too old).
# - cargo-fuzz (cargo install, a few minutes once) for scripts/fuzz.sh.
# - redis-py (pip, in /opt/softrdma-py) and ioredis (npm, in
#   /opt/softrdma-node): the Redis door's client-library tests.
# - The guest: ../shared/kvm-rdma/build.sh (root + apt; about a minute).
#
# Services that Debian would start (etcd, redis) are kept from starting: tests
# run their own instances on loopback ports.
set -euo pipefail

ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel 2>/dev/null || (cd "$(dirname "$0")/.." && pwd))
SHARED=${SOFTRDMA_SHARED:-$ROOT/../shared}
# rdmacm-utils, ibverbs-utils, perftest, qperf: the unmodified RDMA
# applications tests/dropin.rs runs on softrdma's libibverbs (issue 30);
# util-linux: runuser, for the test as `nobody`.
PKGS=(etcd-server tshark fio redis-server redis-tools iproute2 ucx-utils hyperfine build-essential mount libibverbs-dev librdmacm-dev rdmacm-utils ibverbs-utils perftest qperf util-linux binutils)
LOG=$(mktemp /tmp/softrdma-setup.XXXXXX.log)
trap 'rm -f "$LOG"' EXIT

say() { echo "setup: $*"; }
die() { echo "setup: error: $*" >&2; exit 1; }
# Runs a command with its output in $LOG; shows the log's tail if it fails.
quiet() {
  if ! "$@" >>"$LOG" 2>&1; then
    echo "setup: '$*' failed; last lines:" >&2
    tail -n 30 "$LOG" >&2
    exit 1
  fi
}

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"
  elif command -v sudo >/dev/null; then sudo "$@"
  else die "need root for: $*"; fi
}

# --- Debian packages -------------------------------------------------------
missing=()
for p in "${PKGS[@]}"; do
  [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  quiet as_root apt-get update -qq
  for p in "${missing[@]}"; do
    # (no pipe into grep -q: with pipefail, SIGPIPE would fail the check)
    policy=$(apt-cache policy "$p" 2>/dev/null || true)
    [[ "$policy" =~ Candidate:\ [^\(] ]] || die "package $p has no install candidate (is this Debian 12?)"
  done
  # tshark: do not ask whether non-root users may capture.
  echo 'wireshark-common wireshark-common/install-setuid boolean false' | quiet as_root debconf-set-selections
  # Keep etcd/redis from being started as system services by their packages.
  made_policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | as_root tee /usr/sbin/policy-rc.d >/dev/null
    as_root chmod +x /usr/sbin/policy-rc.d; made_policy=1
  fi
  rc=0
  as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"$LOG" 2>&1 || rc=$?
  [ -z "$made_policy" ] || as_root rm -f /usr/sbin/policy-rc.d
  if [ $rc -ne 0 ]; then tail -n 30 "$LOG" >&2; die "apt-get install failed"; fi
else
  say "Debian packages present"
fi

# No system-wide etcd or redis left running (tests start their own).
if [ -d /run/systemd/system ]; then
  for s in etcd redis-server; do
    if systemctl is-enabled --quiet "$s" 2>/dev/null || systemctl is-active --quiet "$s" 2>/dev/null; then
      quiet as_root systemctl disable --now "$s"
    fi
  done
fi

command -v etcd >/dev/null || [ -x /usr/bin/etcd ] || die "etcd binary not found after installing etcd-server"
command -v tshark >/dev/null || die "tshark not found after installing tshark"

# --- Rust ------------------------------------------------------------------
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
if ! command -v cargo >/dev/null; then
  say "installing Rust (rustup, stable, minimal + rustfmt + clippy)"
  command -v curl >/dev/null || quiet as_root apt-get install -y -qq curl ca-certificates
  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs >"$LOG.rustup"
  quiet sh "$LOG.rustup" -y -q --profile minimal -c rustfmt -c clippy
  rm -f "$LOG.rustup"
  say "Rust installed in ~/.cargo; run: . \"\$HOME/.cargo/env\""
fi

# --- cargo-fuzz (the bounded fuzz runs of scripts/fuzz.sh) ---------------------
# Stable toolchain, no sanitizer (`-s none`); libFuzzer is built with the C++
# compiler from build-essential.
if ! cargo fuzz --version >/dev/null 2>&1; then
  start=$(date +%s)
  quiet cargo install cargo-fuzz --locked --version 0.13.2
  say "cargo-fuzz installed ($(( $(date +%s) - start )) s)"
fi

# --- Redis client libraries (the RESP door's tests, issue 32) ----------------
# Unmodified redis-py (PyPI) in a venv of its own, and ioredis (npm) beside
# Node.js (Debian's nodejs and npm when no node is installed). Pinned, so a
# new release cannot change what the suite tests. The tests find them here
# (or where SOFTRDMA_PYTHON / SOFTRDMA_NODE_MODULES point).
PYDIR=/opt/softrdma-py
NODEDIR=/opt/softrdma-node
if ! "$PYDIR/bin/python" -c 'import redis, sys; sys.exit(redis.__version__ != "8.1.0")' 2>/dev/null; then
  python3 -m venv --help >/dev/null 2>&1 && python3 -c 'import ensurepip' 2>/dev/null \
    || quiet as_root apt-get install -y -qq python3-venv
  quiet as_root python3 -m venv "$PYDIR"
  quiet as_root "$PYDIR/bin/pip" install -q redis==8.1.0
  say "redis-py 8.1.0 installed in $PYDIR"
fi
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  quiet as_root apt-get install -y -qq --no-install-recommends nodejs npm
fi
if [ "$(node -p 'require("'"$NODEDIR"'/node_modules/ioredis/package.json").version' 2>/dev/null)" != "5.11.1" ]; then
  quiet as_root mkdir -p "$NODEDIR"
  quiet as_root npm install --no-audit --no-fund --prefix "$NODEDIR" ioredis@5.11.1
  say "ioredis 5.11.1 installed in $NODEDIR"
fi

# --- Interop guest -----------------------------------------------------------
[ -x "$SHARED/kvm-rdma/build.sh" ] || die "$SHARED/kvm-rdma/build.sh not found (clone shared/ beside the repo, or set SOFTRDMA_SHARED)"
GUEST_DIR=${KVM_RDMA_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvm-rdma}
start=$(date +%s)
quiet as_root env KVM_RDMA_DIR="$GUEST_DIR" "$SHARED/kvm-rdma/build.sh"
say "$(tail -n 1 "$LOG") ($(( $(date +%s) - start )) s)"
say "ok"
