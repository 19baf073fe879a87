//! Rate limits: at most `max` task starts per `per`, in every window of
//! the store's clock, across every claimer ([`RateLimit`],
//! [`WorkerConfig::rate_limit`](super::WorkerConfig::rate_limit),
//! [`WorkerConfig::shared_rate_limit`](super::WorkerConfig::shared_rate_limit)).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::duration::{format_duration, parse_duration};
use crate::error::InvalidInput;

/// The largest `max` a rate limit takes: the store keeps one instant per
/// start allowed in a window.
pub const MAX_RATE: u32 = 100_000;

const ACCEPTED: &str = "use STARTS/PERIOD, e.g. 100/1m, 10/1s or 5/500ms \
                        (1..=100000 starts per a period of at least 1ms)";

/// At most `max` task starts in any window of length `per` of the store's
/// clock (an exact sliding window: no burst beyond `max` at a window's
/// edge). Parsed from `STARTS/PERIOD`, e.g. `"100/1m"`.
///
/// ```
/// use std::time::Duration;
/// use baton::queue::RateLimit;
/// let r: RateLimit = "100/1m".parse().unwrap();
/// assert_eq!((r.max(), r.per()), (100, Duration::from_secs(60)));
/// assert_eq!(r.to_string(), "100/1m");
/// assert_eq!("0/1m".parse::<RateLimit>().unwrap_err().field, "rate");
/// assert!(RateLimit::parse("rate", "10/0s").is_err());
/// assert!(RateLimit::parse("rate", "10 per minute").is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RateLimit {
    max: u32,
    per: Duration,
}

impl RateLimit {
    /// `max` starts per `per`: `max` in `1..=`[`MAX_RATE`], `per` at least
    /// a millisecond (whole milliseconds count). Errors name the field
    /// `rate`.
    pub fn new(max: u32, per: Duration) -> Result<RateLimit, InvalidInput> {
        RateLimit::checked("rate", max, per, &format!("{max}/{}", format_duration(per)))
    }

    /// Parse `STARTS/PERIOD` (`100/1m`, `10/1s`, `5/500ms`; the period in
    /// any form [`parse_duration`] takes); `field` names the input in the
    /// error.
    pub fn parse(field: &str, text: &str) -> Result<RateLimit, InvalidInput> {
        let bad = || InvalidInput::new(field, format!("{text:?} is not a rate; {ACCEPTED}"));
        let (max, per) = text.trim().split_once('/').ok_or_else(bad)?;
        let max: u32 = max.trim().parse().map_err(|_| bad())?;
        let per = parse_duration(field, per).map_err(|_| bad())?;
        RateLimit::checked(field, max, per, text)
    }

    /// Parse a queue's limit as the CLI and config files write it:
    /// `STARTS/PERIOD` (the queue's own limit) or `NAME=STARTS/PERIOD` (the
    /// named limit `NAME`, shared by every queue that names it). The name
    /// is checked as other names are (1 to 255 bytes).
    ///
    /// ```
    /// use baton::queue::RateLimit;
    /// let (name, r) = RateLimit::parse_named("rate", "partner-api=10/1s")?;
    /// assert_eq!((name.as_deref(), r.max()), (Some("partner-api"), 10));
    /// assert_eq!(RateLimit::parse_named("rate", "100/1m")?.0, None);
    /// assert!(RateLimit::parse_named("rate", "=10/1s").is_err());
    /// # Ok::<(), baton::InvalidInput>(())
    /// ```
    pub fn parse_named(
        field: &str,
        text: &str,
    ) -> Result<(Option<String>, RateLimit), InvalidInput> {
        match text.split_once('=') {
            None => Ok((None, RateLimit::parse(field, text)?)),
            Some((name, rate)) => {
                let name = name.trim();
                crate::names::validate_name(field, name).map_err(|e| {
                    InvalidInput::new(
                        field,
                        format!(
                            "the limit's name {}; use NAME=STARTS/PERIOD, e.g. partner-api=10/1s",
                            e.problem
                        ),
                    )
                })?;
                Ok((Some(name.to_string()), RateLimit::parse(field, rate)?))
            }
        }
    }

    fn checked(
        field: &str,
        max: u32,
        per: Duration,
        text: &str,
    ) -> Result<RateLimit, InvalidInput> {
        if max == 0 || max > MAX_RATE {
            return Err(InvalidInput::new(
                field,
                format!("{text:?}: {max} starts is out of range; {ACCEPTED}"),
            ));
        }
        if per < Duration::from_millis(1) {
            return Err(InvalidInput::new(
                field,
                format!("{text:?}: the period must be at least 1ms; {ACCEPTED}"),
            ));
        }
        // Whole milliseconds: the stores count in them.
        let per = Duration::from_millis(u64::try_from(per.as_millis()).unwrap_or(u64::MAX));
        Ok(RateLimit { max, per })
    }

    /// Starts allowed per window.
    pub fn max(&self) -> u32 {
        self.max
    }

    /// The window's length.
    pub fn per(&self) -> Duration {
        self.per
    }
}

impl fmt::Display for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.max, format_duration(self.per))
    }
}

impl FromStr for RateLimit {
    type Err = InvalidInput;
    /// [`RateLimit::parse`] with the field `rate`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RateLimit::parse("rate", s)
    }
}

/// A queue's rate limit in a [`WorkerConfig`](super::WorkerConfig): its
/// own, or a named one shared with other queues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QueueRate {
    /// The shared limit's name; `None`: the queue's own.
    pub(crate) name: Option<String>,
    pub(crate) limit: RateLimit,
}
