// The application of kv_app.py on ioredis's Cluster client, unmodified:
// 3,000 keys written over and over (each write a value of its own), 10
// counters counted with INCR, transfers in MULTI, and sessions with TTLs
// (long ones that must stay, short ones that must be gone after their
// deadline), then
// every acknowledged value read back through a fresh client. Run by
// crates/cli/tests/redis_door.rs, which kills the primary part-way.
//
//   node kv_app.js PORT,PORT SECONDS      (the password on stdin)
//
// stdout: JSON lines, {"type":"progress","acked":N} every 200 writes, then
// {"type":"summary",...}. Exit 1 if a verification failed.
const Redis = require("ioredis");

const ports = process.argv[2].split(",").map(Number);
const seconds = Number(process.argv[3]);
// What the test needs seen at least (acked writes, increments, transfers,
// short and long sessions): past `seconds` the application goes on until
// it has them, up to ten times as long (a machine loaded by CI's CPU hog
// once ran it at 330 operations/s).
const minimum = process.argv[4] ? JSON.parse(process.argv[4]) : {};
const KEYS = 3000;

function cluster(password) {
  return new Redis.Cluster(
    ports.map((port) => ({ host: "127.0.0.1", port })),
    {
      redisOptions: { password },
      clusterRetryStrategy: () => 50,
      retryDelayOnFailover: 50,
      retryDelayOnClusterDown: 50,
      slotsRefreshTimeout: 2000,
    }
  );
}

const say = (o) => process.stdout.write(JSON.stringify(o) + "\n");

