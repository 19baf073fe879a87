//! Successes finished in one round trip on MySQL, alone or carried by a
//! claim. The worker's usual finish batch (every attempt succeeded) is one
//! text batch — `BEGIN`, the current running rows set `succeeded` by
//! `(id, claim_token)`, how many it changed, `COMMIT` — instead of four
//! round trips (`BEGIN`, a locking read, the update, `COMMIT`);
//! carried by an uncapped claim (`task_finish_and_claim`), the same two
//! statements open the claim's first batch, so the claim and its
//! finishes share a transaction and its commit. The same compare-and-set
//! as `task_finish_many`'s general path: an item counts when its claim
//! token is the row's current one and the row is running, decided by the
//! update itself (which locks the row); a claim named twice counts once.
//! When every claim counted (the update changed one row a claim) no row
//! is read back; else the rows it changed are, by their `finished_at`.

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
    /// The statements that finish `claims` as successes, each ended by
    /// `; ` (empty for no claims): the update by `(id, claim_token)` of
    /// the running rows, with `finished_at` the store's now held in
    /// `@baton_f`; then one row, `finished_n`, the rows it changed; then,
    /// only when that is not one a claim (some claim was not current, or
    /// a claim is named twice), the rows it changed, `(id, claim_token)`,
    /// told apart by their `finished_at`. The common case reads no row
    /// per task (the locking read of every named row it replaced did).
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
        let n = claims.len();
        format!(
            "SET @baton_f = {now}; \
             UPDATE {t} FORCE INDEX (PRIMARY) \
                 SET state = 'succeeded', finished_at = @baton_f, lease_until = NULL \
                 WHERE id IN ({id_list}) AND state = 'running' \
                     AND (id, claim_token) IN ({pairs}); \
             SET @baton_n = ROW_COUNT(); \
             SELECT @baton_n AS finished_n; \
             SELECT id, claim_token FROM {t} FORCE INDEX (PRIMARY) \
                 WHERE @baton_n <> {n} AND id IN ({id_list}) \
                     AND state = 'succeeded' AND finished_at = @baton_f; "
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
                // A deadlock's victim was rolled back whole, its finishes
                // with it: running it again runs both once.
                let (finished, tasks) =
                    super::again_if_deadlocked(|| self.claim_in_two_batches(claim, walk, &claims))
                        .await?;
                Ok(FinishedAndClaimed { finished, tasks })
            }
            _ => finish_then_claim(self, req).await,
        }
    }
}

/// Per claim, in order, from [`MyBackend::successes_sql`]'s rows: every
/// claim when the update changed one row a claim, else whether its
/// `(id, token)` is among the rows it changed, the first time that id is
/// named.
pub(super) fn answer_rows(claims: &[Claim], rows: &[&MySqlRow]) -> Result<Vec<bool>, StoreError> {
    if claims.is_empty() {
        return Ok(Vec::new());
    }
    let Some((first, changed)) = rows.split_first() else {
        return Err(StoreError::Corrupt("finished successes: no answer".into()));
    };
    let n: i64 = first.try_get("finished_n")?;
    if usize::try_from(n).ok() == Some(claims.len()) {
        return Ok(vec![true; claims.len()]);
    }
    let current = changed
        .iter()
        .map(|r| Ok((r.try_get::<i64, _>(0)?, r.try_get::<i64, _>(1)?)))
        .collect::<Result<HashMap<i64, i64>, sqlx::Error>>()?;
    Ok(answer(claims, &current))
}

/// Whether `row` is one of [`MyBackend::successes_sql`]'s answers (not a
/// claim's candidate).
pub(super) fn is_answer(row: &MySqlRow) -> bool {
    use sqlx::Column;
    let col = |i: usize| row.columns().get(i).map(|c| c.name());
    col(0) == Some("finished_n") || col(1) == Some("claim_token")
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
