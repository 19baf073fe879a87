//! Enqueueing on Redis (one script per chunk, pipelined on the queue's
//! shard) and grouping task ids by their queue: the helpers behind the
//! [`Backend`](crate::store::Backend) impl's enqueue and batch calls.

use std::collections::BTreeMap;

use super::decode::{decode_enqueued, push_task_args};
use super::{RedisBackend, ENQUEUE_CHUNK, ENQUEUE_PIPELINE};
use crate::error::StoreError;
use crate::store::{Enqueued, NewTask};

impl RedisBackend {
    /// Enqueue `tasks`, all of `queue`, whose reserved ids start at
    /// `first`: one script per [`ENQUEUE_CHUNK`], pipelined
    /// [`ENQUEUE_PIPELINE`] at a time (a pipeline stays on the queue's
    /// shard). Answers (enqueued, due now) per task; `publish`: the script
    /// announces the due queue itself.
    pub(super) async fn enqueue_queue(
        &self,
        queue: &str,
        tasks: &[&NewTask],
        first: i64,
        publish: bool,
    ) -> Result<Vec<(Enqueued, bool)>, StoreError> {
        let base = self.qbase(queue);
        let route = format!("{base}counts");
        let hash = self.scripts.enqueue.get_hash().to_string();
        let chunks: Vec<(i64, &[&NewTask])> = tasks
            .chunks(ENQUEUE_CHUNK)
            .enumerate()
            .map(|(k, c)| (first + (k * ENQUEUE_CHUNK) as i64, c))
            .collect();
        let mut out = Vec::with_capacity(tasks.len());
        // The test clock's argument, last in each script call (see
        // `scripts::test_clock`; feature `test-clock`, tests only).
        #[cfg(feature = "test-clock")]
        let clock = self.test_clock_arg().await?;
        let mut conn = self.conn.clone();
        for group in chunks.chunks(ENQUEUE_PIPELINE) {
            let pipe = |load: bool| {
                let mut pipe = redis::pipe();
                if load {
                    pipe.cmd("SCRIPT")
                        .arg("LOAD")
                        .arg(&self.scripts.enqueue_code)
                        .ignore();
                }
                for (first, chunk) in group {
                    pipe.cmd("EVALSHA")
                        .arg(&hash)
                        .arg(1)
                        .arg(&route)
                        .arg(&base)
                        .arg(if publish { "1" } else { "0" })
                        .arg(*first);
                    for t in *chunk {
                        push_task_args(&mut pipe, t)?;
                    }
                    #[cfg(feature = "test-clock")]
                    pipe.arg(&clock);
                }
                Ok::<_, StoreError>(pipe)
            };
            // One script call goes alone (the script is ~8 KB: loading it
            // each time cost more than the insert); a NOSCRIPT answer means
            // it did nothing, so it is loaded and sent again (and again, a
            // few times, when the cache was emptied in between). Several go
            // after a load in the same pipeline, as a NOSCRIPT among them
            // would leave unknown which ones ran.
            let replies: Vec<Vec<i64>> = if group.len() == 1 {
                let mut tries = 1;
                loop {
                    match pipe(tries > 1)?.query_async(&mut conn).await {
                        Err(e)
                            if e.kind() == redis::ErrorKind::NoScriptError
                                && tries < super::NOSCRIPT_TRIES =>
                        {
                            tries += 1;
                        }
                        r => break r?,
                    }
                }
            } else {
                pipe(true)?.query_async(&mut conn).await?
            };
            if replies.len() != group.len() {
                return Err(StoreError::Corrupt(format!(
                    "enqueue: {} replies for {} scripts",
                    replies.len(),
                    group.len()
                )));
            }
            for ((_, chunk), reply) in group.iter().zip(replies) {
                if reply.len() != chunk.len() * 4 {
                    return Err(StoreError::Corrupt(format!(
                        "enqueue: reply of {} values for {} tasks",
                        reply.len(),
                        chunk.len()
                    )));
                }
                for r in reply.chunks(4) {
                    out.push((decode_enqueued(r)?, r[2] == 1));
                }
            }
        }
        Ok(out)
    }

    /// The positions of `ids` grouped by their tasks' queue (ids of no
    /// known queue left out).
    pub(super) async fn by_queue(
        &self,
        ids: impl Iterator<Item = i64>,
    ) -> Result<BTreeMap<String, Vec<usize>>, StoreError> {
        let mut by: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, id) in ids.enumerate() {
            if let Some(q) = self.queue_of(id).await? {
                by.entry(q).or_default().push(i);
            }
        }
        Ok(by)
    }
}
