//! The checker: reads a run's history and the store's tasks and checks the
//! invariants of docs/DESIGN.md against what the processes observed.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use baton::queue::RateLimit;
use baton::store::TaskInfo;

use super::history::Record;

/// The invariants checked, in report order.
///
/// T8 is T6 per concurrency key (`--per-key-rate`): no key of the
/// workload's queue has more than N `started_at` in any window `[t, t +
/// P)` of the store's clock (`super::key_rate`).
pub const INVARIANTS: [&str; 11] = [
    "L1", "L2", "T1", "T2", "T3", "T4", "T5", "T6", "T8", "S1", "S2",
];

/// What a run asked of its workload's queue beyond the fixed invariants:
/// the per-key cap (T5) and the rate limit (T6) the checker holds the
/// history to. Each unset is reported as not exercised.
#[derive(Debug, Clone, Default)]
pub struct Limits {
    /// The queue both apply to.
    pub queue: String,
    /// At most this many tasks of one concurrency key running at once.
    pub per_key_max_running: Option<u32>,
    /// At most N starts in any window of length P of the store's clock.
    pub rate: Option<RateLimit>,
    /// At most N starts of one concurrency key in any window of length P.
    pub per_key_rate: Option<RateLimit>,
    /// Durable jobs whose overlap policy lets no two runs overlap (S2:
    /// `skip`, `buffer_one`, `buffer_all`, `cancel_other`,
    /// `terminate_other`).
    pub exclusive_jobs: BTreeSet<String>,
}

/// What the checker found.
#[derive(Debug, Default)]
pub struct Report {
    /// Operations by kind (effects, enqueues, register writes).
    pub ops: BTreeMap<String, u64>,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, u64>,
    /// Violations by invariant: (count, up to 3 examples).
    pub violations: BTreeMap<&'static str, (u64, Vec<String>)>,
    /// Invariants the run did not exercise, with why (shown as `-`).
    pub unchecked: BTreeMap<&'static str, &'static str>,
}

impl Report {
    pub(super) fn violation(&mut self, inv: &'static str, example: String) {
        let e = self.violations.entry(inv).or_default();
        e.0 += 1;
        if e.1.len() < 3 {
            e.1.push(example);
        }
    }

    pub(super) fn op(&mut self, what: &str, n: u64) {
        *self.ops.entry(what.to_string()).or_default() += n;
    }

    /// Violations in total.
    pub fn total(&self) -> u64 {
        self.violations.values().map(|v| v.0).sum()
    }

    /// The table printed at the end of a run.
    pub fn table(&self) -> String {
        let mut s = String::from("OPERATIONS\n");
        for (k, v) in &self.ops {
            s += &format!("  {k:<34} {v:>7}\n");
        }
        s += "FAULTS\n";
        if self.faults.is_empty() {
            s += "  (none)\n";
        }
        for (k, v) in &self.faults {
            s += &format!("  {k:<34} {v:>7}\n");
        }
        s += "INVARIANT  VIOLATIONS  EXAMPLE\n";
        for inv in INVARIANTS {
            if let Some(why) = self.unchecked.get(inv) {
                s += &format!("  {inv:<8} {:>10}  not exercised ({why})\n", "-");
                continue;
            }
            match self.violations.get(inv) {
                None => s += &format!("  {inv:<8} {:>10}\n", 0),
                Some((n, ex)) => {
                    s += &format!("  {inv:<8} {n:>10}  {}\n", ex[0]);
                    for e in &ex[1..] {
                        s += &format!("  {:<8} {:>10}  {e}\n", "", "");
                    }
                }
            }
        }
        s += &format!("TOTAL VIOLATIONS {}\n", self.total());
        s
    }
}

/// One effect: its begin, end (if recorded) and identity.
#[derive(Debug, Clone)]
struct Effect {
    id: String,
    kind: String,
    proc: String,
    name: String,
    token: Option<i64>,
    task: Option<i64>,
    attempt: Option<u32>,
    slot: String,
    group: Option<i64>,
    begin: i64,
    /// When its command's process started, if recorded (at or before
    /// `begin`).
    spawned: Option<i64>,
    end: Option<i64>,
    /// The place of its `begin` record in the history file.
    begin_at: usize,
    /// The place of the `killed` record that saw its command's process
    /// group gone (no `end` recorded): every record after it in the file
    /// was written after the effect's death.
    dead_at: Option<usize>,
}

impl Effect {
    /// When its command began to exist: its process's start where the
    /// `begin` record carries it, else that record's time. A pause that
    /// froze the command on its way to recording `begin` falls between
    /// the two.
    fn start(&self) -> i64 {
        self.spawned.map_or(self.begin, |s| s.min(self.begin))
    }

    /// Whether `killed` (a `killed` record for this effect's process group)
    /// is the death of this effect's command: recorded by its instance, for
    /// its task and attempt, or, not being a task's, for its fencing token.
    fn died_by(&self, killed: &Record) -> bool {
        // (The caller found `killed` by this effect's group.) A supervisor's
        // record names the group alone: its command is this effect's.
        if killed.proc != self.proc {
            return false;
        }
        killed.supervisor
            || match self.task {
                Some(_) => killed.task == self.task && killed.attempt == self.attempt,
                None => killed.task.is_none() && self.token.is_some() && killed.token == self.token,
            }
    }

    /// Whether `self` is known to have ended before `later` (which began
    /// no earlier) began: by their times, or because `later`'s `begin`
    /// was appended after the `killed` record of `self`'s command. That
    /// order is the file's, so it holds whatever the writers' clocks.
    fn ended_before(&self, later: &Effect) -> bool {
        later.begin >= self.end.unwrap_or(self.begin)
            || self.dead_at.is_some_and(|k| later.begin_at > k)
    }
}

