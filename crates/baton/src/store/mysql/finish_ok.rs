//! Successes finished in one round trip on MySQL, alone or carried by a
//! claim. The worker's usual finish batch (every attempt succeeded) is one
//! text batch — `BEGIN`, the named running rows read and locked, the
//! current ones set `succeeded` by `(id, claim_token)`, `COMMIT` — instead
//! of four round trips (`BEGIN`, the locking read, the update, `COMMIT`);
//! carried by an uncapped claim (`task_finish_and_claim`), the same two
//! statements open the claim's first batch, so the claim and its
//! finishes share a transaction and its commit. The same compare-and-set
//! as `task_finish_many`'s general path: an item counts when its claim
//! token is the row's current one and the row is running, read under the
//! row's lock in the transaction that updates it; a claim named twice
//! counts once.

use std::collections::{HashMap, HashSet};

use sqlx::mysql::MySqlRow;
use sqlx::Row;

use super::{MyBackend, BEGIN};
use crate::error::StoreError;
use crate::store::sql_row::token_arg;
use crate::store::{finish_then_claim, Claim, Finish, FinishedAndClaimed, TaskFinishAndClaim};

/// The most items the one-batch form takes (the general path chunks
/// larger batches).
pub(super) const MAX_ITEMS: usize = 1000;

/// The claims of `items` when every one is a success and there are at
/// most [`MAX_ITEMS`]: the batches the one-round-trip form takes.
pub(super) fn successes(items: &[(Claim, Finish)]) -> Option<Vec<Claim>> {
    (items.len() <= MAX_ITEMS && items.iter().all(|(_, f)| matches!(f, Finish::Succeeded)))
        .then(|| items.iter().map(|(c, _)| *c).collect())
}

impl MyBackend {
    /// The locking read and the update that finish `claims` as
    /// successes, each statement ended by `; ` (empty for no claims).
    /// Only integers are spliced into the text: ids and tokens.
    pub(super) fn successes_sql(&self, claims: &[Claim]) -> String {
        if claims.is_empty() {
            return String::new();
        }
        let (t, now) = (&self.names.tasks, &self.names.now);
        // The primary key serves these (as the general path's): with
        // fewer running rows than ids named the server would rather walk
        // the `lease` index's running rows and sort them.
        let mut ids: Vec<i64> = claims.iter().map(|c| c.id).collect();
        ids.sort_unstable();
        ids.dedup();
        let id_list = join(ids.iter().map(i64::to_string));
        let pairs = join(
            claims
                .iter()
                .map(|c| format!("({}, {})", c.id, token_arg(c.token))),
        );
        format!(
            "SELECT id, claim_token FROM {t} FORCE INDEX (PRIMARY) \
                 WHERE id IN ({id_list}) AND state = 'running' ORDER BY id FOR UPDATE; \
             UPDATE {t} FORCE INDEX (PRIMARY) \
                 SET state = 'succeeded', finished_at = {now}, lease_until = NULL \
                 WHERE id IN ({id_list}) AND state = 'running' \
                     AND (id, claim_token) IN ({pairs}); "
        )
    }

    /// Finish `claims` (each a success) in one round trip; per item,
    /// whether its claim was current.
    pub(super) async fn finish_successes(&self, claims: &[Claim]) -> Result<Vec<bool>, StoreError> {
        let sql = format!("{BEGIN}; {}COMMIT", self.successes_sql(claims));
        let rows = self.batch(&sql).await?;
        answer_rows(claims, &rows.iter().collect::<Vec<_>>())
    }

    /// See [`Backend::task_finish_and_claim`](crate::store::Backend::task_finish_and_claim):
    /// successes ride with an uncapped claim (two round trips for both);
    /// anything else is [`finish_then_claim`].
    pub(super) async fn finish_and_claim(
        &self,
        req: &TaskFinishAndClaim<'_>,
    ) -> Result<FinishedAndClaimed, StoreError> {
        let claim = req.claim;
        let uncapped =
            claim.max_running.is_none() && claim.per_key_max_running.is_none() && !claim.fair;
        match successes(req.finish) {
            Some(claims) if uncapped && claim.limit > 0 && !claims.is_empty() => {
                let walk = super::claim::plain_walk(claim);
                let (finished, tasks) = self.claim_in_two_batches(claim, walk, &claims).await?;
                Ok(FinishedAndClaimed { finished, tasks })
            }
            _ => finish_then_claim(self, req).await,
        }
    }
}

/// Per claim, in order, from the locking read's rows `(id, claim_token)`:
/// whether its token is its row's current one, the first time that id is
/// named.
pub(super) fn answer_rows(claims: &[Claim], rows: &[&MySqlRow]) -> Result<Vec<bool>, StoreError> {
    let current = rows
        .iter()
        .map(|r| Ok((r.try_get::<i64, _>(0)?, r.try_get::<i64, _>(1)?)))
        .collect::<Result<HashMap<i64, i64>, sqlx::Error>>()?;
    Ok(answer(claims, &current))
}

/// Per claim, in order: whether its token is `current`'s for its id, the
/// first time that id is named.
fn answer(claims: &[Claim], current: &HashMap<i64, i64>) -> Vec<bool> {
    let mut used = HashSet::new();
    claims
        .iter()
        .map(|c| current.get(&c.id) == Some(&token_arg(c.token)) && used.insert(c.id))
        .collect()
}

/// `items` joined with `, `.
fn join(items: impl Iterator<Item = String>) -> String {
    items.collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::FencingToken;

    fn claim(id: i64, token: u64) -> Claim {
        Claim {
            id,
            attempt: 1,
            token: FencingToken(token),
        }
    }

    #[test]
    fn a_claim_counts_when_current_and_once() {
        let current = HashMap::from([(1, 5), (2, 7)]);
        let claims = [claim(1, 5), claim(2, 6), claim(3, 1), claim(1, 5)];
        assert_eq!(answer(&claims, &current), [true, false, false, false]);
    }
}
