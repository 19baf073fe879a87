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

    /// Warnings about the store's configuration that weaken a guarantee
    /// (e.g. Redis without AOF, MySQL with `sync_binlog` off), one
    /// sentence each; empty when there is nothing to say.
    pub async fn warnings(&self) -> Result<Vec<String>, StoreError> {
        self.backend().warnings().await
    }
}
