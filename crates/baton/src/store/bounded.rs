//! The call deadline every backend gets: [`bounded`] runs one store call
//! with a client-side deadline, and `Bounded` wraps a backend so every
//! seam method has it (generated from the seam list), marking the store
//! read-only when a call meets a read-only refusal.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::{Backend, WriteWatch};
use crate::error::StoreError;

/// Run a store call with a client-side deadline: a call that gets no answer
/// within `limit` (a connection gone dark: no reply, no close) fails with
/// the retryable [`StoreError::Unavailable`], saying it timed out.
pub async fn bounded<T>(
    limit: Duration,
    what: &str,
    call: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(limit, call).await {
        Ok(r) => r,
        Err(_) => Err(StoreError::Unavailable(format!(
            "{what} timed out after {} (no answer from the store)",
            crate::format_duration(limit)
        ))),
    }
}

/// A backend whose every call has a client-side deadline (see
/// [`StoreOptions::statement_timeout`]). [`Store::connect_with`] wraps each
/// backend in one.
pub(super) struct Bounded {
    pub(super) inner: Arc<dyn Backend>,
    pub(super) limit: Duration,
    /// Marked by every call that meets a read-only refusal.
    pub(super) writes: Arc<WriteWatch>,
}

impl Bounded {
    /// After a call: a read-only refusal marks the store (logged once)
    /// and recycles the pool's connections (see [`Backend::pool_recycle`]).
    fn noted<T>(&self, r: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(e) = &r {
            if e.is_read_only() {
                self.writes.refused(self.inner.kind(), e);
                self.inner.pool_recycle();
            }
        }
        r
    }
}

// Generated from the seam list, so every method is bounded the same way.
macro_rules! bounded_backend {
    ($($(#[$m:meta])* fn $name:ident($($arg:ident : $ty:ty),*) -> $out:ty;)*) => {
        #[async_trait]
        impl Backend for Bounded {
            fn kind(&self) -> &'static str {
                self.inner.kind()
            }
            fn pool_recycle(&self) {
                self.inner.pool_recycle()
            }
            fn wakes_across_processes(&self) -> bool {
                self.inner.wakes_across_processes()
            }
            fn claims_carry_finishes(&self) -> bool {
                self.inner.claims_carry_finishes()
            }
            fn key_capped_claims_spare_places(&self) -> bool {
                self.inner.key_capped_claims_spare_places()
            }
            $(
                async fn $name(&self, $($arg: $ty),*) -> Result<$out, StoreError> {
                    self.noted(bounded(
                        self.limit,
                        concat!("store call ", stringify!($name)),
                        self.inner.$name($($arg),*),
                    )
                    .await)
                }
            )*
        }
    };
}

crate::seam_methods!(bounded_backend);
