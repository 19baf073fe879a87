// BullMQ side of scripts/bench.sh (installed in $PEER_DIR).
// insert N | work : one Worker per process, concurrency 24.
import { createRequire } from "node:module";
import { waitForGo, onTerm } from "./common.mjs";
const require = createRequire(`${process.env.PEER_DIR}/package.json`);
const { Queue, Worker } = require("bullmq");
const [mode, n] = process.argv.slice(2);
const u = new URL(process.env.REDIS);
const connection = { host: u.hostname, port: Number(u.port || 6379) };
if (mode === "insert") {
  const q = new Queue("bench", { connection });
  const total = Number(n);
  for (let i = 0; i < total; i += 10000) {
    const jobs = [];
    for (let j = i; j < Math.min(total, i + 10000); j++) jobs.push({ name: "noop", data: { id: j } });
    await q.addBulk(jobs);
  }
  await q.close();
} else {
  const w = new Worker("bench", async () => {}, { connection, concurrency: 24, autorun: false });
  await w.waitUntilReady();
  await waitForGo();
  onTerm(() => w.close());
  w.run();
}
