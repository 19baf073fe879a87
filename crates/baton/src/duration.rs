//! Human durations: `500ms`, `30s`, `15m`, `1h30m`, `2d`, and ISO-8601 `PT15M`,
//! `PT30S`, `P1DT2H` (the form ShedLock's `lockAtMostFor` uses).

use std::time::Duration;

use crate::error::InvalidInput;

const ACCEPTED: &str =
    "use a number with a unit (500ms, 30s, 15m, 1h30m, 2d) or ISO-8601 (PT15M, PT30S, P1DT2H)";

/// Parse a duration. `field` names the argument in the error.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(baton::parse_duration("at_most", "PT15M").unwrap(), Duration::from_secs(900));
/// assert_eq!(baton::parse_duration("at_most", "1h30m").unwrap(), Duration::from_secs(5400));
/// assert_eq!(baton::parse_duration("wait", "500ms").unwrap(), Duration::from_millis(500));
/// assert!(baton::parse_duration("at_most", "15 minutes").is_err());
/// assert!(baton::parse_duration("at_most", "1h1h").is_err()); // each unit once, largest first
/// ```
pub fn parse_duration(field: &str, s: &str) -> Result<Duration, InvalidInput> {
    let t = s.trim();
    let bad = || InvalidInput::new(field, format!("{s:?} is not a duration; {ACCEPTED}"));
    if t.is_empty() {
        return Err(bad());
    }
    let upper = t.to_ascii_uppercase();
    let total_ms: u128 = if let Some(rest) = upper.strip_prefix('P') {
        parse_iso(rest).ok_or_else(bad)?
    } else {
        parse_human(t).ok_or_else(bad)?
    };
    let ms = u64::try_from(total_ms).map_err(|_| bad())?;
    Ok(Duration::from_millis(ms))
}

/// Parse a duration that must be greater than zero.
pub fn parse_positive_duration(field: &str, s: &str) -> Result<Duration, InvalidInput> {
    let d = parse_duration(field, s)?;
    if d.is_zero() {
        return Err(InvalidInput::new(
            field,
            format!("{s:?} is zero; it must be greater than 0"),
        ));
    }
    Ok(d)
}

fn parse_human(t: &str) -> Option<u128> {
    let mut total: u128 = 0;
    let mut rest = t;
    // Units come largest first, each at most once (`1h30m`, not `30m1h` or
    // `1h1h`), as in ISO-8601's form.
    let mut previous = f64::INFINITY;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        if digits == 0 {
            return None;
        }
        let num: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let mult: f64 = match unit {
            "ms" => 1.0,
            "s" | "sec" => 1_000.0,
            "m" | "min" => 60_000.0,
            "h" => 3_600_000.0,
            "d" => 86_400_000.0,
            _ => return None,
        };
        if mult >= previous {
            return None;
        }
        previous = mult;
        let v = num * mult;
        if !v.is_finite() || !(0.0..=1e15).contains(&v) {
            return None;
        }
        total += v.round() as u128;
    }
    Some(total)
}

fn parse_iso(rest: &str) -> Option<u128> {
    // rest is after 'P': [nD][T[nH][nM][n.nS]]
    let (date, time) = match rest.split_once('T') {
        Some((d, t)) => {
            if t.is_empty() {
                return None;
            }
            (d, Some(t))
        }
        None => (rest, None),
    };
    let mut total: u128 = 0;
    let mut any = false;
    for (part, units) in [
        (date, &[('W', 604_800_000.0), ('D', 86_400_000.0)][..]),
        (
            time.unwrap_or(""),
            &[('H', 3_600_000.0), ('M', 60_000.0), ('S', 1_000.0)][..],
        ),
    ] {
        let mut s = part;
        let mut unit_idx = 0;
        while !s.is_empty() {
            let end = s.find(|c: char| c.is_ascii_alphabetic())?;
            let num: f64 = s[..end].parse().ok()?;
            let u = s[end..].chars().next()?;
            let pos = units[unit_idx..].iter().position(|(c, _)| *c == u)? + unit_idx;
            unit_idx = pos + 1;
            let v = num * units[pos].1;
            if !v.is_finite() || !(0.0..=1e15).contains(&v) {
                return None;
            }
            total += v.round() as u128;
            any = true;
            s = &s[end + 1..];
        }
    }
    any.then_some(total)
}

/// Format a duration the way [`parse_duration`] reads it back (`1h30m`, `500ms`).
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    if ms % 1000 != 0 {
        return format!("{ms}ms");
    }
    let mut s = ms / 1000;
    let mut out = String::new();
    for (unit, len) in [("d", 86_400u128), ("h", 3_600), ("m", 60), ("s", 1)] {
        if s >= len {
            out.push_str(&format!("{}{unit}", s / len));
            s %= len;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_forms() {
        let ok = |s: &str| parse_duration("d", s).unwrap();
        assert_eq!(ok("500ms"), Duration::from_millis(500));
        assert_eq!(ok("30s"), Duration::from_secs(30));
        assert_eq!(ok("15m"), Duration::from_secs(900));
        assert_eq!(ok("1h30m"), Duration::from_secs(5400));
        assert_eq!(ok("2d"), Duration::from_secs(172_800));
        assert_eq!(ok("1.5s"), Duration::from_millis(1500));
        assert_eq!(ok("PT15M"), Duration::from_secs(900));
        assert_eq!(ok("PT30S"), Duration::from_secs(30));
        assert_eq!(ok("pt0.5s"), Duration::from_millis(500));
        assert_eq!(ok("P1DT2H"), Duration::from_secs(93_600));
        assert_eq!(ok("PT1H30M"), Duration::from_secs(5400));
    }

    #[test]
    fn rejects_with_the_field_name() {
        for bad in [
            "",
            "15",
            "m",
            "15 minutes",
            "PT",
            "P",
            "PT15",
            "-5s",
            "1x",
            "PTM15",
            "PT1M1H",
            "1h1h",
            "30m1h",
            "1s1sec",
        ] {
            let e = parse_duration("at_most", bad).unwrap_err();
            assert_eq!(e.field, "at_most", "{bad}");
            assert!(e.problem.contains("PT15M"), "{bad}: {}", e.problem);
        }
        assert!(parse_positive_duration("lease", "0s")
            .unwrap_err()
            .problem
            .contains("zero"));
    }

    #[test]
    fn formats_round_trip() {
        for d in [
            Duration::from_millis(500),
            Duration::from_secs(5400),
            Duration::from_secs(90_061),
        ] {
            assert_eq!(parse_duration("d", &format_duration(d)).unwrap(), d);
        }
    }
}
