//! The finish statements of PostgreSQL (`Backend::task_finish_many`),
//! built in parts ([`FinishParts`]: the CTEs and the answer's `SELECT`),
//! so that the same text runs alone or beside a claim in one statement
//! (`finish_claim.rs`); `base` shifts their parameters past the claim's.
//!
//! A finish reads its arrays through sub-`SELECT`s (`UNNEST((SELECT
//! $1::int8[]), …)`) so that the planner does not see how many items a
//! batch has. With the lengths known (a custom plan, or an unnamed
//! statement behind a pooler), a batch of a few hundred was joined by
//! hashing every running task of the table (a bitmap scan of the running
//! index, dead entries and all); estimated at ten rows, it is a nested
//! loop over the primary key, one probe an item. Measured with
//! `auto_explain` over a PostgreSQL drain (4 x 24, docs/BENCHMARKS.md
//! session 39): the finish's update cost 104-124 us a row where it hashed
//! against 29-33 where it probed, and a quarter of the finish-and-claim
//! statements hashed.

use super::sql::{append_error, WAKE_AT};
use crate::store::CANCEL_REQUESTED;

/// A finish statement in two parts: its CTEs (`name AS (…), …`; the
/// data-modifying ones run whether or not anything reads them) and the
/// `SELECT` of the (id, token) pairs it finished, over those CTEs.
#[derive(Debug)]
pub(super) struct FinishParts {
    /// The CTEs, comma-separated, without `WITH`.
    pub(super) ctes: String,
    /// The answer: (id, token) of each attempt finished.
    pub(super) answer: String,
}

impl FinishParts {
    /// The parts as one statement of their own.
    pub(super) fn statement(&self) -> String {
        format!("WITH {} {}", self.ctes, self.answer)
    }

    /// The parts as the `WITH` of a statement that calls a claim
    /// function after them: `fd` is one row, the attempts finished
    /// (`done_n`, `done_ids`, `done_tokens`); a function called `LATERAL`
    /// on `fd.done_n` runs after the finishes and sees them.
    pub(super) fn counted(&self) -> String {
        format!(
            "WITH {}, fa AS ({}), \
                 fd AS (SELECT count(*) AS done_n, array_agg(id) AS done_ids, \
                     array_agg(token) AS done_tokens FROM fa)",
            self.ctes, self.answer
        )
    }
}

/// A batch's finish whose parameters start after `$base`: every kind
/// ([`finish_many_parts`]), or with `succeeded` successes only
/// ([`finish_succeeded_parts`]).
pub(super) fn finish_parts(
    t: &str,
    now: &str,
    keep_succeeded: bool,
    base: usize,
    succeeded: bool,
) -> FinishParts {
    if succeeded {
        finish_succeeded_parts(t, now, keep_succeeded, base)
    } else {
        finish_many_parts(t, now, keep_succeeded, base)
    }
}

/// The kind of one finish in [`Sql::finish_many`](super::sql::Sql::finish_many)'s `$3`.
#[derive(Debug, Clone, Copy)]
pub(super) enum FinishKind {
    Succeeded,
    Failed,
    Cancelled,
    HandBack,
}

impl FinishKind {
    /// The code bound for this kind.
    pub(super) fn code(self) -> &'static str {
        match self {
            FinishKind::Succeeded => "s",
            FinishKind::Failed => "f",
            FinishKind::Cancelled => "c",
            FinishKind::HandBack => "h",
        }
    }
}

