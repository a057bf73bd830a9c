# Shell functions for scripts run inside the kvm-rdma guest (busybox sh).
# crates/cli/tests/interop_siw.rs puts this file at the top of every guest
# script it generates; hand-written guest scripts can paste it the same way.
# The guest has siw.ko loaded; the host is 10.0.2.2, the guest 10.0.2.15.

fail=0

# siw_up: soft-iWARP device siw0 on eth0. (siw on `lo` is accepted by
# `rdma link add`, but rdma_cm cannot resolve 127.0.0.1 to it.)
siw_up() {
  rdma link add siw0 type siw netdev eth0
}

# wait_listen PORT: until a socket listens on TCP PORT, IPv4 or IPv6
# (30 s at most; returns 1 then).
wait_listen() {
  hex=$(printf '%04X' "$1"); n=0
  while ! cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | grep -q ":$hex [0-9A-F]*:0000 0A"; do
    n=$((n+1)); [ $n -gt 300 ] && return 1; sleep 0.1
  done
}

# marker TEXT: a line the host acts on. run.sh's `sed -n '/GUEST-READY/,$p'`
# holds each line until the next one arrives (to know whether it is the last),
# so a second line follows to push the marker out at once.
marker() { echo "$1"; echo "(sent $1)"; }

# report NAME RC STDOUT EXPECTED STDERR: prints
#   CASE NAME RC <rc> DATA match|mismatch|missing LINES <n>
# comparing STDOUT with the EXPECTED file, details when something is wrong,
# then STDERR; sets fail=1 on a non-zero RC or data that does not match.
report() {
  if [ ! -s "$3" ]; then data=missing; elif cmp -s "$3" "$4"; then data=match; else data=mismatch; fi
  echo "CASE $1 RC $2 DATA $data LINES $(wc -l < "$3")"
  if [ "$2" != 0 ] || [ "$data" != match ]; then
    fail=1
    [ "$data" = mismatch ] && cmp "$3" "$4" 2>&1 | head -n 2
    echo "-- $1 stdout (clipped):"; head -n 20 "$3" | cut -c1-150
  fi
  echo "-- $1 stderr:"; cat "$5"
}
