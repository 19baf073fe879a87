//! A job's definition: its name, schedule, mode (durable or lock) and
//! policies, and the task that runs one of its slots.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::spec::{Misfire, Schedule, DEFAULT_MAX_CATCH_UP};
use crate::error::InvalidInput;
use crate::lock::LockOptions;
use crate::names::validate_name;
use crate::queue::TaskBuilder;
use crate::store::{slot_key, NewTask, Overlap};

/// How a job's slots are run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobMode {
    /// Each slot is a durable task in the queue.
    Durable,
    /// Each instance fires; a lease lock lets one run (ShedLock).
    Lock {
        /// Lease length (the run's upper bound if its holder dies).
        at_most: Duration,
        /// Minimum hold after the grant.
        at_least: Duration,
    },
}

/// A job definition.
#[derive(Debug, Clone)]
#[must_use = "a Job does nothing until added to a Scheduler"]
pub struct Job {
    /// Name: unique per store; the cursor's key and the lock's name.
    pub name: String,
    /// When its slots are.
    pub schedule: Schedule,
    /// Durable (queued) or lock mode.
    pub mode: JobMode,
    /// Lock mode only: wait this long after each run instead of firing at
    /// slot instants (ShedLock's `fixedDelay`).
    pub fixed_delay: Option<Duration>,
    /// Missed-slot policy (durable mode).
    pub misfire: Misfire,
    /// Most missed slots run with [`Misfire::All`].
    pub max_catch_up: usize,
    /// How old a slot may be and still run with [`Misfire::None`].
    pub misfire_grace: Duration,
    /// What to do when the previous run is unfinished.
    pub overlap: Overlap,
    /// A delay of up to this long added to each slot's run (not to the
    /// slot itself), the same on every instance: derived from the job's
    /// name and the slot ([`Job::jitter_at`]), so a fleet of jobs on one
    /// cron spreads its runs instead of stampeding, while every instance
    /// agrees on each run's time.
    pub jitter: Duration,
    /// Queue for durable runs.
    pub queue: String,
    /// Task kind for durable runs (default: the job's name).
    pub kind: String,
    /// Task payload for durable runs.
    pub payload: serde_json::Value,
    /// Task priority.
    pub priority: i32,
    /// Attempts per slot.
    pub max_attempts: u32,
    /// Timeout per attempt.
    pub timeout: Option<Duration>,
    /// Durable mode: take each on-time slot this long before it (by store
    /// time), so its task, due at the slot, is queued and announced ahead
    /// and a worker claims it as the slot comes (at most a quarter of the
    /// gap to the following slot). The store refuses the take before
    /// `slot - lead` by its clock; pause is judged that much earlier, but
    /// the overlap rule still at the slot (an unfinished previous run
    /// defers the take to the slot, where the rule applies). Missed slots
    /// (misfire, catch-up) are taken only once due. Lock mode ignores it:
    /// its run starts at once.
    pub lead: Duration,
    /// No slot before this instant runs (Temporal's start time, a
    /// CronJob that begins later): the first slot is the first at or after
    /// it. `None`: from when the job is first seen.
    pub start_at: Option<DateTime<Utc>>,
    /// Missed slots older than this (by the store's clock when the cursor
    /// moves) are recorded as skipped whatever the misfire policy
    /// (Temporal's catch-up window): after a long outage, `misfire = all`
    /// runs only the last window's slots. `None`: no window.
    pub catch_up_window: Option<Duration>,
    /// No slot after this instant runs; once the store's clock passes it
    /// the job runs nothing more, not even slots it missed before it.
    pub end_at: Option<DateTime<Utc>>,
    /// The document the job was defined from, when its runs depend on more
    /// than the fields above (`baton`'s `[[job]]` table, whose command the
    /// worker runs): counted in [`Job::fingerprint`].
    pub definition: Option<serde_json::Value>,
}

