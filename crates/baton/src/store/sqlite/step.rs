//! Host clock steps (DESIGN.md C1 on SQLite, whose store clock is the
//! host's wall clock).
//!
//! A forward step of the wall clock (an NTP correction after a VM resume,
//! a suspend, an operator's `date -s`) makes every lease written before it
//! look that much older, so a rescue right after the step would take
//! claims whose workers are alive and heartbeating. This process keeps a
//! (wall, monotonic) pair and compares the two on every store-clock read
//! and before every rescue: wall time that ran ahead of monotonic time by
//! more than [`STEP_MIN`] is a forward step, logged as a warning, and for
//! [`STEP_HOLD`] after it the rescue only takes leases that lapsed more
//! than the step's size ago (the grace), and a lock is granted over an
//! earlier lease only once that lease lapsed more than the grace ago. Every
//! live claim heartbeats
//! within a third of its lease, after which its lease is in the new clock's
//! terms, so the grace only delays the rescue of dead workers' tasks by
//! the step, for leases up to three times [`STEP_HOLD`].
//!
//! A step the process did not run across (it started after the step) is
//! not seen; nor is one between the check and the rescue statement (a few
//! milliseconds). docs/GUIDE.md ("Clock steps on SQLite") has the bound.

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// Wall time ahead of monotonic time by at least this much is a step
/// (NTP's slew moves the wall clock by at most 0.5 ms per second).
pub(super) const STEP_MIN: Duration = Duration::from_millis(100);

/// How long a forward step's grace applies to the rescue.
pub(super) const STEP_HOLD: Duration = Duration::from_secs(3600);

/// The process's (wall, monotonic) pair and the forward steps it saw.
struct Guard {
    wall: SystemTime,
    mono: Instant,
    /// (when, by how much) for each forward step within [`STEP_HOLD`].
    steps: Vec<(Instant, Duration)>,
}

fn guard() -> &'static Mutex<Guard> {
    static GUARD: std::sync::OnceLock<Mutex<Guard>> = std::sync::OnceLock::new();
    GUARD.get_or_init(|| {
        Mutex::new(Guard {
            wall: SystemTime::now(),
            mono: Instant::now(),
            steps: Vec::new(),
        })
    })
}

/// Compare the wall clock with the monotonic clock since the last check;
/// log a step (forward or back) and return the grace the rescue must allow
/// now: the sum of the forward steps seen within [`STEP_HOLD`].
pub(super) fn check() -> Duration {
    let mut g = guard().lock().unwrap_or_else(|p| p.into_inner());
    let (wall, mono) = (SystemTime::now(), Instant::now());
    let mono_elapsed = mono.saturating_duration_since(g.mono);
    match wall.duration_since(g.wall) {
        Ok(wall_elapsed) => {
            let ahead = wall_elapsed.saturating_sub(mono_elapsed);
            if ahead >= STEP_MIN {
                tracing::warn!(
                    step_ms = ahead.as_millis() as u64,
                    "sqlite: the host's wall clock stepped forward by {}; the rescue \
                     of expired leases allows that much more for the next {}, so \
                     live claims are not taken",
                    crate::format_duration(ahead),
                    crate::format_duration(STEP_HOLD)
                );
                g.steps.push((mono, ahead));
            } else if mono_elapsed.saturating_sub(wall_elapsed) >= STEP_MIN {
                tracing::warn!(
                    step_ms = mono_elapsed.saturating_sub(wall_elapsed).as_millis() as u64,
                    "sqlite: the host's wall clock stepped back; leases and due times \
                     read that much later (nothing runs twice)"
                );
            }
        }
        Err(back) => tracing::warn!(
            step_ms = (back.duration() + mono_elapsed).as_millis() as u64,
            "sqlite: the host's wall clock stepped back; leases and due times read \
             that much later (nothing runs twice)"
        ),
    }
    g.wall = wall;
    g.mono = mono;
    g.steps
        .retain(|&(at, _)| mono.saturating_duration_since(at) < STEP_HOLD);
    g.steps.iter().map(|&(_, d)| d).sum()
}
