//! The fair claim's plan (`TaskClaim::fair`) for a backend that reads the
//! candidates and writes the claim itself (SQLite; PostgreSQL and MySQL run
//! the same rule in a server-side function and procedure, Redis in its
//! script): which groups (concurrency keys, and the tasks without a key as
//! one group) a claim serves and which of their tasks it takes.
//!
//! The rule (DESIGN.md, "Fair claiming"): a candidate task ranks by
//! `(priority, n + running, after cursor, group)`, where `n` is its place
//! among its group's due tasks in `(priority, run_at, id)` order (1 for the
//! first), `running` its group's running tasks in the queue, and the cursor
//! the group the queue's previous fair claim served last: groups after it
//! (by name) come before the groups up to it, so ties rotate round-robin.
//! Priority wins across priorities; within one, the group with the fewest
//! tasks running or just taken goes first. The backend reads only the
//! first due task (the head) of every group with pending tasks, then at
//! most `limit` tasks of each of the at most `limit` groups whose heads rank
//! first: a group's `n`-th task ranks after its head, so no task of another
//! group can make the cut. The reads scale with the number of groups with
//! pending tasks, not with the backlog of any of them.

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
use std::collections::HashMap;

#[cfg(feature = "sqlite")]
use super::TaskClaim;

#[cfg(any(feature = "sqlite", feature = "mysql"))]
/// The name the group of tasks without a concurrency key goes by in the
/// rotation (and in the stored cursor): the empty string, which no
/// concurrency key can be (`queue::validate_concurrency_key`).
pub(crate) const NO_KEY: &str = "";

#[cfg(any(feature = "sqlite", feature = "mysql"))]
/// The name of a task's group.
pub(crate) fn group_of(key: Option<&str>) -> &str {
    key.unwrap_or(NO_KEY)
}

#[cfg(feature = "sqlite")]
/// A group's first due task, as the backend read it.
#[derive(Debug, Clone)]
pub(crate) struct Head {
    /// The group's concurrency key (`None`: the tasks without one).
    pub(crate) key: Option<String>,
    /// The head's priority.
    pub(crate) priority: i32,
}

#[cfg(feature = "sqlite")]
/// A due task of a chosen group, as the backend read it.
#[derive(Debug, Clone)]
pub(crate) struct Candidate {
    /// Task id.
    pub(crate) id: i64,
    /// Its group's concurrency key.
    pub(crate) key: Option<String>,
    /// Its priority.
    pub(crate) priority: i32,
    /// Attempts so far.
    pub(crate) attempt: i32,
    /// Its attempt budget.
    pub(crate) max_attempts: i32,
}

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
/// The queue's state a fair claim plans from.
#[derive(Debug, Clone, Default)]
pub(crate) struct Running {
    /// Running tasks per group name ([`group_of`]).
    pub(crate) by_group: HashMap<String, u32>,
    /// Running tasks of the queue.
    pub(crate) total: u32,
}

#[cfg(any(feature = "sqlite", feature = "mysql"))]
impl Running {
    /// From `(concurrency key, running count)` rows.
    pub(crate) fn from_rows(rows: impl IntoIterator<Item = (Option<String>, i64)>) -> Running {
        let mut r = Running::default();
        for (key, n) in rows {
            let n = u32::try_from(n.max(0)).unwrap_or(u32::MAX);
            r.total = r.total.saturating_add(n);
            *r.by_group
                .entry(group_of(key.as_deref()).to_string())
                .or_default() += n;
        }
        r
    }

    #[cfg(feature = "sqlite")]
    fn of(&self, key: Option<&str>) -> u32 {
        self.by_group.get(group_of(key)).copied().unwrap_or(0)
    }
}

#[cfg(feature = "sqlite")]
/// A group chosen by [`choose`]: read up to `take` of its due tasks.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Chosen {
    /// Its concurrency key (`None`: the tasks without one).
    pub(crate) key: Option<String>,
    /// How many of its due tasks, in `(priority, run_at, id)` order.
    pub(crate) take: u32,
}

#[cfg(feature = "sqlite")]
/// What a fair claim takes: the ids in claim order, and the cursor to
/// store (`None`: the claim took nothing; leave the cursor as it is).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Plan {
    /// The ids to claim, best first.
    pub(crate) ids: Vec<i64>,
    /// The group served last.
    pub(crate) cursor: Option<String>,
}

