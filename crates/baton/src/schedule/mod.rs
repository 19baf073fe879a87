//! Schedules: cron and interval jobs that run once per slot across any
//! number of instances, with no leader.
//!
//! [`spec`] is the pure arithmetic: which instants are a job's slots
//! ([`spec::Schedule::next_after`]) and which of them are due after a
//! downtime ([`spec::due_slots`], with the [`spec::Misfire`] policy). Every
//! instance computes the same slots from the same inputs, so the store's
//! cursor compare-and-set (DESIGN.md S1) is all that is needed to run each
//! slot once.

mod backfill;
pub mod definitions;
mod job;
mod lock_run;
mod plan;
mod reload;
pub mod scheduler;
mod slots;
pub mod spec;
mod status;

/// Slot keys are the store's (the queue checks them too); re-exported
/// here where a schedule's user looks for them.
pub use crate::store::{is_slot_key, slot_key};
pub use backfill::{
    backfill, backfill_slots, Backfill, BackfilledSlot, BACKFILL_DEFAULT_MAX, BACKFILL_LIMIT,
};
pub use scheduler::{
    is_lock_run_record, job_state, job_statuses, latest_slot, run_skipped, set_paused,
    set_paused_with, slot_report, trigger, trigger_slot, trigger_with, Job, JobMode, JobStatus,
    Scheduler, SlotOutcome, SlotReport, SlotRun, StoreClock, LOCK_BUSY, RELOAD_EVERY,
};
pub use spec::{Misfire, Schedule};
