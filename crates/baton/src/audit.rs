//! The audit log: every operator action (the admin API's and the
//! dashboard's writes, the CLI's) recorded in the store with who did it,
//! what, on which target, from where and how it ended, so every instance
//! lists the same trail. Workers prune records older than [`RETENTION`].
//!
//! ```no_run
//! # async fn demo(store: baton::Store) -> baton::Result<()> {
//! use baton::audit;
//! use baton::store::{AuditAppend, AuditPage};
//!
//! audit::record(&store, &AuditAppend {
//!     actor: "ana@ops-1",
//!     action: "queues pause",
//!     target: "queue emails",
//!     source: "cli",
//!     outcome: "done",
//! })
//! .await?;
//! for r in audit::list(&store, &AuditPage::default()).await? {
//!     println!("{} {} {} {}", r.at, r.actor, r.action, r.target);
//! }
//! # Ok(()) }
//! ```

use std::time::Duration;

use crate::store::audit::clip_field;
use crate::store::{AuditAppend, AuditPage, AuditRecord};
use crate::{Error, Store};

/// How long the audit log keeps a record: 90 days.
pub const RETENTION: Duration = Duration::from_secs(90 * 24 * 3600);

/// Record one action at the store's now (fields longer than
/// [`MAX_AUDIT_FIELD`](crate::store::MAX_AUDIT_FIELD) bytes are cut, ending
/// with `…`).
pub async fn record(store: &Store, entry: &AuditAppend<'_>) -> Result<(), Error> {
    let (actor, action, target) = (
        clip_field(entry.actor),
        clip_field(entry.action),
        clip_field(entry.target),
    );
    let (source, outcome) = (clip_field(entry.source), clip_field(entry.outcome));
    store
        .backend()
        .audit_append(&AuditAppend {
            actor: &actor,
            action: &action,
            target: &target,
            source: &source,
            outcome: &outcome,
        })
        .await?;
    Ok(())
}

/// A page of the audit log, newest first.
pub async fn list(store: &Store, page: &AuditPage) -> Result<Vec<AuditRecord>, Error> {
    Ok(store.backend().audit_list(page).await?)
}
