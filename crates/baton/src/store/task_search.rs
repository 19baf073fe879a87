//! Task search: the checks on a [`TaskFilter`] and the one `WHERE` clause
//! every SQL backend lists tasks with, so the three dialects cannot drift.
//!
//! Each condition is added only when asked for (the planner sees plain
//! terms); a dialect says how it spells a placeholder, "contains" and
//! "ends with", and binds the [`SearchArg`]s in order. Listing walks the
//! primary key backwards (`ORDER BY id DESC LIMIT n`, from `before_id`) and
//! stops at a full page, so a search that matches often is quick at any
//! size; the terms have no index of their own (each would cost every
//! enqueue and state change), so one that matches little reads up to the
//! whole table (docs/GUIDE.md, "Finding tasks").

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
use chrono::{DateTime, Utc};

use crate::error::InvalidInput;
use crate::store::TaskFilter;

/// The longest payload text a search accepts, in bytes.
pub const MAX_SEARCH_TEXT: usize = 256;

/// A value to bind, in placeholder order.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum SearchArg {
    Text(String),
    Int(i64),
    Time(DateTime<Utc>),
}

/// How a SQL dialect spells what the search needs.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) trait SearchDialect {
    /// The `n`th placeholder (1-based).
    fn ph(n: usize) -> String;
    /// `col` contains the text in placeholder `p` (no pattern characters).
    fn contains(col: &str, p: &str) -> String;
    /// `col` ends with the text bound twice, in placeholders `p` and `q`
    /// (a positional dialect cannot name one placeholder twice).
    fn ends_with(col: &str, p: &str, q: &str) -> String;
}

/// The `WHERE …` clause (empty when nothing is asked) and its arguments.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) fn where_clause<D: SearchDialect>(f: &TaskFilter) -> (String, Vec<SearchArg>) {
    let mut conds = Vec::new();
    let mut args = Vec::new();
    let bind = |a: SearchArg, args: &mut Vec<SearchArg>| {
        args.push(a);
        D::ph(args.len())
    };
    if let Some(q) = &f.queue {
        conds.push(format!(
            "queue = {}",
            bind(SearchArg::Text(q.clone()), &mut args)
        ));
    }
    if let Some(s) = f.state {
        let p = bind(SearchArg::Text(s.as_str().into()), &mut args);
        conds.push(format!("state = {p}"));
    }
    if let Some(j) = &f.job {
        conds.push(format!(
            "job = {}",
            bind(SearchArg::Text(j.clone()), &mut args)
        ));
    }
    if let Some(k) = &f.kind {
        conds.push(format!(
            "kind = {}",
            bind(SearchArg::Text(k.clone()), &mut args)
        ));
    }
    if let Some(k) = &f.key {
        // A key as given (a global key, a slot key), the caller's key at
        // the end of a scoped composite, or a concurrency key.
        let whole = bind(SearchArg::Text(k.clone()), &mut args);
        let tail = format!("\u{1f}{k}");
        let t1 = bind(SearchArg::Text(tail.clone()), &mut args);
        let t2 = bind(SearchArg::Text(tail), &mut args);
        let conc = bind(SearchArg::Text(k.clone()), &mut args);
        conds.push(format!(
            "(unique_key = {whole} OR {} OR concurrency_key = {conc})",
            D::ends_with("unique_key", &t1, &t2)
        ));
    }
    if let Some(t) = &f.text {
        let p = bind(SearchArg::Text(t.clone()), &mut args);
        conds.push(D::contains("payload", &p));
    }
    if let Some(t) = f.created_from {
        conds.push(format!(
            "created_at >= {}",
            bind(SearchArg::Time(t), &mut args)
        ));
    }
    if let Some(t) = f.created_to {
        conds.push(format!(
            "created_at < {}",
            bind(SearchArg::Time(t), &mut args)
        ));
    }
    if let Some(b) = f.before_id {
        conds.push(format!("id < {}", bind(SearchArg::Int(b), &mut args)));
    }
    if conds.is_empty() {
        (String::new(), args)
    } else {
        (format!("WHERE {}", conds.join(" AND ")), args)
    }
}

/// The page size a filter asks for (0 means 100).
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) fn page_size(f: &TaskFilter) -> u32 {
    if f.limit == 0 {
        100
    } else {
        f.limit
    }
}