impl Effect {
    fn describe(&self) -> String {
        let mut s = format!("{} by {}", self.id, self.proc);
        if let Some(t) = self.task {
            s += &format!(" task {t}");
        }
        if let Some(a) = self.attempt {
            s += &format!(" attempt {a}");
        }
        if let Some(t) = self.token {
            s += &format!(" token {t}");
        }
        s
    }
}

/// Check `history` (every record of the run) against `tasks` (every task
/// in the run's store, after the drain) and the run's `limits`.
pub fn check(history: &[Record], tasks: &[TaskInfo], limits: &Limits) -> Report {
    let mut r = Report::default();
    let mut effects: BTreeMap<String, Effect> = BTreeMap::new();
    // Pauses and kills per instance: (from, to).
    let mut pauses: HashMap<String, Vec<(i64, i64)>> = HashMap::new();
    // Freezes of a baton process alone (its commands ran on): not excused,
    // only counted, so the table shows the case was met.
    let mut freezes: HashMap<String, Vec<(i64, i64)>> = HashMap::new();
    let mut kills: HashMap<String, Vec<i64>> = HashMap::new();
    let mut writes: BTreeMap<String, Vec<&Record>> = BTreeMap::new();
    let mut enqueued: BTreeMap<String, BTreeSet<i64>> = BTreeMap::new();
    // `killed` records by process group: their places in the file.
    let mut killed: HashMap<i64, Vec<(usize, &Record)>> = HashMap::new();
    for (at, rec) in history.iter().enumerate() {
        match rec.op.as_str() {
            "begin" => {
                effects.insert(
                    rec.effect.clone(),
                    Effect {
                        id: rec.effect.clone(),
                        kind: rec.kind.clone(),
                        proc: rec.proc.clone(),
                        name: rec.name.clone(),
                        token: rec.token,
                        task: rec.task,
                        attempt: rec.attempt,
                        slot: rec.slot.clone(),
                        group: rec.group,
                        begin: rec.t,
                        spawned: rec.spawned,
                        end: None,
                        begin_at: at,
                        dead_at: None,
                    },
                );
            }
            "end" => {
                if let Some(e) = effects.get_mut(&rec.effect) {
                    e.end = Some(rec.t);
                }
            }
            "write" => writes.entry(rec.name.clone()).or_default().push(rec),
            "killed" => {
                if let Some(g) = rec.group {
                    killed.entry(g).or_default().push((at, rec));
                }
            }
            "enqueue" => {
                r.op("enqueue calls", 1);
                if let Some(id) = rec.task {
                    enqueued.entry(rec.name.clone()).or_default().insert(id);
                }
            }
            "fault" => {
                *r.faults.entry(rec.kind.clone()).or_default() += 1;
                let until = rec.until.unwrap_or(rec.t);
                match rec.kind.as_str() {
                    "pause" => pauses
                        .entry(rec.proc.clone())
                        .or_default()
                        .push((rec.t, until)),
                    "freeze" => freezes
                        .entry(rec.proc.clone())
                        .or_default()
                        .push((rec.t, until)),
                    "kill-9" => kills.entry(rec.proc.clone()).or_default().push(rec.t),
                    _ => {}
                }
            }
            _ => {}
        }
    }
    // An effect whose end was not recorded was killed: by the baton
    // process that ran it (a worker, a lock-mode job, `baton lock`), which
    // then saw its command's process group gone and recorded `killed` (the
    // first such record after its begin with its instance and group, and
    // its task and attempt, or for a lock holder its fencing token), or by
    // a SIGKILL of its instance: it ended by that kill at the latest, else
    // count its begin.
    let mut effects: Vec<Effect> = effects.into_values().collect();
    for e in &mut effects {
        if e.end.is_none() {
            e.dead_at = e.group.and_then(|g| killed.get(&g)).and_then(|l| {
                l.iter()
                    .find(|(at, k)| *at > e.begin_at && e.died_by(k))
                    .map(|(at, _)| *at)
            });
            let killed = kills
                .get(&e.proc)
                .and_then(|k| k.iter().copied().filter(|&t| t >= e.begin).min());
            e.end = Some(killed.unwrap_or(e.begin));
        }
    }
    let paused = |e: &Effect| frozen(e, &pauses);
    for e in &effects {
        r.op(&format!("effects: {}", e.kind), 1);
        if paused(e) {
            r.op("effects frozen by a pause (fenced)", 1);
        }
        let end = e.end.unwrap_or(e.begin);
        if freezes
            .get(&e.proc)
            .is_some_and(|p| p.iter().any(|&(a, b)| a <= end && e.begin <= b))
        {
            r.op("effects under a frozen baton (not excused)", 1);
        }
    }

    // L1: lock holders' effects (and lock-mode job runs) never overlap,
    // except an instance frozen past its lease: fencing (L2) covers it.
    let mut by_lock: BTreeMap<String, Vec<&Effect>> = BTreeMap::new();
    for e in effects
        .iter()
        .filter(|e| e.kind == "lock" || e.kind == "lockjob")
    {
        by_lock
            .entry(format!("{} {}", e.kind, e.name))
            .or_default()
            .push(e);
    }
    for (lock, list) in by_lock {
        for (a, b) in overlaps(list) {
            if !paused(a) && !paused(b) {
                r.violation(
                    "L1",
                    format!("{lock}: {} overlaps {}", a.describe(), b.describe()),
                );
            }
        }
    }

    // L2: a register never accepts a token below one it accepted, and one
    // token belongs to one effect.
    for (reg, list) in &writes {
        let mut high: Option<(i64, &str)> = None;
        let mut owner: HashMap<i64, &str> = HashMap::new();
        for w in list {
            r.op(
                if w.accepted == Some(true) {
                    "register writes accepted"
                } else {
                    "register writes refused (stale token)"
                },
                1,
            );
            let (Some(tok), Some(true)) = (w.token, w.accepted) else {
                continue;
            };
            if let Some((h, by)) = high {
                if tok < h {
                    r.violation(
                        "L2",
                        format!(
                            "{reg} accepted token {tok} from {} after {h} from {by}",
                            w.effect
                        ),
                    );
                }
            }
            if let Some(o) = owner.get(&tok) {
                if *o != w.effect.as_str() {
                    r.violation(
                        "L2",
                        format!(
                            "{reg}: token {tok} accepted from two effects, {o} and {}",
                            w.effect
                        ),
                    );
                }
            }
            owner.insert(tok, &w.effect);
            if high.is_none_or(|(h, _)| tok > h) {
                high = Some((tok, &w.effect));
            }
        }
    }

    // T1: every enqueued task (and every job run) is terminal in the store.
    let by_id: HashMap<i64, &TaskInfo> = tasks.iter().map(|t| (t.id, t)).collect();
    let mut expected: BTreeSet<i64> = enqueued.values().flatten().copied().collect();
    expected.extend(tasks.iter().filter(|t| t.job.is_some()).map(|t| t.id));
    r.op(
        "tasks checked (enqueued and job runs)",
        expected.len() as u64,
    );
    for id in &expected {
        match by_id.get(id) {
            None => r.violation(
                "T1",
                format!("task {id} was enqueued and is gone from the store"),
            ),
            Some(t) if !t.state.is_terminal() => r.violation(
                "T1",
                format!(
                    "task {id} is still {} after the drain (attempt {})",
                    t.state, t.attempt
                ),
            ),
            Some(t) => r.op(&format!("tasks ended {}", t.state), 1),
        }
    }

    // T2: no two attempts (effects) of one task overlap, except an
    // instance frozen past its lease (its late writes are fenced).
    let mut by_task: BTreeMap<i64, Vec<&Effect>> = BTreeMap::new();
    for e in &effects {
        if let Some(t) = e.task {
            by_task.entry(t).or_default().push(e);
        }
    }
    for (task, list) in &by_task {
        for (a, b) in overlaps(list.clone()) {
            if !paused(a) && !paused(b) {
                r.violation(
                    "T2",
                    format!("task {task}: {} overlaps {}", a.describe(), b.describe()),
                );
            }
        }
    }

    // T3: attempts ≤ max_attempts, in the store and as the commands saw them.
    for t in tasks {
        let seen = by_task
            .get(&t.id)
            .and_then(|l| l.iter().filter_map(|e| e.attempt).max())
            .unwrap_or(0);
        let attempt = t.attempt.max(seen);
        if attempt > t.max_attempts {
            r.violation(
                "T3",
                format!(
                    "task {} ran attempt {attempt} of max {}",
                    t.id, t.max_attempts
                ),
            );
        }
    }

    // T4: one task per unique key, by what enqueue returned and in the store.
    // The records name the producer's keys, all of one kind in one queue,
    // so each names one stored key whatever its scope.
    for (key, ids) in &enqueued {
        if ids.len() > 1 {
            r.violation("T4", format!("key {key:?} gave tasks {ids:?}"));
        }
    }
    // By the stored key, which carries the key's scope (queue and kind
    // by default): one stored key is one key, whatever the key string.
    let mut by_key: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for t in tasks {
        if let (Some(k), None) = (&t.unique_key, &t.job) {
            by_key.entry(k).or_default().push(t.id);
        }
    }
    for (key, ids) in by_key {
        if ids.len() > 1 {
            r.violation(
                "T4",
                format!(
                    "the store holds tasks {ids:?} for key {}",
                    baton::queue::UniqueKey::parse(key)
                ),
            );
        }
    }

    match limits.per_key_max_running {
        Some(cap) => per_key_cap(&mut r, &effects, tasks, &limits.queue, cap, &pauses),
        None => {
            r.unchecked.insert("T5", "no --per-key-max-running");
        }
    }
    match limits.rate {
        Some(rate) => rate_limit(&mut r, tasks, &limits.queue, rate),
        None => {
            r.unchecked.insert("T6", "no --rate");
        }
    }
    match limits.per_key_rate {
        Some(rate) => super::key_rate::per_key_rate(&mut r, tasks, &limits.queue, rate),
        None => {
            r.unchecked.insert("T8", "no --per-key-rate");
        }
    }

    // S1: each (job, slot) is enqueued at most once (one task; lock mode:
    // one run record), and runs as one task / one lock-mode run.
    let mut slots: BTreeMap<(String, String), Vec<i64>> = BTreeMap::new();
    for t in tasks {
        if let (Some(j), Some(s)) = (&t.job, t.slot) {
            slots
                .entry((j.clone(), s.to_rfc3339()))
                .or_default()
                .push(t.id);
        }
    }
    for ((job, slot), ids) in &slots {
        if ids.len() > 1 {
            r.violation(
                "S1",
                format!("{job} slot {slot}: tasks {ids:?} in the store"),
            );
        }
    }
    let mut ran: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for e in effects
        .iter()
        .filter(|e| e.kind == "job" || e.kind == "lockjob")
    {
        // A durable slot's task may run again after a lost attempt (T2
        // covers overlap); a second task for one slot is the violation.
        let who = match (e.kind.as_str(), e.task) {
            ("job", Some(t)) => format!("task {t}"),
            _ => e.id.clone(),
        };
        ran.entry((e.name.clone(), e.slot.clone()))
            .or_default()
            .insert(who);
    }
    for ((job, slot), who) in &ran {
        r.op("job slots run", 1);
        if who.len() > 1 {
            r.violation("S1", format!("{job} slot {slot} ran as {who:?}"));
        }
    }
    job_overlap(&mut r, &effects, tasks, &limits.exclusive_jobs, &pauses);
    r
}

