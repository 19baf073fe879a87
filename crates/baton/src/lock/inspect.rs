//! Looking at locks from outside their holders, and an operator's
//! force-release: what `baton locks`, `/metrics` and the admin API's
//! lock endpoints ask.

use chrono::{DateTime, Utc};

use super::{Locker, RELEASE_BOUND};
use crate::error::Error;
use crate::names::validate_name;
use crate::store::{FencingToken, LockHistoryQuery, LockInfo, LockRecord, LockRevoke};

impl Locker {
    /// Every lock the store has a record of, by name: held ones and
    /// lapsed ones not yet taken again ([`LockInfo::held`] tells them
    /// apart, judged by the store's clock, [`LockInfo::now`]).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), baton::Error> {
    /// let locker = baton::lock::Locker::new(baton::Store::connect("sqlite://app.db").await?);
    /// for l in locker.list().await?.iter().filter(|l| l.held) {
    ///     println!("{} held by {} until {}", l.name, l.holder, l.lock_until);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn list(&self) -> Result<Vec<LockInfo>, Error> {
        Ok(self.store.backend().lock_list().await?)
    }

    /// Released leases, newest first: one lock's (`q.name`) or every
    /// lock's, at most `q.limit` (1 to 1000; 0 means 100). The store keeps
    /// a day of them and at most
    /// [`LOCK_HISTORY_PER_LOCK`](crate::store::LOCK_HISTORY_PER_LOCK) a
    /// lock.
    ///
    /// ```no_run
    /// # async fn demo(store: baton::Store) -> Result<(), baton::Error> {
    /// use baton::store::LockHistoryQuery;
    /// let locker = baton::lock::Locker::new(store);
    /// let q = LockHistoryQuery { name: Some("nightly-report".into()), limit: 10 };
    /// for r in locker.history(&q).await? {
    ///     println!("{} held it (token {}) {} to {}", r.holder, r.token.0, r.acquired_at, r.released_at);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn history(&self, q: &LockHistoryQuery) -> Result<Vec<LockRecord>, Error> {
        if let Some(n) = &q.name {
            validate_name("lock name", n)?;
        }
        if q.limit > 1000 {
            return Err(crate::InvalidInput::new(
                "limit",
                format!("{} is too many; give 1 to 1000", q.limit),
            )
            .into());
        }
        Ok(self.store.backend().lock_history_list(q).await?)
    }

    /// One lock's record; `None` when the store has none for `name`.
    pub async fn get(&self, name: &str) -> Result<Option<LockInfo>, Error> {
        validate_name("lock name", name)?;
        Ok(self.store.backend().lock_get(name).await?)
    }

    /// Force-release `name`, only if `token` is still its current grant's
    /// (so a newer holder is never released by mistake): the lease is
    /// revoked (its holder's extensions and release are refused, and the
    /// holder stops its work within [`RELEASE_BOUND`]) and the lock is
    /// free at the instant answered, `min(lock_until, now +
    /// RELEASE_BOUND)` in store time. `None` when `token` is not current
    /// or the lease lapsed already; nothing changed then.
    pub async fn revoke(
        &self,
        name: &str,
        token: FencingToken,
    ) -> Result<Option<DateTime<Utc>>, Error> {
        validate_name("lock name", name)?;
        Ok(self
            .store
            .backend()
            .lock_revoke(&LockRevoke {
                name,
                token,
                within: RELEASE_BOUND,
            })
            .await?)
    }
}
