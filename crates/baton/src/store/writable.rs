//! Noticing a store that refuses writes: a read-only server behind the
//! URL (a standby, a demoted primary after a failover, PostgreSQL
//! `default_transaction_read_only`, MySQL/MariaDB `read_only`).
//!
//! Every store call whose error is [`StoreError::ReadOnly`] marks the
//! store read-only ([`WriteWatch::refused`]); the first such error is
//! logged once as an error for the whole process, so the loops that meet
//! it (claims, heartbeats, schedulers, lock keep-alives) log theirs at
//! debug and only back off. A write probe that works
//! ([`crate::Store::check_writable`], run by `/readyz`, the worker's
//! rescue tick and the scheduler's identity tick while the store is read
//! only) clears the mark, logged once too. `/readyz` answers 503 with
//! the reason while it is set.

use std::sync::Mutex;

use crate::error::StoreError;

/// Whether the store refused writes, and why (see the module docs).
#[derive(Debug, Default)]
pub struct WriteWatch {
    refused: Mutex<Option<String>>,
}

impl WriteWatch {
    /// Why the store refuses writes, while it does (the error of the
    /// first refusal since it last took writes).
    pub fn read_only(&self) -> Option<String> {
        self.refused.lock().ok().and_then(|r| r.clone())
    }

    /// A call failed with a read-only error: mark the store read-only,
    /// logging it once (an error) when it was not marked.
    pub fn refused(&self, kind: &str, e: &StoreError) {
        let Ok(mut r) = self.refused.lock() else {
            return;
        };
        if r.is_none() {
            let why = crate::error::chain(e);
            tracing::error!(
                store = kind,
                error = %why,
                "the {kind} store refuses writes (read-only): claims, schedules and lock \
                 renewals back off and resume once the store URL reaches a writable server"
            );
            *r = Some(why);
        }
    }

    /// A write probe worked: clear the mark, logging it once.
    pub fn accepted(&self, kind: &str) {
        let Ok(mut r) = self.refused.lock() else {
            return;
        };
        if r.take().is_some() {
            tracing::info!(
                store = kind,
                "the {kind} store takes writes again; resuming"
            );
        }
    }
}

/// Log a store failure at warn, or at debug when it is a read-only
/// refusal (said once for the process by [`WriteWatch::refused`]).
macro_rules! warn_unless_read_only {
    ($e:expr, $($arg:tt)+) => {
        if $e.is_read_only() {
            tracing::debug!($($arg)+)
        } else {
            tracing::warn!($($arg)+)
        }
    };
}
pub(crate) use warn_unless_read_only;

/// Pooled connections to drop after a read-only refusal (see
/// [`crate::store::Backend::pool_recycle`]): the pool's `before_acquire`
/// discards every connection opened before the last mark, so the next
/// acquire connects again (and may reach the writable server the URL now
/// leads to).
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[derive(Debug, Default)]
pub(crate) struct Recycle {
    since: Mutex<Option<std::time::Instant>>,
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl Recycle {
    /// Drop the connections open now, each at its next acquire.
    pub(crate) fn mark(&self) {
        if let Ok(mut t) = self.since.lock() {
            *t = Some(std::time::Instant::now());
        }
    }

    /// Whether a connection of this age was open at the last mark.
    pub(crate) fn stale(&self, age: std::time::Duration) -> bool {
        let Some(mark) = self.since.lock().ok().and_then(|t| *t) else {
            return false;
        };
        std::time::Instant::now()
            .checked_sub(age)
            .is_none_or(|born| born <= mark)
    }
}
