#!/usr/bin/env bash
# Unmodified perftest on softrdma's libibverbs against `softrdma bench` on
# the same path, in one run (issue 30; BENCHMARKS.md, "Unmodified perftest
# on the drop-in"):
#
#   ib_write_bw -R at 64 KiB and 1 MiB    vs  softrdma bench --test write_bw
#   ib_read_lat -R at 8 B                 vs  softrdma bench --test read_lat
#
# over the TCP path (SOFTRDMA_SAME_HOST=0, what two hosts get; first), the
# same-host path (registered malloc pages moved into shared memfds, the
# default), and the same-host path with SOFTRDMA_SHARE_MR=0 on the drop-in
# ("private": perftest's buffers reached with process_vm_writev/readv).
# Prints, per line: the rate or p50/p99 of each, the ratio drop-in / bench
# (target >= 0.9), and both processes' CPU (cores busy: CPU seconds / wall
# seconds) for each side.
#
#   scripts/bench-dropin.sh [SECS]      (default 3 s per bandwidth run)
#   REPS=N                              (bandwidth pairs per line, default 5:
#                                        the median pair is shown, and the
#                                        range of the ratios)
#   PATHS="tcp same-host private"       (the paths to run, in this order)
#   MD=1                                (markdown table rows, the format of
#                                        BENCHMARKS.md; scripts/bench-report.sh
#                                        uses it)
#
# Needs `cargo build --release --workspace` and Debian's perftest.
set -euo pipefail
cd "$(dirname "$0")/.."
S=${SOFTRDMA_BIN:-target/release/softrdma}
SECS=${1:-3}
REPS=${REPS:-5}
LAT_ITERS=${LAT_ITERS:-20000}
[ -x "$S" ] || { echo "build first: cargo build --release --workspace" >&2; exit 1; }
command -v ib_write_bw >/dev/null || { echo "perftest missing: scripts/setup.sh" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# "0m1.250s" -> 1.250
secs() { awk -F'[ms]' '{ printf "%.3f", $1 * 60 + $2 }' <<<"$1"; }

port() { echo $(( 20000 + RANDOM % 20000 )); }

wait_listen() {
  for _ in $(seq 1 500); do
    ss -ltn | grep -q ":$1 " && return 0
    sleep 0.01
  done
  echo "server did not listen on $1" >&2; exit 1
}

# run_timed OUT CMD...: runs CMD (output to OUT), then appends
# "cpu WALL CHILD_USER CHILD_SYS" from the shell's `times`.
run_timed() {
  local out=$1; shift
  bash -c 't0=$(date +%s.%N); "$@" > "$0" 2>&1; rc=$?; t1=$(date +%s.%N);
           times > "$0.times"; set -- $(tail -1 "$0.times");
           echo "cpu $(awk -v a="$t0" -v b="$t1" "BEGIN { print b - a }") $1 $2" >> "$0"; exit $rc' "$out" "$@"
}

cpu_of() { # file -> cores busy
  local l; l=$(grep '^cpu ' "$1" | tail -1)
  set -- $l
  awk -v w="$2" -v u="$(secs "$3")" -v s="$(secs "$4")" 'BEGIN { printf "%.2f", (u + s) / w }'
}

# perftest PATHFLAG TEST SIZE ARGS...: a server and a client on the drop-in;
# leaves the client's output in $tmp/c and the CPU of each in CPU_S / CPU_C.
perftest() {
  local flag=$1 t=$2 size=$3; shift 3
  local p; p=$(port)
  run_timed "$tmp/s" "$S" run $flag -- "$t" -R -p "$p" -s "$size" "$@" &
  local spid=$!
  wait_listen "$p"
  run_timed "$tmp/c" "$S" run $flag -- "$t" -R -p "$p" -s "$size" "$@" 127.0.0.1
  wait $spid
  CPU_S=$(cpu_of "$tmp/s"); CPU_C=$(cpu_of "$tmp/c")
}

md_size() { awk -v s="$1" 'BEGIN { if (s >= 1048576) printf "%d MiB", s / 1048576; else if (s >= 1024) printf "%d KiB", s / 1024; else printf "%d B", s }'; }

json_num() { grep -o "\"$1\":[0-9.eE+-]*" <<<"$2" | head -1 | cut -d: -f2; }

[ "${MD:-}" = 1 ] || printf '%-9s %-12s %8s | %-46s | %-46s | %6s\n' path test size "drop-in (CPU srv,cli)" "softrdma bench (CPU srv,cli)" ratio
for path in ${PATHS:-tcp same-host private}; do
  if [ $path = tcp ]; then flag=--tcp-only; benchflag=--no-same-host; else flag=""; benchflag=""; fi
  # private: the same-host path with SOFTRDMA_SHARE_MR=0 on the drop-in
  # (perftest's malloc buffers stay private; the peer reaches them with
  # process_vm_writev/readv).
  if [ $path = private ]; then export SOFTRDMA_SHARE_MR=0; envp="SOFTRDMA_SHARE_MR=0 "; else unset SOFTRDMA_SHARE_MR; envp=""; fi
  for size in 65536 1048576; do
    # REPS pairs, each the drop-in then the bench back to back; the line
    # shows the pair whose ratio is the median (loopback rates on a shared
    # host vary run to run by up to 2x, for raw TCP too), and the range.
    pairs=()
    for _ in $(seq 1 "$REPS"); do
      perftest "$flag" ib_write_bw "$size" -D "$SECS"
      mpps=$(awk -v s="$size" '$1 == s { print $NF }' "$tmp/c" | tail -1)
      d_gbps=$(awk -v m="$mpps" -v s="$size" 'BEGIN { printf "%.2f", m * 1e6 * s * 8 / 1e9 }')
      j=$("$S" bench --loopback --test write_bw --size "$size" --duration "$SECS" --json $benchflag 2>/dev/null | tail -1)
      b_gbps=$(awk -v g="$(json_num gbps "$j")" 'BEGIN { printf "%.2f", g }')
      ratio=$(awk -v a="$d_gbps" -v b="$b_gbps" 'BEGIN { printf "%.2f", a / b }')
      pairs+=("$ratio|$d_gbps|$b_gbps|$CPU_S|$CPU_C|$j")
    done
    mapfile -t sorted < <(printf '%s\n' "${pairs[@]}" | sort -t'|' -k1,1n)
    IFS='|' read -r ratio d_gbps b_gbps CPU_S CPU_C j <<<"${sorted[$(( ${#sorted[@]} / 2 ))]}"
    range="${sorted[0]%%|*}-${sorted[-1]%%|*}"
    # perftest's bandwidth tests report no per-message latency; the bench's
    # is post-to-completion of its signaled WRs (how long a WR waited).
    [ "${MD:-}" = 1 ] || printf '%-9s %-12s %8s | %7s Gbit/s (%s, %s)%18s | %7s Gbit/s p99 %7s us (%s, %s) | %6s  (%s of %s)\n' $path write_bw "$size" \
      "$d_gbps" "$CPU_S" "$CPU_C" "" "$b_gbps" "$(json_num lat_us_p99 "$j")" "$(json_num cpu_server "$j")" "$(json_num cpu_client "$j")" "$ratio" "$range" "$REPS"
    # shellcheck disable=SC2016 # the backquotes are markdown
    if [ "${MD:-}" = 1 ]; then printf '| %s | ib_write_bw | %s | %s Gbit/s | - | %s, %s | %s Gbit/s, p99 %s us, CPU %s, %s | %s (%s of %s) | `%ssoftrdma run%s -- ib_write_bw -R -s %s -D %s` vs `softrdma bench --loopback --test write_bw --size %s --duration %s%s` |\n' \
      "$path" "$(md_size "$size")" "$d_gbps" "$CPU_S" "$CPU_C" "$b_gbps" "$(json_num lat_us_p99 "$j")" "$(json_num cpu_server "$j")" "$(json_num cpu_client "$j")" \
      "$ratio" "$range" "$REPS" "$envp" "${flag:+ $flag}" "$size" "$SECS" "$size" "$SECS" "${benchflag:+ $benchflag}"; fi
  done
  perftest "$flag" ib_read_lat 8 -n "$LAT_ITERS"
  # #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%
  read -r d_p50 d_p99 < <(awk '$1 == 8 && NF >= 9 { print $5, $8 }' "$tmp/c" | tail -1)
  j=$("$S" bench --loopback --test read_lat --size 8 --iters "$LAT_ITERS" --json $benchflag 2>/dev/null | tail -1)
  b_p50=$(json_num lat_us_p50 "$j"); b_p99=$(json_num lat_us_p99 "$j")
  ratio=$(awk -v a="$d_p50" -v b="$b_p50" 'BEGIN { printf "%.2f", b / a }')
  [ "${MD:-}" = 1 ] || printf '%-9s %-12s %8s | p50 %6s p99 %7s us (%s, %s) | p50 %6s p99 %7s us (%s, %s) | %6s\n' $path read_lat 8 \
    "$d_p50" "$d_p99" "$CPU_S" "$CPU_C" "$b_p50" "$b_p99" "$(json_num cpu_server "$j")" "$(json_num cpu_client "$j")" "$ratio"
  # shellcheck disable=SC2016 # the backquotes are markdown
  if [ "${MD:-}" = 1 ]; then printf '| %s | ib_read_lat | 8 B | p50 %s us | %s us | %s, %s | p50 %s us, p99 %s us, CPU %s, %s | %s | `%ssoftrdma run%s -- ib_read_lat -R -s 8 -n %s` vs `softrdma bench --loopback --test read_lat --size 8 --iters %s%s` |\n' \
    "$path" "$d_p50" "$d_p99" "$CPU_S" "$CPU_C" "$b_p50" "$b_p99" "$(json_num cpu_server "$j")" "$(json_num cpu_client "$j")" "$ratio" \
    "$envp" "${flag:+ $flag}" "$LAT_ITERS" "$LAT_ITERS" "${benchflag:+ $benchflag}"; fi
done
if [ "${MD:-}" = 1 ]; then exit 0; fi
echo "ratio: drop-in / softrdma bench (rate; the median of REPS pairs, their range after it), softrdma bench / drop-in (p50 latency); target >= 0.9"
echo "write_bw p99: the bench's post-to-completion time of a signaled WR; perftest's bw tests report none"
