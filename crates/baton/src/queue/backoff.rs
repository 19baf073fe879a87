//! Retry delays: exponential with jitter, capped.

use std::time::Duration;

/// Exponential backoff with jitter: attempt `n` (1-based) waits about
/// `base * factor^(n-1)`, capped at `max`, spread by ±`jitter` (a fraction).
///
/// ```
/// use std::time::Duration;
/// let b = baton::queue::Backoff { base: Duration::from_secs(1), factor: 2.0, max: Duration::from_secs(60), jitter: 0.0 };
/// assert_eq!(b.delay(1), Duration::from_secs(1));
/// assert_eq!(b.delay(3), Duration::from_secs(4));
/// assert_eq!(b.delay(30), Duration::from_secs(60));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// The first delay.
    pub base: Duration,
    /// Growth per attempt.
    pub factor: f64,
    /// The longest delay.
    pub max: Duration,
    /// Random spread as a fraction of the delay (0.0 to 1.0).
    pub jitter: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_secs(1),
            factor: 2.0,
            max: Duration::from_secs(3600),
            jitter: 0.2,
        }
    }
}

impl Backoff {
    /// The delay after failed attempt `attempt` (1-based).
    pub fn delay(&self, attempt: u32) -> Duration {
        let exp = self
            .factor
            .max(1.0)
            .powi(attempt.saturating_sub(1).min(64) as i32);
        let raw = (self.base.as_secs_f64() * exp).min(self.max.as_secs_f64());
        let j = self.jitter.clamp(0.0, 1.0);
        let spread = if j > 0.0 {
            1.0 + j * (fastrand::f64() * 2.0 - 1.0)
        } else {
            1.0
        };
        Duration::from_secs_f64((raw * spread).clamp(0.0, self.max.as_secs_f64()))
    }
}
