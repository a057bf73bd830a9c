"""A small application on redis-py, unmodified, against the store's RESP
door: it writes 3,000 keys over and over (each write a value of its own),
counts with INCR on 10 counters, moves units between two accounts in
MULTI transactions and keeps sessions with TTLs (long ones that must
stay, short ones that must be gone once their deadline passed), then
reads them back,
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
# What the test needs seen at least (acked writes, increments, transfers,
# short and long sessions): past `seconds` the application goes on until
# it has them, up to ten times as long (a machine loaded by CI's CPU hog
# once ran ioredis at 330 operations/s).
minimum = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
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
# Sessions: long ones (EX 600) must hold their last acknowledged value
# (or one whose outcome is unknown) with a TTL; short ones (PX 1500) must
# read back at once and be gone after their deadline, failover or not.
SHORT_MS = 1500
sess_acked, sess_maybe = {}, {}
short_sent_last = None
short_written = early = 0


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


def enough():
    have = dict(acked=writes, increments=sum(counted.values()), transfers=transfers,
                short_sessions=short_written, sessions=len(sess_acked))
    return all(have[k] > v for k, v in minimum.items())


t0 = time.time()
i = 0
while time.time() - t0 < seconds or (not enough() and time.time() - t0 < 10 * seconds):
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
    if i % 7 == 2:
        short = (i // 7) % 2 == 0
        sid = "%ssess%s%d" % (prefix, "S" if short else "L", (i // 14) % 100)
        try:
            if short:
                short_sent_last = time.time()
                client.set(sid, value, px=SHORT_MS)
                short_written += 1
                # Read back at once: long before the deadline, never gone.
                got = client.get(sid)
                if got != value.encode() and time.time() - short_sent_last < 1.0:
                    early += 1
                    errors.append("session %s read %r right after SET PX" % (sid, got))
            else:
                client.set(sid, value, ex=600)
                sess_acked[sid] = value
                sess_maybe.pop(sid, None)
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as e:
            if not short:
                sess_maybe.setdefault(sid, set()).add(value.encode())
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
# answer was lost besides. Beyond those, one operation in all may have been
# applied twice: the command in flight when the primary was killed can be
# applied, its answer lost with the connection, and sent again by redis-py
# itself (it retries a command or a transaction whose connection broke,
# and succeeds on the new primary): at-least-once, as against Redis. The
# application has one command in flight at a time, so at most one.
counters_off = []
retried = 0
for ctr, n in counted.items():
    got = int((plain(node) if check is None else check).get(ctr) or 0)
    extra = got - n - uncounted.get(ctr, 0)
    if got < n or extra > 1:
        counters_off.append((ctr, n, uncounted.get(ctr, 0), got))
    retried += max(0, extra)

# Both sides of every transfer, or neither.
reader = plain(node) if check is None else check
a, b = (int(reader.get(k) or 0) for k in (acct_a, acct_b))
extra = b - transfers - transfers_unknown
transfers_off = [] if a + b == 0 and transfers <= b and extra <= 1 else [
    a, b, transfers, transfers_unknown]
retried += max(0, extra)

# Sessions: the long ones hold their value and a TTL; the short ones are
# gone once the last one's deadline passed (plus the readers' clock bound).
sessions_off = []
for sid, value in sess_acked.items():
    got, ttl = reader.get(sid), reader.ttl(sid)
    if (got != value.encode() and got not in sess_maybe.get(sid, set())) or not 0 < ttl <= 600:
        sessions_off.append((sid, value, got, ttl))
if short_sent_last is not None:
    time.sleep(max(0.0, short_sent_last + SHORT_MS / 1000 + 0.2 - time.time()))
    for n in range(100):
        sid = "%ssessS%d" % (prefix, n)
        got = reader.get(sid)
        if got is not None:
            sessions_off.append((sid, "expired", got, reader.pttl(sid)))

say(type="summary", mode=mode, secs=round(time.time() - t0, 1), acked=writes, sessions=len(sess_acked), short_sessions=short_written,
    sessions_off=sessions_off[:5], early=early, transfers=transfers, transfers_off=transfers_off, retried=retried, keys=len(acked), unknown=unknown, lost=len(lost),
    increments=sum(counted.values()), counters_off=counters_off,
    lost_examples=lost[:5], errors=len(errors), error_examples=errors[:5],
    proto=(hello or {}).get(b"proto") if isinstance(hello, dict) else None,
    redis_py=redis.__version__)
sys.exit(1 if lost or counters_off or transfers_off or retried > 1 or sessions_off or early or not acked
         or not counted or not transfers or not sess_acked or not short_written else 0)
