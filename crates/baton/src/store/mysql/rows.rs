//! How the MySQL/MariaDB backend stores each kind of column (`DATETIME(6)`
//! in UTC, text that may come back as binary, `TINYINT(1)` flags, JSON as
//! text): [`SqlRow`] for its rows. Turning rows into values is shared with
//! SQLite and PostgreSQL in [`crate::store::sql_row`].

use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlRow;
use sqlx::Row;

use crate::error::StoreError;
use crate::store::sql_row::{corrupt, decoded_columns, json_of, to_u32, SqlRow};
use crate::store::AttemptError;

/// Bytes of a text column as UTF-8 (`CHARACTER SET binary` columns and
/// some expressions come back as bytes).
fn utf8(b: Vec<u8>, col: &str) -> Result<String, StoreError> {
    String::from_utf8(b).map_err(|e| corrupt(col, e))
}

impl SqlRow for MySqlRow {
    fn text(&self, col: &str) -> Result<String, StoreError> {
        utf8(self.try_get_unchecked(col)?, col)
    }

    fn opt_text(&self, col: &str) -> Result<Option<String>, StoreError> {
        self.try_get_unchecked::<Option<Vec<u8>>, _>(col)?
            .map(|b| utf8(b, col))
            .transpose()
    }

    decoded_columns! {
        int: i64 as i32,
        big: i64,
        opt_big: Option<i64>,
        flag: bool,
    }

    fn time(&self, col: &str) -> Result<DateTime<Utc>, StoreError> {
        self.opt_time(col)?.ok_or_else(|| corrupt(col, "NULL"))
    }

    fn opt_time(&self, col: &str) -> Result<Option<DateTime<Utc>>, StoreError> {
        // A multi-statement batch (`batch_on`) answers as text: the usual
        // shape read directly; anything else (the binary protocol's bytes
        // are not that shape) as sqlx reads it.
        let Some(text) = self.try_get_unchecked::<Option<&str>, _>(col).ok() else {
            return Ok(self.try_get(col)?);
        };
        match text.map(datetime_text) {
            None => Ok(None),
            Some(Some(t)) => Ok(Some(t)),
            Some(None) => Ok(self.try_get(col)?),
        }
    }

    fn json(&self, col: &str) -> Result<serde_json::Value, StoreError> {
        json_of(&self.text(col)?, col)
    }

    fn opt_json(&self, col: &str) -> Result<Option<serde_json::Value>, StoreError> {
        self.opt_text(col)?.map(|t| json_of(&t, col)).transpose()
    }

    fn errors(&self, col: &str) -> Result<Vec<AttemptError>, StoreError> {
        // Appended by `APPEND_ERROR` with `at` as RFC 3339 UTC.
        serde_json::from_str(&self.text(col)?)
            .map_err(|e| StoreError::Corrupt(format!("task errors: {e}")))
    }
}

/// A `DATETIME(6)` (UTC) as MySQL's text protocol sends it,
/// `YYYY-MM-DD HH:MM:SS` with up to six fractional digits; `None` for any
/// other shape. sqlx reads the same text through chrono's format parser,
/// which cost ~4,000 instructions a value: a claim's two or three times a
/// task were a sixth of a MySQL worker's instructions per task
/// (docs/BENCHMARKS.md, session 37).
fn datetime_text(s: &str) -> Option<DateTime<Utc>> {
    let b = s.as_bytes();
    if b.len() < 19
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b' '
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        b[r].iter().try_fold(0u32, |n, &c| {
            c.is_ascii_digit().then(|| n * 10 + u32::from(c - b'0'))
        })
    };
    let micros = match &b[19..] {
        [] => 0,
        [b'.', frac @ ..] if (1..=6).contains(&frac.len()) => {
            let n = num(20..b.len())?;
            n * 10u32.pow(6 - frac.len() as u32)
        }
        _ => return None,
    };
    let date =
        chrono::NaiveDate::from_ymd_opt(i32::try_from(num(0..4)?).ok()?, num(5..7)?, num(8..10)?)?;
    let time =
        chrono::NaiveTime::from_hms_micro_opt(num(11..13)?, num(14..16)?, num(17..19)?, micros)?;
    Some(date.and_time(time).and_utc())
}

/// An attempt count (`attempt`, `max_attempts`).
pub(super) fn attempt_of(row: &MySqlRow, col: &str) -> Result<u32, StoreError> {
    to_u32(row.int(col)?, col)
}

#[cfg(test)]
mod tests {
    use super::datetime_text;

    #[test]
    fn datetime_text_reads_what_mysql_sends_and_nothing_else() {
        let read = |s| datetime_text(s).map(|t| t.to_rfc3339());
        assert_eq!(
            read("2026-12-07 09:21:26.123456").as_deref(),
            Some("2026-12-07T09:21:26.123456+00:00")
        );
        assert_eq!(
            read("2026-12-07 09:21:26.5").as_deref(),
            Some("2026-12-07T09:21:26.500+00:00")
        );
        assert_eq!(
            read("2026-12-07 09:21:26").as_deref(),
            Some("2026-12-07T09:21:26+00:00")
        );
        for bad in [
            "2026-12-07",
            "2026-13-07 09:21:26",
            "2026-12-07 24:00:00",
            "2026-12-07T09:21:26",
            "2026-12-07 09:21:26.",
            "2026-12-07 09:21:26.1234567",
            "2026-12-07 09:21:2x",
        ] {
            assert_eq!(read(bad), None, "{bad}");
        }
        // The same instants chrono's own parse reads (sqlx's fallback).
        let s = "1999-02-28 23:59:59.000001";
        let chrono =
            chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f").map(|t| t.and_utc());
        assert_eq!(datetime_text(s), chrono.ok());
    }
}
