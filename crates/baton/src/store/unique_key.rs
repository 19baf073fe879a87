//! Unique keys and their scope: what a task's unique key is compared with
//! ([`UniqueScope`]), how long it holds ([`UniqueHold`]), a key derived
//! from the payload or a time bucket ([`UniqueOpts`]), and the one stored
//! form all of it becomes ([`UniqueKey`]).
//!
//! Every store keeps one `unique_key` per task and compares keys as whole
//! strings, so the scope is written into the stored key: a scoped key is
//! a composite of control-character-separated fields,
//!
//! ```text
//! \x1f TAG \x1f QUEUE \x1f KIND \x1f PERIOD \x1f ARGS \x1f KEY
//! ```
//!
//! (`TAG` `k` kind-in-queue, `q` queue, `n` kind, `g` global; `QUEUE` and
//! `KIND` empty where the scope leaves them out; `PERIOD`
//! `<period in ms>:<bucket number>` or empty; `ARGS` the payload's hash or
//! empty; `KEY` the caller's key, possibly empty). Names and keys contain
//! no control characters, so the fields cannot run into each other: two
//! stored keys are equal exactly when scope, queue, kind, bucket, hash and
//! key all are. A [`UniqueScope::Global`] key with neither args nor a
//! period is stored as given, as every key was before scopes existed, and
//! so are a schedule slot's keys (`JOB|RFC3339`, see [`slot_key`]).
//! This layout lives here because the queue composes keys and every
//! backend's schema upgrade rewrites old ones into it (the SQL and Lua
//! spellings of [`UniqueKey::upgraded`] must match it byte for byte).
//!
//! [`slot_key`]: crate::store::slot_key

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::InvalidInput;

/// The longest stored unique key, in bytes (every store's column holds
/// this much; MySQL's is `VARBINARY(1024)`).
pub const MAX_STORED_KEY_LEN: usize = 1024;

/// The field separator of a composite key (ASCII unit separator).
const SEP: char = '\u{1f}';

/// What a task's unique key is compared with.
///
/// | scope | a key is taken by a task of | on Redis |
/// |---|---|---|
/// | `KindInQueue` (default) | the same kind in the same queue | yes |
/// | `Queue` | any kind in the same queue | yes |
/// | `Kind` | the same kind in any queue | refused |
/// | `Global` | any kind in any queue (the behaviour before scopes) | refused |
///
/// Redis keeps unique keys per queue (one hash tag per queue, and a Redis
/// Cluster cannot check a key across hash slots atomically), so an
/// enqueue with a scope wider than a queue is refused there
/// ([`InvalidInput`], field `unique_scope`).
///
/// ```
/// use baton::queue::UniqueScope;
/// assert_eq!(UniqueScope::default(), UniqueScope::KindInQueue);
/// assert_eq!("global".parse::<UniqueScope>().unwrap(), UniqueScope::Global);
/// assert_eq!(UniqueScope::Queue.to_string(), "queue");
/// assert_eq!("store".parse::<UniqueScope>().unwrap_err().field, "unique_scope");
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UniqueScope {
    /// Tasks of the same kind in the same queue (the default).
    #[default]
    KindInQueue,
    /// Tasks of any kind in the same queue.
    Queue,
    /// Tasks of the same kind in any queue (not on Redis).
    Kind,
    /// Every task of the store (not on Redis): the key as given.
    Global,
}

impl UniqueScope {
    /// Every scope, narrowest first.
    pub const ALL: [UniqueScope; 4] = [
        UniqueScope::KindInQueue,
        UniqueScope::Queue,
        UniqueScope::Kind,
        UniqueScope::Global,
    ];

    /// The name: `kind-in-queue`, `queue`, `kind`, `global`.
    pub fn as_str(self) -> &'static str {
        match self {
            UniqueScope::KindInQueue => "kind-in-queue",
            UniqueScope::Queue => "queue",
            UniqueScope::Kind => "kind",
            UniqueScope::Global => "global",
        }
    }

    /// Whether the scope reaches beyond one queue (`Kind`, `Global`):
    /// what Redis refuses.
    pub fn spans_queues(self) -> bool {
        matches!(self, UniqueScope::Kind | UniqueScope::Global)
    }

    fn tag(self) -> &'static str {
        match self {
            UniqueScope::KindInQueue => "k",
            UniqueScope::Queue => "q",
            UniqueScope::Kind => "n",
            UniqueScope::Global => "g",
        }
    }

    fn from_tag(t: &str) -> Option<UniqueScope> {
        UniqueScope::ALL.into_iter().find(|s| s.tag() == t)
    }
}