/// The default [`Job::lead`].
pub const DEFAULT_LEAD: Duration = Duration::from_millis(150);

impl Job {
    /// A durable job on the default queue, misfire `latest`, overlap
    /// `skip`, 3 attempts, kind = name.
    pub fn new(name: impl Into<String>, schedule: Schedule) -> Job {
        let name = name.into();
        Job {
            kind: name.clone(),
            name,
            schedule,
            mode: JobMode::Durable,
            fixed_delay: None,
            misfire: Misfire::Latest,
            max_catch_up: DEFAULT_MAX_CATCH_UP,
            misfire_grace: Duration::from_secs(60),
            overlap: Overlap::Skip,
            jitter: Duration::ZERO,
            queue: crate::queue::DEFAULT_QUEUE.into(),
            payload: serde_json::json!({}),
            priority: 0,
            max_attempts: crate::queue::DEFAULT_MAX_ATTEMPTS,
            timeout: None,
            lead: DEFAULT_LEAD,
            start_at: None,
            catch_up_window: None,
            end_at: None,
            definition: None,
        }
    }
    /// A durable job whose slots run as typed tasks: kind `A::KIND`,
    /// payload `args`, and `A`'s [`insert_opts`](crate::queue::TaskArgs::insert_opts)
    /// (queue, priority, attempts, timeout) where they are set. Fails with
    /// [`InvalidInput`] (field `payload`) when `args` does not serialize.
    ///
    /// ```
    /// use baton::queue::TaskArgs;
    /// use baton::schedule::{Job, Schedule};
    ///
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// struct Report { region: String }
    /// impl TaskArgs for Report { const KIND: &'static str = "report"; }
    ///
    /// let schedule = Schedule::cron("0 */6 * * *", "Asia/Seoul")?;
    /// let job = Job::durable("six-hourly-report", schedule, &Report { region: "kr".into() })?;
    /// assert_eq!(job.kind, "report");
    /// assert_eq!(job.payload["region"], "kr");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn durable<A: crate::queue::TaskArgs>(
        name: impl Into<String>,
        schedule: Schedule,
        args: &A,
    ) -> Result<Job, InvalidInput> {
        let mut job = Job::new(name, schedule);
        job.kind = A::KIND.into();
        job.payload = crate::queue::payload_of(args)?;
        let opts = A::insert_opts();
        if let Some(q) = opts.queue {
            job.queue = q;
        }
        if let Some(p) = opts.priority {
            job.priority = p;
        }
        if let Some(n) = opts.max_attempts {
            job.max_attempts = n;
        }
        job.timeout = opts.timeout.or(job.timeout);
        Ok(job)
    }

    /// Lock mode with these lease bounds.
    pub fn lock_mode(mut self, at_most: Duration, at_least: Duration) -> Job {
        self.mode = JobMode::Lock { at_most, at_least };
        self
    }
    /// Set the misfire policy.
    pub fn misfire(mut self, m: Misfire) -> Job {
        self.misfire = m;
        self
    }
    /// Set the overlap rule.
    pub fn overlap(mut self, o: Overlap) -> Job {
        self.overlap = o;
        self
    }
    /// Set the queue.
    pub fn queue(mut self, q: impl Into<String>) -> Job {
        self.queue = q.into();
        self
    }
    /// Set attempts per slot.
    pub fn max_attempts(mut self, n: u32) -> Job {
        self.max_attempts = n;
        self
    }
    /// Set the task kind of durable runs (default: the job's name).
    pub fn kind(mut self, kind: impl Into<String>) -> Job {
        self.kind = kind.into();
        self
    }
    /// Set the task payload of durable runs (default `{}`).
    pub fn payload(mut self, payload: serde_json::Value) -> Job {
        self.payload = payload;
        self
    }
    /// Set the task priority (-100..=100, lower first; checked when the
    /// job is added).
    pub fn priority(mut self, p: i32) -> Job {
        self.priority = p;
        self
    }
    /// Set the timeout per attempt.
    pub fn timeout(mut self, d: Duration) -> Job {
        self.timeout = Some(d);
        self
    }
    /// Set the most missed slots run with [`Misfire::All`].
    pub fn max_catch_up(mut self, n: usize) -> Job {
        self.max_catch_up = n;
        self
    }
    /// Set how old a slot may be and still run with [`Misfire::None`].
    pub fn misfire_grace(mut self, d: Duration) -> Job {
        self.misfire_grace = d;
        self
    }
    /// Set the random delay added to each run (see [`Job::jitter`]).
    pub fn jitter(mut self, d: Duration) -> Job {
        self.jitter = d;
        self
    }
    /// Set how early an on-time slot is taken (see [`Job::lead`]).
    pub fn lead(mut self, d: Duration) -> Job {
        self.lead = d;
        self
    }
    /// Record missed slots older than `d` as skipped (see
    /// [`Job::catch_up_window`]).
    pub fn catch_up_window(mut self, d: Duration) -> Job {
        self.catch_up_window = Some(d);
        self
    }
    /// Run no slot before `t` (see [`Job::start_at`]).
    pub fn starts_at(mut self, t: DateTime<Utc>) -> Job {
        self.start_at = Some(t);
        self
    }
    /// Run no slot after `t` (see [`Job::end_at`]); must be after
    /// [`Job::start_at`], checked when the job is added.
    pub fn ends_at(mut self, t: DateTime<Utc>) -> Job {
        self.end_at = Some(t);
        self
    }
    /// Whether `slot` is within the job's start and end.
    pub fn in_window(&self, slot: DateTime<Utc>) -> bool {
        self.start_at.is_none_or(|s| slot >= s) && self.end_at.is_none_or(|e| slot <= e)
    }
    /// Lock mode only: wait `d` after each run instead of firing at slot
    /// instants (ShedLock's `fixedDelay`); refused for durable jobs when
    /// the job is added.
    pub fn fixed_delay(mut self, d: Duration) -> Job {
        self.fixed_delay = Some(d);
        self
    }

    pub(super) fn validate(&self) -> Result<(), InvalidInput> {
        let ctx = |e: InvalidInput| {
            InvalidInput::new(format!("job {:?}: {}", self.name, e.field), e.problem)
        };
        validate_name("job name", &self.name)?;
        if let (Some(s), Some(e)) = (self.start_at, self.end_at) {
            if e <= s {
                return Err(ctx(InvalidInput::new(
                    "end_at",
                    format!(
                        "{} is not after start_at {}; the job would never run",
                        crate::format_time(e),
                        crate::format_time(s)
                    ),
                )));
            }
        }
        if let JobMode::Lock { at_most, at_least } = self.mode {
            if self.overlap.may_wait() {
                // A lock-mode run holds the job's lease lock for its whole
                // run, so runs never overlap and there is no queued slot
                // to hold back or previous task to cancel.
                return Err(ctx(InvalidInput::new(
                    "overlap",
                    format!(
                        "{} applies to durable jobs only (a lock-mode job runs one slot at a \
                         time under its lease lock); use skip or allow",
                        self.overlap
                    ),
                )));
            }
            // Checked only: the scheduler builds its own when it runs.
            LockOptions::new(at_most)
                .at_least(at_least)
                .validate()
                .map_err(ctx)?;
        } else if self.fixed_delay.is_some() {
            return Err(ctx(InvalidInput::new(
                "fixed_delay",
                "applies only to lock mode",
            )));
        }
        self.task(Utc::now(), false).map(|_| ()).map_err(ctx)
    }

    /// The offset of `slot`'s run from the slot, from 0 to
    /// [`Job::jitter`]: a hash of the job's name and the slot, the same on
    /// every instance and every build (FNV-1a, not the standard library's
    /// per-process hasher).
    ///
    /// ```
    /// use std::time::Duration;
    /// use baton::schedule::{Job, Schedule};
    /// let job = Job::new("hourly", Schedule::cron("0 * * * *", None)?).jitter(Duration::from_secs(30));
    /// let slot = chrono::DateTime::parse_from_rfc3339("2026-12-03T10:00:00Z")?.to_utc();
    /// assert_eq!(job.jitter_at(slot), job.jitter_at(slot));
    /// assert!(job.jitter_at(slot) <= Duration::from_secs(30));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn jitter_at(&self, slot: DateTime<Utc>) -> Duration {
        jitter_of(&self.name, slot, self.jitter)
    }

    /// The next `n` slots after `t` that this job runs, within its
    /// [`start_at`](Job::start_at) and [`end_at`](Job::end_at), each with
    /// its time in the schedule's zone; a slot's run is
    /// [`Job::jitter_at`] after it.
    pub fn next_fires(&self, t: DateTime<Utc>, n: usize) -> Vec<super::spec::FireTime> {
        let from = match self.start_at {
            Some(s) => t.max(s - chrono::Duration::nanoseconds(1)),
            None => t,
        };
        let mut fires = self.schedule.next_fires(from, n);
        fires.retain(|f| self.in_window(f.at));
        fires
    }

    /// The unique key of this job's run for `slot`: `job|RFC3339`.
    pub fn slot_key(&self, slot: DateTime<Utc>) -> String {
        slot_key(&self.name, slot)
    }

    /// The task that runs `slot`. Triggered runs are due now; scheduled
    /// runs at the slot (plus jitter).
    pub fn task(&self, slot: DateTime<Utc>, triggered: bool) -> Result<NewTask, InvalidInput> {
        let mut t = TaskBuilder::new(self.kind.clone(), self.payload.clone())
            .queue(self.queue.clone())
            .priority(self.priority)
            // A lock-mode run is its instance's one attempt: if that
            // instance dies, rescue fails it ("lease expired").
            .max_attempts(match self.mode {
                JobMode::Durable => self.max_attempts,
                JobMode::Lock { .. } => 1,
            })
            .unique_key(self.slot_key(slot))
            .unique_forever(true)
            .slot(self.name.clone(), slot);
        if !triggered {
            let jitter = self.jitter_at(slot);
            t = t.run_at(slot + chrono::Duration::from_std(jitter).unwrap_or_default());
        }
        if let Some(d) = self.timeout {
            t = t.timeout(d);
        }
        t.build()
    }
}

