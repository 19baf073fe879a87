//! What every lease shares, a lock's as well as a task's: how long before
//! its local deadline the work under it must be gone.

use std::time::Duration;

/// How long before a lease's local deadline the work under it must be
/// gone (killed, dropped): a tenth of the lease, at most 100 ms. The
/// deadline itself is safe by the request's one-way latency only; this
/// margin absorbs a late timer on a busy host and the teardown itself, so
/// the work is gone before the store could grant the lease again. Lock
/// leases ([`crate::lock::LeaseHandle::stop_by`]) and task leases (a
/// worker's attempt) both use it.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(baton::lease::stop_margin(Duration::from_secs(30)), Duration::from_millis(100));
/// assert_eq!(baton::lease::stop_margin(Duration::from_millis(500)), Duration::from_millis(50));
/// ```
pub fn stop_margin(lease: Duration) -> Duration {
    (lease / 10).min(Duration::from_millis(100))
}
