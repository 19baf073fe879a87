// pg-boss side of scripts/bench.sh (Node >= 22, installed in $PEER_DIR).
// insert N | work : partitioned queue, batchSize 100, localConcurrency 24,
// burstWhenBatchFull, 10 connections per process.
import { waitForGo, onTerm, mod } from "./common.mjs";
const { PgBoss } = await mod(process.env.PEER_DIR, "pg-boss/dist/index.js");
const [mode, n] = process.argv.slice(2);
const schema = "bench_pgboss";
const boss = new PgBoss({ connectionString: process.env.PG, schema, max: 10, supervise: false, schedule: false });
boss.on("error", (e) => console.error(e));
await boss.start();
if (mode === "insert") {
  await boss.createQueue("bench", { partition: true });
  const total = Number(n);
  for (let i = 0; i < total; i += 10000) {
    const jobs = [];
    for (let j = i; j < Math.min(total, i + 10000); j++) jobs.push({ data: { id: j } });
    await boss.insert("bench", jobs);
  }
  await boss.stop({ graceful: false, wait: true });
} else {
  await waitForGo();
  await boss.work("bench", { batchSize: 100, localConcurrency: 24, burstWhenBatchFull: true }, async () => {});
  onTerm(() => boss.stop({ graceful: true, wait: true, timeout: 5000 }));
}
