// Shared by the peer benchmarks: wait for the driver's go signal, stop on SIGTERM.
import { existsSync } from "node:fs";
export async function waitForGo() {
  console.log("ready");
  const go = process.env.GO_FILE;
  while (go && !existsSync(go)) await new Promise((r) => setTimeout(r, 2));
}
export function onTerm(stop) {
  process.on("SIGTERM", async () => {
    try { await stop(); } finally { process.exit(0); }
  });
}
export const mod = (dir, name) => import(`${dir}/node_modules/${name}`);
