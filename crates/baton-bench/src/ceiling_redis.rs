//! `baton-bench ceiling` on Redis: baton's own claim and finish scripts
//! (the Lua the backend loads, `crates/baton/src/store/redis/lua/`, with
//! the same prelude) run by a minimal pipelined client and no baton in the
//! way. Each client loads the two scripts once, then each round trip
//! pipelines the finish of the batch it holds (every task a compare-and-set
//! on its claim token, as `task_finish_many` sends it) with the claim of
//! the next batch: one round trip and two script runs a batch.

use super::*;

/// The queue scripts' shared prelude, exactly as the backend builds them
/// (`store/redis/scripts.rs`: prelude, then the body; the claim script
/// with the fair plan before it).
const PRELUDE: &str = include_str!("../../baton/src/store/redis/lua/prelude.lua");
const FAIR: &str = include_str!("../../baton/src/store/redis/lua/fair.lua");
const CLAIM: &str = include_str!("../../baton/src/store/redis/lua/claim.lua");
const FINISH: &str = include_str!("../../baton/src/store/redis/lua/finish.lua");

/// A claim's lease, ms (the worker's default).
const LEASE_MS: u64 = 30_000;

/// One Redis ceiling client: claim and finish `queue`'s tasks in batches of
/// `batch` until a claim comes back empty.
pub(super) async fn redis_client(
    url: &str,
    prefix: &str,
    queue: &str,
    batch: u32,
    worker: &str,
    done: &AtomicU64,
) -> Result<()> {
    if url.contains("+cluster://") {
        bail!("the Redis ceiling runs on one Redis server, not a cluster");
    }
    let client = redis::Client::open(url).context("opening the Redis URL")?;
    let mut c = client
        .get_multiplexed_async_connection()
        .await
        .context("connecting to Redis")?;
    let claim_sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(format!("{PRELUDE}{FAIR}{CLAIM}"))
        .query_async(&mut c)
        .await?;
    let finish_sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(format!("{PRELUDE}{FINISH}"))
        .query_async(&mut c)
        .await?;
    // The key base and routing key as `RedisBackend::qs` passes them.
    let base = format!("{prefix}{{baton:q:{queue}}}:");
    let route = format!("{base}counts");
    let limit = batch.to_string();
    let mut claim = redis::cmd("EVALSHA");
    claim.arg(&claim_sha).arg(1).arg(&route).arg(&base);
    // queue, worker, limit, lease, no cap, the cancel text, all start now,
    // no per-key cap, no rate, not fair, no rate per key.
    claim
        .arg(queue)
        .arg(worker)
        .arg(&limit)
        .arg(LEASE_MS)
        .arg("");
    claim.arg(baton::store::CANCEL_REQUESTED).arg(&limit);
    for _ in 0..7 {
        claim.arg("");
    }
    // The (id, claim token) pairs held, to finish with the next claim.
    let mut held: Vec<(String, String)> = Vec::new();
    loop {
        let mut pipe = redis::pipe();
        if !held.is_empty() {
            let mut fin = redis::cmd("EVALSHA");
            fin.arg(&finish_sha).arg(1).arg(&route).arg(&base);
            fin.arg(baton::store::CANCEL_REQUESTED);
            for (id, tok) in &held {
                fin.arg(id).arg(tok).arg("s").arg("").arg("");
            }
            pipe.add_command(fin);
        }
        pipe.add_command(claim.clone());
        let mut replies: Vec<redis::Value> = pipe.query_async(&mut c).await?;
        let claimed: Vec<Vec<String>> = redis::from_redis_value(
            &replies
                .pop()
                .ok_or_else(|| anyhow!("the pipeline answered nothing"))?,
        )?;
        if let Some(fin) = replies.pop() {
            let oks: Vec<i64> = redis::from_redis_value(&fin)?;
            let n = oks.iter().filter(|&&v| v == 1).count();
            if n != held.len() {
                bail!("finish: {n} of {} compare-and-sets held", held.len());
            }
            done.fetch_add(n as u64, Ordering::Relaxed);
        }
        held = claimed
            .iter()
            .map(|h| Ok((field(h, "id")?, field(h, "claim_token")?)))
            .collect::<Result<_>>()?;
        if held.is_empty() {
            return Ok(());
        }
    }
}

/// Field `f` of a task record as the claim script answers it (a flat
/// field, value list).
fn field(h: &[String], f: &str) -> Result<String> {
    h.chunks(2)
        .find(|p| p[0] == f)
        .and_then(|p| p.get(1).cloned())
        .ok_or_else(|| anyhow!("a claimed task's record has no {f}"))
}
