#!/usr/bin/env bash
# The whole test suite, as CI runs it:
#   1. scripts/setup.sh        (Debian packages + the siw guest; skip with SOFTRDMA_SKIP_SETUP=1)
#   2. cargo build --release --workspace --bins
#   3. cargo test --workspace --release   (includes the interop tests against Linux siw)
# Exits non-zero on any failure. Long soak/stress runs only with SOFTRDMA_SOAK=1.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

step() { echo; echo "=== $* ($(date +%T))"; }
t0=$(date +%s)

if [ "${SOFTRDMA_SKIP_SETUP:-}" = 1 ]; then
  step "setup skipped (SOFTRDMA_SKIP_SETUP=1)"
else
  step "scripts/setup.sh"
  scripts/setup.sh
fi

step "cargo build --release --workspace --bins"
cargo build --release --workspace --bins

step "cargo test --workspace --release${SOFTRDMA_SOAK:+ (SOFTRDMA_SOAK=$SOFTRDMA_SOAK)}"
# Release: the interop and engine tests move real data; debug builds are slow.
cargo test --workspace --release --no-fail-fast

step "all tests passed in $(( $(date +%s) - t0 )) s"
