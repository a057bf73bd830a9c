#!/usr/bin/env bash
# Regenerates BENCHMARKS.md: runs every capability's benchmark on this
# machine, in one run, and writes the whole file (the machine and the commit
# at the top, then one markdown table per capability) to stdout or to OUT.
# Every figure printed comes from a command this run ran; the command is
# printed beside each row. Progress and the benchmarks' own messages go to
# stderr.
#
#   scripts/bench-report.sh [OUT.md]       (scripts/bench-report.sh BENCHMARKS.md)
#
#   SECTIONS="engine storage transfer heap store demo dropin"   (the default:
#             all, in this order; name fewer to run fewer)
#   REPEAT=3        softrdma bench --repeat (runs alternated with the
#                   baselines, medians reported)
#   REPS=5 DROPIN_SECS=3   scripts/bench-dropin.sh's pairs and seconds
#   STORE_SECS=2    softrdma store bench --secs
#   SOFTRDMA_BIN=PATH      use this binary (and the libraries beside it)
#                          instead of building target/release
#   KEEP=1          keep the raw JSON and logs (their directory is printed)
#
# Needs no root. Needs the release build (made here unless SOFTRDMA_BIN is
# set: `cargo build --release --workspace`), and for the baselines Debian's
# redis-server/redis-tools, fio, ucx-utils, perftest (scripts/setup.sh
# installs them); a section whose tool is missing says "not run" and why.
# A whole run with the defaults takes about 15 minutes on the 2-core
# machine (2026-11-27: 14 min 59 s). Each table leads with what a user
# between two hosts gets (iWARP over TCP: `--no-same-host` or
# SOFTRDMA_SAME_HOST=0), then the same-host transport.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

OUT=${1:-}
SECTIONS=${SECTIONS:-engine storage transfer heap store demo dropin}
REPEAT=${REPEAT:-3}
STORE_SECS=${STORE_SECS:-2}
export REPS=${REPS:-5}
DROPIN_SECS=${DROPIN_SECS:-3}

if [ -n "${SOFTRDMA_BIN:-}" ]; then
  S=$SOFTRDMA_BIN
else
  echo "bench-report: cargo build --release --workspace" >&2
  cargo build --release --workspace -q
  S=${CARGO_TARGET_DIR:-target}/release/softrdma
fi
[ -x "$S" ] || { echo "bench-report: no binary at $S" >&2; exit 1; }
export SOFTRDMA_BIN=$S

WORK=$(mktemp -d "${TMPDIR:-/var/tmp}/bench-report.XXXXXX")
if [ "${KEEP:-}" = 1 ]; then
  trap 'echo "bench-report: raw output kept in $WORK" >&2' EXIT
else
  trap 'rm -rf "$WORK"' EXIT
fi
LOG=$WORK/log
if [ -n "$OUT" ]; then exec 3>"$OUT"; else exec 3>&1; fi
say() { echo "bench-report: $* ($(date +%T))" >&2; }
out() { printf '%s\n' "$@" >&3; }