impl fmt::Display for UniqueScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for UniqueScope {
    type Err = InvalidInput;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        UniqueScope::ALL
            .into_iter()
            .find(|x| x.as_str() == s)
            .ok_or_else(|| {
                InvalidInput::new(
                    "unique_scope",
                    format!("{s:?} is not a scope; use kind-in-queue, queue, kind or global"),
                )
            })
    }
}

/// How long a unique key stays taken: by which of the holding task's
/// states. Enqueueing a key that is taken returns the task holding it
/// (`inserted = false`); a key that is free is taken by the new task.
///
/// | hold | taken while the task is | freed when it | like |
/// |---|---|---|---|
/// | `Unfinished` (default) | pending, running | succeeded, failed, was cancelled | Oban's `states: :incomplete` |
/// | `UntilFailed` | pending, running, succeeded | failed (for good), was cancelled | River's default unique states, Oban's `:successful` (its default) |
/// | `Forever` | in any state | is pruned | Oban's `states: :all` |
///
/// `UntilFailed` is "do this work once, unless it did not happen": a
/// task that succeeded keeps its key (a second enqueue returns it), one
/// that failed for good (dead-lettered) or was cancelled frees it, so the
/// work can be enqueued again. Every hold frees its key when the task is
/// pruned (a schedule slot's key excepted: its tombstone keeps it). A
/// retried failed or cancelled task takes its key back, and the retry is
/// refused while another task holds the key.
///
/// ```
/// use baton::queue::UniqueHold;
/// assert_eq!(UniqueHold::default(), UniqueHold::Unfinished);
/// assert_eq!("until-failed".parse::<UniqueHold>().unwrap(), UniqueHold::UntilFailed);
/// assert_eq!(UniqueHold::Forever.to_string(), "forever");
/// assert_eq!("always".parse::<UniqueHold>().unwrap_err().field, "unique_hold");
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UniqueHold {
    /// While the task holding it is pending or running (the default).
    #[default]
    Unfinished,
    /// While the task is pending, running or succeeded: a task that
    /// failed for good or was cancelled frees it (River's default).
    UntilFailed,
    /// In any state, until the task is pruned
    /// ([`TaskBuilder::unique_forever`](crate::queue::TaskBuilder::unique_forever)).
    Forever,
}

impl UniqueHold {
    /// Every hold, shortest first.
    pub const ALL: [UniqueHold; 3] = [
        UniqueHold::Unfinished,
        UniqueHold::UntilFailed,
        UniqueHold::Forever,
    ];

    /// `Forever` when `on`, else `Unfinished` (what
    /// `unique_forever(bool)` and `--key-forever` mean).
    pub fn forever(on: bool) -> UniqueHold {
        if on {
            UniqueHold::Forever
        } else {
            UniqueHold::Unfinished
        }
    }

    /// The hold a store's two flags spell (`unique_forever`,
    /// `unique_until_failed`; forever wins).
    pub(crate) fn from_flags(forever: bool, until_failed: bool) -> UniqueHold {
        match (forever, until_failed) {
            (true, _) => UniqueHold::Forever,
            (false, true) => UniqueHold::UntilFailed,
            (false, false) => UniqueHold::Unfinished,
        }
    }

    /// The name: `unfinished`, `until-failed`, `forever`.
    pub fn as_str(self) -> &'static str {
        match self {
            UniqueHold::Unfinished => "unfinished",
            UniqueHold::UntilFailed => "until-failed",
            UniqueHold::Forever => "forever",
        }
    }
}

impl fmt::Display for UniqueHold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for UniqueHold {
    type Err = InvalidInput;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        UniqueHold::ALL
            .into_iter()
            .find(|x| x.as_str() == s)
            .ok_or_else(|| {
                InvalidInput::new(
                    "unique_hold",
                    format!("{s:?} is not a hold; use unfinished, until-failed or forever"),
                )
            })
    }
}