/// `max` scaled by a hash of `job` and `slot` (see [`Job::jitter_at`]), in
/// whole milliseconds.
fn jitter_of(job: &str, slot: DateTime<Utc>, max: Duration) -> Duration {
    let span = u64::try_from(max.as_millis()).unwrap_or(u64::MAX);
    if span == 0 {
        return Duration::ZERO;
    }
    // FNV-1a, 64-bit, over the name, a separator and the slot's µs.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let micros = slot.timestamp_micros().to_le_bytes();
    let bytes = job.as_bytes().iter().chain(&[0u8]).chain(&micros);
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    Duration::from_millis(h % span.saturating_add(1))
}

impl Job {
    /// A fingerprint of this definition (16 hex digits): equal for jobs
    /// that schedule and run alike, so that instances can tell, through
    /// the job's record in the store, that they define one job two ways
    /// (DESIGN.md D2). Its name, schedule, mode, policies, queue, kind,
    /// payload (canonical JSON), limits and end count; `start_at` does not
    /// (a scheduler raises it to when a definition in the store was written
    /// or deleted, which a config file does not say).
    pub fn fingerprint(&self) -> String {
        let text = format!(
            "{}\n{}\n{:?}\n{:?}\n{:?}\n{}\n{:?}\n{}\n{:?}\n{}\n{}\n{}\n{}\n{}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}",
            self.name,
            self.schedule,
            self.mode,
            self.fixed_delay,
            self.misfire,
            self.max_catch_up,
            self.misfire_grace,
            self.overlap,
            self.jitter,
            self.queue,
            self.kind,
            crate::store::canonical_json(&self.payload),
            self.priority,
            self.max_attempts,
            self.timeout,
            self.lead,
            self.catch_up_window,
            self.end_at,
            self.definition.as_ref().map(crate::store::canonical_json),
        );
        // FNV-1a, 64 bits: stable across builds and platforms.
        let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        format!("{hash:016x}")
    }
}

