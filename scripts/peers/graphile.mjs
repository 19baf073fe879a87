// graphile-worker side of scripts/bench.sh (Node 22, installed in $PEER_DIR).
// insert N | work : 24 concurrent jobs, localQueue 500, batched completion.
import { createRequire } from "node:module";
import { waitForGo, onTerm } from "./common.mjs";
const require = createRequire(`${process.env.PEER_DIR}/package.json`);
const { run, runMigrations } = require("graphile-worker");
const [mode, n] = process.argv.slice(2);
const connectionString = process.env.PG;
const preset = {
  worker: {
    connectionString,
    concurrentJobs: 24,
    maxPoolSize: Number(process.env.GW_POOL || 25),
    localQueue: { size: 500 },
    completeJobBatchDelay: 0,
    failJobBatchDelay: 0,
  },
};
if (mode === "migrate") {
  await runMigrations({ connectionString, preset });
} else {
  await runMigrations({ connectionString, preset });
  await waitForGo();
  const runner = await run({ preset, taskList: { log_if_999: async () => {} } });
  onTerm(() => runner.stop());
  await runner.promise;
}