/// The one statement that finishes a batch of attempts of any kinds (see
/// [`Sql::finish_many`](super::sql::Sql::finish_many)). Each row is a fenced compare-and-set on its
/// claim token. A failure with a retry and attempts left goes back to
/// pending after its delay (and is announced with its due time, so a
/// worker starts it when the backoff ends rather than at a later poll),
/// unless its cancel was requested; a hand-back goes back to pending now
/// without counting the attempt (announced), or is cancelled when its
/// cancel was requested; a snooze (kind `h` with a `retry_ms`) is a
/// hand-back due `retry_ms` after now (announced with its due time). With `keep_succeeded: false` a success deletes
/// the task, except rows that hold a unique key or a job's run history,
/// which are kept as succeeded.
/// Its parameters are `$base+1` (ids) to `$base+7` (the cancel reason).
pub(super) fn finish_many_parts(
    t: &str,
    now: &str,
    keep_succeeded: bool,
    base: usize,
) -> FinishParts {
    let p = |i: usize| format!("${}", base + i);
    let (ids, tokens, kinds, msgs, retries) = (p(1), p(2), p(3), p(4), p(5));
    let (chan, cancel) = (p(6), p(7));
    // A retry whose cancellation was requested is not retried.
    let again = "(c.kind = 'f' AND c.retry_ms IS NOT NULL AND t.attempt < t.max_attempts \
                  AND NOT t.cancel_requested)";
    let stop = "(c.kind = 'f' AND c.retry_ms IS NOT NULL AND t.attempt < t.max_attempts \
                 AND t.cancel_requested)";
    // A snooze is a hand-back with a delay.
    let snooze = "(c.kind = 'h' AND c.retry_ms IS NOT NULL AND NOT t.cancel_requested)";
    let errs = append_error(now, "c.msg");
    let deleted = "c.kind = 's' AND t.unique_key IS NULL AND t.job IS NULL";
    let (delete, kept) = if keep_succeeded {
        (
            "d AS (SELECT NULL::int8 AS id, NULL::int8 AS token WHERE false)".to_string(),
            String::new(),
        )
    } else {
        (
            format!(
                "d AS (DELETE FROM {t} AS t USING c \
                     WHERE t.id = c.id AND t.claim_token = c.token AND t.state = 'running' \
                         AND {deleted} \
                     RETURNING t.id, t.claim_token AS token)"
            ),
            format!(" AND NOT ({deleted})"),
        )
    };
    let ctes = format!(
        "c AS (SELECT DISTINCT ON (id) * \
             FROM UNNEST((SELECT {ids}::int8[]), (SELECT {tokens}::int8[]), \
                 (SELECT {kinds}::text[]), (SELECT {msgs}::text[]), \
                 (SELECT {retries}::int8[])) \
                 AS c(id, token, kind, msg, retry_ms)), \
         {delete}, \
         u AS (UPDATE {t} AS t SET \
             state = CASE c.kind WHEN 's' THEN 'succeeded' WHEN 'c' THEN 'cancelled' \
                 WHEN 'h' THEN CASE WHEN t.cancel_requested THEN 'cancelled' ELSE 'pending' END \
                 ELSE CASE WHEN {again} THEN 'pending' WHEN {stop} THEN 'cancelled' \
                     ELSE 'failed' END END, \
             finished_at = CASE c.kind WHEN 'h' THEN CASE WHEN t.cancel_requested THEN {now} END \
                 WHEN 'f' THEN CASE WHEN {again} THEN NULL ELSE {now} END \
                 ELSE {now} END, \
             lease_until = NULL, \
             last_error = CASE c.kind WHEN 's' THEN t.last_error WHEN 'c' THEN c.msg \
                 WHEN 'h' THEN CASE WHEN t.cancel_requested THEN {cancel} ELSE t.last_error END \
                 ELSE CASE WHEN {stop} THEN '{CANCEL_REQUESTED}: ' || c.msg ELSE c.msg END END, \
             errors = CASE WHEN c.kind = 'f' THEN {errs} ELSE t.errors END, \
             run_at = CASE WHEN {again} OR {snooze} \
                 THEN {now} + c.retry_ms * interval '1 millisecond' ELSE t.run_at END, \
             attempt = CASE WHEN c.kind = 'h' THEN t.attempt - 1 ELSE t.attempt END \
         FROM c \
         WHERE t.id = c.id AND t.claim_token = c.token AND t.state = 'running'{kept} \
         RETURNING t.id, t.claim_token AS token, t.queue, t.state, t.run_at, c.kind, \
             c.retry_ms), \
         n AS (SELECT count(pg_notify({chan}, CASE WHEN u.kind = 'h' AND u.retry_ms IS NULL \
                 THEN u.queue \
                 ELSE u.queue || chr(10) || {WAKE_AT} END)) AS n \
             FROM u WHERE u.state = 'pending')"
    );
    FinishParts {
        ctes,
        answer: "SELECT r.id, r.token FROM (SELECT id, token FROM d UNION ALL \
                 SELECT id, token FROM u) AS r CROSS JOIN n"
            .into(),
    }
}