# ---------------------------------------------------------------- helpers
# jv KEY JSON: the value of a top-level scalar KEY of a one-line JSON
# object (strings without quotes; empty when absent or null).
jv() {
  local v
  v=$(grep -o "\"$1\":\(\"[^\"]*\"\|[^,}]*\)" <<<"$2" | head -1) || true
  v=${v#*:}; v=${v#\"}; v=${v%\"}
  [ "$v" = null ] && v=
  printf '%s' "$v"
}
# f FORMAT VALUE: printf through awk; "-" for an empty value.
f() { if [ -z "$2" ]; then printf -- '-'; else awk -v v="$2" "BEGIN { printf \"$1\", v }"; fi; }
# pct VALUE: a fraction of one core as a percentage.
pct() { if [ -z "$1" ]; then printf -- '-'; else awk -v v="$1" 'BEGIN { printf "%.0f%%", v * 100 }'; fi; }
# human SIZE: 65536 -> 64 KiB.
human() {
  awk -v s="$1" 'BEGIN {
    if (s !~ /^[0-9]+$/) { print s; exit }
    if (s >= 1048576 && s % 1048576 == 0) printf "%d MiB", s / 1048576
    else if (s >= 1024 && s % 1024 == 0) printf "%d KiB", s / 1024
    else printf "%d B", s }'
}
# shown CMD...: the command as a reader types it (the binary as `softrdma`).
shown() { local c="$*"; c=${c#env }; c=${c//$WORK\//}; printf '%s' "${c//$S/softrdma}"; }
# run_json FILE CMD...: runs CMD, its JSON lines into FILE; false on failure.
run_json() {
  local file=$1; shift
  say "$(shown "$@")"
  if "$@" >"$file.all" 2>>"$LOG"; then
    grep '^{' "$file.all" >"$file" || true
    return 0
  fi
  echo "bench-report: failed: $(shown "$@") (last lines of its log:)" >&2
  tail -n 5 "$LOG" >&2
  return 1
}
notrun() { out "" "Not run in this run: $*." ""; }

# ---------------------------------------------------------------- header
cpu_model=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
hyper=$(lscpu | sed -n 's/^Hypervisor vendor: *//p' | head -1)
mem=$(free -g | awk '/^Mem:/ { print $2 }')
# shellcheck source=/dev/null
os=$(. /etc/os-release && echo "$PRETTY_NAME")
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || commit="$commit (with uncommitted changes)"
tools=""
command -v redis-server >/dev/null && tools="$tools, Redis $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')"
command -v fio >/dev/null && tools="$tools, $(fio --version)"
v=$(dpkg-query -W -f='${Version}' ucx-utils 2>/dev/null) && tools="$tools, UCX ${v%%-*}"
v=$(dpkg-query -W -f='${Version}' perftest 2>/dev/null) && tools="$tools, perftest ${v%%+*}"
out "# Benchmarks" "" \
    "**Machine:** $(nproc) cores ($cpu_model${hyper:+, $hyper guest}), $mem GiB (\`free -g\`), $os, Linux $(uname -r), $(rustc -V 2>/dev/null | cut -d' ' -f1-2)$tools." \
    "**Run:** $(date -u '+%Y-%m-%d %H:%M') UTC, commit $commit, release build." "" \
    "Generated by \`scripts/bench-report.sh\` (no root): every figure below comes from a" \
    "command it ran in this run, printed beside its row, and every ratio is against a baseline measured in" \
    "the same run. The investigations behind the figures: docs/perf-notes.md." "" \
    "Each table leads with what a user between two hosts gets: iWARP over TCP (\`--no-same-host\` or" \
    "\`SOFTRDMA_SAME_HOST=0\`; all processes on one host, over loopback), then the same-host transport that" \
    "two softrdma processes on one host use by themselves. \"n/r\": the command reports no such figure." ""

# ---------------------------------------------------------------- engine
engine_row() { # PATHLABEL JSON CMD
  local j=$2 t size rate p99 cpu base ratio
  t=$(jv test "$j"); size=$(human "$(jv size "$j")")
  cpu="$(pct "$(jv cpu_client "$j")") / $(pct "$(jv cpu_server "$j")")"
  base=""; ratio=""
  case $t in
    idle_qps)
      rate="$(jv qps "$j") QPs: RSS $(f '%.1f' "$(jv rss_client_mib "$j")") / $(f '%.1f' "$(jv rss_server_mib "$j")") MiB"
      size=""; p99="-" ;;
    *_bw)
      if [ "$(jv size "$j")" -le 64 ]; then
        rate="$(f '%.2f' "$(awk -v m="$(jv msg_rate "$j")" 'BEGIN { print m / 1e6 }')") M msg/s"
      else
        rate="$(f '%.1f' "$(jv gbps "$j")") Gbit/s"
      fi
      [ -n "$(jv runs_min_over_max "$j")" ] && rate="$rate (slowest/fastest $(jv runs_min_over_max "$j"))"
      p99="$(f '%.0f us' "$(jv lat_us_p99 "$j")")"
      [ -n "$(jv baseline_gbps "$j")" ] && { base="TCP pump $(f '%.1f' "$(jv baseline_gbps "$j")") Gbit/s"; ratio="$(f '%.2f' "$(jv ratio "$j")")"; }
      [ -n "$(jv tcp_segments_gbps "$j")" ] && { base="$base; segment pump $(f '%.1f' "$(jv tcp_segments_gbps "$j")")"; ratio="$ratio; $(f '%.2f' "$(jv ratio_tcp_segments "$j")") segment pump"; }
      if [ -n "$(jv ucx_gbps "$j")" ]; then
        if [ "$(jv size "$j")" -le 64 ]; then
          base="${base:+$base; }UCX ($(jv ucx_tls "$j")) $(f '%.3f' "$(awk -v m="$(jv ucx_msg_rate "$j")" 'BEGIN { print m / 1e6 }')") M msg/s"
        else
          base="${base:+$base; }UCX ($(jv ucx_tls "$j")) $(f '%.2f' "$(jv ucx_gbps "$j")") Gbit/s"
        fi
        ratio="${ratio:+$ratio; }$(f '%.2f' "$(jv ucx_ratio "$j")") UCX"
      fi ;;
    *)
      rate="p50 $(f '%.2f' "$(jv lat_us_p50 "$j")") us"
      p99="$(f '%.2f us' "$(jv lat_us_p99 "$j")")"
      if [ -n "$(jv baseline_lat_us_p50 "$j")" ]; then
        if [ "$(jv busy_poll "$j")" = true ]; then base="TCP ping-pong, busy-polled"; else base="TCP ping-pong, blocking"; fi
        base="$base, p50 $(f '%.2f' "$(jv baseline_lat_us_p50 "$j")") us"; ratio="$(f '%.2f' "$(jv ratio "$j")")"
      fi
      [ -n "$(jv ucx_lat_us_p50 "$j")" ] && { base="${base:+$base; }UCX ($(jv ucx_tls "$j")) p50 $(f '%.2f' "$(jv ucx_lat_us_p50 "$j")") us"; ratio="${ratio:+$ratio; }$(f '%.2f' "$(jv ucx_ratio "$j")") UCX"; } ;;
  esac
  [ "$(jv busy_poll "$j")" = true ] && t="$t --busy-poll"
  [ "$(jv extensions "$j")" = false ] && t="$t --no-ext"
  out "| $1 | $t | $size | $rate | $p99 | $cpu | ${base:--} | ${ratio:--} | \`$3\` |"
}
engine() {
  local label=$1; shift
  local f=$WORK/engine.$RANDOM
  if run_json "$f" "$@"; then
    while read -r j; do engine_row "$label" "$j" "$(shown "$@")"; done <"$f"
  else
    out "| $label | failed: \`$(shown "$@")\` | | | | | | | |"
  fi
}
section_engine() {
  out "## 1. Verbs engine, iWARP over TCP, same-host transport (\`softrdma bench\`)" ""
  out "Each line: \`softrdma bench --loopback\` (a server child process and a client), RDMA and baseline runs" \
      "alternated \`--repeat $REPEAT\` times, medians. Rate: Gbit/s of payload (bandwidth) or p50 latency (\`*_lat\`:" \
      "half round trips; \`read_lat\`: a full round trip); p99: of every WR's post-to-completion time (bandwidth) or" \
      "of the round trips; CPU: cores busy in the client / server process. Ratio: ours / baseline (bandwidth: higher" \
      "is better; latency: lower is better)." ""
  out "| path | test | size | rate | p99 | CPU client / server | baseline, same run | ratio | command |" \
      "|---|---|---|---|---|---|---|---|---|"
  local B=("$S" bench --loopback --json --repeat "$REPEAT")
  local N=("${B[@]}" --no-same-host) T="iWARP/TCP" H="same-host"
  local L=(--size 8 --iters 20000) M=(--size 8 --qps 4 --depth 256 --cq-mod 64 --iters 500000)
  engine "$T" "${N[@]}" --test write_bw --size 64K,1M --baseline tcp,ucx
  engine "$T" "${N[@]}" --test send_bw --size 64K,1M --baseline tcp,ucx
  engine "$T" "${N[@]}" --test read_bw --size 64K,1M --baseline tcp,ucx
  engine "$T, siw framing" "${N[@]}" --no-ext --test write_bw --size 64K,1M --baseline tcp,tcp-segments
  engine "$T, siw framing" "${N[@]}" --no-ext --test send_bw --size 64K,1M --baseline tcp,tcp-segments
  engine "$T, siw framing" "${N[@]}" --no-ext --test read_bw --size 64K,1M --baseline tcp,tcp-segments
  engine "$T" "${N[@]}" --test write_lat "${L[@]}" --baseline tcp,ucx
  engine "$T" "${N[@]}" --test send_lat "${L[@]}" --baseline tcp
  engine "$T" "${N[@]}" --test read_lat "${L[@]}" --baseline tcp
  engine "$T" "${N[@]}" --test write_lat "${L[@]}" --baseline tcp --busy-poll
  engine "$T" "${N[@]}" --test send_lat "${L[@]}" --baseline tcp --busy-poll
  engine "$T" "${N[@]}" --test read_lat "${L[@]}" --baseline tcp --busy-poll
  engine "$T, 4 QPs, depth 256, 1 in 64 signaled" "${N[@]}" --test write_bw "${M[@]}" --baseline ucx
  engine "$T" "$S" bench --loopback --json --no-same-host --test idle_qps --qps 1000 --idle-secs 5
  engine "$H" "${B[@]}" --test write_bw --size 64K,1M --baseline tcp,ucx --ucx-tls cma,tcp
  engine "$H" "${B[@]}" --test read_bw --size 64K,1M --baseline tcp,ucx --ucx-tls cma,tcp
  engine "$H" "${B[@]}" --test send_bw --size 64K,1M --baseline tcp
  engine "$H" "${B[@]}" --test write_lat "${L[@]}" --baseline tcp
  engine "$H" "${B[@]}" --test write_lat "${L[@]}" --baseline tcp --busy-poll
  engine "$H" "${B[@]}" --test send_lat "${L[@]}" --baseline tcp --busy-poll
  engine "$H" "${B[@]}" --test read_lat "${L[@]}" --baseline tcp --busy-poll
  engine "$H, 4 QPs, depth 256, 1 in 64 signaled" "${B[@]}" --test write_bw "${M[@]}" --baseline ucx --ucx-tls cma,tcp
  engine "$H" "$S" bench --loopback --json --test idle_qps --qps 1000 --idle-secs 5
  out "" "Against a real siw peer (the qemu guest, root) there are no rate figures: the guest runs the interop tests only" \
      "(docs/interop.md). The siw-framing lines are softrdma without its extensions, which is what a siw peer gets." ""
}