impl TaskFilter {
    /// Check the search terms: a payload text of 1 to
    /// [`MAX_SEARCH_TEXT`] bytes, a key no longer than a stored key, names
    /// without control characters, and a time range whose start is before
    /// its end. [`Queue::tasks`](crate::queue::Queue::tasks) calls it.
    ///
    /// ```
    /// use baton::store::TaskFilter;
    /// let f = TaskFilter { text: Some(String::new()), ..TaskFilter::default() };
    /// assert_eq!(f.validate().unwrap_err().field, "text");
    /// ```
    pub fn validate(&self) -> Result<(), InvalidInput> {
        let no_control = |field: &str, v: &str| {
            if v.chars().any(char::is_control) {
                Err(InvalidInput::new(field, "contains a control character"))
            } else {
                Ok(())
            }
        };
        if let Some(t) = &self.text {
            if t.is_empty() || t.len() > MAX_SEARCH_TEXT {
                return Err(InvalidInput::new(
                    "text",
                    format!("use 1 to {MAX_SEARCH_TEXT} bytes of payload text"),
                ));
            }
            no_control("text", t)?;
        }
        if let Some(k) = &self.key {
            if k.is_empty() || k.len() > crate::store::MAX_STORED_KEY_LEN {
                return Err(InvalidInput::new(
                    "key",
                    format!(
                        "use 1 to {} bytes (a unique or concurrency key)",
                        crate::store::MAX_STORED_KEY_LEN
                    ),
                ));
            }
            no_control("key", k)?;
        }
        if let Some(k) = &self.kind {
            if k.is_empty() {
                return Err(InvalidInput::new(
                    "kind",
                    "use a task kind, e.g. send_email",
                ));
            }
            no_control("kind", k)?;
        }
        if let (Some(a), Some(b)) = (self.created_from, self.created_to) {
            if a >= b {
                return Err(InvalidInput::new(
                    "created_from",
                    format!(
                        "{} is not before the range's end {}",
                        a.to_rfc3339(),
                        b.to_rfc3339()
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(all(test, any(feature = "sqlite", feature = "postgres", feature = "mysql")))]
mod tests {
    use super::*;

    struct Numbered;
    impl SearchDialect for Numbered {
        fn ph(n: usize) -> String {
            format!("${n}")
        }
        fn contains(col: &str, p: &str) -> String {
            format!("strpos({col}, {p}) > 0")
        }
        fn ends_with(col: &str, p: &str, q: &str) -> String {
            format!("right({col}, length({p})) = {q}")
        }
    }

    #[test]
    fn only_the_terms_asked_for_in_bind_order() {
        let (w, a) = where_clause::<Numbered>(&TaskFilter::default());
        assert_eq!((w.as_str(), a.len()), ("", 0));
        let f = TaskFilter {
            kind: Some("mail".into()),
            key: Some("c:1".into()),
            before_id: Some(9),
            ..TaskFilter::default()
        };
        let (w, a) = where_clause::<Numbered>(&f);
        assert_eq!(
            w,
            "WHERE kind = $1 AND (unique_key = $2 OR right(unique_key, length($3)) = $4 \
             OR concurrency_key = $5) AND id < $6"
        );
        assert_eq!(a[3], SearchArg::Text("\u{1f}c:1".into()));
        assert_eq!(a[5], SearchArg::Int(9));
    }

    #[test]
    fn bad_terms_name_their_field() {
        let long = "x".repeat(MAX_SEARCH_TEXT + 1);
        let t = chrono::Utc::now();
        for (f, field) in [
            (
                TaskFilter {
                    text: Some(long),
                    ..Default::default()
                },
                "text",
            ),
            (
                TaskFilter {
                    key: Some("a\nb".into()),
                    ..Default::default()
                },
                "key",
            ),
            (
                TaskFilter {
                    kind: Some(String::new()),
                    ..Default::default()
                },
                "kind",
            ),
            (
                TaskFilter {
                    created_from: Some(t),
                    created_to: Some(t),
                    ..Default::default()
                },
                "created_from",
            ),
        ] {
            assert_eq!(f.validate().unwrap_err().field, field);
        }
    }
}
