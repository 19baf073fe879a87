//! Finishing attempts on PostgreSQL (`Backend::task_finish_many`): one
//! statement and one commit a batch, each row a fenced compare-and-set on
//! (id, claim token, `running`). A batch of successes only — a worker's
//! common batch — takes the bare statement ([`Sql::finish_succeeded`]);
//! any other batch the statement that handles every kind
//! ([`Sql::finish_many`]).
//!
//! [`Sql::finish_succeeded`]: super::sql::Sql::finish_succeeded
//! [`Sql::finish_many`]: super::sql::Sql::finish_many

use crate::fast_hash::FastSet;

use sqlx::postgres::PgRow;
use sqlx::Row;

use super::finish_sql::FinishKind;
use super::{dur, PgBackend};
use crate::error::StoreError;
use crate::store::sql_row::token_arg;
use crate::store::{Claim, Finish, CANCEL_REQUESTED};

impl PgBackend {
    /// Finish `items`, answering per item whether its claim was current.
    pub(super) async fn finish_many(
        &self,
        items: &[(Claim, Finish)],
    ) -> Result<Vec<bool>, StoreError> {
        self.finish_many_on(self.exec(), items).await
    }

    /// [`finish_many`](Self::finish_many) on `ex` (a transaction's
    /// connection, or the pool); nothing is sent for no items.
    pub(super) async fn finish_many_on<'e, E>(
        &self,
        ex: E,
        items: &[(Claim, Finish)],
    ) -> Result<Vec<bool>, StoreError>
    where
        E: sqlx::Executor<'e, Database = sqlx::Postgres>,
    {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        // A batch of successes only (a worker's usual batch) takes the bare
        // statement; any other the one that handles every kind.
        let args = FinishArgs::new(items);
        let sql = if args.succeeded {
            &self.sql.finish_succeeded
        } else {
            &self.sql.finish_many
        };
        let rows = self
            .bind_finish(self.q(sql), &args, items)
            .fetch_all(ex)
            .await?;
        finished(&args.ids, &args.tokens, rows)
    }

    /// Bind the every-kind finish's arguments after its ids and tokens:
    /// each item's kind, text and delay ([`kind_args`]), the channel, and
    /// the reason a requested cancel ends a hand-back.
    pub(super) fn bind_kinds<'q>(
        &self,
        query: PgQuery<'q>,
        items: &'q [(Claim, Finish)],
    ) -> PgQuery<'q> {
        let (kinds, texts, retries) = kind_args(items);
        query
            .bind(kinds)
            .bind(texts)
            .bind(retries)
            .bind(self.names.chan.clone())
            .bind(CANCEL_REQUESTED)
    }
}

/// The arguments a batch of finishes binds, alone or beside a claim in
/// one statement (`finish_claim.rs`, `key_rate.rs`): each item's id and
/// token, and whether every item is a success (the successes-only
/// statement).
pub(super) struct FinishArgs {
    pub(super) ids: Vec<i64>,
    pub(super) tokens: Vec<i64>,
    pub(super) succeeded: bool,
}

impl FinishArgs {
    pub(super) fn new(items: &[(Claim, Finish)]) -> FinishArgs {
        FinishArgs {
            ids: items.iter().map(|(c, _)| c.id).collect(),
            tokens: items.iter().map(|(c, _)| token_arg(c.token)).collect(),
            succeeded: items.iter().all(|(_, f)| matches!(f, Finish::Succeeded)),
        }
    }

    /// Per item, whether `row`'s `done_ids` and `done_tokens` (the
    /// attempts the statement finished) hold its (id, token).
    pub(super) fn answered(&self, row: &PgRow) -> Result<Vec<bool>, StoreError> {
        let done_ids: Vec<i64> = row
            .try_get::<Option<Vec<i64>>, _>("done_ids")?
            .unwrap_or_default();
        let done_tokens: Vec<i64> = row
            .try_get::<Option<Vec<i64>>, _>("done_tokens")?
            .unwrap_or_default();
        let done: FastSet<(i64, i64)> = done_ids.into_iter().zip(done_tokens).collect();
        Ok(answered(&self.ids, &self.tokens, &done))
    }
}

impl PgBackend {
    /// Bind a batch's finish (after a claim's arguments, or alone): the
    /// ids and tokens, and for a batch that is not all successes each
    /// item's kind, text and delay ([`PgBackend::bind_kinds`]).
    pub(super) fn bind_finish<'q>(
        &self,
        query: PgQuery<'q>,
        args: &'q FinishArgs,
        items: &'q [(Claim, Finish)],
    ) -> PgQuery<'q> {
        let query = query.bind(&args.ids).bind(&args.tokens);
        if args.succeeded {
            query
        } else {
            self.bind_kinds(query, items)
        }
    }

    /// A claim function's call `query` with a batch's finish bound after
    /// its arguments, sent on the pool, its time noted as a claim's.
    pub(super) async fn claim_with_finish<'q>(
        &self,
        query: PgQuery<'q>,
        args: &'q FinishArgs,
        items: &'q [(Claim, Finish)],
    ) -> Result<Vec<PgRow>, StoreError> {
        let sent = tokio::time::Instant::now();
        let rows = self
            .bind_finish(query, args, items)
            .fetch_all(self.exec())
            .await?;
        self.claim_took(sent.elapsed());
        Ok(rows)
    }
}

/// A statement with its arguments bound so far.
pub(super) type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// The per-item arguments of [`Sql::finish_many`](super::sql::Sql::finish_many)
/// after the ids and tokens: each item's kind code, text (a failure's
/// error, a cancel's reason) and delay ms (a retry's or a snooze's).
fn kind_args(
    items: &[(Claim, Finish)],
) -> (Vec<&'static str>, Vec<Option<&str>>, Vec<Option<i64>>) {
    let n = items.len();
    let (mut kinds, mut texts, mut retries) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for (_, finish) in items {
        let (kind, text, retry) = match finish {
            Finish::Succeeded => (FinishKind::Succeeded, None, None),
            Finish::Failed { error, retry_in } => {
                (FinishKind::Failed, Some(error.as_str()), retry_in.map(dur))
            }
            Finish::Cancelled { reason } => (FinishKind::Cancelled, Some(reason.as_str()), None),
            Finish::HandBack => (FinishKind::HandBack, None, None),
            Finish::Snoozed { run_in } => (FinishKind::HandBack, None, Some(dur(*run_in))),
        };
        kinds.push(kind.code());
        texts.push(text);
        retries.push(retry);
    }
    (kinds, texts, retries)
}

/// Per item, whether the statement's answer `rows` (id, claim token of
/// each attempt it finished) holds its (id, token).
fn finished(ids: &[i64], tokens: &[i64], rows: Vec<PgRow>) -> Result<Vec<bool>, StoreError> {
    let done = rows
        .iter()
        .map(|row| Ok((row.try_get::<i64, _>(0)?, row.try_get::<i64, _>(1)?)))
        .collect::<Result<FastSet<_>, StoreError>>()?;
    Ok(answered(ids, tokens, &done))
}

/// Per item, whether `done` (the (id, token) pairs a statement finished)
/// holds its (id, token).
pub(super) fn answered(ids: &[i64], tokens: &[i64], done: &FastSet<(i64, i64)>) -> Vec<bool> {
    ids.iter()
        .zip(tokens)
        .map(|(&id, &token)| done.contains(&(id, token)))
        .collect()
}
