//! Planner statistics for a `tasks` table that never had any. Without
//! them PostgreSQL estimates every filter of the limited claims' functions
//! (fair, capped, rated per key) to match about one row, and may walk the
//! queue's whole pending set in claim order where the key index finds a
//! key's first task at once: on a fresh table with a 20,000-task backlog
//! of 10 keys, a fair claim took ~150 ms and fair claiming ran at ~550
//! tasks/s (docs/BENCHMARKS.md session 27). Autovacuum analyzes the table
//! in time where it runs; where it is off, or before it comes by, a
//! limited claim that took [`SLOW_CLAIM`] or longer has the table
//! analyzed, once it is found never analyzed, checked at most every
//! [`RECHECK`]. The cached plans of the functions are made again after
//! the `ANALYZE` (it invalidates them). Plain claims need nothing: their
//! plan is an index walk with or without statistics
//! (`postgres_smoke::claim_plan_is_an_index_walk`).

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::PgBackend;

/// A limited claim taking this long is a sign of plans made without
/// statistics (such a claim takes 1–6 ms with them).
pub(super) const SLOW_CLAIM: Duration = Duration::from_millis(20);

/// The shortest time between two checks of the table's statistics.
pub(super) const RECHECK: Duration = Duration::from_secs(60);

/// When the statistics were last checked.
#[derive(Debug, Default)]
pub(super) struct Statistics {
    checked: Mutex<Option<Instant>>,
}

impl Statistics {
    /// Whether a check is due now (and, if so, it is counted as made).
    fn due(&self) -> bool {
        let mut checked = crate::store::sizing::lock(&self.checked);
        if checked.is_some_and(|t| t.elapsed() < RECHECK) {
            return false;
        }
        *checked = Some(Instant::now());
        true
    }
}

impl PgBackend {
    /// A limited claim took `took`: if that is slow and a check is due,
    /// check in the background whether `tasks` was ever analyzed, and
    /// analyze it if not.
    pub(super) fn claim_took(&self, took: Duration) {
        if took < SLOW_CLAIM || !self.stats.due() {
            return;
        }
        let pool = self.pool.clone();
        let sql = analyze_sql(&self.names.tasks);
        tokio::spawn(async move {
            match sqlx::Executor::execute(&pool, sqlx::raw_sql(&sql)).await {
                Ok(_) => tracing::debug!("checked the tasks table's planner statistics"),
                Err(e) => tracing::warn!(
                    error = %e,
                    "checking or making the tasks table's planner statistics failed; \
                     limited claims may stay slow until autovacuum analyzes it"
                ),
            }
        });
    }
}

/// One round trip: unless another session is at it (a transaction-scoped
/// advisory lock taken with a try), `ANALYZE` the tasks table `tasks` (a
/// quoted name made of a validated prefix) if it was never analyzed.
/// Several workers finding the same slow claims analyze it once.
fn analyze_sql(tasks: &str) -> String {
    let lit = tasks.replace('\'', "''");
    format!(
        "DO $analyze$ BEGIN \
             IF pg_try_advisory_xact_lock(hashtextextended('baton analyze ' || '{lit}', 0)) \
                 AND EXISTS (SELECT 1 FROM pg_class AS c \
                     LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid \
                     WHERE c.oid = to_regclass('{lit}') AND (c.reltuples < 0 \
                         OR coalesce(s.last_analyze, s.last_autoanalyze) IS NULL)) THEN \
                 RAISE LOG 'baton: analyzing %, never analyzed', '{lit}'; \
                 ANALYZE {tasks}; \
             END IF; \
         END $analyze$"
    )
}

/// The statement a slow limited claim sends (see the module docs): for
/// the tasks table of `prefix`, `ANALYZE` it unless it was analyzed
/// before or another session is analyzing it. For tests and diagnostics;
/// not a stable API.
#[doc(hidden)]
pub fn analyze_if_never_sql(prefix: Option<&str>) -> String {
    analyze_sql(&super::Names::new(prefix).tasks)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check is made at most once a [`RECHECK`]: a slow claim finds it
    /// due, the next one not, and one after the interval due again.
    #[test]
    fn a_check_is_due_at_most_once_a_recheck() {
        let s = Statistics::default();
        assert!(s.due(), "never checked: due");
        assert!(!s.due(), "checked just now: not due");
        let long_ago = Instant::now().checked_sub(RECHECK + Duration::from_secs(1));
        *crate::store::sizing::lock(&s.checked) = long_ago;
        assert!(s.due(), "checked more than RECHECK ago: due");
        assert!(!s.due(), "and counted as made");
    }
}
