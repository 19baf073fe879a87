//! Deleting finished tasks: by age (`task_prune_many`, batch by batch per
//! queue) and by id (`task_delete_many`, one script per queue). Both run
//! the Lua prelude's `forget`, which leaves a slot's run its tombstone.

use std::collections::HashMap;
use std::time::Duration;

use super::{RedisBackend, BATCH};
use crate::error::StoreError;
use crate::store::ms;

/// Delete the tasks of every queue that finished more than `older_than`
/// ago; how many.
pub(super) async fn prune_many(b: &RedisBackend, older_than: Duration) -> Result<u64, StoreError> {
    let mut total = 0u64;
    for queue in b.queues().await? {
        loop {
            let (n, examined, gone): (i64, i64, Vec<i64>) = b
                .qs(&queue, &b.scripts.prune, sargs![ms(older_than), BATCH])
                .await?;
            total += n.max(0) as u64;
            // The pruned ids leave the id index (a failure leaves
            // entries pointing at tasks that are gone: harmless).
            b.unreserve(&gone).await;
            if (examined as usize) < BATCH {
                break;
            }
        }
    }
    Ok(total)
}

/// Delete the finished tasks among `ids`; the ids deleted.
pub(super) async fn delete_many(b: &RedisBackend, ids: &[i64]) -> Result<Vec<i64>, StoreError> {
    // One script per queue (a queue's keys share its hash tag).
    let mut by_queue: HashMap<String, Vec<i64>> = HashMap::new();
    for &id in ids {
        if let Some(q) = b.queue_of(id).await? {
            by_queue.entry(q).or_default().push(id);
        }
    }
    let mut gone = Vec::new();
    for (queue, ids) in by_queue {
        for chunk in ids.chunks(BATCH) {
            let args = chunk.iter().map(i64::to_string).collect();
            let deleted: Vec<i64> = b.qs(&queue, &b.scripts.delete, args).await?;
            b.unreserve(&deleted).await;
            gone.extend(deleted);
        }
    }
    Ok(gone)
}
