//! The busy handler of every writer connection: how a connection waits
//! while another holds the database's write lock.
//!
//! SQLite's own handler (what `busy_timeout` installs) sleeps 1, 2, 5, 10,
//! 15, 20, 25 … 100 ms between tries, so a writer that meets the lock held
//! for a fraction of a millisecond (a claim's or a finish's transaction)
//! sleeps at least a millisecond, and the lock sits free meanwhile: two
//! writer connections of one process ran a keyed claim's drain with a core
//! idle. This one tries again after 50 µs for the first millisecond, then
//! every 250 µs up to 6 ms, then every millisecond, and gives up (the
//! statement fails `SQLITE_BUSY`, as the built-in handler does) once it has
//! waited the store's statement timeout.

use std::ffi::{c_int, c_void};
use std::time::Duration;

use sqlx::sqlite::SqliteConnection;

/// Install the handler on `conn`, giving up after `timeout` (in place of
/// the `busy_timeout` sqlx set on connecting).
pub(super) async fn install(conn: &mut SqliteConnection, timeout: Duration) -> sqlx::Result<()> {
    let mut handle = conn.lock_handle().await?;
    // The timeout in µs travels as the handler's argument (a number, not a
    // pointer to anything), so nothing needs to outlive the connection.
    let limit = usize::try_from(timeout.as_micros()).unwrap_or(usize::MAX);
    // SAFETY: the handle is the open connection's, locked out of its worker
    // thread for this call; `on_busy` reads its argument as a number only.
    let rc = unsafe {
        libsqlite3_sys::sqlite3_busy_handler(
            handle.as_raw_handle().as_ptr(),
            Some(on_busy),
            limit as *mut c_void,
        )
    };
    if rc != libsqlite3_sys::SQLITE_OK {
        return Err(sqlx::Error::Protocol(format!(
            "sqlite3_busy_handler failed with code {rc}"
        )));
    }
    Ok(())
}

/// The pause before the `n`-th try after the first (µs), and how long the
/// tries before it have waited in all.
fn pause(n: u64) -> (u64, u64) {
    const FAST: u64 = 20; // 20 × 50 µs: the first millisecond
    const MID: u64 = 20; // 20 × 250 µs: up to 6 ms
    if n < FAST {
        (50, n * 50)
    } else if n < FAST + MID {
        (250, FAST * 50 + (n - FAST) * 250)
    } else {
        (1000, FAST * 50 + MID * 250 + (n - FAST - MID) * 1000)
    }
}

/// SQLite's busy callback: `count` is how many times it was called for
/// this wait. Non-zero: try again; zero: give up with `SQLITE_BUSY`.
extern "C" fn on_busy(limit: *mut c_void, count: c_int) -> c_int {
    let limit = limit as usize as u64;
    let (next, waited) = pause(u64::try_from(count).unwrap_or(0));
    if waited >= limit {
        return 0;
    }
    std::thread::sleep(Duration::from_micros(next.min(limit - waited)));
    1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_grow_and_add_up() {
        assert_eq!(pause(0), (50, 0));
        assert_eq!(pause(19), (50, 950));
        assert_eq!(pause(20), (250, 1000));
        assert_eq!(pause(40), (1000, 6000));
        assert_eq!(pause(45), (1000, 11000));
    }

    #[test]
    fn gives_up_at_the_limit() {
        // A limit of 0 µs: no wait at all.
        assert_eq!(on_busy(std::ptr::null_mut(), 0), 0);
        // 100 µs: two tries of 50 µs, then give up.
        let limit = 100usize as *mut c_void;
        assert_eq!(on_busy(limit, 0), 1);
        assert_eq!(on_busy(limit, 1), 1);
        assert_eq!(on_busy(limit, 2), 0);
    }
}