async function main(password) {
  const prefix = `js${Date.now()}:`;
  let client = cluster(password);
  const acked = new Map();
  const maybe = new Map();
  const errors = [];
  let writes = 0;
  let unknown = 0;
  const counted = new Map();
  const uncounted = new Map();
  const bump = (m, k) => m.set(k, (m.get(k) || 0) + 1);
  // Transfers: MULTI, INCRBY a -1, INCRBY b 1, EXEC (one slot: a hash
  // tag). Atomic, so a + b is 0 whatever happened to each, and b counts
  // the acknowledged transfers (and at most those whose outcome is unknown).
  const acctA = `{${prefix}acct}a`;
  const acctB = `{${prefix}acct}b`;
  let transfers = 0;
  let transfersUnknown = 0;
  // Sessions (as kv_app.py): long ones EX 600, short ones PX 1500.
  const SHORT_MS = 1500;
  const sessAcked = new Map();
  const sessMaybe = new Map();
  let shortSentLast = null;
  let shortWritten = 0;
  let early = 0;
  const t0 = Date.now();
  let i = 0;
  const enough = () => {
    const have = {
      acked: writes, increments: [...counted.values()].reduce((a, b) => a + b, 0),
      transfers, short_sessions: shortWritten, sessions: sessAcked.size,
    };
    return Object.entries(minimum).every(([k, v]) => have[k] > v);
  };
  const elapsed = () => Date.now() - t0;
  while (elapsed() < seconds * 1000 || (!enough() && elapsed() < 10 * seconds * 1000)) {
    const key = `${prefix}${i % KEYS}`;
    const value = `v${i}`;
    i += 1;
    if (i % 5 === 1) {
      try {
        const got = await client.multi().incrby(acctA, -1).incrby(acctB, 1).exec();
        if (!got || got.length !== 2 || got[0][0] || got[1][0] || got[0][1] !== -got[1][1]) {
          errors.push(`EXEC answered ${JSON.stringify(got)}`);
        }
        transfers += 1;
      } catch (e) {
        transfersUnknown += 1;
        unknown += 1;
        errors.push(String(e.message || e).slice(0, 120));
        await new Promise((r) => setTimeout(r, 50));
      }
      continue;
    }
    if (i % 7 === 2) {
      const short = Math.floor(i / 7) % 2 === 0;
      const sid = `${prefix}sess${short ? "S" : "L"}${Math.floor(i / 14) % 100}`;
      try {
        if (short) {
          shortSentLast = Date.now();
          await client.set(sid, value, "PX", SHORT_MS);
          shortWritten += 1;
          // Read back at once: long before the deadline, never gone.
          const got = await client.get(sid);
          if (got !== value && Date.now() - shortSentLast < 1000) {
            early += 1;
            errors.push(`session ${sid} read ${got} right after SET PX`);
          }
        } else {
          await client.set(sid, value, "EX", 600);
          sessAcked.set(sid, value);
          sessMaybe.delete(sid);
        }
      } catch (e) {
        if (!short) {
          if (!sessMaybe.has(sid)) sessMaybe.set(sid, new Set());
          sessMaybe.get(sid).add(value);
        }
        unknown += 1;
        errors.push(String(e.message || e).slice(0, 120));
        await new Promise((r) => setTimeout(r, 50));
      }
      continue;
    }
    if (i % 3 === 0) {
      const ctr = `${prefix}ctr${i % 10}`;
      try {
        await client.incr(ctr);
        bump(counted, ctr);
      } catch (e) {
        bump(uncounted, ctr);
        unknown += 1;
        errors.push(String(e.message || e).slice(0, 120));
        await new Promise((r) => setTimeout(r, 50));
      }
      continue;
    }
    try {
      const r = await client.set(key, value);
      if (r !== "OK") throw new Error(`SET answered ${r}`);
      acked.set(key, value);
      maybe.delete(key);
      writes += 1;
      if (writes % 200 === 0) say({ type: "progress", acked: writes, t: (Date.now() - t0) / 1000 });
    } catch (e) {
      // The outcome is unknown: the write may or may not have happened.
      unknown += 1;
      if (!maybe.has(key)) maybe.set(key, new Set());
      maybe.get(key).add(value);
      errors.push(String(e.message || e).slice(0, 120));
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  client.disconnect();
  const check = cluster(password);
  const lost = [];
  for (const [key, value] of acked) {
    let got;
    for (let tries = 0; ; tries++) {
      try {
        got = await check.get(key);
        break;
      } catch (e) {
        if (tries > 200) throw e;
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    if (got !== value && !(maybe.get(key) || new Set()).has(got)) lost.push([key, value, got]);
  }
  // Each counter holds its acknowledged increments, and at most those
  // whose answer was lost besides. Beyond those, one operation in all may
  // have been applied twice: the command in flight when the primary was
  // killed can be applied, its answer lost with the connection, and sent
  // again by ioredis itself (it retries commands whose connection broke):
  // at-least-once, as against Redis. One command is in flight at a time.
  const countersOff = [];
  let retried = 0;
  for (const [ctr, n] of counted) {
    const got = Number((await check.get(ctr)) || 0);
    const unknown = uncounted.get(ctr) || 0;
    const extra = got - n - unknown;
    if (got < n || extra > 1) countersOff.push([ctr, n, unknown, got]);
    retried += Math.max(0, extra);
  }
  // Both sides of every transfer, or neither.
  const a = Number((await check.get(acctA)) || 0);
  const b = Number((await check.get(acctB)) || 0);
  const extraT = b - transfers - transfersUnknown;
  const transfersOff = a + b === 0 && transfers <= b && extraT <= 1
    ? [] : [a, b, transfers, transfersUnknown];
  retried += Math.max(0, extraT);
  // Sessions: the long ones hold their value and a TTL; the short ones
  // are gone once the last one's deadline passed (plus the clock bound).
  const sessionsOff = [];
  for (const [sid, value] of sessAcked) {
    const got = await check.get(sid);
    const ttl = await check.ttl(sid);
    if ((got !== value && !(sessMaybe.get(sid) || new Set()).has(got)) || !(ttl > 0 && ttl <= 600)) {
      sessionsOff.push([sid, value, got, ttl]);
    }
  }
  if (shortSentLast !== null) {
    const wait = shortSentLast + SHORT_MS + 200 - Date.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    for (let n = 0; n < 100; n++) {
      const sid = `${prefix}sessS${n}`;
      const got = await check.get(sid);
      if (got !== null) sessionsOff.push([sid, "expired", got, await check.pttl(sid)]);
    }
  }
  check.disconnect();
  say({
    sessions: sessAcked.size, short_sessions: shortWritten, sessions_off: sessionsOff.slice(0, 5),
    early,
    type: "summary", mode: "ioredis-cluster", secs: elapsed() / 1000, acked: writes, keys: acked.size, unknown,
    transfers, transfers_off: transfersOff, retried,
    lost: lost.length, lost_examples: lost.slice(0, 5), errors: errors.length,
    increments: [...counted.values()].reduce((a, b) => a + b, 0), counters_off: countersOff,
    error_examples: errors.slice(0, 5), ioredis: require("ioredis/package.json").version,
  });
  process.exit(lost.length || countersOff.length || transfersOff.length || retried > 1 || sessionsOff.length
    || early || !writes || !counted.size || !transfers || !sessAcked.size || !shortWritten ? 1 : 0);
}

let input = "";
process.stdin.on("data", (d) => (input += d));
process.stdin.on("end", () => main(input.trim()).catch((e) => {
  console.error(e);
  process.exit(2);
}));