# ---------------------------------------------------------------- drop-in
section_dropin() {
  out "## 6. Unmodified RDMA applications on the drop-in libibverbs (\`scripts/bench-dropin.sh\`)" ""
  if ! command -v ib_write_bw >/dev/null; then notrun "perftest is not installed (scripts/setup.sh)"; return; fi
  out "Debian's perftest (\`-R\`, both ends under \`softrdma run\`) against \`softrdma bench\` on the same path, pairs run" \
      "back to back; bandwidth lines show the pair whose ratio is the median of $REPS, with the range of the $REPS ratios." \
      "CPU: cores busy (CPU seconds / wall seconds) of server, client; the drop-in's include process start-up." ""
  out "| path | test | size | drop-in rate | p99 | CPU server, client | \`softrdma bench\`, same run | ratio | command |" \
      "|---|---|---|---|---|---|---|---|---|"
  say "scripts/bench-dropin.sh $DROPIN_SECS"
  if ! MD=1 scripts/bench-dropin.sh "$DROPIN_SECS" >"$WORK/dropin" 2>>"$LOG"; then
    echo "bench-report: scripts/bench-dropin.sh failed" >&2; tail -n 5 "$LOG" >&2
  fi
  grep '^|' "$WORK/dropin" >&3 || true
  out "" "Ratio: drop-in / bench for rates, bench / drop-in for p50 latency (above 1: the drop-in is faster). perftest's" \
      "bandwidth tests report no per-message latency; the bench's p99 is its WRs' post-to-completion time." ""
}

