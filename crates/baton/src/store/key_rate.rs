//! A rate per concurrency key on the SQL stores
//! ([`TaskClaimKeyRated`]), decided once here and carried out by each
//! backend inside one transaction that holds the queue's claim turn
//! (SQLite `BEGIN IMMEDIATE`, PostgreSQL the queue's advisory lock, MySQL
//! the queue's row in `<p>queues`). PostgreSQL runs the same rules in
//! PL/pgSQL, one function call a claim (`postgres/key_rate_fn.rs`: keep
//! the two in step):
//!
//! 1. read the store's now (µs) and, with a cap, the queue's running tasks
//!    per key;
//! 2. read a walk of due candidates in claim order, leaving out keys whose
//!    log says they are used up (`free_at > now`, a probe of
//!    `<p>key_rates` per candidate key) and keys at their cap;
//! 3. read the start logs of the candidates' keys only ([`StartLog`], one
//!    row of `<p>key_rates` per (queue, key));
//! 4. [`pick`] the tasks in claim order while each key has room under its
//!    rate and cap, and the claim under its size and `max_running`;
//! 5. claim them, then write each claimed key's log ([`logs_after`]): the
//!    latest `max` starts less those `per` before the store's clock read
//!    in the turn, `free_at` (the `max`-th latest + `per`: no start of the
//!    key before it) and `idle_at` (the latest + `per` + [`PRUNE_GRACE`]);
//! 6. prune up to [`PRUNE_BATCH`] of the queue's rows idle since before
//!    now, and, when the claim came back short, read the earliest
//!    `free_at` of a used-up key with pending tasks (`RatedClaim::key_next`).
//!
//! Exact for the reason the queue's limit is (`store::rate`): claims of the
//! queue take turns, each counts its key's logged starts later than its
//! `now - per` with no upper bound, and keeps the latest `max` of those a
//! later claim could count (DESIGN T6, "a key's log holds a period"). A pruned
//! row held no start later than `now - per - PRUNE_GRACE`; the grace covers
//! PostgreSQL's `now()` (the transaction's start) lagging behind the claim
//! that pruned, so a pruned start could not have counted for any claim.

use std::collections::HashMap;
use std::time::Duration;

use crate::error::StoreError;
use crate::store::rate::{self, StartLog};
use crate::store::{KeyRate, RatedClaim, Task, TaskClaim};

/// How long past its window a key's log is kept before a claim may prune
/// it (longer than any claim transaction waits for its turn).
pub(crate) const PRUNE_GRACE: Duration = Duration::from_secs(60);

/// Rows a claim prunes at most (the others wait for the next claims).
pub(crate) const PRUNE_BATCH: i64 = 100;

pub(crate) use crate::store::BUFFER_HOLD;

/// Whether the `i`-th id [`pick`] returned (in claim order) goes to the
/// worker's prefetch buffer: the first `limit - buffered` start at once.
pub(crate) fn is_buffered(req: &TaskClaim<'_>, i: usize) -> bool {
    i >= (req.limit - req.buffered.min(req.limit)) as usize
}

/// The start to log for the `i`-th id [`pick`] returned, claimed at
/// `now_us`: the claim's now, or for a buffered task now plus
/// [`BUFFER_HOLD`].
pub(crate) fn logged_start(req: &TaskClaim<'_>, i: usize, now_us: i64) -> i64 {
    if is_buffered(req, i) {
        now_us.saturating_add(us(BUFFER_HOLD))
    } else {
        now_us
    }
}

/// A due task the walk read: id, concurrency key, and whether it has an
/// attempt to spare after this one (`TaskClaim::buffered`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// Task id.
    pub(crate) id: i64,
    /// Its concurrency key.
    pub(crate) key: Option<String>,
    /// `attempt + 1 < max_attempts`.
    pub(crate) spare: bool,
}

