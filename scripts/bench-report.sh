#!/usr/bin/env bash
# The figures BENCHMARKS.md records for `softrdma bench` (issue 3's
# targets), one JSON object per line, every ratio against baselines
# measured in the same run. About 2-3 minutes on the 2-core machine.
#   scripts/bench-report.sh [extra bench args]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q --bin softrdma
B="./target/release/softrdma bench --loopback --json --repeat 3"
$B --test write_bw --size 64K,1M --baseline tcp,ucx "$@"
$B --test send_bw --size 64K,1M --baseline tcp,ucx "$@"
$B --test read_bw --size 64K --baseline tcp,ucx "$@"
$B --test write_bw --size 64K,1M --baseline tcp --no-ext "$@"
$B --test write_lat --size 8 --iters 20000 --baseline tcp,ucx "$@"
$B --test write_lat --size 8 --iters 20000 --baseline tcp --busy-poll "$@"
$B --test send_lat --size 8 --iters 20000 --baseline tcp --busy-poll "$@"
$B --test read_lat --size 8 --iters 20000 --baseline tcp --busy-poll "$@"
$B --test write_bw --size 8 --qps 4 --depth 256 --cq-mod 64 --iters 500000 --baseline ucx "$@"
./target/release/softrdma bench --loopback --json --test idle_qps --qps 1000 --idle-secs 5
