//! What an operator's tools ask a [`Store`] about itself: its kind, its
//! schema version and warnings about its configuration. Reads only; the
//! CLI's `/readyz`, `baton migrate` and start-up warnings use them rather
//! than the raw seam ([`Store::backend`]).

use super::{SchemaStatus, Store};
use crate::error::StoreError;

impl Store {
    /// Which backend this is: `"sqlite"`, `"postgres"`, `"mysql"` or
    /// `"redis"` (what [`super::Backend::kind`] answers).
    pub fn kind(&self) -> &'static str {
        self.backend().kind()
    }

    /// The schema version recorded at this store's prefix against this
    /// build's (a read only: nothing is created or upgraded).
    /// [`SchemaStatus::problem`] says why a process of this build cannot
    /// serve it, if it cannot.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), baton::Error> {
    /// let store = baton::Store::connect("sqlite://app.db").await?;
    /// if let Some(why) = store.schema_status().await?.problem() {
    ///     eprintln!("not ready: {why}");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn schema_status(&self) -> Result<SchemaStatus, StoreError> {
        self.backend().schema_status().await
    }

    /// Remove baton's schema at this store's prefix, with every task, lock,
    /// job cursor and queue flag in it: the tables and sequence (SQL) or
    /// keys (Redis) baton made, nothing of the application's nor of other
    /// prefixes. Stop every baton process on the prefix first (one still
    /// running would recreate the schema at its next connect, empty). The
    /// CLI's `baton migrate --remove --yes` calls this.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), baton::Error> {
    /// let store = baton::Store::connect_with(
    ///     "postgres://app@db/app",
    ///     baton::StoreOptions { migrate: false, ..baton::StoreOptions::prefixed("baton_") },
    /// ).await?;
    /// store.remove_schema().await?;
    /// assert_eq!(store.schema_status().await?.found, None);
    /// # Ok(()) }
    /// ```
    pub async fn remove_schema(&self) -> Result<(), StoreError> {
        self.backend().schema_remove().await
    }

    /// Warnings about the store's configuration that weaken a guarantee
    /// (e.g. Redis without AOF, MySQL with `sync_binlog` off), one
    /// sentence each; empty when there is nothing to say.
    pub async fn warnings(&self) -> Result<Vec<String>, StoreError> {
        self.backend().warnings().await
    }
}