# ---------------------------------------------------------------- storage
storage_row() { # MODE JSON CMD
  local j=$2 op base ratio p99
  op=$(jv op "$j")
  if [ "${op%_mixed}" != "$op" ]; then
    p99="small: p50 $(f '%.1f' "$(jv small_lat_us_p50 "$j")") / p99 $(f '%.1f' "$(jv small_lat_us_p99 "$j")") us"
    if [ -n "$(jv speedup "$j")" ]; then base="strict ordering, same run"; ratio="$(jv speedup "$j") (small p50)"; else base="-"; ratio="-"; fi
  else
    p99="p50 $(f '%.1f' "$(jv lat_us_p50 "$j")") / p99 $(f '%.1f' "$(jv lat_us_p99 "$j")") us"
    if [ -n "$(jv tcp_gbps "$j")" ]; then base="TCP pump $(jv tcp_gbps "$j") GB/s"; ratio=$(jv tcp_ratio "$j")
    elif [ -n "$(jv fio_gbps "$j")" ]; then base="fio $(jv fio_gbps "$j") GB/s"; ratio=$(jv ratio "$j")
    else base="-"; ratio="-"; fi
  fi
  out "| $1 | $(jv where "$j") | $op | $(human "$(jv size "$j")") | $(jv depth "$j") | $(jv ordering "$j") | $(jv gbps "$j") GB/s, $(f '%.0f' "$(jv iops "$j")") IOPS | $p99 | $(pct "$(jv cpu "$j")") | $base | $ratio | \`$3\` |"
}
storage() {
  local mode=$1; shift
  local f=$WORK/storage.$RANDOM
  if run_json "$f" "$@"; then
    local j
    for sel in '"where":"remote"' '"where":"local"'; do
      { grep "$sel" "$f" || true; } | { grep -v '_mixed"' || true; } | while read -r j; do storage_row "$mode" "$j" "$(shown "$@")"; done
    done
    { grep '_mixed"' "$f" || true; } | while read -r j; do storage_row "$mode" "$j" "$(shown "$@")"; done
  else
    out "| $mode | failed: \`$(shown "$@")\` | | | | | | | | | | |"
  fi
}
section_storage() {
  out "## 2. Local storage as an RDMA endpoint (\`softrdma storage bench\`)" ""
  local fio=() note=""
  command -v fio >/dev/null || { fio=(--no-fio); note="fio is not installed: no fio baseline in this run."; }
  out "A 1 GiB store in a file on this machine's disk, workload over 256 MiB of partition 0. Remote: through" \
      "\`softrdma storage serve\`'s target over loopback TCP (what a peer on another host gets), against a raw TCP" \
      "pump of the same message size. Local: a network-less QP, against fio (io_uring) on the same bytes. $note" ""
  out "| mode | where | op | size | depth | ordering | rate | p99 | CPU | baseline, same run | ratio | command |" \
      "|---|---|---|---|---|---|---|---|---|---|---|---|"
  storage "page cache" "$S" storage bench "$WORK/sb.img" --json "${fio[@]}"
  storage "O_DIRECT" "$S" storage bench "$WORK/sb.img" --json --direct --seconds 1 "${fio[@]}"
  out "" "p50 / p99: post-to-completion time of one WR in eight (the mixed workload: of its 4 KiB requests). CPU: cores busy in" \
      "the bench's one process (its client and the engine's threads, and for remote rows the target too). The file" \
      "lies in \`\$TMPDIR\` (default /var/tmp; O_DIRECT needs a disk, not tmpfs)." ""
}