/// How a task's unique key is made and held, besides the key itself
/// ([`TaskBuilder::unique`](crate::queue::TaskBuilder::unique),
/// [`InsertOpts::unique`](crate::queue::InsertOpts::unique)). A task has a
/// unique key when it is given a key, `by_args` or a `period` (any
/// combination: each narrows the key further).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UniqueOpts {
    /// What the key is compared with (default: the same kind in the same
    /// queue).
    pub scope: UniqueScope,
    /// Make the payload part of the key: tasks whose payloads are equal as
    /// JSON (object fields in any order) share it, others do not.
    pub by_args: bool,
    /// Make the time bucket part of the key: `floor(now / period)`, with
    /// `now` read from **this host's clock** at build time (UTC, from the
    /// Unix epoch: `1d` buckets are UTC days). The same key enqueued in
    /// the next bucket is a new task. At least 1 s. A host whose clock is
    /// off moves its bucket edges by as much.
    pub period: Option<Duration>,
    /// How long the key stays taken (default: while the task is unfinished).
    pub hold: UniqueHold,
}

/// A period bucket of a decoded key: the period and the bucket's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UniquePeriod {
    /// The period.
    pub period: Duration,
    /// The start of the bucket (a multiple of the period since the epoch).
    pub start: DateTime<Utc>,
}

/// A stored unique key, decoded ([`UniqueKey::parse`]; what
/// [`TaskInfo::unique`](crate::store::TaskInfo::unique) answers). Its
/// [`Display`](fmt::Display) is the readable form the CLI and dashboard
/// print, e.g. `report-42 [kind-in-queue]`.
///
/// ```
/// use baton::queue::{TaskBuilder, UniqueKey, UniqueScope};
/// let t = TaskBuilder::new("report", serde_json::json!({"id": 42}))
///     .queue("mail")
///     .unique_key("42")
///     .build()
///     .unwrap();
/// let k = UniqueKey::parse(t.unique_key.as_deref().unwrap());
/// assert_eq!((k.scope, k.key.as_deref()), (UniqueScope::KindInQueue, Some("42")));
/// assert_eq!((k.queue.as_deref(), k.kind.as_deref()), (Some("mail"), Some("report")));
/// assert_eq!(k.to_string(), "42 [kind-in-queue]");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UniqueKey {
    /// The scope (`Global` for a key stored as given).
    pub scope: UniqueScope,
    /// The queue, when the scope has one.
    pub queue: Option<String>,
    /// The kind, when the scope has one.
    pub kind: Option<String>,
    /// The time bucket, with [`UniqueOpts::period`].
    pub period: Option<UniquePeriod>,
    /// The payload's hash (32 hex digits), with [`UniqueOpts::by_args`].
    pub args: Option<String>,
    /// The caller's key, if one was given.
    pub key: Option<String>,
    /// False for a key stored as given: a global key without args or
    /// period, a schedule slot's key, or a key from before scopes that
    /// did not fit the composite.
    pub composed: bool,
}

impl UniqueKey {
    /// Decode a stored key. A key that is not a composite (no leading
    /// separator, or not six fields) is a key stored as given: global,
    /// `composed = false`.
    pub fn parse(stored: &str) -> UniqueKey {
        let bare = || UniqueKey {
            scope: UniqueScope::Global,
            queue: None,
            kind: None,
            period: None,
            args: None,
            key: Some(stored.to_string()),
            composed: false,
        };
        let Some(rest) = stored.strip_prefix(SEP) else {
            return bare();
        };
        let f: Vec<&str> = rest.splitn(6, SEP).collect();
        let [tag, queue, kind, period, args, key] = f[..] else {
            return bare();
        };
        let Some(scope) = UniqueScope::from_tag(tag) else {
            return bare();
        };
        let period = match period {
            "" => None,
            p => match decode_period(p) {
                Some(p) => Some(p),
                None => return bare(),
            },
        };
        let some = |s: &str| (!s.is_empty()).then(|| s.to_string());
        UniqueKey {
            scope,
            queue: some(queue),
            kind: some(kind),
            period,
            args: some(args),
            key: some(key),
            composed: true,
        }
    }

