#!/usr/bin/env bash
# Bounded runs of every cargo-fuzz target under fuzz/ (the wire codecs, the
# store's and storage's decoders, and the engine's receive path). CI runs
# it after the tests (scripts/test.sh, SOFTRDMA_FUZZ_SECS, default 60).
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]   (default 60 s per target; all)
#   FUZZ_TARGETS="a b" scripts/fuzz.sh 30   (the same, targets from the env)
#
# Stable toolchain, no sanitizer (`cargo fuzz run -s none`, see
# ../shared/notes/toolchain.md); FUZZ_SANITIZER=address uses
# AddressSanitizer instead (nightly features: the script then sets
# RUSTC_BOOTSTRAP=1). Each run starts from the corpus kept in
# fuzz/corpus/TARGET (tracked; read-only here: new inputs go to a scratch
# directory, so a run leaves the checkout as it was; `cargo fuzz cmin` and
# a commit grow the kept corpus). A finding fails the script and leaves its
# input under fuzz/artifacts/TARGET.
set -euo pipefail

secs="${1:-60}"
case "$secs" in
  '' | *[!0-9]*) echo "usage: $0 [SECONDS] [TARGET...]" >&2; exit 2 ;;
esac
shift || true

cd "$(dirname "${BASH_SOURCE[0]}")/../fuzz"
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "cargo-fuzz not found; installing it (cargo install cargo-fuzz)" >&2
  cargo install --locked cargo-fuzz --version 0.13.2
fi

sanitizer="${FUZZ_SANITIZER:-none}"
[ "$sanitizer" = none ] || export RUSTC_BOOTSTRAP=1

if [ $# -gt 0 ]; then
  targets=("$@")
else
  read -r -a targets <<<"${FUZZ_TARGETS:-$(cargo fuzz list | tr '\n' ' ')}"
fi
cargo fuzz build -s "$sanitizer" 2>&1 | tail -n 1

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=()
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t" "$scratch/$t"
  log="$scratch/$t.log"
  start=$(date +%s)
  if cargo fuzz run -s "$sanitizer" "$t" "$scratch/$t" "corpus/$t" -- \
      -max_total_time="$secs" -print_final_stats=1 >"$log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 || true)
    echo "fuzz $t: ok, $runs runs in $(( $(date +%s) - start )) s, $cov (sanitizer: $sanitizer)"
  else
    echo "!! fuzz $t FAILED; the end of its log:" >&2
    grep -v '^ *[0-9]*: ' "$log" | tail -n 40 >&2
    failed+=("$t")
  fi
done

if [ "${#failed[@]}" -ne 0 ]; then
  echo "fuzz targets failed: ${failed[*]}" >&2
  exit 1
fi
echo "all ${#targets[@]} fuzz targets ran ${secs} s each without a finding"