# ---------------------------------------------------------------- transfer
section_transfer() {
  out "## 3. One-shot operations and the transfer planner (\`softrdma transfer bench\`, \`softrdma transfer oneshot\`)" ""
  out "| path | bench | WRs | rate | p50 / p99 per round of 4,096 | CPU | baseline, same run | ratio | command |" \
      "|---|---|---|---|---|---|---|---|---|"
  local f=$WORK/transfer j b c base ratio rate one p k
  if run_json "$f" "$S" transfer bench --json; then
    c=$(shown "$S" transfer bench --json)
    for tr in tcp same-host; do
      one=""
      { grep "\"transport\":\"$tr\"" "$f" || true; } | while read -r j; do
        b=$(jv bench "$j")
        case $b in
          scattered*) rate="$(jv gbps "$j") GB/s ($(human "$(jv bytes "$j")"), $(jv buffers "$j") buffers)"; p="-" ;;
          *) rate="$(f '%.0f' "$(jv ops_per_s "$j")") transfers/s"; p="$(jv p50_round_us "$j") / $(jv p99_round_us "$j") us" ;;
        esac
        base="-"; ratio="-"
        case $b in
          *_one_by_one) one=$(f '%.0f' "$(jv ops_per_s "$j")") ;;
          *_coalesced) base="${b%_coalesced}_one_by_one ${one:-?} transfers/s"; ratio="$(jv speedup "$j")x" ;;
        esac
        out "| $([ "$tr" = tcp ] && echo iWARP/TCP || echo same-host) | $b | $(jv wrs "$j") | $rate | $p | $(pct "$(jv cpu "$j")") | $base | $ratio | \`$c\` |"
      done
    done
  else
    out "| | failed: \`$(shown "$S" transfer bench --json)\` | | | | | | | |"
  fi
  out "" "One-shot advertise/close against fast-register + Send + Local Invalidate (an iSER-like write, iWARP/TCP):" ""
  out "| path | bench | size | depth | commands/s | initiator calls/cmd | target calls/cmd | baseline, same run | ratio (commands/s; initiator calls) | command |" \
      "|---|---|---|---|---|---|---|---|---|---|"
  f=$WORK/oneshot
  if run_json "$f" "$S" transfer oneshot --json; then
    c=$(shown "$S" transfer oneshot --json)
    local conv=()
    while read -r j; do
      b=$(jv bench "$j"); k="$(jv size "$j")/$(jv depth "$j")"
      if [ "$b" = iser_write_conventional ]; then
        conv+=("$k|$(f '%.0f' "$(jv commands_per_s "$j")")|$(jv initiator_calls_per_cmd "$j")"); base="-"; ratio="-"
      else
        base="-"; ratio="-"
        for x in "${conv[@]}"; do
          IFS='|' read -r ck cr cc <<<"$x"
          [ "$ck" = "$k" ] && { base="conventional $cr cmd/s, $cc calls/cmd"
            ratio="$(awk -v a="$(jv commands_per_s "$j")" -v b="$cr" 'BEGIN { printf "%.2f", a / b }'); $(awk -v a="$(jv initiator_calls_per_cmd "$j")" -v b="$cc" 'BEGIN { printf "%.2f", a / b }')"; }
        done
      fi
      out "| iWARP/TCP | $b | $(human "$(jv size "$j")") | $(jv depth "$j") | $(f '%.0f' "$(jv commands_per_s "$j")") | $(jv initiator_calls_per_cmd "$j") | $(jv target_calls_per_cmd "$j") | $base | $ratio | \`$c\` |"
    done <"$f"
  else
    out "| | failed: \`$(shown "$S" transfer oneshot --json)\` | | | | | | | | |"
  fi
  out "" "\`transfer oneshot\` reports no percentiles and no CPU; its figure is driver calls per command." ""
}

