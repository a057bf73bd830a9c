#!/usr/bin/env bash
# Regenerates crates/ibverbs/src/abi.rs from the installed rdma-core headers
# (Debian 12: libibverbs-dev, librdmacm-dev 44.0). Needs Debian's `bindgen`
# and `libclang1-14` (not needed to build: the output is committed).
set -euo pipefail
cd "$(dirname "$0")/../crates/ibverbs"
out=$(mktemp)
LIBCLANG_PATH=${LIBCLANG_PATH:-/usr/lib/llvm-14/lib} bindgen abi-wrap.h \
  --ignore-functions --allowlist-type '(ibv|verbs|rdma|_ibv)_.*' \
  --allowlist-var '(IBV|RDMA|IB)_.*' --no-doc-comments \
  --default-enum-style consts --with-derive-default --no-prepend-enum-name \
  -o "$out" --
head -8 src/abi.rs > src/abi.rs.new
cat "$out" >> src/abi.rs.new
mv src/abi.rs.new src/abi.rs
rm -f "$out"
echo "regenerated src/abi.rs; run cargo test -p softrdma-ibverbs"