/// Whether `e`'s instance was paused (frozen with its commands, past its
/// lease: its late writes are fenced) at some time while `e` ran, from its
/// command's start: a command the pause froze on its way to recording
/// `begin` records it only after the pause, its lease perhaps gone.
fn frozen(e: &Effect, pauses: &HashMap<String, Vec<(i64, i64)>>) -> bool {
    let (start, end) = (e.start(), e.end.unwrap_or(e.begin));
    pauses
        .get(&e.proc)
        .is_some_and(|p| p.iter().any(|&(a, b)| a <= end && start <= b))
}

/// S2: no two runs of a job whose overlap policy forbids it are ever under
/// way at once — a slot that waits (`buffer_one`) starts after the running
/// one ended, one that stops it (`cancel_other`) after it stopped — where
/// the earlier run is the later one's *previous run* by S1's catch-up rule
/// (its task existed before the later slot was due: a catch-up's tasks,
/// created after the slots they run were due, are not each other's), and
/// except an instance frozen past its lease (as T2).
fn job_overlap(
    r: &mut Report,
    effects: &[Effect],
    tasks: &[TaskInfo],
    jobs: &BTreeSet<String>,
    pauses: &HashMap<String, Vec<(i64, i64)>>,
) {
    if jobs.is_empty() {
        r.unchecked
            .insert("S2", "no job with an exclusive overlap policy");
        return;
    }
    // Each run's task: (its slot, when it was created), store time, µs.
    let of: HashMap<i64, (i64, i64)> = tasks
        .iter()
        .filter_map(|t| {
            let slot = t.slot?.timestamp_micros();
            Some((t.id, (slot, t.created_at.timestamp_micros())))
        })
        .collect();
    let previous = |a: &Effect, b: &Effect| {
        let (Some(&x), Some(&y)) = (
            a.task.and_then(|t| of.get(&t)),
            b.task.and_then(|t| of.get(&t)),
        ) else {
            // A task the store no longer holds: held to the rule.
            return true;
        };
        let ((slot, created), later) = if x.0 <= y.0 { (x, y.0) } else { (y, x.0) };
        slot < later && created < later
    };
    let paused = |e: &Effect| frozen(e, pauses);
    for job in jobs {
        let list: Vec<&Effect> = effects
            .iter()
            .filter(|e| e.kind == "job" && &e.name == job)
            .collect();
        r.op(&format!("S2: runs of {job}"), list.len() as u64);
        for (a, b) in overlaps(list) {
            if a.task == b.task {
                continue;
            }
            if previous(a, b) && !paused(a) && !paused(b) {
                r.violation(
                    "S2",
                    format!("{job}: {} overlaps {}", a.describe(), b.describe()),
                );
            } else {
                r.op("S2: catch-up or frozen runs overlapping", 1);
            }
        }
    }
}