# ---------------------------------------------------------------- heap
section_heap() {
  out "## 4. Registered-memory heap (\`softrdma heap bench\`)" ""
  out "One op = allocate + look up the address's keys + free. Cached: a \`HeapBuf\` from the shared heap; baseline:" \
      "the global allocator + registering (pin + STag) and deregistering each allocation, same run. The heap is shared" \
      "by the processes of one host: there is no between-hosts figure." ""
  out "| size | processes | cached ns/op | p99 | CPU | baseline, same run | ratio | command |" \
      "|---|---|---|---|---|---|---|---|"
  local f=$WORK/heap j c
  if run_json "$f" "$S" heap bench --json; then
    c=$(shown "$S" heap bench --json)
    while read -r j; do
      out "| $(human "$(jv size "$j")") | $(jv processes "$j") | $(jv cached_ns "$j") | n/r | n/r | uncached $(jv uncached_ns "$j") ns/op (pinning $(jv pinning "$j")) | $(jv speedup "$j")x | \`$c\` |"
    done <"$f"
  else
    out "| failed: \`$(shown "$S" heap bench --json)\` | | | | | | | |"
  fi
  out "" "n/r: \`heap bench\` reports mean times per op only (no percentiles, no CPU)." ""
}

# ---------------------------------------------------------------- store
store() {
  local label=$1; shift
  local f=$WORK/store.$RANDOM j c sw
  c=$(shown "$@")
  if run_json "$f" "$@"; then
    while read -r j; do
      sw="-"; local r2="-"
      [ -n "$(jv redis_set_wait_ops_per_s "$j")" ] && {
        sw="$(f '%.0f' "$(jv redis_set_wait_ops_per_s "$j")") ($(f '%.0f' "$(jv redis_set_wait_p50_us "$j")") / $(f '%.0f' "$(jv redis_set_wait_p99_us "$j")") us)"
        r2=$(jv ratio_set_wait "$j"); }
      out "| $label | $(jv op "$j") | $(jv value_size "$j") | $(jv clients "$j") | $(f '%.0f' "$(jv ops_per_s "$j")") | $(f '%.0f' "$(jv p50_us "$j")") / $(f '%.0f' "$(jv p99_us "$j")") us | $(pct "$(jv cpu_client "$j")") / $(pct "$(jv cpu_primary "$j")") / $(pct "$(jv cpu_secondary "$j")") | $(jv redis_op "$j") $(f '%.0f' "$(jv redis_ops_per_s "$j")") ($(f '%.0f' "$(jv redis_p50_us "$j")") / $(f '%.0f' "$(jv redis_p99_us "$j")") us) | $(jv ratio "$j") | $sw | $r2 | \`$c\` |"
    done <"$f"
  else
    out "| $label | failed: \`$c\` | | | | | | | | | | |"
  fi
}
section_store() {
  out "## 5. HA remote memory store (\`softrdma store bench\`, \`softrdma demo\`)" ""
  if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null; then
    notrun "\`store bench\` needs redis-server and redis-benchmark (scripts/setup.sh)"; return
  fi
  out "The bench starts a two-node group (\`softrdma store serve\` processes, embedded coordinator, group secret) and a" \
      "Redis primary with one replica; per value size and client count: the store's ops, then redis-benchmark's" \
      "SET/GET (\`-P 16\` beside \`read_many\`) and Redis's replicated write (SET + \`WAIT 1 0\`), all in the same run." \
      "CPU: client / primary / secondary (for \`resp_*\`: redis-benchmark / the two nodes)." ""
  out "| path | op | value B | clients | ops/s | p50 / p99 | CPU | Redis, same run: ops/s (p50 / p99) | ratio | Redis SET+WAIT, same run | ratio to SET+WAIT | command |" \
      "|---|---|---|---|---|---|---|---|---|---|---|---|"
  store "iWARP/TCP" env SOFTRDMA_SAME_HOST=0 "$S" store bench --json --secs "$STORE_SECS"
  store "same-host" "$S" store bench --json --secs "$STORE_SECS"
  out ""
  out "Large values (\`softrdma store bench-large\`): the native put against plain TCP relaying the same bytes" \
      "client -> A -> B with acknowledgements (target 0.8x), the one-sided get against one TCP hop; one client." \
      "CPU: client / primary / secondary (the pump's: this process, all its ends)." ""
  out "| path | op | value B | ops/s | p50 / p99 | CPU | baseline, same run: ops/s (p99) | ratio | command |" \
      "|---|---|---|---|---|---|---|---|---|"
  large "iWARP/TCP" env SOFTRDMA_SAME_HOST=0 "$S" store bench-large --json --secs "$STORE_SECS"
  large "same-host" "$S" store bench-large --json --secs "$STORE_SECS"
  out ""
}
large() {
  local label=$1; shift
  local f=$WORK/large.$RANDOM j c
  c=$(shown "$@")
  if run_json "$f" "$@"; then
    while read -r j; do
      [ -n "$(jv baseline "$j")" ] || continue
      out "| $label | $(jv op "$j") | $(jv size "$j") | $(f '%.1f' "$(jv ops_per_s "$j")") | $(f '%.0f' "$(jv p50_us "$j")") / $(f '%.0f' "$(jv p99_us "$j")") us | $(pct "$(jv cpu_client "$j")") / $(pct "$(jv cpu_primary "$j")") / $(pct "$(jv cpu_secondary "$j")") | $(jv baseline "$j") $(f '%.1f' "$(jv baseline_ops_per_s "$j")") ($(f '%.0f' "$(jv baseline_p99_us "$j")") us, CPU $(pct "$(jv baseline_cpu "$j")")) | $(jv ratio "$j") | \`$c\` |"
    done <"$f"
  else
    out "| $label | failed: \`$c\` | | | | | | | |"
  fi
}
demo() {
  local label=$1; shift
  local f=$WORK/demo.$RANDOM c
  c=$(shown "$@")
  say "$c"
  if "$@" >"$f" 2>>"$LOG"; then
    local ops lat gap rejoin lost
    ops=$(sed -n 's/.*operations on keys: .* = \([0-9.]*\) ops\/s.*/\1/p' "$f")
    lat=$(awk '$2 ~ /^[0-9]+$/ && $3 == "ops" && $4 == "p50" { printf "%s%s %s / %s us", sep, $1, $5, $8; sep = "; " }' "$f")
    gap=$(sed -n 's/.*failover gap.*: \([0-9]*\) ms/\1 ms/p' "$f")
    rejoin=$(sed -n 's/^ *rejoin: .*back in sync after \([0-9.]*\) s.*/\1 s/p' "$f" | head -n 1)
    lost=$(sed -n 's/^lost writes: //p' "$f")
    out "| $label | ${ops:--} | ${lat:--} | ${gap:--} | ${rejoin:-not in sync} | ${lost:--} | \`$c\` |"
  else
    out "| $label | failed: \`$c\` (lost writes: $(sed -n 's/^lost writes: //p' "$f")) | | | | | |"
  fi
}
section_demo() {
  out "\`softrdma demo\` (the main job: 4 verifying clients, the primary SIGKILLed part-way, failover, rejoin):" ""
  out "| path | ops/s | p50 / p99 per op | failover gap | rejoin | lost writes | command |" \
      "|---|---|---|---|---|---|---|"
  demo "iWARP/TCP" env SOFTRDMA_SAME_HOST=0 "$S" demo
  demo "same-host" "$S" demo
  out "" "The demo has no baseline and reports no CPU: its figures are the failover's (gap, rejoin, \`lost writes\`)." ""
}

say "writing to ${OUT:-stdout}; raw output in $WORK"
for s in $SECTIONS; do
  case $s in
    engine|dropin|storage|transfer|heap|store|demo) "section_$s" ;;
    *) echo "bench-report: unknown section $s" >&2; exit 2 ;;
  esac
done
say "done"