#[cfg(feature = "sqlite")]
/// The rank of a group's `n`-th candidate (1-based): smaller first.
fn rank<'k>(
    priority: i32,
    n: u32,
    running: u32,
    key: Option<&'k str>,
    cursor: Option<&str>,
) -> (i32, u32, bool, &'k str) {
    let name = group_of(key);
    let after = name > cursor.unwrap_or(NO_KEY);
    (priority, n.saturating_add(running), !after, name)
}

#[cfg(feature = "sqlite")]
/// Room left in a group under the per-key cap (the tasks without a key are
/// not capped).
fn room(req: &TaskClaim<'_>, key: Option<&str>, running: &Running) -> u32 {
    match (key, req.per_key_max_running) {
        (Some(_), Some(cap)) => cap.saturating_sub(running.of(key)),
        _ => u32::MAX,
    }
}

#[cfg(feature = "sqlite")]
/// The claim's size: the limit, or under `max_running` what it leaves.
pub(crate) fn total(req: &TaskClaim<'_>, running: &Running) -> u32 {
    match req.max_running {
        Some(max) => req.limit.min(max.saturating_sub(running.total)),
        None => req.limit,
    }
}

#[cfg(feature = "sqlite")]
/// The groups to read the candidates of, from every group's head: the
/// at most `limit` groups whose heads rank first, leaving out the keys at
/// their cap.
pub(crate) fn choose(
    req: &TaskClaim<'_>,
    heads: &[Head],
    running: &Running,
    cursor: Option<&str>,
) -> Vec<Chosen> {
    let total = total(req, running);
    if total == 0 {
        return Vec::new();
    }
    let mut open: Vec<(&Head, u32)> = heads
        .iter()
        .map(|h| (h, room(req, h.key.as_deref(), running)))
        .filter(|(_, room)| *room > 0)
        .collect();
    open.sort_by_cached_key(|(h, _)| {
        let key = h.key.as_deref();
        rank(h.priority, 1, running.of(key), key, cursor)
    });
    // A buffer share may step over tasks on their last attempt: read as
    // many more per group as the claim may step over.
    let per_group = total.saturating_add(req.buffered.min(req.limit));
    open.into_iter()
        .take(total as usize)
        .map(|(h, room)| Chosen {
            key: h.key.clone(),
            take: room.min(per_group),
        })
        .collect()
}

#[cfg(feature = "sqlite")]
/// The tasks to claim among the chosen groups' candidates (each group's
/// in `(priority, run_at, id)` order): by rank, the first `limit -
/// buffered` at once, the rest only with an attempt to spare
/// (`TaskClaim::buffered`), at most the claim's size.
pub(crate) fn pick(
    req: &TaskClaim<'_>,
    candidates: &[Candidate],
    running: &Running,
    cursor: Option<&str>,
) -> Plan {
    let total = total(req, running) as usize;
    let mut seen: HashMap<&str, u32> = HashMap::new();
    let mut ranked: Vec<(_, &Candidate)> = candidates
        .iter()
        .filter_map(|c| {
            let key = c.key.as_deref();
            let n = seen.entry(group_of(key)).or_default();
            *n += 1;
            (*n <= room(req, key, running))
                .then(|| (rank(c.priority, *n, running.of(key), key, cursor), c))
        })
        .collect();
    ranked.sort_by(|a, b| a.0.cmp(&b.0));
    let at_once = req.limit.saturating_sub(req.buffered) as usize;
    let taken: Vec<&Candidate> = ranked
        .into_iter()
        .enumerate()
        .filter(|(i, (_, c))| *i < at_once || c.attempt + 1 < c.max_attempts)
        .map(|(_, (_, c))| c)
        .take(total)
        .collect();
    Plan {
        ids: taken.iter().map(|c| c.id).collect(),
        cursor: taken.last().map(|c| group_of(c.key.as_deref()).to_string()),
    }
}

/// The walk over a queue's keys in rotation order (after the cursor, then
/// from the first key up to the cursor), a page of keys with their heads
/// at a time, which stops as soon as it has found as many keys as the
/// claim takes whose head is at the queue's best due priority and which
/// have nothing running. Every key it has not walked has nothing running
/// either (the keys with running tasks, at most the workers' slots, are
/// read apart, as is the group without a key), a head no better than the
/// best and a later place in the rotation, so it ranks after each of the
/// keys found: [`choose`] over the heads read is exact, and a claim reads
/// about `limit` + running keys' heads, however many keys wait.
#[cfg(feature = "sqlite")]
#[derive(Debug)]
pub(crate) struct KeyWalk {
    cursor: Option<String>,
    best: i32,
    need: u32,
    found: u32,
    page: u32,
    from: String,
    wrapped: bool,
    done: bool,
    seen: std::collections::HashSet<String>,
}