/// T5: at no instant more than `cap` tasks of one concurrency key running.
///
/// Which key a task has is the store's record. When a task ran is its
/// commands' lifetimes (the effects' `begin` and `end`, on one clock, and
/// an effect without `end` bounded as for T2): a command runs only while
/// its attempt is `running` in the store (claimed before it starts,
/// stopped before its lease's end, finished after it ends), so more than
/// `cap` distinct tasks of a key with commands alive at one instant had
/// more than `cap` running in the store. (The store's own times cannot
/// serve: it keeps one `started_at` per task, the latest attempt's, and
/// PostgreSQL dates a claim at its transaction's start, before the lock
/// wait that orders it after the finish it saw.) The count is taken at
/// each begin, where the most are alive. An effect whose instance was
/// paused (it and its commands frozen) between its command's start
/// ([`Effect::start`], which may precede its recorded begin) and that
/// instant is not counted: its lease may have lapsed and the store rescued its
/// task, which is then not running though the frozen command wakes later
/// (fenced, as for T2). A baton frozen alone is not excused: its commands'
/// supervisor kills them by the lease's end.
fn per_key_cap(
    r: &mut Report,
    effects: &[Effect],
    tasks: &[TaskInfo],
    queue: &str,
    cap: u32,
    pauses: &HashMap<String, Vec<(i64, i64)>>,
) {
    let key_of: HashMap<i64, &str> = tasks
        .iter()
        .filter(|t| t.queue == queue)
        .filter_map(|t| Some((t.id, t.concurrency_key.as_deref()?)))
        .collect();
    r.op("T5: tasks with a key", key_of.len() as u64);
    let mut by_key: BTreeMap<&str, Vec<&Effect>> = BTreeMap::new();
    for e in effects.iter().filter(|e| e.kind == "task") {
        if let Some(k) = e.task.and_then(|t| key_of.get(&t)) {
            by_key.entry(k).or_default().push(e);
        }
    }
    let rescuable = |a: &Effect, at: i64| {
        pauses
            .get(&a.proc)
            .is_some_and(|p| p.iter().any(|&(from, to)| from <= at && a.start() <= to))
    };
    let mut most = 0;
    for (key, mut list) in by_key {
        list.sort_by_key(|e| (e.begin, e.begin_at));
        for (j, b) in list.iter().enumerate() {
            // Its command was paused on its way to recording its begin:
            // its task may have been rescued meanwhile (fenced, as above).
            if rescuable(b, b.begin) {
                continue;
            }
            let mut running: BTreeSet<i64> = b.task.into_iter().collect();
            for a in &list[..j] {
                if a.task != b.task && !a.ended_before(b) && !rescuable(a, b.begin) {
                    running.extend(a.task);
                }
            }
            most = most.max(running.len());
            if running.len() > cap as usize {
                let ids: Vec<i64> = running.into_iter().collect();
                r.violation(
                    "T5",
                    format!(
                        "key {key:?}: {} tasks running at {} ({} began), cap {cap}: tasks {ids:?}",
                        ids.len(),
                        at(b.begin),
                        b.describe()
                    ),
                );
            }
        }
    }
    r.op("T5: most of one key running", most as u64);
}

