//! The claim under a cap per concurrency key
//! (`TaskClaim::per_key_max_running`): claimers of the queue take turns on
//! its row in `<p>queues` (as under `max_running`), count its running
//! tasks per key, lock due candidates of the keys not at the cap with
//! `FOR UPDATE SKIP LOCKED`, and keep in claim order each key's first
//! tasks while they fit under the cap.

use std::collections::{HashMap, HashSet};

use super::claim::{claim_ids, claim_pick, finish_claim, lock_queue_row, BEGIN_IN_BACKLOG};
use super::{marks, MyBackend, BEGIN};
use crate::error::StoreError;
use crate::store::{Task, TaskClaim};

/// One transaction: lock the queue's row, count (with `max_running`, the
/// queue's and) each key's running tasks, lock the candidates, claim the
/// ones that fit, read them back. The walk goes three times the free
/// slots' share past the plain claim's ([`TaskClaim::key_limited_walk`]),
/// so keys with one place left do not fill it on their own. The buffer's
/// share is granted only where the walked keys have places to spare
/// ([`crate::store::key_capped_take`]).
///
/// Into a backlog (the queue's last such claim walked as far as it asked)
/// it runs at `REPEATABLE READ`, as an uncapped claim does
/// ([`BEGIN_IN_BACKLOG`]), and counts right all the same: the row lock on
/// the queue is taken by a write, which takes no snapshot, so the running
/// tasks' count is the transaction's first consistent read and its
/// snapshot, taken after the lock, holds every claim committed before it
/// (claimers of the queue take turns on that row). A finish committed
/// after the snapshot counts as running still, which only claims less.
pub(super) async fn task_claim(
    b: &MyBackend,
    req: &TaskClaim<'_>,
    per_key: u32,
) -> Result<Vec<Task>, StoreError> {
    let begin = if b.backlog.holds(req.queue) {
        BEGIN_IN_BACKLOG
    } else {
        BEGIN
    };
    let mut tx = b.pool.begin_with(begin).await?;
    let tasks = claim_in(b, &mut tx, req, per_key).await?;
    finish_claim(tx, tasks).await
}

/// [`task_claim`] inside `tx`, committed by the caller.
pub(super) async fn claim_in(
    b: &MyBackend,
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    req: &TaskClaim<'_>,
    per_key: u32,
) -> Result<Vec<Task>, StoreError> {
    let now = &b.names.now;
    let t = &b.names.tasks;
    lock_queue_row(b, tx, req.queue).await?;
    // Every running task of the queue, by key (NULL: no key), from the
    // `claim` index's (queue, state) prefix: bounded by the workers' slots.
    let counts: Vec<(Option<Vec<u8>>, i64)> = sqlx::query_as(&format!(
        "SELECT concurrency_key, COUNT(*) FROM {t} WHERE queue = ? AND state = 'running' \
         GROUP BY concurrency_key"
    ))
    .bind(req.queue)
    .fetch_all(&mut **tx)
    .await?;
    let running: i64 = counts.iter().map(|(_, n)| n).sum();
    let mut room: HashMap<Vec<u8>, i64> = HashMap::new();
    for (k, n) in counts {
        if let Some(k) = k {
            room.insert(k, i64::from(per_key) - n);
        }
    }
    let mut limit = i64::from(req.limit);
    if let Some(max) = req.max_running {
        limit = limit.min(i64::from(max) - running);
    }
    if limit <= 0 {
        return Ok(Vec::new());
    }
    let full: Vec<&Vec<u8>> = room
        .iter()
        .filter(|(_, r)| **r <= 0)
        .map(|(k, _)| k)
        .collect();
    let skip = if full.is_empty() {
        String::new()
    } else {
        format!(
            "AND (concurrency_key IS NULL OR concurrency_key NOT IN ({}))",
            marks(full.len())
        )
    };
    let select = format!(
        "SELECT id, CAST(attempt + 1 < max_attempts AS SIGNED), concurrency_key FROM {t} \
         WHERE queue = ? AND state = 'pending' \
             AND run_at <= {now} AND cancel_requested = 0 \
             AND NOT EXISTS (SELECT 1 FROM {q} WHERE queue = ? AND paused = 1) {skip} \
         ORDER BY priority, run_at, id LIMIT {n} FOR UPDATE SKIP LOCKED",
        q = b.names.queues,
        n = req.key_limited_walk(),
    );
    let mut s = sqlx::query_as(&select)
        .bind(req.queue.as_bytes())
        .bind(req.queue.as_bytes());
    for k in &full {
        s = s.bind(k.as_slice());
    }
    let rows: Vec<(i64, i64, Option<Vec<u8>>)> = s.fetch_all(&mut **tx).await?;
    b.backlog.set(
        req.queue,
        i64::try_from(rows.len()).is_ok_and(|n| n >= i64::from(req.key_limited_walk())),
    );
    // The places the walked keys have to spare: the buffer's share is
    // granted only when they are plenty (`store::key_capped_take`).
    let mut walked = HashSet::new();
    let places: i64 = rows
        .iter()
        .map(|(_, _, key)| match key {
            None => 1,
            Some(k) if walked.insert(k) => {
                room.get(k).copied().unwrap_or(i64::from(per_key)).max(0)
            }
            Some(_) => 0,
        })
        .sum();
    let limit = limit.min(i64::from(crate::store::key_capped_take(
        places,
        req.limit,
        req.buffered,
    )));
    // Each key's tasks in claim order, while they fit under its cap.
    let fits: Vec<(i64, i64)> = rows
        .into_iter()
        .filter_map(|(id, spare, key)| match key {
            None => Some((id, spare)),
            Some(k) => {
                let r = room.entry(k).or_insert(i64::from(per_key));
                (*r > 0).then(|| {
                    *r -= 1;
                    (id, spare)
                })
            }
        })
        .collect();
    let ids = claim_pick(fits, req, u32::try_from(limit).unwrap_or(u32::MAX));
    claim_ids(b, tx, req, &ids).await
}