    /// The stored form: the composite, or the key as given when it is not
    /// composed.
    pub fn encode(&self) -> String {
        if !self.composed {
            return self.key.clone().unwrap_or_default();
        }
        let period = self
            .period
            .map(|p| {
                let ms = p.period.as_millis().max(1) as i64;
                format!("{ms}:{}", p.start.timestamp_millis().div_euclid(ms))
            })
            .unwrap_or_default();
        let s = |o: &Option<String>| o.clone().unwrap_or_default();
        format!(
            "{SEP}{}{SEP}{}{SEP}{}{SEP}{period}{SEP}{}{SEP}{}",
            self.scope.tag(),
            s(&self.queue),
            s(&self.kind),
            s(&self.args),
            s(&self.key)
        )
    }

    /// What the schema upgrade makes of a key stored before scopes by a
    /// task of `queue` and `kind` (not a schedule job's run): the default
    /// scope's composite, or `None` when it does not fit
    /// [`MAX_STORED_KEY_LEN`] (the key then stays as it was) or the key
    /// is a composite already. The SQL and Lua steps spell the same.
    pub fn upgraded(queue: &str, kind: &str, old: &str) -> Option<String> {
        if old.starts_with(SEP) {
            return None;
        }
        let k = UniqueKey {
            scope: UniqueScope::KindInQueue,
            queue: Some(queue.into()),
            kind: Some(kind.into()),
            period: None,
            args: None,
            key: Some(old.into()),
            composed: true,
        }
        .encode();
        (k.len() <= MAX_STORED_KEY_LEN).then_some(k)
    }
}

fn decode_period(p: &str) -> Option<UniquePeriod> {
    let (ms, n) = p.split_once(':')?;
    let ms: i64 = ms.parse().ok().filter(|m| *m > 0)?;
    let n: i64 = n.parse().ok()?;
    Some(UniquePeriod {
        period: Duration::from_millis(ms.unsigned_abs()),
        start: DateTime::from_timestamp_millis(ms.checked_mul(n)?)?,
    })
}

impl fmt::Display for UniqueKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = self.key.as_deref().unwrap_or("-");
        if !self.composed {
            return f.write_str(key);
        }
        write!(f, "{key} [{}", self.scope)?;
        if let Some(a) = &self.args {
            write!(f, "; args {a}")?;
        }
        if let Some(p) = &self.period {
            write!(
                f,
                "; period {} from {}",
                crate::format_duration(p.period),
                p.start.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
            )?;
        }
        f.write_str("]")
    }
}