#[cfg(feature = "sqlite")]
impl KeyWalk {
    /// A walk for a claim of `req` with `running`, from the queue's
    /// `cursor`, its best due priority `best`, and the heads read apart
    /// (`heads`: those of the keys with running tasks and of the group
    /// without a key).
    pub(crate) fn new(
        req: &TaskClaim<'_>,
        running: &Running,
        cursor: Option<&str>,
        best: i32,
        heads: &[Head],
    ) -> KeyWalk {
        let need = total(req, running);
        KeyWalk {
            cursor: cursor.filter(|c| !c.is_empty()).map(str::to_string),
            best,
            need,
            found: 0,
            page: need
                .saturating_add(u32::try_from(running.by_group.len()).unwrap_or(u32::MAX))
                .saturating_add(8),
            from: cursor.unwrap_or(NO_KEY).to_string(),
            wrapped: false,
            done: need == 0,
            seen: heads.iter().filter_map(|h| h.key.clone()).collect(),
        }
    }

    /// The next page to read: at most `.1` keys after `.0`, in key order,
    /// each with its head's priority (none without a due task), and (in
    /// the same round trip, for the wrap) at most `.2` keys from the first
    /// one; `None`: the walk is over.
    pub(crate) fn next_page(&self) -> Option<(&str, u32, u32)> {
        let wrap = if self.wrapped || self.cursor.is_none() {
            0
        } else {
            self.page
        };
        (!self.done).then_some((self.from.as_str(), self.page, wrap))
    }

    /// Take a page read for [`next_page`](Self::next_page) (`after`: the
    /// keys after `.0`; `first`: the keys from the first one), adding the
    /// heads of keys not seen yet to `heads`.
    pub(crate) fn take(
        &mut self,
        after: Vec<(String, Option<i32>)>,
        first: Vec<(String, Option<i32>)>,
        heads: &mut Vec<Head>,
        running: &Running,
    ) {
        let was_wrapped = self.wrapped;
        self.take_page(after, heads, running);
        if !self.done && self.wrapped && !was_wrapped {
            self.take_page(first, heads, running);
        }
    }

    fn take_page(
        &mut self,
        rows: Vec<(String, Option<i32>)>,
        heads: &mut Vec<Head>,
        running: &Running,
    ) {
        let full = rows.len() as u64 >= u64::from(self.page);
        for (key, priority) in rows {
            if self.wrapped && self.cursor.as_deref().is_some_and(|c| key.as_str() > c) {
                self.done = true;
                return;
            }
            self.from.clone_from(&key);
            let Some(priority) = priority else { continue };
            if !self.seen.insert(key.clone()) {
                continue;
            }
            if priority == self.best && running.of(Some(&key)) == 0 {
                self.found += 1;
            }
            heads.push(Head {
                key: Some(key),
                priority,
            });
        }
        if self.found >= self.need {
            self.done = true;
        } else if !full {
            // The last key: wrap to the first, unless this was the wrap.
            if self.wrapped || self.cursor.is_none() {
                self.done = true;
            } else {
                self.wrapped = true;
                self.from = NO_KEY.to_string();
            }
        }
    }
}

/// The claimed tasks in the plan's order (best first), as the claim
/// returns them.
#[cfg(feature = "sqlite")]
pub(crate) fn in_plan_order(mut tasks: Vec<super::Task>, ids: &[i64]) -> Vec<super::Task> {
    tasks.sort_by_key(|t| ids.iter().position(|&x| x == t.id));
    tasks
}

