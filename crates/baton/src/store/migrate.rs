//! The one migration runner (docs/STORE.md, "Migrations"; DESIGN.md,
//! "Schema upgrades"), run by every backend's `migrate` over its own
//! [`Dialect`]: the steps and the statements are the backend's, the order
//! of things is here.
//!
//! 1. A store already at this build's version needs no lock and no DDL:
//!    only its identity is written if missing.
//! 2. Otherwise, under the dialect's migration lock: read the recorded
//!    version; none is a new store, which the dialect creates (SQL: the
//!    base DDL and the base version; Redis: nothing to convert, this
//!    build's version at once); a newer one than this build's is refused,
//!    untouched; then each step from the recorded version runs, its
//!    version recorded after it (so an interrupted upgrade resumes where
//!    it stopped).
//! 3. The lock is released (committed, when it is a transaction), and the
//!    store's identity written once (`store::new_store_id`).

use async_trait::async_trait;

use crate::error::StoreError;

/// One backend's side of the migration: its version record, its lock and
/// its upgrade steps. Methods called after [`Dialect::lock`] run under the
/// lock (in the lock's transaction, where it is one).
#[async_trait]
pub(crate) trait Dialect: Send {
    /// The backend's name in logs (`sqlite`, `postgres`, …).
    fn name(&self) -> &'static str;
    /// The table or key prefix, for logs and messages.
    fn prefix(&self) -> &str;
    /// The version a new store's base schema has.
    fn base_version(&self) -> i64;
    /// How many upgrade steps the backend has: this build's version is
    /// the base plus these.
    fn step_count(&self) -> usize;
    /// The recorded version without the lock, for the fast path; an error
    /// (no meta table yet) takes the locked path.
    async fn peek_version(&mut self) -> Result<Option<i64>, StoreError>;
    /// Take the migration lock, so processes that connect at once take
    /// turns.
    async fn lock(&mut self) -> Result<(), StoreError>;
    /// The recorded version under the lock; `None` for a new store.
    async fn recorded_version(&mut self) -> Result<Option<i64>, StoreError>;
    /// Create a new store and return the version it now records.
    async fn create(&mut self) -> Result<i64, StoreError>;
    /// Run upgrade step `index` (from version `base + index` to the next).
    async fn run_step(&mut self, index: usize) -> Result<(), StoreError>;
    /// Record `version` as the store's.
    async fn record_version(&mut self, version: i64) -> Result<(), StoreError>;
    /// Release the lock: commit what was done when `commit`, else give it
    /// up (a transaction rolls back).
    async fn unlock(&mut self, commit: bool) -> Result<(), StoreError>;
    /// Write the store's identity when none is recorded.
    async fn write_identity(&mut self) -> Result<(), StoreError>;
}

/// The table names (after the prefix) of every SQL backend: what
/// `schema_remove` drops. A backend that adds a table adds it here.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) const SQL_TABLES: [&str; 12] = [
    "meta",
    "locks",
    "tasks",
    "jobs",
    "queues",
    "slots",
    "rates",
    "audit",
    "jobdefs",
    "key_rates",
    "rollup",
    "lock_history",
];

/// Every table of `prefix`, each quoted with `q`, comma-separated.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn quoted_tables(prefix: &str, q: char) -> String {
    SQL_TABLES.map(|t| format!("{q}{prefix}{t}{q}")).join(", ")
}

/// The version this build writes and reads for `d`.
pub(crate) fn expected_version(d: &impl Dialect) -> i64 {
    d.base_version() + i64::try_from(d.step_count()).unwrap_or(i64::MAX)
}

/// A recorded version as text (SQL keeps it in the meta table).
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) fn parse_version(text: &str) -> Result<i64, StoreError> {
    text.trim()
        .parse()
        .map_err(|_| StoreError::Corrupt(format!("schema version: unexpected value {text:?}")))
}

/// Migrate the store behind `d` to this build's version (see the module
/// docs for the order of things).
pub(crate) async fn run(d: &mut impl Dialect) -> Result<(), StoreError> {
    let expected = expected_version(d);
    if let Ok(Some(v)) = d.peek_version().await {
        if v == expected {
            return d.write_identity().await;
        }
    }
    d.lock().await?;
    let upgraded = upgrade_locked(d, expected).await;
    let released = d.unlock(upgraded.is_ok()).await;
    upgraded?;
    released?;
    d.write_identity().await
}

