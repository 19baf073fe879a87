//! PostgreSQL's finish-and-claim (`Backend::task_finish_and_claim`): a
//! worker's held results and its next uncapped claim in one statement
//! ([`Sql::finish_claim`](super::sql::Sql::finish_claim)), so a busy
//! worker pays one round trip and one commit for both. Each finish is the
//! same compare-and-set on (id, claim token, `running`) that
//! `task_finish_many` makes, answered per item; a claim under a cap or
//! fair goes after its finishes, as two calls (it must see them).

use std::collections::HashSet;

use sqlx::Row;

use super::backend::{claim_walk, claimed};
use super::finish::answered;
use super::{dur, PgBackend};
use crate::error::StoreError;
use crate::store::sql_row::token_arg;
use crate::store::{finish_then_claim, Finish, FinishedAndClaimed, TaskFinishAndClaim};

impl PgBackend {
    /// See [`Backend::task_finish_and_claim`](crate::store::Backend::task_finish_and_claim).
    pub(super) async fn finish_and_claim(
        &self,
        req: &TaskFinishAndClaim<'_>,
    ) -> Result<FinishedAndClaimed, StoreError> {
        let (items, claim) = (req.finish, req.claim);
        let uncapped =
            claim.max_running.is_none() && claim.per_key_max_running.is_none() && !claim.fair;
        if items.is_empty() || claim.limit == 0 || !uncapped {
            return finish_then_claim(self, req).await;
        }
        let ids: Vec<i64> = items.iter().map(|(c, _)| c.id).collect();
        let tokens: Vec<i64> = items.iter().map(|(c, _)| token_arg(c.token)).collect();
        let succeeded = items.iter().all(|(_, f)| matches!(f, Finish::Succeeded));
        let query = self
            .q(self.sql.finish_claim(claim_walk(claim), succeeded))
            .bind(claim.queue)
            .bind(claim.worker)
            .bind(dur(claim.lease))
            .bind(i64::from(claim.limit))
            .bind(i64::from(claim.buffered))
            .bind(&ids)
            .bind(&tokens);
        let query = if succeeded {
            query
        } else {
            self.bind_kinds(query, items)
        };
        let rows = query.fetch_all(self.exec()).await?;
        // A finished attempt's row carries its token in `done`.
        let mut done = HashSet::new();
        let mut claims = Vec::with_capacity(rows.len());
        for row in rows {
            match row.try_get::<Option<i64>, _>("done")? {
                Some(token) => {
                    done.insert((row.try_get::<i64, _>("id")?, token));
                }
                None => claims.push(row),
            }
        }
        Ok(FinishedAndClaimed {
            finished: answered(&ids, &tokens, &done),
            tasks: claimed(&claims)?,
        })
    }
}