#[cfg(feature = "sqlite")]
#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn req(limit: u32) -> TaskClaim<'static> {
        TaskClaim {
            queue: "q",
            worker: "w",
            limit,
            lease: Duration::from_secs(1),
            max_running: None,
            per_key_max_running: None,
            buffered: 0,
            fair: true,
        }
    }

    fn cand(id: i64, key: Option<&str>, priority: i32) -> Candidate {
        Candidate {
            id,
            key: key.map(str::to_string),
            priority,
            attempt: 0,
            max_attempts: 3,
        }
    }

    #[test]
    fn interleaves_groups_and_rotates_from_the_cursor() {
        let c = [
            cand(1, Some("a"), 0),
            cand(2, Some("a"), 0),
            cand(3, Some("a"), 0),
            cand(9, Some("b"), 0),
            cand(10, None, 0),
        ];
        let run = Running::default();
        let p = pick(&req(4), &c, &run, None);
        assert_eq!(p.ids, vec![1, 9, 10, 2]);
        assert_eq!(p.cursor.as_deref(), Some("a"));
        // After "a", "b" comes first, then the wrap: "" then "a".
        let p = pick(&req(1), &c, &run, Some("a"));
        assert_eq!(p.ids, vec![9]);
        let p = pick(&req(2), &c, &run, Some("b"));
        assert_eq!(p.ids, vec![10, 1]);
    }

    #[test]
    fn priority_wins_and_running_groups_wait() {
        let c = [cand(1, Some("a"), 0), cand(2, Some("b"), 1)];
        let run = Running::from_rows([(Some("a".to_string()), 5)]);
        assert_eq!(pick(&req(1), &c, &run, None).ids, vec![1]);
        let c = [cand(1, Some("a"), 1), cand(2, Some("b"), 1)];
        assert_eq!(pick(&req(1), &c, &run, None).ids, vec![2]);
    }

    #[test]
    fn caps_per_key_and_queue() {
        let c = [
            cand(1, Some("a"), 0),
            cand(2, Some("a"), 0),
            cand(3, Some("b"), 0),
        ];
        let run = Running::from_rows([(Some("a".to_string()), 1)]);
        let mut r = req(8);
        r.per_key_max_running = Some(2);
        assert_eq!(pick(&r, &c, &run, None).ids, vec![3, 1]);
        r.max_running = Some(2);
        assert_eq!(pick(&r, &c, &run, None).ids, vec![3]);
        let heads = [
            Head {
                key: Some("a".into()),
                priority: 0,
            },
            Head {
                key: Some("b".into()),
                priority: 0,
            },
        ];
        r.max_running = None;
        r.per_key_max_running = Some(1);
        assert_eq!(
            choose(&r, &heads, &run, None),
            vec![Chosen {
                key: Some("b".into()),
                take: 1
            }]
        );
    }

    #[test]
    fn the_key_walk_stops_once_enough_keys_are_found_and_wraps() {
        // Keys k00..k19 all at priority 0; k05 runs one task; cursor k10.
        let keys: Vec<String> = (0..20).map(|i| format!("k{i:02}")).collect();
        let run = Running::from_rows([(Some("k05".to_string()), 1)]);
        let heads = vec![Head {
            key: Some("k05".into()),
            priority: 0,
        }];
        let read = |from: &str, n: u32| -> Vec<(String, Option<i32>)> {
            keys.iter()
                .filter(|k| k.as_str() > from)
                .take(n as usize)
                .map(|k| (k.clone(), Some(0)))
                .collect()
        };
        let mut got = heads.clone();
        let mut walk = KeyWalk::new(&req(3), &run, Some("k10"), 0, &heads);
        let mut pages = 0;
        while let Some((from, n, wrap)) = walk.next_page() {
            let (after, first) = (read(from, n), read("", wrap));
            walk.take(after, first, &mut got, &run);
            pages += 1;
        }
        assert_eq!(
            pages, 1,
            "one page: 3 + 1 running + 8 keys after the cursor"
        );
        let chosen: Vec<_> = choose(&req(3), &got, &run, Some("k10"))
            .into_iter()
            .map(|c| c.key.unwrap())
            .collect();
        assert_eq!(chosen, ["k11", "k12", "k13"]);
        // Near the end of the keys the walk wraps to the first ones, and
        // stops before passing the cursor again.
        let mut got = heads.clone();
        let mut walk = KeyWalk::new(&req(8), &run, Some("k17"), 0, &heads);
        let mut pages = 0;
        while let Some((from, n, wrap)) = walk.next_page() {
            let (after, first) = (read(from, n), read("", wrap));
            walk.take(after, first, &mut got, &run);
            pages += 1;
        }
        assert_eq!(pages, 1, "the wrap read in the same round trip");
        let chosen: Vec<_> = choose(&req(8), &got, &run, Some("k17"))
            .into_iter()
            .map(|c| c.key.unwrap())
            .collect();
        assert_eq!(
            chosen,
            ["k18", "k19", "k00", "k01", "k02", "k03", "k04", "k06"]
        );
    }
}
