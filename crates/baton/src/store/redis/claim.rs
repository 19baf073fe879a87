//! Claims on Redis: the one claim script (`lua/claim.lua`), with or
//! without a rate limit's start log, and its answer read as tasks.

use std::collections::HashMap;

use super::cluster::Conn;
use super::decode::task;
use super::RedisBackend;
use crate::error::StoreError;
use crate::store::{from_ms, ms, RatedClaim, Task, TaskClaim, TaskClaimRated, CANCEL_REQUESTED};

impl RedisBackend {
    /// The claim script; with a rate limit `(key, max, per ms)` its
    /// answer starts with `{now, next}` (ms; `next` 0 when a start is
    /// allowed now).
    pub(super) async fn claim_script(
        &self,
        req: &TaskClaim<'_>,
        rate: Option<(String, u32, i64)>,
    ) -> Result<Vec<HashMap<String, String>>, StoreError> {
        let (rkey, rmax, rper) = match rate {
            Some((k, m, p)) => (k, m.to_string(), p.to_string()),
            None => Default::default(),
        };
        self.qs(
            req.queue,
            &self.scripts.claim,
            sargs![
                req.queue,
                req.worker,
                req.limit,
                ms(req.lease),
                req.max_running.map(|m| m.to_string()).unwrap_or_default(),
                CANCEL_REQUESTED,
                req.limit.saturating_sub(req.buffered),
                req.per_key_max_running
                    .map(|m| m.to_string())
                    .unwrap_or_default(),
                rkey,
                rmax,
                rper
            ],
        )
        .await
    }

    /// Claimed task records as tasks, remembering each one's queue.
    pub(super) fn claimed(
        &self,
        queue: &str,
        maps: &[HashMap<String, String>],
    ) -> Result<Vec<Task>, StoreError> {
        let tasks = maps.iter().map(task).collect::<Result<Vec<Task>, _>>()?;
        for t in &tasks {
            self.remember_task(t.id, queue);
        }
        Ok(tasks)
    }

    /// A claim under a rate limit (`Backend::task_claim_rated`).
    pub(super) async fn claim_rated(
        &self,
        req: &TaskClaimRated<'_>,
    ) -> Result<RatedClaim, StoreError> {
        // A queue's own limit lives under the queue's hash tag; a named
        // one under the index tag, which on a cluster is another slot than
        // the queue's: the one script could not read both.
        let key = match req.name {
            None => format!("{}rate", self.qbase(req.claim.queue)),
            Some(_) if matches!(self.conn, Conn::Cluster(_)) => {
                return Err(StoreError::Config(format!(
                    "rate limit {:?}: a limit shared by queues is not supported on a Redis \
                     Cluster (its log and the queues' keys sit on different slots); give each \
                     queue its own rate limit",
                    req.name.unwrap_or_default()
                )))
            }
            Some(name) => self.key(&format!("rate:{name}")),
        };
        let per = i64::try_from(req.per.as_millis()).unwrap_or(i64::MAX);
        let mut maps = self
            .claim_script(&req.claim, Some((key, req.max, per)))
            .await?;
        if maps.is_empty() {
            return Err(StoreError::Corrupt("rated claim: no answer".into()));
        }
        let meta = maps.remove(0);
        let num = |f: &str| -> Result<i64, StoreError> {
            meta.get(f)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| StoreError::Corrupt(format!("rated claim: {f}")))
        };
        let (now, next) = (num("now")?, num("next")?);
        Ok(RatedClaim {
            tasks: self.claimed(req.claim.queue, &maps)?,
            now: from_ms(now)?,
            next_start: if next > now {
                Some(from_ms(next)?)
            } else {
                None
            },
        })
    }
}