/// The payload as canonical JSON: object fields sorted by name at every
/// depth, no spaces, so payloads equal as JSON give the same text whatever
/// their field order (with or without serde_json's `preserve_order`).
///
/// ```
/// let a = serde_json::json!({"b": 1, "a": [true, {"y": null, "x": "z"}]});
/// assert_eq!(baton::queue::canonical_json(&a), r#"{"a":[true,{"x":"z","y":null}],"b":1}"#);
/// ```
pub fn canonical_json(v: &serde_json::Value) -> String {
    fn walk(v: &serde_json::Value, out: &mut String) {
        match v {
            serde_json::Value::Object(m) => {
                let mut fields: Vec<_> = m.iter().collect();
                fields.sort_unstable_by(|a, b| a.0.cmp(b.0));
                out.push('{');
                for (i, (k, v)) in fields.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&serde_json::Value::String(k.clone()).to_string());
                    out.push(':');
                    walk(v, out);
                }
                out.push('}');
            }
            serde_json::Value::Array(a) => {
                out.push('[');
                for (i, v) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    walk(v, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    walk(v, &mut out);
    out
}

/// The hash a by-args key holds: the first 128 bits of the SHA-256 of
/// [`canonical_json`], in hex.
pub fn args_hash(payload: &serde_json::Value) -> String {
    let digest = Sha256::digest(canonical_json(payload).as_bytes());
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// Check a caller's unique key: 1 byte or more, no control characters
/// (field `unique key`).
pub(crate) fn validate_user_key(k: &str) -> Result<(), InvalidInput> {
    if k.is_empty() || k.len() > MAX_STORED_KEY_LEN {
        return Err(InvalidInput::new(
            "unique key",
            format!("is {} bytes; use 1 to {MAX_STORED_KEY_LEN} bytes", k.len()),
        ));
    }
    if k.chars().any(char::is_control) {
        return Err(InvalidInput::new(
            "unique key",
            format!("{k:?} contains a control character; use printable text (e.g. report-42)"),
        ));
    }
    Ok(())
}

/// The period bounds: at least 1 s, at most [`crate::queue::MAX_DELAY`].
fn check_period(p: Duration) -> Result<(), InvalidInput> {
    if p < Duration::from_secs(1) || p > crate::queue::MAX_DELAY {
        return Err(InvalidInput::new(
            "unique_period",
            format!(
                "{} is out of range; use 1s to 10 years (e.g. 1h, 1d)",
                crate::format_duration(p)
            ),
        ));
    }
    Ok(())
}

/// The stored key of a task of `queue` and `kind` (both validated names)
/// with the caller's `key` and `opts`, at `now` (the period's clock);
/// `None` when the task has no unique key. Refuses a key with control
/// characters and a composite longer than [`MAX_STORED_KEY_LEN`], naming
/// the bytes left for the caller's key.
pub(crate) fn compose_unique_key(
    queue: &str,
    kind: &str,
    payload: &serde_json::Value,
    key: Option<&str>,
    opts: &UniqueOpts,
    now: DateTime<Utc>,
) -> Result<Option<String>, InvalidInput> {
    if let Some(k) = key {
        validate_user_key(k)?;
    }
    if let Some(p) = opts.period {
        check_period(p)?;
    }
    if !opts.by_args && opts.period.is_none() {
        match key {
            None => return Ok(None),
            Some(k) if opts.scope == UniqueScope::Global => return Ok(Some(k.to_string())),
            Some(_) => {}
        }
    }
    let scope = opts.scope;
    let composite = UniqueKey {
        scope,
        queue: matches!(scope, UniqueScope::KindInQueue | UniqueScope::Queue)
            .then(|| queue.to_string()),
        kind: matches!(scope, UniqueScope::KindInQueue | UniqueScope::Kind)
            .then(|| kind.to_string()),
        period: opts.period.map(|p| {
            let ms = p.as_millis() as i64;
            let start = now.timestamp_millis().div_euclid(ms) * ms;
            UniquePeriod {
                period: p,
                start: DateTime::from_timestamp_millis(start).unwrap_or(now),
            }
        }),
        args: opts.by_args.then(|| args_hash(payload)),
        key: key.map(str::to_string),
        composed: true,
    }
    .encode();
    if composite.len() > MAX_STORED_KEY_LEN {
        let own = key.map_or(0, str::len);
        let frame = composite.len() - own;
        let left = MAX_STORED_KEY_LEN.saturating_sub(frame);
        return Err(InvalidInput::new(
            "unique key",
            format!(
                "is {own} bytes, and its scope {scope} (queue, kind, period, args) takes \
                 {frame} more of the {MAX_STORED_KEY_LEN} stored; use at most {left} bytes \
                 (or shorter queue and kind names)"
            ),
        ));
    }
    Ok(Some(composite))
}

/// Check a stored key as a task carries it after the builder (or an insert
/// middleware): a composite that decodes and fits, or a key as given
/// (1 to [`MAX_STORED_KEY_LEN`] bytes, no control characters).
pub(crate) fn validate_stored_unique_key(k: &str) -> Result<(), InvalidInput> {
    let d = UniqueKey::parse(k);
    if !d.composed {
        return validate_user_key(k);
    }
    if k.len() > MAX_STORED_KEY_LEN {
        return Err(InvalidInput::new(
            "unique key",
            format!("is {} bytes stored; at most {MAX_STORED_KEY_LEN}", k.len()),
        ));
    }
    if let Some(u) = &d.key {
        validate_user_key(u)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(ms).unwrap()
    }

    #[test]
    fn composites_round_trip_and_differ_by_every_part() {
        let p = serde_json::json!({"a": 1});
        let mk = |q: &str, k: &str, key: Option<&str>, o: &UniqueOpts, now: i64| {
            compose_unique_key(q, k, &p, key, o, at(now))
                .unwrap()
                .unwrap()
        };
        let d = UniqueOpts::default();
        let base = mk("q", "k", Some("42"), &d, 0);
        assert_ne!(base, mk("q", "other", Some("42"), &d, 0), "kind");
        assert_ne!(base, mk("q2", "k", Some("42"), &d, 0), "queue");
        let queue = UniqueOpts {
            scope: UniqueScope::Queue,
            ..d.clone()
        };
        assert_eq!(
            mk("q", "a", Some("42"), &queue, 0),
            mk("q", "b", Some("42"), &queue, 0)
        );
        let kind = UniqueOpts {
            scope: UniqueScope::Kind,
            ..d.clone()
        };
        assert_eq!(
            mk("q1", "a", Some("42"), &kind, 0),
            mk("q2", "a", Some("42"), &kind, 0)
        );
        let global = UniqueOpts {
            scope: UniqueScope::Global,
            ..d.clone()
        };
        assert_eq!(mk("q1", "a", Some("42"), &global, 0), "42");
        let hourly = UniqueOpts {
            period: Some(Duration::from_secs(3600)),
            ..d.clone()
        };
        assert_eq!(
            mk("q", "k", Some("42"), &hourly, 3_600_000),
            mk("q", "k", Some("42"), &hourly, 7_199_999)
        );
        assert_ne!(
            mk("q", "k", Some("42"), &hourly, 3_599_999),
            mk("q", "k", Some("42"), &hourly, 3_600_000)
        );
        for (o, key) in [(&d, Some("42")), (&hourly, None), (&queue, Some("x"))] {
            let s = mk("q", "k", key, o, 5_000_000);
            let u = UniqueKey::parse(&s);
            assert!(u.composed);
            assert_eq!(u.encode(), s);
            assert_eq!(u.key.as_deref(), key);
        }
        let u = UniqueKey::parse(&mk("q", "k", Some("42"), &hourly, 5_000_000));
        assert_eq!(u.period.unwrap().start, at(3_600_000));
        assert_eq!(
            u.to_string(),
            "42 [kind-in-queue; period 1h from 1970-01-01T01:00:00Z]"
        );
    }

    #[test]
    fn args_hash_ignores_field_order_only() {
        let a = serde_json::json!({"x": 1, "y": {"b": [1, 2], "a": "s"}});
        let b: serde_json::Value =
            serde_json::from_str(r#"{"y": {"a": "s", "b": [1, 2]}, "x": 1}"#).unwrap();
        assert_eq!(args_hash(&a), args_hash(&b));
        assert_ne!(
            args_hash(&a),
            args_hash(&serde_json::json!({"x": 1, "y": {"b": [2, 1], "a": "s"}}))
        );
        assert_eq!(args_hash(&a).len(), 32);
    }

    #[test]
    fn bad_keys_are_refused_naming_the_field_and_the_budget() {
        let p = serde_json::json!({});
        let d = UniqueOpts::default();
        let e = compose_unique_key("q", "k", &p, Some("a\u{1f}b"), &d, Utc::now()).unwrap_err();
        assert_eq!(e.field, "unique key");
        let e =
            compose_unique_key("q", "k", &p, Some(&"x".repeat(1020)), &d, Utc::now()).unwrap_err();
        assert_eq!(e.field, "unique key");
        assert!(e.problem.contains("use at most 1015 bytes"), "{e}");
        assert!(compose_unique_key("q", "k", &p, Some(&"x".repeat(1015)), &d, Utc::now()).is_ok());
        let e = compose_unique_key(
            "q",
            "k",
            &p,
            None,
            &UniqueOpts {
                period: Some(Duration::from_millis(10)),
                ..d
            },
            Utc::now(),
        )
        .unwrap_err();
        assert_eq!(e.field, "unique_period");
    }

    #[test]
    fn upgrade_spelling_matches_the_default_composite() {
        let now = Utc::now();
        let want = compose_unique_key(
            "q",
            "k",
            &serde_json::json!({}),
            Some("42"),
            &UniqueOpts::default(),
            now,
        )
        .unwrap();
        assert_eq!(UniqueKey::upgraded("q", "k", "42"), want);
        assert_eq!(
            UniqueKey::upgraded("q", "k", want.as_deref().unwrap()),
            None
        );
        assert_eq!(UniqueKey::upgraded("q", "k", &"x".repeat(1020)), None);
        assert_eq!(
            UniqueKey::parse("job|2026-01-01T00:00:00Z").to_string(),
            "job|2026-01-01T00:00:00Z"
        );
    }
}