/// T6: no window `[t, t + P)` of the store's clock holds more than N
/// `started_at` of the queue's tasks. The store keeps each task's latest
/// start (a task rescued and claimed again was started again and counted
/// again; its earlier start is overwritten), so the check sees every
/// task's last start: a subset of the starts, and N + 1 of them within P
/// is a violation whatever the rest were.
fn rate_limit(r: &mut Report, tasks: &[TaskInfo], queue: &str, rate: RateLimit) {
    let starts: Vec<(i64, i64)> = tasks
        .iter()
        .filter(|t| t.queue == queue)
        .filter_map(|t| Some((t.started_at?.timestamp_micros(), t.id)))
        .collect();
    r.op("T6: starts (latest per task)", starts.len() as u64);
    let (most, over) = crowded(starts, rate);
    r.op("T6: most starts in one period", most as u64);
    for (t, ids) in over {
        r.violation(
            "T6",
            format!(
                "queue {queue:?}: {} starts in [{}, +{}), limit {rate}: tasks {ids:?}",
                ids.len(),
                at(t),
                baton::format_duration(rate.per())
            ),
        );
    }
}

/// The starts `(µs, task id)` against `rate`: the most in one window of
/// its period, and each window `[t, t + P)` beginning at a start that
/// holds more than N of them (t and the tasks in it).
pub(super) fn crowded(
    mut starts: Vec<(i64, i64)>,
    rate: RateLimit,
) -> (usize, Vec<(i64, Vec<i64>)>) {
    let p = i64::try_from(rate.per().as_micros()).unwrap_or(i64::MAX);
    let n = rate.max() as usize;
    starts.sort_unstable();
    let (mut most, mut lo) = (0, 0);
    for hi in 0..starts.len() {
        while starts[hi].0 - starts[lo].0 >= p {
            lo += 1;
        }
        most = most.max(hi - lo + 1);
    }
    let mut over = Vec::new();
    for (i, w) in starts.windows(n + 1).enumerate() {
        let t = w[0].0;
        if w[n].0 - t < p {
            let ids: Vec<i64> = starts[i..]
                .iter()
                .take_while(|s| s.0 - t < p)
                .map(|s| s.1)
                .collect();
            over.push((t, ids));
        }
    }
    (most, over)
}

/// A history or store time (µs since the epoch) as RFC 3339.
pub(super) fn at(us: i64) -> String {
    chrono::DateTime::from_timestamp_micros(us).map_or_else(
        || format!("{us}µs"),
        |t| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
    )
}