pub(super) fn random_upto(d: Duration) -> Duration {
    if d.is_zero() {
        Duration::ZERO
    } else {
        Duration::from_millis(fastrand::u64(0..=d.as_millis() as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().to_utc()
    }

    /// The same offset for a (job, slot) wherever it is computed, within
    /// the bound, and spread: jobs on one slot, and one job's slots, get
    /// different offsets.
    #[test]
    fn jitter_is_per_job_and_slot_alike_everywhere_and_spread() {
        let max = Duration::from_secs(60);
        let slot = at("2026-12-03T10:00:00Z");
        assert_eq!(jitter_of("a", slot, max), jitter_of("a", slot, max));
        // A fixed value: the hash may not change between builds.
        assert_eq!(
            jitter_of("report", slot, max),
            Duration::from_millis(26_773)
        );
        let offsets: std::collections::BTreeSet<Duration> = (0..50)
            .map(|i| jitter_of(&format!("job-{i}"), slot, max))
            .collect();
        assert!(
            offsets.len() > 40,
            "50 jobs share {} offsets",
            offsets.len()
        );
        assert!(offsets.iter().all(|d| *d <= max));
        let mut slots = std::collections::BTreeSet::new();
        for h in 0..24 {
            slots.insert(jitter_of("a", slot + chrono::Duration::hours(h), max));
        }
        assert!(slots.len() > 20, "24 slots share {} offsets", slots.len());
        assert_eq!(jitter_of("a", slot, Duration::ZERO), Duration::ZERO);
        assert!(jitter_of("a", slot, Duration::from_millis(1)) <= Duration::from_millis(1));
    }

    #[test]
    fn next_fires_keep_within_start_and_end() {
        let every_hour = Schedule::every(Duration::from_secs(3600)).unwrap();
        let job = Job::new("h", every_hour)
            .starts_at(at("2027-01-01T03:00:00Z"))
            .ends_at(at("2027-01-01T05:00:00Z"));
        let fires: Vec<_> = job
            .next_fires(at("2026-12-31T00:00:00Z"), 10)
            .into_iter()
            .map(|f| f.at)
            .collect();
        assert_eq!(
            fires,
            [
                at("2027-01-01T03:00:00Z"),
                at("2027-01-01T04:00:00Z"),
                at("2027-01-01T05:00:00Z")
            ]
        );
    }

    #[test]
    fn lock_mode_refuses_the_waiting_overlap_policies_naming_the_field() {
        let every = Schedule::every(Duration::from_secs(60)).unwrap();
        let lock = |o| {
            Job::new("l", every.clone())
                .lock_mode(Duration::from_secs(30), Duration::ZERO)
                .overlap(o)
                .validate()
        };
        for o in [
            Overlap::BufferOne,
            Overlap::BufferAll,
            Overlap::CancelOther,
            Overlap::TerminateOther,
        ] {
            let e = lock(o).unwrap_err();
            assert_eq!(e.field, "job \"l\": overlap", "{e}");
            assert!(e.problem.contains(o.as_str()), "{e}");
        }
        assert!(lock(Overlap::Skip).is_ok() && lock(Overlap::Allow).is_ok());
        assert!(Job::new("d", every)
            .overlap(Overlap::CancelOther)
            .validate()
            .is_ok());
    }
}