/// A key's log after a claim, to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LogWrite {
    /// The concurrency key.
    pub(crate) key: String,
    /// [`StartLog::encode`] of the latest starts.
    pub(crate) starts: String,
    /// No start of the key before this instant (µs).
    pub(crate) free_at: i64,
    /// The row may be pruned once the store's clock passes this (µs).
    pub(crate) idle_at: i64,
}

/// `d` in µs (saturating).
pub(crate) fn us(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// How many candidates the walk reads: as far as the per-key cap's walk
/// ([`TaskClaim::key_limited_walk`]), so keys with one place left do not
/// fill it on their own.
pub(crate) fn walk_len(req: &TaskClaim<'_>) -> i64 {
    i64::from(req.key_limited_walk())
}

/// The queue's running tasks per key and in all (the fair claim's
/// [`Running`]: a key's group is named by the key), when the claim has a
/// cap to honour.
pub(crate) use crate::store::fair::Running;

/// The keys at the claim's per-key cap (to leave out of the walk; SQLite's
/// walk leaves them out in SQL).
#[cfg(feature = "mysql")]
pub(crate) fn full_keys(running: &Running, req: &TaskClaim<'_>) -> Vec<String> {
    let Some(cap) = req.per_key_max_running else {
        return Vec::new();
    };
    running
        .by_group
        .iter()
        .filter(|(g, &n)| g.as_str() != crate::store::fair::NO_KEY && n >= cap)
        .map(|(k, _)| k.clone())
        .collect()
}

/// The distinct keys of `cands` (whose logs to read; MySQL's claim reads
/// them in a statement of their own).
#[cfg(feature = "mysql")]
pub(crate) fn keys_of(cands: &[Candidate]) -> Vec<String> {
    let mut keys: Vec<String> = cands.iter().filter_map(|c| c.key.clone()).collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// The ids to claim among `cands` (in claim order): each key while its
/// log has room at `now_us` and (with a cap) its running tasks leave
/// room, at most the claim's size (cut to what `max_running` leaves); the
/// first `limit - buffered` taken start at once, the later ones only with
/// an attempt to spare.
pub(crate) fn pick(
    req: &TaskClaim<'_>,
    rate: KeyRate,
    cands: &[Candidate],
    logs: &HashMap<String, StartLog>,
    running: &Running,
    now_us: i64,
) -> Vec<i64> {
    let mut size = req.limit;
    if let Some(max) = req.max_running {
        size = size.min(max.saturating_sub(running.total));
    }
    let now_share = req.limit - req.buffered.min(req.limit);
    let per = us(rate.per);
    let mut taken: HashMap<&str, u32> = HashMap::new();
    let mut ids = Vec::new();
    let mut pos = 0u32;
    for c in cands {
        if ids.len() >= size as usize {
            break;
        }
        if let Some(k) = c.key.as_deref() {
            let took = taken.get(k).copied().unwrap_or(0);
            let used = logs.get(k).map_or(0, |l| {
                u32::try_from(l.in_window(now_us, per)).unwrap_or(u32::MAX)
            });
            if used.saturating_add(took) >= rate.max {
                continue;
            }
            if let Some(cap) = req.per_key_max_running {
                let run = running.by_group.get(k).copied().unwrap_or(0);
                if run.saturating_add(took) >= cap {
                    continue;
                }
            }
        }
        let place = pos;
        pos += 1;
        if place >= now_share && !c.spare {
            continue;
        }
        if let Some(k) = c.key.as_deref() {
            *taken.entry(k).or_default() += 1;
        }
        ids.push(c.id);
    }
    ids
}

/// The logs to write after a claim that started the tasks `started`
/// (each task's key and `started_at` in µs, as the store wrote it): each
/// key's `max` latest starts, less those a period before `turn_us`.
///
/// `turn_us` is the store's clock read once the claim held its turn (the
/// queue's lock, SQLite's write lock), so the claims of a queue read
/// non-decreasing instants and every later claim counts its window from
/// `turn_us` or after: a start a period before it is in no later window.
/// A log then holds a period's starts, not `max` (PostgreSQL's function
/// does the same; a log of `1000/100ms` kept 1,000 starts, read and
/// rewritten by every claim of its key). `None` keeps the `max` latest.
pub(crate) fn logs_after(
    rate: KeyRate,
    mut logs: HashMap<String, StartLog>,
    started: impl IntoIterator<Item = (String, i64)>,
    turn_us: Option<i64>,
) -> Vec<LogWrite> {
    let per = us(rate.per);
    let mut starts: HashMap<String, Vec<i64>> = HashMap::new();
    for (k, at) in started {
        starts.entry(k).or_default().push(at);
    }
    let mut out = Vec::with_capacity(starts.len());
    for (key, at) in starts {
        let mut log = logs.remove(&key).unwrap_or_default();
        log.record(&at, rate.max);
        if let Some(turn) = turn_us {
            log.forget_until(turn.saturating_sub(per));
        }
        out.push(LogWrite {
            free_at: log.free_at(rate.max, per),
            idle_at: idle_at(log.latest().unwrap_or(0), per),
            starts: log.encode(),
            key,
        });
    }
    out.sort_by(|a, b| a.key.cmp(&b.key));
    out
}

/// When a key's log may be pruned, its latest start at `latest_us`: past
/// that start's window and [`PRUNE_GRACE`], rounded up to a whole grace,
/// so the key's further starts within it leave the column (and its index)
/// unchanged: PostgreSQL then rewrites the row in place without new index
/// entries (heap-only), SQLite and MySQL leave the index alone. Later, not
/// earlier: a row is kept at most one grace longer.
pub(crate) fn idle_at(latest_us: i64, per_us: i64) -> i64 {
    let grace = us(PRUNE_GRACE);
    latest_us
        .saturating_add(per_us)
        .saturating_add(grace)
        .div_euclid(grace)
        .saturating_add(1)
        .saturating_mul(grace)
}

/// The starts a claim logs (SQLite's and MySQL's, which read each claimed
/// task's `started_at` back): each picked task's key, and how far past
/// its start it is logged (a buffered task at its hold's end,
/// [`logged_start`]).
pub(crate) struct StartsToLog {
    keys: HashMap<i64, String>,
    hold: HashMap<i64, i64>,
}

impl StartsToLog {
    /// For the ids [`pick`] returned (`ids`, in claim order) among
    /// `cands`.
    pub(crate) fn new(req: &TaskClaim<'_>, cands: &[Candidate], ids: &[i64]) -> StartsToLog {
        StartsToLog {
            keys: cands
                .iter()
                .filter_map(|c| c.key.clone().map(|k| (c.id, k)))
                .collect(),
            hold: ids
                .iter()
                .enumerate()
                .map(|(i, &id)| (id, logged_start(req, i, 0)))
                .collect(),
        }
    }

    /// The start to log for task `id` that started at `started_us`: its
    /// key and instant, or `None` for a task of no key.
    pub(crate) fn of(&self, id: i64, started_us: i64) -> Option<(String, i64)> {
        let key = self.keys.get(&id)?;
        let held = self.hold.get(&id).copied().unwrap_or(0);
        Some((key.clone(), started_us.saturating_add(held)))
    }
}

/// The answer of a claim under a key rate alone.
pub(crate) fn answer(
    tasks: Vec<Task>,
    now_us: i64,
    key_next: Option<i64>,
) -> Result<RatedClaim, StoreError> {
    Ok(RatedClaim {
        finished: Vec::new(),
        tasks,
        now: rate::at(now_us)?,
        next_start: None,
        key_next: key_next_at(key_next, now_us)?,
    })
}

/// [`answer`]'s `key_next` as a time.
pub(crate) fn key_next_at(
    key_next: Option<i64>,
    now_us: i64,
) -> Result<Option<chrono::DateTime<chrono::Utc>>, StoreError> {
    key_next.filter(|&t| t > now_us).map(rate::at).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(limit: u32, buffered: u32, cap: Option<u32>) -> TaskClaim<'static> {
        TaskClaim {
            queue: "q",
            worker: "w",
            limit,
            lease: Duration::from_secs(1),
            max_running: None,
            per_key_max_running: cap,
            buffered,
            fair: false,
        }
    }

    fn c(id: i64, key: Option<&str>) -> Candidate {
        Candidate {
            id,
            key: key.map(str::to_string),
            spare: true,
        }
    }

    #[test]
    fn each_key_takes_its_room_only() {
        let rate = KeyRate {
            max: 2,
            per: Duration::from_secs(1),
        };
        let cands = [
            c(1, Some("a")),
            c(2, Some("a")),
            c(3, Some("a")),
            c(4, Some("b")),
            c(5, None),
            c(6, Some("b")),
        ];
        let mut logs = HashMap::new();
        // `b` started once 0.5 s ago: one place left; `a` none logged.
        logs.insert("b".to_string(), StartLog::decode("500000").unwrap());
        let got = pick(
            &req(10, 0, None),
            rate,
            &cands,
            &logs,
            &Running::default(),
            1_000_000,
        );
        assert_eq!(got, vec![1, 2, 4, 5]);
        // Exactly `per` after b's start, it has two places again.
        let got = pick(
            &req(10, 0, None),
            rate,
            &cands,
            &logs,
            &Running::default(),
            1_500_000,
        );
        assert_eq!(got, vec![1, 2, 4, 5, 6]);
        // A cap of 1 with `a` running one: `a` is left out.
        let running = Running::from_rows([(Some("a".to_string()), 1)]);
        let got = pick(
            &req(10, 0, Some(1)),
            rate,
            &cands,
            &logs,
            &running,
            1_000_000,
        );
        assert_eq!(got, vec![4, 5]);
        #[cfg(feature = "mysql")]
        assert_eq!(
            full_keys(&running, &req(1, 0, Some(1))),
            vec!["a".to_string()]
        );
        // A buffer share of 2 of 3: past the first, only spare attempts.
        let mut last = c(2, Some("a"));
        last.spare = false;
        let cands = [c(1, None), last, c(3, Some("b")), c(4, None)];
        let got = pick(
            &req(3, 2, None),
            rate,
            &cands,
            &logs,
            &Running::default(),
            1_000_000,
        );
        assert_eq!(got, vec![1, 3, 4]);
    }

    #[test]
    fn logs_after_keep_the_latest_and_say_when_free_and_idle() {
        let rate = KeyRate {
            max: 2,
            per: Duration::from_secs(1),
        };
        let mut logs = HashMap::new();
        logs.insert("a".to_string(), StartLog::decode("100 200").unwrap());
        let w = logs_after(
            rate,
            logs,
            [("a".to_string(), 300), ("b".to_string(), 50)],
            None,
        );
        assert_eq!(w.len(), 2);
        assert_eq!((w[0].key.as_str(), w[0].starts.as_str()), ("a", "300 200"));
        // Free once the 2nd latest (200) leaves the window; idle after
        // the latest's window and the grace.
        assert_eq!(w[0].free_at, 1_000_200);
        assert_eq!(w[0].idle_at, idle_at(300, 1_000_000));
        // Idle past the window and the grace, rounded up to a whole grace:
        // a later start in the same grace leaves it as it was.
        let g = us(PRUNE_GRACE);
        assert_eq!(idle_at(300, 1_000_000), 2 * g);
        assert_eq!(idle_at(g - 1_000_300, 1_000_000), 2 * g);
        assert_eq!(idle_at(g - 1_000_000, 1_000_000), 3 * g);
        assert!(idle_at(5 * g + 17, 1_000_000) >= 6 * g + 1_000_017);
        // One start of a max of 2: free now.
        assert_eq!((w[1].key.as_str(), w[1].free_at), ("b", 0));
    }
}