/// Pairs of effects whose [begin, end] intervals overlap (sweep by begin).
fn overlaps(mut list: Vec<&Effect>) -> Vec<(&Effect, &Effect)> {
    list.sort_by_key(|e| e.begin);
    let mut out = Vec::new();
    for (i, a) in list.iter().enumerate() {
        let a_end = a.end.unwrap_or(a.begin);
        for b in &list[i + 1..] {
            if b.begin >= a_end {
                break;
            }
            if a.id != b.id && !a.ended_before(b) {
                out.push((*a, *b));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Check with no per-key cap or rate limit.
    fn check(history: &[Record], tasks: &[TaskInfo]) -> Report {
        super::check(history, tasks, &Limits::default())
    }

    fn begin(effect: &str, kind: &str, task: Option<i64>, t: i64) -> Record {
        Record {
            op: "begin".into(),
            kind: kind.into(),
            proc: "w1.0".into(),
            effect: effect.into(),
            name: "x".into(),
            task,
            attempt: task.map(|_| 1),
            t,
            ..Default::default()
        }
    }

    fn end(effect: &str, t: i64) -> Record {
        Record {
            op: "end".into(),
            effect: effect.into(),
            t,
            ..Default::default()
        }
    }

    /// A `pause` fault of `proc` (an instance and its commands frozen)
    /// from `from` to `until`.
    pub(super) fn pause(proc: &str, from: i64, until: i64) -> Record {
        Record {
            op: "fault".into(),
            kind: "pause".into(),
            proc: proc.into(),
            t: from,
            until: Some(until),
            ..Default::default()
        }
    }

    /// S2: two runs of an exclusive job (different slots' tasks) under way
    /// at once are a violation; back to back they are not, nor are two
    /// runs of a job that allows overlap, nor attempts of one task (T2's).
    #[test]
    fn overlapping_runs_of_an_exclusive_job_are_an_s2_violation() {
        let run = |effect: &str, job: &str, task: i64, t: i64| Record {
            name: job.into(),
            slot: format!("slot-{task}"),
            ..begin(effect, "job", Some(task), t)
        };
        let limits = Limits {
            exclusive_jobs: ["buffered".to_string()].into(),
            ..Limits::default()
        };
        let s2 = |h: &[Record]| {
            super::check(h, &[], &limits)
                .violations
                .get("S2")
                .map(|v| v.0)
        };
        // Back to back: the second starts when the first ended.
        let ok = vec![
            run("a", "buffered", 1, 0),
            end("a", 100),
            run("b", "buffered", 2, 100),
            end("b", 200),
        ];
        assert_eq!(s2(&ok), None);
        // The second starts while the first runs.
        let bad = vec![
            run("a", "buffered", 1, 0),
            run("b", "buffered", 2, 50),
            end("a", 100),
            end("b", 200),
        ];
        assert_eq!(
            s2(&bad),
            Some(1),
            "{}",
            super::check(&bad, &[], &limits).table()
        );
        // The same under a job that allows overlap: not S2's.
        let allowed: Vec<Record> = bad
            .iter()
            .map(|r| Record {
                name: if r.op == "begin" {
                    "free".into()
                } else {
                    r.name.clone()
                },
                ..r.clone()
            })
            .collect();
        assert_eq!(s2(&allowed), None);
        // Two tasks of a catch-up (the earlier created once the later slot
        // was due) are not each other's previous run: their overlap is
        // allowed; created before it, it is not.
        let slot_task = |id: i64, slot_ms: i64, created_ms: i64| {
            let at = |ms: i64| {
                chrono::DateTime::from_timestamp_millis(ms)
                    .unwrap()
                    .to_rfc3339()
            };
            let mut t = super::limits::task(id, None, slot_ms);
            t.slot = chrono::DateTime::from_timestamp_millis(slot_ms);
            t.created_at = chrono::DateTime::parse_from_rfc3339(&at(created_ms))
                .unwrap()
                .into();
            t
        };
        let with = |tasks: &[TaskInfo]| {
            super::check(&bad, tasks, &limits)
                .violations
                .get("S2")
                .map(|v| v.0)
        };
        assert_eq!(
            with(&[slot_task(1, 1000, 2500), slot_task(2, 2000, 2500)]),
            None
        );
        assert_eq!(
            with(&[slot_task(1, 1000, 900), slot_task(2, 2000, 1900)]),
            Some(1)
        );
        // Without exclusive jobs the invariant is reported unexercised.
        let r = check(&ok, &[]);
        assert!(r.unchecked.contains_key("S2"), "{}", r.table());
    }

    #[test]
    fn overlapping_lock_effects_are_an_l1_violation_unless_paused() {
        let h = vec![
            begin("a", "lock", None, 0),
            begin("b", "lock", None, 50),
            end("a", 100),
            end("b", 150),
            begin("c", "lock", None, 200),
            end("c", 300),
        ];
        let r = check(&h, &[]);
        assert_eq!(
            r.violations.get("L1").map(|v| v.0),
            Some(1),
            "{}",
            r.table()
        );
        let mut h2 = h.clone();
        h2.push(pause("w1.0", 60, 90));
        assert_eq!(check(&h2, &[]).total(), 0);
    }

    #[test]
    fn a_command_frozen_before_its_begin_is_excused_by_its_pause() {
        // "b" held an older lease; its instance and its command, started at
        // 40, were paused from 45 to 95, past the lease: the command
        // recorded its begin only at 96, inside "a"'s hold.
        let frozen = pause("w1.0", 45, 95);
        let b = |spawned| Record {
            spawned,
            ..begin("b", "lock", None, 96)
        };
        let h = |spawned| {
            vec![
                Record {
                    proc: "w2.0".into(),
                    ..begin("a", "lock", None, 50)
                },
                b(spawned),
                end("b", 120),
                end("a", 150),
                frozen.clone(),
            ]
        };
        let l1 = |h: &[Record]| check(h, &[]).violations.get("L1").map(|v| v.0);
        assert_eq!(l1(&h(Some(40))), None, "started before the pause");
        assert_eq!(l1(&h(None)), Some(1), "no start recorded: its begin alone");
        assert_eq!(l1(&h(Some(96))), Some(1), "started after the pause");
    }

    #[test]
    fn the_process_start_is_read_and_precedes_now() {
        use crate::chaos::history::{now_us, process_started_us};
        let started = process_started_us().expect("/proc/self/stat");
        let now = now_us();
        assert!(started <= now + 20_000, "{started} after {now}");
        // This test process started within the last hour.
        assert!(now - started < 3_600_000_000, "{started} long before {now}");
    }

    #[test]
    fn a_lower_token_accepted_after_a_higher_one_is_an_l2_violation() {
        let w = |effect: &str, token, accepted| Record {
            op: "write".into(),
            name: "lock-x".into(),
            effect: effect.into(),
            token: Some(token),
            accepted: Some(accepted),
            ..Default::default()
        };
        let ok = vec![
            w("a", 5, true),
            w("a", 5, true),
            w("b", 4, false),
            w("c", 6, true),
        ];
        assert_eq!(check(&ok, &[]).total(), 0);
        let bad = vec![w("a", 5, true), w("b", 4, true)];
        assert_eq!(check(&bad, &[]).violations.get("L2").map(|v| v.0), Some(1));
        let shared = vec![w("a", 5, true), w("b", 5, true)];
        assert_eq!(
            check(&shared, &[]).violations.get("L2").map(|v| v.0),
            Some(1)
        );
    }

    #[test]
    fn two_tasks_for_one_key_and_overlapping_attempts_are_caught() {
        let enq = |key: &str, id| Record {
            op: "enqueue".into(),
            name: key.into(),
            task: Some(id),
            ..Default::default()
        };
        let h = vec![
            enq("k1", 1),
            enq("k1", 2),
            begin("a", "task", Some(1), 0),
            begin("b", "task", Some(1), 10),
            end("a", 20),
            end("b", 30),
        ];
        let r = check(&h, &[]);
        assert_eq!(r.violations.get("T4").map(|v| v.0), Some(1));
        assert_eq!(r.violations.get("T2").map(|v| v.0), Some(1));
        // Both tasks are missing from the (empty) store: T1.
        assert_eq!(r.violations.get("T1").map(|v| v.0), Some(2));
    }

    /// The shape of issue #15: attempt 1's worker stopped its command,
    /// SIGKILLed it (no `end`), and attempt 2 began elsewhere later; the
    /// instance of attempt 1 was killed by the nemesis long after.
    fn killed_history(killed: Option<(u32, i64)>, killed_after_next_begin: bool) -> Vec<Record> {
        let attempt = |effect: &str, proc: &str, n: u32, group: i64, t: i64| Record {
            proc: proc.into(),
            attempt: Some(n),
            group: Some(group),
            ..begin(effect, "task", Some(7), t)
        };
        let mut h = vec![attempt("a1", "w1.0", 1, 100, 0)];
        let bound = killed.map(|(n, group)| Record {
            op: "killed".into(),
            proc: "w1.0".into(),
            task: Some(7),
            attempt: Some(n),
            group: Some(group),
            // The worker's clock may be skewed: the file order counts.
            t: 45_000_000,
            ..Default::default()
        });
        if let (Some(k), false) = (&bound, killed_after_next_begin) {
            h.push(k.clone());
        }
        h.push(attempt("a2", "w2.0", 2, 200, 4_000));
        if let (Some(k), true) = (&bound, killed_after_next_begin) {
            h.push(k.clone());
        }
        h.push(end("a2", 5_000));
        h.push(Record {
            op: "fault".into(),
            kind: "kill-9".into(),
            proc: "w1.0".into(),
            t: 20_000,
            until: Some(20_000),
            ..Default::default()
        });
        h
    }

    #[test]
    fn a_killed_record_before_the_next_attempt_bounds_an_effect_without_end() {
        let t2 = |h: &[Record]| check(h, &[]).violations.get("T2").map(|v| v.0);
        // No bound: the effect lasts until its instance's kill-9.
        assert_eq!(t2(&killed_history(None, false)), Some(1));
        // The worker saw the command's group gone before attempt 2 began.
        let bounded = killed_history(Some((1, 100)), false);
        assert_eq!(t2(&bounded), None, "{}", check(&bounded, &[]).table());
        // Seen gone only after attempt 2 began: a real overlap.
        assert_eq!(t2(&killed_history(Some((1, 100)), true)), Some(1));
        // A record for another attempt or another group bounds nothing.
        assert_eq!(t2(&killed_history(Some((2, 100)), false)), Some(1));
        assert_eq!(t2(&killed_history(Some((1, 101)), false)), Some(1));
    }

    /// A frozen worker's command killed by its supervisor at the stop-by
    /// deadline: the supervisor's record (group only) before attempt 2's
    /// begin bounds attempt 1, though the worker's own record comes after
    /// (it woke later); the worker's late record alone does not.
    #[test]
    fn a_supervisors_killed_record_bounds_a_frozen_workers_effect() {
        let t2 = |h: &[Record]| check(h, &[]).violations.get("T2").map(|v| v.0);
        let supervisor = |proc: &str, group: i64| Record {
            op: "killed".into(),
            proc: proc.into(),
            group: Some(group),
            supervisor: true,
            t: 3_000,
            ..Default::default()
        };
        // The worker's own record after attempt 2 began: an overlap.
        let late = killed_history(Some((1, 100)), true);
        assert_eq!(t2(&late), Some(1));
        // Its supervisor's record before attempt 2 began: none.
        let mut h = late.clone();
        h.insert(1, supervisor("w1.0", 100));
        assert_eq!(t2(&h), None, "{}", check(&h, &[]).table());
        // A supervisor record of another group or instance bounds nothing.
        let mut h = late.clone();
        h.insert(1, supervisor("w1.0", 101));
        assert_eq!(t2(&h), Some(1));
        let mut h = late;
        h.insert(1, supervisor("w9.0", 100));
        assert_eq!(t2(&h), Some(1));
    }

    /// The same shape for a lock-mode job's run: its scheduler lost the
    /// lease and SIGKILLed the command (no `end`); the next holder began
    /// later. A `killed` record names the holder by its fencing token.
    #[test]
    fn a_killed_record_bounds_a_lock_holder_without_end() {
        let holder = |effect: &str, proc: &str, token: i64, group: i64, t: i64| Record {
            proc: proc.into(),
            token: Some(token),
            group: Some(group),
            ..begin(effect, "lockjob", None, t)
        };
        let killed = |proc: &str, token: i64, group: i64| Record {
            op: "killed".into(),
            proc: proc.into(),
            token: Some(token),
            group: Some(group),
            t: 1,
            ..Default::default()
        };
        let kill9 = Record {
            op: "fault".into(),
            kind: "kill-9".into(),
            proc: "s1.0".into(),
            t: 20_000,
            until: Some(20_000),
            ..Default::default()
        };
        let run = |bound: Option<Record>| {
            let mut h = vec![holder("a", "s1.0", 10, 100, 0)];
            h.extend(bound);
            h.push(holder("b", "s2.0", 11, 200, 4_000));
            h.push(end("b", 5_000));
            h.push(kill9.clone());
            check(&h, &[]).violations.get("L1").map(|v| v.0)
        };
        assert_eq!(run(None), Some(1), "unbounded: lasts until the kill-9");
        assert_eq!(run(Some(killed("s1.0", 10, 100))), None);
        // Another token, instance or group bounds nothing.
        assert_eq!(run(Some(killed("s1.0", 11, 100))), Some(1));
        assert_eq!(run(Some(killed("s2.0", 10, 100))), Some(1));
        assert_eq!(run(Some(killed("s1.0", 10, 101))), Some(1));
    }
}

#[cfg(test)]
pub(super) mod limits {
    use super::tests::pause;
    use super::*;

    /// A succeeded task of the workload queue as the store lists it.
    pub(in crate::chaos) fn task(id: i64, key: Option<&str>, started_ms: i64) -> TaskInfo {
        let at = |ms: i64| {
            chrono::DateTime::from_timestamp_millis(ms)
                .unwrap()
                .to_rfc3339()
        };
        serde_json::from_value(serde_json::json!({
            "id": id, "queue": "chaos", "kind": "command", "payload": {},
            "state": "succeeded", "priority": 0, "attempt": 1, "max_attempts": 5,
            "timeout": null, "run_at": at(0), "created_at": at(0),
            "started_at": at(started_ms), "finished_at": at(started_ms + 1),
            "cancel_requested": false, "errors": [], "concurrency_key": key,
        }))
        .unwrap()
    }

    fn effect(effect: &str, proc: &str, task: i64, begin: i64, end: Option<i64>) -> Vec<Record> {
        let b = Record {
            op: "begin".into(),
            kind: "task".into(),
            proc: proc.into(),
            effect: effect.into(),
            task: Some(task),
            attempt: Some(1),
            t: begin,
            ..Default::default()
        };
        let e = end.map(|t| Record {
            op: "end".into(),
            effect: effect.into(),
            t,
            ..Default::default()
        });
        std::iter::once(b).chain(e).collect()
    }

    fn cap(c: u32) -> Limits {
        Limits {
            queue: "chaos".into(),
            per_key_max_running: Some(c),
            rate: None,
            ..Limits::default()
        }
    }

    fn t5(h: &[Record], tasks: &[TaskInfo], limits: &Limits) -> Option<u64> {
        let r = check(h, tasks, limits);
        r.violations.get("T5").map(|v| v.0)
    }

    #[test]
    fn more_tasks_of_one_key_alive_than_the_cap_is_a_t5_violation() {
        let tasks = [
            task(1, Some("a"), 0),
            task(2, Some("a"), 0),
            task(3, Some("b"), 0),
        ];
        let h: Vec<Record> = [
            effect("e1", "w1.0", 1, 0, Some(100)),
            effect("e2", "w2.0", 2, 50, Some(150)),
            effect("e3", "w3.0", 3, 60, Some(160)),
        ]
        .concat();
        // Tasks 1 and 2 (key a) overlap: over a cap of 1, within 2.
        assert_eq!(t5(&h, &tasks, &cap(1)), Some(1));
        let r = check(&h, &tasks, &cap(1));
        let example = &r.violations["T5"].1[0];
        assert!(
            example.contains("key \"a\"") && example.contains("[1, 2]"),
            "{example}"
        );
        assert_eq!(t5(&h, &tasks, &cap(2)), None);
        // One after the other: none.
        let h: Vec<Record> = [
            effect("e1", "w1.0", 1, 0, Some(100)),
            effect("e2", "w2.0", 2, 100, Some(150)),
        ]
        .concat();
        assert_eq!(t5(&h, &tasks, &cap(1)), None);
        // Without a cap the row is not exercised.
        let r = check(&h, &tasks, &Limits::default());
        assert!(r
            .table()
            .contains("not exercised (no --per-key-max-running)"));
    }

    #[test]
    fn two_commands_of_one_task_count_once_for_t5() {
        // The unsafe wrapper runs each command twice at once: T2's case.
        let tasks = [task(1, Some("a"), 0)];
        let h: Vec<Record> = [
            effect("e1", "w1.0", 1, 0, Some(100)),
            effect("e1b", "w1.0", 1, 0, Some(100)),
        ]
        .concat();
        assert_eq!(t5(&h, &tasks, &cap(1)), None);
    }

    #[test]
    fn a_paused_workers_command_is_not_running_once_its_task_may_be_rescued() {
        let tasks = [task(1, Some("a"), 0), task(2, Some("a"), 0)];
        let mut h: Vec<Record> = [
            effect("e1", "w1.0", 1, 0, Some(9_000)),
            effect("e2", "w2.0", 2, 5_000, Some(6_000)),
        ]
        .concat();
        assert_eq!(t5(&h, &tasks, &cap(1)), Some(1));
        // w1 (and its command) frozen from 1 000 to 8 000: its lease ran
        // out, the store rescued task 1, task 2 of the key was claimed.
        h.push(pause("w1.0", 1_000, 8_000));
        assert_eq!(t5(&h, &tasks, &cap(1)), None);
        // A baton frozen alone is not excused (its supervisor kills).
        h.last_mut().unwrap().kind = "freeze".into();
        assert_eq!(t5(&h, &tasks, &cap(1)), Some(1));
    }

    #[test]
    fn a_command_paused_before_its_begin_is_not_running_once_its_task_may_be_rescued() {
        let tasks = [task(1, Some("a"), 0), task(2, Some("a"), 0)];
        // w1's command started at 500 and was frozen with w1 from 1 000 to
        // 8 000 before it recorded its begin (at 8 001); task 2 of the key
        // began at 5 000 after task 1 was rescued, and runs to 9 000.
        let frozen = pause("w1.0", 1_000, 8_000);
        let h = |spawned| {
            let mut e1 = effect("e1", "w1.0", 1, 8_001, Some(8_500));
            e1[0].spawned = spawned;
            [
                e1,
                effect("e2", "w2.0", 2, 5_000, Some(9_000)),
                vec![frozen.clone()],
            ]
            .concat()
        };
        assert_eq!(t5(&h(Some(500)), &tasks, &cap(1)), None);
        assert_eq!(t5(&h(None), &tasks, &cap(1)), Some(1), "its begin alone");
    }

    #[test]
    fn n_plus_one_starts_within_a_period_are_a_t6_violation() {
        let limits = |n: u32| Limits {
            queue: "chaos".into(),
            per_key_max_running: None,
            rate: Some(RateLimit::new(n, std::time::Duration::from_secs(1)).unwrap()),
            ..Limits::default()
        };
        // Starts at 0, 400, 999 ms: 3 in [0, 1 s).
        let tasks = [task(1, None, 0), task(2, None, 400), task(3, None, 999)];
        let t6 = |l: &Limits| check(&[], &tasks, l).violations.get("T6").map(|v| v.0);
        assert_eq!(t6(&limits(3)), None);
        assert_eq!(t6(&limits(2)), Some(1));
        let r = check(&[], &tasks, &limits(2));
        assert!(
            r.violations["T6"].1[0].contains("tasks [1, 2, 3]"),
            "{}",
            r.table()
        );
        // 1 000 ms apart is the next window: [0, 1 s) is half-open.
        let tasks = [task(1, None, 0), task(2, None, 1_000)];
        assert_eq!(check(&[], &tasks, &limits(1)).violations.get("T6"), None);
        // Another queue's starts do not count.
        let mut other = task(3, None, 500);
        other.queue = "other".into();
        let tasks = [task(1, None, 0), other];
        assert_eq!(check(&[], &tasks, &limits(1)).violations.get("T6"), None);
    }
}
