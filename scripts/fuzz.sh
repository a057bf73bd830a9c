#!/usr/bin/env bash
# Runs every cargo-fuzz target of softrdma-wire for N seconds each.
#
#   scripts/fuzz.sh [SECONDS]          (default 30 per target)
#
# Not part of the default CI: run it by hand, or from CI behind a flag.
# Uses the stable toolchain with no sanitizer (cargo fuzz run -s none);
# set FUZZ_SANITIZER=address to use AddressSanitizer instead, which needs
# nightly features (the script then sets RUSTC_BOOTSTRAP=1).
# Set FUZZ_TARGETS="a b" to run only some targets. Crashes are kept under
# fuzz/artifacts/TARGET/ and the corpus under fuzz/corpus/TARGET/ (both
# git-ignored). Exits non-zero if any target fails.
set -euo pipefail

secs="${1:-30}"
case "$secs" in
  '' | *[!0-9]*) echo "usage: $0 [SECONDS]" >&2; exit 2 ;;
esac

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root/fuzz"

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "cargo-fuzz not found; installing it (cargo install cargo-fuzz)" >&2
  cargo install --locked cargo-fuzz
fi

sanitizer="${FUZZ_SANITIZER:-none}"
if [ "$sanitizer" != none ]; then
  export RUSTC_BOOTSTRAP=1
fi

targets="${FUZZ_TARGETS:-$(cargo fuzz list)}"
failed=()
for t in $targets; do
  log="$(mktemp)"
  echo "== $t: ${secs}s (sanitizer: $sanitizer)"
  if cargo fuzz run -s "$sanitizer" "$t" -- -max_total_time="$secs" >"$log" 2>&1; then
    grep -E '^Done [0-9]+ runs' "$log" | tail -n 1 || tail -n 3 "$log"
  else
    echo "!! $t FAILED; the end of its log:" >&2
    tail -n 40 "$log" >&2
    failed+=("$t")
  fi
  rm -f "$log"
done

if [ "${#failed[@]}" -ne 0 ]; then
  echo "fuzz targets failed: ${failed[*]}" >&2
  exit 1
fi
echo "all fuzz targets ran ${secs}s each without a crash"
