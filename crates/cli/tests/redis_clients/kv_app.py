"""A small application on redis-py, unmodified, against the store's RESP
door: it writes 3,000 keys over and over (each write a value of its own)
and counts with INCR on 10 counters, then reads them back,
through a cluster client (RedisCluster) or a plain one (Redis, which
fails over by hand to the next node when its node stops answering or
redirects). Run by crates/cli/tests/redis_door.rs, which kills the primary
with SIGKILL part-way.

    kv_app.py cluster|plain PORT,PORT SECONDS

stdout: JSON lines: {"type":"progress","acked":N} after each 200 writes,
then {"type":"summary", ...}. Exit 1 if a verification failed.
"""
import json
import sys
import time

import redis
from redis.cluster import ClusterNode, RedisCluster

mode, ports, seconds = sys.argv[1], [int(p) for p in sys.argv[2].split(",")], float(sys.argv[3])
password = sys.stdin.readline().strip()
prefix = "app%d:" % int(time.time() * 1000)


def plain(i):
    return redis.Redis(host="127.0.0.1", port=ports[i % len(ports)], password=password,
                       socket_timeout=5, protocol=3)


def cluster():
    return RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", p) for p in ports],
                        password=password, socket_timeout=5, protocol=3)


def say(**kv):
    print(json.dumps(kv), flush=True)


client = cluster() if mode == "cluster" else plain(0)
node = 0
hello = client.execute_command("HELLO") if mode == "plain" else None
KEYS = 3000
# key -> the last acknowledged value; key -> values written since with an
# unknown outcome (any of them may be what the key holds now).
acked, maybe, errors = {}, {}, []
writes = unknown = 0
# counter -> increments acknowledged, increments with an unknown outcome
counted, uncounted = {}, {}
# Transfers: MULTI, INCRBY a -1, INCRBY b 1, EXEC (one slot: a hash tag).
# Atomic, so a + b is 0 whatever happened to each, and b counts the
# acknowledged transfers (and at most those whose outcome is unknown).
acct_a, acct_b = "{%sacct}a" % prefix, "{%sacct}b" % prefix
transfers = transfers_unknown = 0


def failed(e):
    """A request whose outcome is unknown: counted, and the plain client
    fails over by hand to the next node (a -MOVED names it too)."""
    global unknown, node, client
    unknown += 1
    if mode == "plain":
        node += 1
        client = plain(node)
    errors.append(type(e).__name__ + ": " + str(e)[:120])
    time.sleep(0.05)


t0 = time.time()
i = 0
while time.time() - t0 < seconds:
    key, value = "%s%d" % (prefix, i % KEYS), "v%d" % i
    i += 1
    if i % 5 == 1:
        try:
            with client.pipeline(transaction=True) as p:
                p.incrby(acct_a, -1)
                p.incrby(acct_b, 1)
                got = p.execute()
            if len(got) != 2 or got[0] != -got[1]:
                errors.append("EXEC answered %r" % (got,))
            transfers += 1
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as e:
            transfers_unknown += 1
            failed(e)
        continue
    if i % 3 == 0:
        ctr = "%sctr%d" % (prefix, i % 10)
        try:
            client.incr(ctr)
            counted[ctr] = counted.get(ctr, 0) + 1
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as e:
            uncounted[ctr] = uncounted.get(ctr, 0) + 1
            failed(e)
        continue
    try:
        if client.set(key, value) is True:
            acked[key] = value
            maybe.pop(key, None)
            writes += 1
            if writes % 200 == 0:
                say(type="progress", acked=writes, t=time.time() - t0)
        else:
            errors.append("SET %s answered not OK" % key)
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as e:
        # The outcome is unknown: the write may or may not have happened.
        maybe.setdefault(key, set()).add(value.encode())
        failed(e)

# Every acknowledged write reads back, from a fresh client.
check = cluster() if mode == "cluster" else None
lost = []
deadline = time.time() + 20
for key, value in acked.items():
    while True:
        try:
            if check is None:
                # The plain client reads from any node that answers.
                got = plain(node).get(key)
            else:
                got = check.get(key)
            break
        except redis.exceptions.RedisError:
            if time.time() > deadline:
                raise
            node += 1
            time.sleep(0.05)
    if got != value.encode() and got not in maybe.get(key, set()):
        lost.append((key, value, got.decode() if got else None))
# Each counter holds its acknowledged increments, and at most those whose
# answer was lost besides.
counters_off = []
for ctr, n in counted.items():
    got = int((plain(node) if check is None else check).get(ctr) or 0)
    if not n <= got <= n + uncounted.get(ctr, 0):
        counters_off.append((ctr, n, uncounted.get(ctr, 0), got))

# Both sides of every transfer, or neither.
reader = plain(node) if check is None else check
a, b = (int(reader.get(k) or 0) for k in (acct_a, acct_b))
transfers_off = [] if a + b == 0 and transfers <= b <= transfers + transfers_unknown else [
    a, b, transfers, transfers_unknown]

say(type="summary", mode=mode, acked=writes, transfers=transfers, transfers_off=transfers_off, keys=len(acked), unknown=unknown, lost=len(lost),
    increments=sum(counted.values()), counters_off=counters_off,
    lost_examples=lost[:5], errors=len(errors), error_examples=errors[:5],
    proto=(hello or {}).get(b"proto") if isinstance(hello, dict) else None,
    redis_py=redis.__version__)
sys.exit(1 if lost or counters_off or transfers_off or not acked or not counted or not transfers
         else 0)