/// [`finish_many_parts`] as a statement of its own.
pub(super) fn finish_many_sql(t: &str, now: &str, keep_succeeded: bool) -> String {
    finish_many_parts(t, now, keep_succeeded, 0).statement()
}

/// [`Sql::finish_succeeded`](super::sql::Sql::finish_succeeded): [`finish_many_sql`] for a batch whose
/// items are all successes, which is a worker's common batch. Each row is
/// the same fenced compare-and-set on (id, claim token, `running`), and
/// ends as an `s` row of `finish_many` does: `succeeded` with its
/// `finished_at` and no lease, its error fields, `run_at` and attempt
/// untouched, or deleted (with `keep_succeeded: false`, unless it holds a
/// unique key or a job's run history). A success announces nothing, so
/// the statement has no `pg_notify`, no per-kind `CASE` and no
/// `DISTINCT ON` (a duplicate id joins once per matching token, and a row
/// is updated at most once).
/// Its parameters are `$base+1` (ids) and `$base+2` (tokens).
pub(super) fn finish_succeeded_parts(
    t: &str,
    now: &str,
    keep_succeeded: bool,
    base: usize,
) -> FinishParts {
    let input = succeeded_input(base);
    if keep_succeeded {
        return FinishParts {
            ctes: format!("u AS ({})", succeeded_update(t, now, &input, "")),
            answer: "SELECT id, token FROM u".into(),
        };
    }
    let deleted = "t.unique_key IS NULL AND t.job IS NULL";
    FinishParts {
        ctes: format!(
            "c AS (SELECT * FROM {input}), \
             d AS (DELETE FROM {t} AS t USING c WHERE {SUCCEEDED_CAS} AND {deleted} \
                 RETURNING t.id, t.claim_token AS token), \
             u AS ({})",
            succeeded_update(t, now, "c", &format!(" AND NOT ({deleted})"))
        ),
        answer: "SELECT id, token FROM d UNION ALL SELECT id, token FROM u".into(),
    }
}

/// [`finish_succeeded_parts`] as a statement of its own; with
/// `keep_succeeded`, the bare `UPDATE`.
pub(super) fn finish_succeeded_sql(t: &str, now: &str, keep_succeeded: bool) -> String {
    if keep_succeeded {
        return succeeded_update(t, now, &succeeded_input(0), "");
    }
    finish_succeeded_parts(t, now, false, 0).statement()
}

/// The compare-and-set of a success on (id, claim token, `running`).
const SUCCEEDED_CAS: &str = "t.id = c.id AND t.claim_token = c.token AND t.state = 'running'";

/// The (id, token) pairs of a batch of successes, from `$base+1` and
/// `$base+2`, each read through a sub-`SELECT` (see the module's doc).
fn succeeded_input(base: usize) -> String {
    format!(
        "UNNEST((SELECT ${}::int8[]), (SELECT ${}::int8[])) AS c(id, token)",
        base + 1,
        base + 2
    )
}

/// The `UPDATE` that marks the successes of `from` (alias `c`) succeeded,
/// under [`SUCCEEDED_CAS`] and `also`.
fn succeeded_update(t: &str, now: &str, from: &str, also: &str) -> String {
    format!(
        "UPDATE {t} AS t SET state = 'succeeded', finished_at = {now}, lease_until = NULL \
         FROM {from} WHERE {SUCCEEDED_CAS}{also} \
         RETURNING t.id, t.claim_token AS token"
    )
}
