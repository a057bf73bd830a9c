#!/usr/bin/env bash
# Bounded fuzz runs of every cargo-fuzz target under fuzz/ (CI runs this
# after the tests; scripts/test.sh):
#
#   scripts/fuzz.sh [SECONDS]        # each target for SECONDS (default 60)
#   scripts/fuzz.sh 1800 engine_stream   # one target, longer
#
# Stable toolchain, no sanitizer (`-s none`, see ../shared/notes/toolchain.md).
# Each run starts from the corpus kept in fuzz/corpus/TARGET (read-only
# here: new inputs go to a scratch directory, so a run leaves the checkout
# as it was; `cargo fuzz cmin` and a commit add to the kept corpus). A
# finding fails the script and leaves its input under fuzz/artifacts/TARGET.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
secs=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo fuzz list)
cargo fuzz build -s none 2>&1 | tail -n 1
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
fail=0
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t" "$scratch/$t"
  start=$(date +%s)
  if out=$(cargo fuzz run -s none "$t" "$scratch/$t" "corpus/$t" -- \
        -max_total_time="$secs" -print_final_stats=1 2>&1); then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' <<<"$out" | grep -o '[0-9]*$' || echo '?')
    cov=$(grep -o 'cov: [0-9]*' <<<"$out" | tail -n 1 || true)
    echo "fuzz $t: ok, $runs runs in $(( $(date +%s) - start )) s, $cov"
  else
    fail=1
    echo "fuzz $t: FINDING" >&2
    grep -v '^ *[0-9]*: ' <<<"$out" | tail -n 40 >&2
  fi
done
exit $fail
