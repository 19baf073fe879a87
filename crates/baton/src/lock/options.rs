//! [`LockOptions`]: a lease's length (`at_most`), its minimum hold
//! (`at_least`), the keep-alive and its timing.

use super::*;

/// How long a lease lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "LockOptions do nothing until passed to a Locker"]
pub struct LockOptions {
    pub(super) at_most: Duration,
    pub(super) at_least: Duration,
    pub(super) keep_alive: bool,
    pub(super) margin: Duration,
}

impl LockOptions {
    /// A lease that lapses `at_most` after its grant or last extension.
    /// Keep-alive is on, `at_least` is 0. The options are checked where
    /// they are used ([`Locker`]'s calls, [`LockOptions::validate`]),
    /// as every builder of the crate is: `at_most` at least 1 ms.
    pub fn new(at_most: Duration) -> LockOptions {
        LockOptions {
            at_most,
            at_least: Duration::ZERO,
            keep_alive: true,
            margin: Duration::ZERO,
        }
    }

    /// Keep the lease at least this long after its grant, even when released
    /// earlier. Must not exceed `at_most` (checked at use).
    pub fn at_least(mut self, at_least: Duration) -> LockOptions {
        self.at_least = at_least;
        self
    }

    /// Check the options, naming the field: `at_most` at least 1 ms,
    /// `at_least` at most `at_most`, the renew margin shorter than
    /// `at_most`. [`Locker`]'s calls check them first; call it to check
    /// earlier (at startup, say).
    ///
    /// ```
    /// use std::time::Duration;
    /// use baton::lock::LockOptions;
    /// let bad = LockOptions::new(Duration::from_secs(10)).at_least(Duration::from_secs(30));
    /// assert_eq!(bad.validate().unwrap_err().field, "at_least");
    /// ```
    pub fn validate(&self) -> Result<(), InvalidInput> {
        if self.at_most < Duration::from_millis(1) {
            return Err(InvalidInput::new(
                "at_most",
                "must be greater than 0 (e.g. 30s, 15m, PT15M)",
            ));
        }
        if self.at_least > self.at_most {
            return Err(InvalidInput::new(
                "at_least",
                format!(
                    "{} is longer than at_most {}; at_least must be at most at_most",
                    crate::format_duration(self.at_least),
                    crate::format_duration(self.at_most)
                ),
            ));
        }
        if self.margin >= self.at_most {
            return Err(InvalidInput::new(
                "margin",
                format!(
                    "{} is not shorter than at_most {}; the margin must be shorter than the lease",
                    crate::format_duration(self.margin),
                    crate::format_duration(self.at_most)
                ),
            ));
        }
        Ok(())
    }

    /// Turn the automatic keep-alive on (default) or off. Without it the
    /// lease lapses `at_most` after the grant however long the work runs
    /// (ShedLock's plain behaviour), and [`LeaseHandle::lost`] fires then.
    pub fn keep_alive(mut self, on: bool) -> LockOptions {
        self.keep_alive = on;
        self
    }

    /// Keep the lease's local deadline ([`LeaseHandle::deadline`]) more
    /// than `margin` ahead while the store answers: the keep-alive extends
    /// every `min(at_most / 3, (at_most - margin) / 2)`. For work that needs
    /// `margin` to shut down once the store stops answering (stop it at
    /// `deadline() - margin`). Must be shorter than `at_most` (checked at use).
    ///
    /// ```
    /// use std::time::Duration;
    /// use baton::lock::LockOptions;
    ///
    /// // A command that needs up to 2 s to stop, under a 3 s lease:
    /// // extensions every 500 ms, so `deadline() - 2s` is never reached
    /// // while they succeed.
    /// let opts = LockOptions::new(Duration::from_secs(3))
    ///     .renew_margin(Duration::from_secs(2));
    /// assert_eq!(opts.renew_period(), Duration::from_millis(500));
    /// ```
    pub fn renew_margin(mut self, margin: Duration) -> LockOptions {
        self.margin = margin;
        self
    }

    /// How often the keep-alive extends the lease:
    /// `min(at_most / 3, (at_most - margin) / 2)`.
    pub fn renew_period(&self) -> Duration {
        (self.at_most / 3).min(self.at_most.saturating_sub(self.margin) / 2)
    }

    /// How often a kept-alive lease whose [`LockOptions::renew_period`] is
    /// longer than `RELEASE_BOUND / 6` (5 s) confirms that it has not been
    /// revoked (a read of its record, between extensions):
    /// `min(RELEASE_BOUND / 6, (RELEASE_BOUND - margin) / 3)`, at least
    /// 50 ms, so the local deadline stays more than `margin` ahead while
    /// the store answers. So a holder learns of a force-release within
    /// 5 s (plus a round trip) whatever `at_most`. `None` when no
    /// confirmation is needed: without keep-alive, or when the extensions
    /// themselves come every 5 s or more often (a revoked token's
    /// extension is refused).
    pub fn confirm_period(&self) -> Option<Duration> {
        if !self.keep_alive || self.renew_period() <= RELEASE_BOUND / 6 {
            return None;
        }
        let by_margin = RELEASE_BOUND.saturating_sub(self.margin) / 3;
        Some(
            (RELEASE_BOUND / 6)
                .min(by_margin)
                .max(Duration::from_millis(50)),
        )
    }

    /// The lease length.
    pub fn at_most_duration(&self) -> Duration {
        self.at_most
    }

    /// The minimum hold after the grant.
    pub fn at_least_duration(&self) -> Duration {
        self.at_least
    }
}