/// The part of [`run`] under the lock.
async fn upgrade_locked(d: &mut impl Dialect, expected: i64) -> Result<(), StoreError> {
    let (found, created) = match d.recorded_version().await? {
        Some(v) => (v, false),
        None => (d.create().await?, true),
    };
    if found > expected {
        return Err(StoreError::Config(format!(
            "{}: the baton schema with prefix {:?} is version {found}, newer than this \
             build's {expected}; upgrade baton",
            d.name(),
            d.prefix()
        )));
    }
    let base = d.base_version();
    for from in found.max(base)..expected {
        let index = usize::try_from(from - base)
            .ok()
            .filter(|&i| i < d.step_count())
            .ok_or_else(|| {
                StoreError::Corrupt(format!("schema version {from}: no upgrade step"))
            })?;
        d.run_step(index).await?;
        d.record_version(from + 1).await?;
        // A store created just now runs the steps too (its tables were
        // made at the base version): not an upgrade anyone needs to read.
        if created {
            tracing::debug!(
                prefix = %d.prefix(),
                "{}: new baton schema, step from version {from} to {}",
                d.name(),
                from + 1
            );
        } else {
            tracing::info!(
                prefix = %d.prefix(),
                "{}: upgraded the baton schema from version {from} to {}",
                d.name(),
                from + 1
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dialect in memory, recording what the runner asked of it.
    #[derive(Default)]
    struct Mem {
        version: Option<i64>,
        created_at: i64,
        steps: usize,
        log: Vec<String>,
        fail_step: Option<usize>,
    }

    #[async_trait]
    impl Dialect for Mem {
        fn name(&self) -> &'static str {
            "mem"
        }
        fn prefix(&self) -> &str {
            "p_"
        }
        fn base_version(&self) -> i64 {
            1
        }
        fn step_count(&self) -> usize {
            self.steps
        }
        async fn peek_version(&mut self) -> Result<Option<i64>, StoreError> {
            Ok(self.version)
        }
        async fn lock(&mut self) -> Result<(), StoreError> {
            self.log.push("lock".into());
            Ok(())
        }
        async fn recorded_version(&mut self) -> Result<Option<i64>, StoreError> {
            Ok(self.version)
        }
        async fn create(&mut self) -> Result<i64, StoreError> {
            self.log.push("create".into());
            self.version = Some(self.created_at);
            Ok(self.created_at)
        }
        async fn run_step(&mut self, index: usize) -> Result<(), StoreError> {
            if self.fail_step == Some(index) {
                return Err(StoreError::Backend("step failed".into()));
            }
            self.log.push(format!("step {index}"));
            Ok(())
        }
        async fn record_version(&mut self, version: i64) -> Result<(), StoreError> {
            self.log.push(format!("record {version}"));
            self.version = Some(version);
            Ok(())
        }
        async fn unlock(&mut self, commit: bool) -> Result<(), StoreError> {
            self.log.push(format!("unlock {commit}"));
            Ok(())
        }
        async fn write_identity(&mut self) -> Result<(), StoreError> {
            self.log.push("identity".into());
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_new_sql_store_is_created_at_the_base_then_upgraded_step_by_step() {
        let mut d = Mem {
            created_at: 1,
            steps: 2,
            ..Mem::default()
        };
        run(&mut d).await.unwrap();
        assert_eq!(
            d.log,
            [
                "lock",
                "create",
                "step 0",
                "record 2",
                "step 1",
                "record 3",
                "unlock true",
                "identity"
            ]
        );
    }

    #[tokio::test]
    async fn a_store_created_at_this_version_runs_no_step() {
        let mut d = Mem {
            created_at: 3,
            steps: 2,
            ..Mem::default()
        };
        run(&mut d).await.unwrap();
        assert_eq!(d.log, ["lock", "create", "unlock true", "identity"]);
    }

    #[tokio::test]
    async fn a_current_store_only_gets_its_identity() {
        let mut d = Mem {
            version: Some(3),
            steps: 2,
            ..Mem::default()
        };
        run(&mut d).await.unwrap();
        assert_eq!(d.log, ["identity"]);
    }

    #[tokio::test]
    async fn a_newer_store_is_refused_untouched() {
        let mut d = Mem {
            version: Some(9),
            steps: 2,
            ..Mem::default()
        };
        let err = run(&mut d).await.unwrap_err().to_string();
        assert!(err.contains("newer than this build's 3"), "{err}");
        assert_eq!(d.log, ["lock", "unlock false"]);
        assert_eq!(d.version, Some(9));
    }

    #[tokio::test]
    async fn a_failed_step_keeps_the_steps_before_it_recorded() {
        let mut d = Mem {
            version: Some(1),
            steps: 3,
            fail_step: Some(1),
            ..Mem::default()
        };
        assert!(run(&mut d).await.is_err());
        assert_eq!(d.log, ["lock", "step 0", "record 2", "unlock false"]);
        assert_eq!(d.version, Some(2));
    }
}
