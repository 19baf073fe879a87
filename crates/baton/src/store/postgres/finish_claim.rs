//! PostgreSQL's finish-and-claim (`Backend::task_finish_and_claim`): a
//! worker's held results and its next uncapped claim in one statement
//! ([`Sql::finish_claim`](super::sql::Sql::finish_claim)), so a busy
//! worker pays one round trip and one commit for both. Each finish is the
//! same compare-and-set on (id, claim token, `running`) that
//! `task_finish_many` makes, answered per item; a capped claim and its
//! finishes are one statement too (`capped::finish_claim_capped_sql`, the
//! function called after the finishes, which it sees), a fair claim goes
//! after its finishes, as two calls (it must see them). The
//! statement answers in one row of arrays (see `Sql::finish_claim`).

use super::backend::claim_order;
use super::finish::FinishArgs;
use super::rows::packed_tasks;
use super::{dur, PgBackend};
use crate::error::StoreError;
use crate::store::{finish_then_claim, FinishedAndClaimed, TaskFinishAndClaim};

impl PgBackend {
    /// See [`Backend::task_finish_and_claim`](crate::store::Backend::task_finish_and_claim).
    pub(super) async fn finish_and_claim(
        &self,
        req: &TaskFinishAndClaim<'_>,
    ) -> Result<FinishedAndClaimed, StoreError> {
        let (items, claim) = (req.finish, req.claim);
        let uncapped =
            claim.max_running.is_none() && claim.per_key_max_running.is_none() && !claim.fair;
        if items.is_empty() || claim.limit == 0 || claim.fair {
            return finish_then_claim(self, req).await;
        }
        if !uncapped {
            let (finished, tasks) = self.finish_and_claim_capped(items, claim).await?;
            return Ok(FinishedAndClaimed { finished, tasks });
        }
        let args = FinishArgs::new(items);
        let query = self
            .q(self.sql.finish_claim(claim.plain_walk(), args.succeeded))
            .bind(claim.queue)
            .bind(claim.worker)
            .bind(dur(claim.lease))
            .bind(i64::from(claim.limit))
            .bind(i64::from(claim.buffered));
        let row = self
            .bind_finish(query, &args, items)
            .fetch_one(self.exec())
            .await?;
        let mut tasks = packed_tasks(&row, claim.queue)?;
        claim_order(&mut tasks);
        Ok(FinishedAndClaimed {
            finished: args.answered(&row)?,
            tasks,
        })
    }
}
