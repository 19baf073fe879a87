//! PostgreSQL's binary array format, read in place: the columns of a
//! packed claim ([`PACKED_CLAIM`](super::sql::PACKED_CLAIM), read by
//! `rows::packed_tasks`), one pass over each array's bytes. sqlx's generic
//! `Vec<T>` decode resolves the element's type and builds a value
//! reference for every element; for a claim's 13 arrays that was about a
//! quarter of a busy worker's instructions per task (docs/BENCHMARKS.md,
//! session 37).
//!
//! The format (PostgreSQL's `array_send`): the number of dimensions, a
//! flags word, the element type's OID, then per dimension its length and
//! lower bound, then each element as a 4-byte length (-1: NULL) and its
//! bytes. Every read is checked: a short or malformed array is
//! [`StoreError::Corrupt`], never a panic.

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgRow, PgValueFormat};
use sqlx::{Row, ValueRef};

use crate::error::StoreError;

/// `int4`'s OID.
pub(super) const INT4: u32 = 23;
/// `int8`'s OID.
pub(super) const INT8: u32 = 20;
/// `text`'s OID.
pub(super) const TEXT: u32 = 25;
/// `timestamptz`'s OID.
pub(super) const TIMESTAMPTZ: u32 = 1184;

/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01 UTC).
const PG_EPOCH_US: i64 = 946_684_800_000_000;

/// The elements of the one-dimensional array in column `col` of `row`,
/// whose elements are of type `oid`: each `None` for a NULL element. A
/// NULL column (an `array_agg` of no rows) is no elements.
pub(super) fn elements<'r>(
    row: &'r PgRow,
    col: &str,
    oid: u32,
) -> Result<Vec<Option<&'r [u8]>>, StoreError> {
    let value = row.try_get_raw(col)?;
    if value.is_null() {
        return Ok(Vec::new());
    }
    let bad = |what: &str| StoreError::Corrupt(format!("claimed tasks: column {col}: {what}"));
    if !matches!(value.format(), PgValueFormat::Binary) {
        return Err(bad("not in the binary format"));
    }
    let mut buf = Reader(
        value
            .as_bytes()
            .map_err(|e| bad(&format!("unreadable ({e})")))?,
    );
    let short = || bad("the array ends early");
    let ndim = buf.i32().ok_or_else(short)?;
    if ndim == 0 {
        return Ok(Vec::new());
    }
    if ndim != 1 {
        return Err(bad(&format!("an array of {ndim} dimensions, not 1")));
    }
    let _flags = buf.i32().ok_or_else(short)?;
    let elem = buf.i32().ok_or_else(short)? as u32;
    if elem != oid {
        return Err(bad(&format!(
            "elements of type OID {elem}, not the expected {oid}"
        )));
    }
    let len = buf.i32().ok_or_else(short)?;
    let _lower = buf.i32().ok_or_else(short)?;
    let len = usize::try_from(len).map_err(|_| bad(&format!("a length of {len}")))?;
    let mut out = Vec::with_capacity(len);
    for _ in 0..len {
        let n = buf.i32().ok_or_else(short)?;
        if n == -1 {
            out.push(None);
        } else {
            let n = usize::try_from(n).map_err(|_| bad(&format!("an element of length {n}")))?;
            out.push(Some(buf.take(n).ok_or_else(short)?));
        }
    }
    Ok(out)
}

/// A cursor over an array's bytes.
struct Reader<'r>(&'r [u8]);

impl<'r> Reader<'r> {
    fn take(&mut self, n: usize) -> Option<&'r [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn i32(&mut self) -> Option<i32> {
        Some(i32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
}

/// An `int8` element.
pub(super) fn int8(b: &[u8]) -> Option<i64> {
    Some(i64::from_be_bytes(b.try_into().ok()?))
}

/// An `int4` element.
pub(super) fn int4(b: &[u8]) -> Option<i32> {
    Some(i32::from_be_bytes(b.try_into().ok()?))
}

/// A `text` element.
pub(super) fn text(b: &[u8]) -> Option<&str> {
    std::str::from_utf8(b).ok()
}

/// A `timestamptz` element: µs since 2000-01-01 UTC (infinities and
/// instants chrono cannot hold are refused).
pub(super) fn timestamptz(b: &[u8]) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp_micros(int8(b)?.checked_add(PG_EPOCH_US)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_decode_as_postgres_sends_them() {
        assert_eq!(int8(&(-5i64).to_be_bytes()), Some(-5));
        assert_eq!(int4(&7i32.to_be_bytes()), Some(7));
        assert_eq!(int4(&[0, 0, 7]), None, "a short element is refused");
        assert_eq!(text(b"send"), Some("send"));
        assert_eq!(text(&[0xff]), None);
        // 2000-01-01T00:00:01.5Z
        let t = timestamptz(&1_500_000i64.to_be_bytes()).map(|t| t.to_rfc3339());
        assert_eq!(t.as_deref(), Some("2000-01-01T00:00:01.500+00:00"));
        assert_eq!(timestamptz(&i64::MAX.to_be_bytes()), None, "infinity");
    }

    #[test]
    fn a_short_array_is_refused_not_read_past() {
        let mut r = Reader(&[0, 0, 0, 1, 0, 0]);
        assert_eq!(r.i32(), Some(1));
        assert_eq!(r.i32(), None);
        assert_eq!(r.take(2), Some(&[0u8, 0][..]));
        assert_eq!(r.take(1), None);
    }
}
