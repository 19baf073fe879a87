//! Parsers for the values that flags, the config file and the admin API
//! take: durations, times, pool sizes, listen addresses. Each answers a
//! clear message naming the accepted form.

use std::time::Duration;

/// The longest duration any flag accepts.
pub const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Parse a duration flag (`500ms`, `30s`, `15m`, `1h30m`, `PT15M`).
/// At most [`MAX_DURATION`] (10 years).
pub fn duration_arg(s: &str) -> Result<Duration, String> {
    let d = baton::parse_duration("duration", s).map_err(|e| e.problem)?;
    if d > MAX_DURATION {
        return Err(format!(
            "{} is too long; use at most 10 years (3650d)",
            baton::format_duration(d)
        ));
    }
    Ok(d)
}

/// Parse `--pool-size`: 1 to [`baton::store::MAX_POOL_SIZE`] connections.
pub fn pool_size_arg(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n) if (1..=baton::store::MAX_POOL_SIZE).contains(&n) => Ok(n),
        _ => Err(format!(
            "{s:?} is not a pool size; use a number of connections from 1 to {}, e.g. 4",
            baton::store::MAX_POOL_SIZE
        )),
    }
}

/// Parse `--listen`: `HOST:PORT` (`127.0.0.1:9090`, `[::1]:9090`,
/// `localhost:9090`); port 0 picks a free one.
pub fn listen_arg(s: &str) -> Result<String, String> {
    let bad = || format!("{s:?} is not an address; use HOST:PORT, e.g. 127.0.0.1:9090");
    let (host, port) = s.rsplit_once(':').ok_or_else(bad)?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() || host.contains(['/', ' ']) || port.parse::<u16>().is_err() {
        return Err(bad());
    }
    if host.contains(':') && !s.starts_with('[') {
        return Err(format!(
            "{s:?}: write an IPv6 address in brackets, e.g. [::1]:9090"
        ));
    }
    Ok(s.to_string())
}

/// Parse an RFC 3339 time flag (`2026-01-31T06:00:00Z`).
pub fn rfc3339_arg(s: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&chrono::Utc))
        .map_err(|e| format!("{s:?} is not an RFC 3339 time like 2026-01-31T06:00:00Z ({e})"))
}

/// Parse a point in time for a search: an RFC 3339 instant
/// (`2026-01-31T06:00:00Z`) or a duration meaning that long ago (`90m`,
/// `7d`, by this machine's clock).
pub fn since_arg(s: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&chrono::Utc));
    }
    let ago = duration_arg(s).map_err(|_| {
        format!("{s:?}: use an RFC 3339 time like 2026-01-31T06:00:00Z or a duration ago like 90m or 7d")
    })?;
    chrono::Duration::from_std(ago)
        .ok()
        .and_then(|d| chrono::Utc::now().checked_sub_signed(d))
        .ok_or_else(|| format!("{s:?} reaches before the first representable time"))
}
