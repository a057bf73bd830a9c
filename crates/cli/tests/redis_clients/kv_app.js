// The application of kv_app.py on ioredis's Cluster client, unmodified:
// 3,000 keys written over and over (each write a value of its own) and 10
// counters counted with INCR, then
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
  const t0 = Date.now();
  let i = 0;
  while (Date.now() - t0 < seconds * 1000) {
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
  // whose answer was lost besides.
  const countersOff = [];
  for (const [ctr, n] of counted) {
    const got = Number((await check.get(ctr)) || 0);
    const extra = uncounted.get(ctr) || 0;
    if (!(n <= got && got <= n + extra)) countersOff.push([ctr, n, extra, got]);
  }
  // Both sides of every transfer, or neither.
  const a = Number((await check.get(acctA)) || 0);
  const b = Number((await check.get(acctB)) || 0);
  const transfersOff = a + b === 0 && transfers <= b && b <= transfers + transfersUnknown
    ? [] : [a, b, transfers, transfersUnknown];
  check.disconnect();
  say({
    type: "summary", mode: "ioredis-cluster", acked: writes, keys: acked.size, unknown,
    transfers, transfers_off: transfersOff,
    lost: lost.length, lost_examples: lost.slice(0, 5), errors: errors.length,
    increments: [...counted.values()].reduce((a, b) => a + b, 0), counters_off: countersOff,
    error_examples: errors.slice(0, 5), ioredis: require("ioredis/package.json").version,
  });
  process.exit(lost.length || countersOff.length || transfersOff.length || !writes || !counted.size
    || !transfers ? 1 : 0);
}

let input = "";
process.stdin.on("data", (d) => (input += d));
process.stdin.on("end", () => main(input.trim()).catch((e) => {
  console.error(e);
  process.exit(2);
}));
