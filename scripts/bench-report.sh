#!/usr/bin/env bash
# The figures BENCHMARKS.md records for `softrdma bench` (issue 3's
# targets), one JSON object per line, every ratio against baselines
# measured in the same run. About 5 minutes on the 2-core machine.
#   scripts/bench-report.sh [extra bench args]
# Part 1 forces the iWARP/TCP path (`--no-same-host`: what two hosts get);
# part 2 is what `--loopback` picks by itself, the same-host transport,
# against UCX's cma transport.
set -euo pipefail
cd "$(dirname "$0")/.."
T="${CARGO_TARGET_DIR:-target}"
cargo build --release -q --bin softrdma
S="$T/release/softrdma"
B="$S bench --loopback --json --repeat 3"
# 1. iWARP over TCP
N="$B --no-same-host"
$N --test write_bw --size 64K,1M --baseline tcp,ucx "$@"
$N --test send_bw --size 64K,1M --baseline tcp,ucx "$@"
$N --test read_bw --size 64K --baseline tcp,ucx "$@"
$N --test write_bw --size 64K,1M --baseline tcp --no-ext "$@"
$N --test write_lat --size 8 --iters 20000 --baseline tcp,ucx "$@"
$N --test write_lat --size 8 --iters 20000 --baseline tcp --busy-poll "$@"
$N --test send_lat --size 8 --iters 20000 --baseline tcp --busy-poll "$@"
$N --test read_lat --size 8 --iters 20000 --baseline tcp --busy-poll "$@"
$N --test write_bw --size 8 --qps 4 --depth 256 --cq-mod 64 --iters 500000 --baseline ucx "$@"
$S bench --loopback --json --no-same-host --test idle_qps --qps 1000 --idle-secs 5
# 2. same-host transport
$B --test write_bw --size 64K,1M --baseline tcp,ucx --ucx-tls cma,tcp "$@"
$B --test read_bw --size 64K,1M --baseline tcp,ucx --ucx-tls cma,tcp "$@"
$B --test send_bw --size 64K,1M --baseline tcp "$@"
$B --test write_lat --size 8 --iters 20000 --baseline tcp "$@"
$B --test write_lat --size 8 --iters 20000 --baseline tcp --busy-poll "$@"
$B --test send_lat --size 8 --iters 20000 --baseline tcp --busy-poll "$@"
$B --test read_lat --size 8 --iters 20000 --baseline tcp --busy-poll "$@"
$B --test write_bw --size 8 --qps 4 --depth 256 --cq-mod 64 --iters 500000 --baseline ucx --ucx-tls cma,tcp "$@"
$S bench --loopback --json --test idle_qps --qps 1000 --idle-secs 5
