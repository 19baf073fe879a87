//! Claims on Redis: the one claim script (`lua/claim.lua`), with or
//! without a rate limit's start log, and its answer read as tasks.

use std::collections::HashMap;

use super::cluster::Conn;
use super::decode::task;
use super::RedisBackend;
use crate::error::StoreError;
use crate::store::{
    from_ms, ms, KeyRate, RatedClaim, Task, TaskClaim, TaskClaimKeyRated, TaskClaimRated,
    CANCEL_REQUESTED,
};

impl RedisBackend {
    /// The claim script (fair or not: `TaskClaim::fair`, `lua/fair.lua`);
    /// with a rate limit `(key, max, per ms)` or a rate per key `(max, per
    /// ms)` its answer starts with `{now, next, knext}` (ms; `next` 0 when
    /// a start is allowed now, `knext` 0 when no key waits for its rate).
    /// A task claimed into the worker's buffer under a rate per key is
    /// logged at the claim's now plus `store::BUFFER_HOLD`.
    pub(super) async fn claim_script(
        &self,
        req: &TaskClaim<'_>,
        rate: Option<(String, u32, i64)>,
        key_rate: Option<KeyRate>,
    ) -> Result<Vec<HashMap<String, String>>, StoreError> {
        let (rkey, rmax, rper) = match rate {
            Some((k, m, p)) => (k, m.to_string(), p.to_string()),
            None => Default::default(),
        };
        let (kmax, kper) = match key_rate {
            Some(r) => (
                r.max.to_string(),
                i64::try_from(r.per.as_millis())
                    .unwrap_or(i64::MAX)
                    .to_string(),
            ),
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
                rper,
                if req.fair { "1" } else { "" },
                kmax,
                kper,
                ms(crate::store::BUFFER_HOLD)
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

    /// A claim under a rate per concurrency key, and the queue's or a
    /// named limit when set (`Backend::task_claim_key_rated`).
    pub(super) async fn claim_key_rated(
        &self,
        req: &TaskClaimKeyRated<'_>,
    ) -> Result<RatedClaim, StoreError> {
        if req.claim.fair {
            return Err(crate::store::key_rate_fair_refused());
        }
        match req.rated() {
            Some(rated) => self.claim_rated(&rated, Some(req.key_rate)).await,
            None => {
                let maps = self
                    .claim_script(&req.claim, None, Some(req.key_rate))
                    .await?;
                self.rated_answer(req.claim.queue, maps)
            }
        }
    }

    /// A claim under a rate limit (`Backend::task_claim_rated`), and a rate
    /// per key when `key_rate` is set.
    pub(super) async fn claim_rated(
        &self,
        req: &TaskClaimRated<'_>,
        key_rate: Option<KeyRate>,
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
        let maps = self
            .claim_script(&req.claim, Some((key, req.max, per)), key_rate)
            .await?;
        self.rated_answer(req.claim.queue, maps)
    }

    /// A rated claim's answer: its first record `{now, next, knext}`, then
    /// the tasks.
    fn rated_answer(
        &self,
        queue: &str,
        mut maps: Vec<HashMap<String, String>>,
    ) -> Result<RatedClaim, StoreError> {
        if maps.is_empty() {
            return Err(StoreError::Corrupt("rated claim: no answer".into()));
        }
        let meta = maps.remove(0);
        let num = |f: &str| -> Result<i64, StoreError> {
            meta.get(f)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| StoreError::Corrupt(format!("rated claim: {f}")))
        };
        let (now, next, knext) = (num("now")?, num("next")?, num("knext")?);
        let after = |t: i64| (t > now).then(|| from_ms(t)).transpose();
        Ok(RatedClaim {
            finished: Vec::new(),
            tasks: self.claimed(queue, &maps)?,
            now: from_ms(now)?,
            next_start: after(next)?,
            key_next: after(knext)?,
        })
    }
}
