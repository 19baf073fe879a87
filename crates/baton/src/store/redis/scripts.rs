//! The Lua scripts, one file each under `lua/` (comments at the head say
//! their `KEYS`, `ARGV` and reply). The queue and job scripts start with
//! `prelude.lua` (key helpers, the clock, task encoding), the lock scripts
//! with `lock_prelude.lua`. Each runs with `EVALSHA` (on `NOSCRIPT`
//! loaded and sent again: `RedisBackend::invoke`), so it is atomic on the
//! server.

use redis::Script;

const PRELUDE: &str = include_str!("lua/prelude.lua");
const ENQUEUE: &str = include_str!("lua/enqueue.lua");
const CLAIM: &str = include_str!("lua/claim.lua");
/// The fair claim's plan, which the claim script starts with.
const FAIR: &str = include_str!("lua/fair.lua");
const HEARTBEAT: &str = include_str!("lua/heartbeat.lua");
const FINISH: &str = include_str!("lua/finish.lua");
const PROGRESS: &str = include_str!("lua/progress.lua");
const RESCUE: &str = include_str!("lua/rescue.lua");
const CANCEL: &str = include_str!("lua/cancel.lua");
const RETRY: &str = include_str!("lua/retry.lua");
const LIST: &str = include_str!("lua/list.lua");
const AUDIT: &str = include_str!("lua/audit.lua");
const QUEUE_VIEW: &str = include_str!("lua/queue_view.lua");
const JOBDEFS: &str = include_str!("lua/jobdefs.lua");
const ROLLUP: &str = include_str!("lua/rollup.lua");
const STATS: &str = include_str!("lua/stats.lua");
const QUEUE_SET_PAUSED: &str = include_str!("lua/queue_set_paused.lua");
const PRUNE: &str = include_str!("lua/prune.lua");
const DELETE: &str = include_str!("lua/delete.lua");
const JOB_REGISTER: &str = include_str!("lua/job_register.lua");
const JOB_ADVANCE: &str = include_str!("lua/job_advance.lua");
const JOB_RELEASE: &str = include_str!("lua/job_release.lua");
const JOB_SET_PAUSED: &str = include_str!("lua/job_set_paused.lua");
const JOB_LIST: &str = include_str!("lua/job_list.lua");
const SLOT_GET: &str = include_str!("lua/slot_get.lua");
const MIGRATE: &str = include_str!("lua/migrate.lua");
const IDS: &str = include_str!("lua/ids.lua");
const JOB_IMPORT: &str = include_str!("lua/job_import.lua");
const TASK_IMPORT: &str = include_str!("lua/task_import.lua");
const UNIQUE_UPGRADE: &str = include_str!("lua/unique_upgrade.lua");
const FAIR_UPGRADE: &str = include_str!("lua/fair_upgrade.lua");
const LOCK_PRELUDE: &str = include_str!("lua/lock_prelude.lua");
const LOCK_ACQUIRE: &str = include_str!("lua/lock_acquire.lua");
const LOCK_EXTEND: &str = include_str!("lua/lock_extend.lua");
const LOCK_RELEASE: &str = include_str!("lua/lock_release.lua");
const LOCK_REVOKE: &str = include_str!("lua/lock_revoke.lua");
const LOCK_GET: &str = include_str!("lua/lock_get.lua");
const LOCK_UPGRADE: &str = include_str!("lua/lock_upgrade.lua");

/// Every script, each the queue prelude or the lock prelude followed by its
/// body.
pub(super) struct Scripts {
    pub enqueue_code: String,
    pub enqueue: Script,
    pub claim: Script,
    pub heartbeat: Script,
    pub finish: Script,
    pub progress: Script,
    pub rescue: Script,
    pub cancel: Script,
    pub retry: Script,
    pub list: Script,
    pub audit: Script,
    /// Declared queue limits (index base) and a queue's keys' load.
    pub queue_view: Script,
    /// Job definitions (an index script).
    pub jobdefs: Script,
    /// The throughput rollup (an index script).
    pub rollup: Script,
    pub stats: Script,
    pub queue_set_paused: Script,
    pub prune: Script,
    /// Delete finished tasks by id.
    pub delete: Script,
    pub job_register: Script,
    pub job_advance: Script,
    pub job_release: Script,
    pub job_set_paused: Script,
    pub job_list: Script,
    pub slot_get: Script,
    pub migrate: Script,
    /// Reserve task ids (an index script).
    pub ids: Script,
    /// Move a job's record to its new home queue.
    pub job_import: Script,
    /// Schema step 7 -> 8: one task into its queue's tag.
    pub task_import: Script,
    /// Schema step 9 -> 10: unique keys into the default scope.
    pub unique_upgrade: Script,
    /// Schema step 14 -> 15: a queue's `ready` into fair claiming's index.
    pub fair_upgrade: Script,
    pub lock_acquire: Script,
    pub lock_extend: Script,
    pub lock_release: Script,
    pub lock_revoke: Script,
    pub lock_get: Script,
    /// Schema upgrades of one lock key (only a key baton wrote).
    pub lock_upgrade: Script,
}

impl Scripts {
    pub(super) fn new() -> Scripts {
        let (prelude, lock_prelude) = (test_clock(PRELUDE), test_clock(LOCK_PRELUDE));
        let q = |body: &str| Script::new(&format!("{prelude}{body}"));
        let l = |body: &str| Script::new(&format!("{lock_prelude}{body}"));
        let enqueue_code = format!("{prelude}{ENQUEUE}");
        Scripts {
            enqueue: Script::new(&enqueue_code),
            enqueue_code,
            claim: q(&format!("{FAIR}{CLAIM}")),
            heartbeat: q(HEARTBEAT),
            finish: q(FINISH),
            progress: q(PROGRESS),
            rescue: q(RESCUE),
            cancel: q(CANCEL),
            retry: q(RETRY),
            list: q(LIST),
            audit: q(AUDIT),
            queue_view: q(QUEUE_VIEW),
            jobdefs: q(JOBDEFS),
            rollup: q(ROLLUP),
            stats: q(STATS),
            queue_set_paused: q(QUEUE_SET_PAUSED),
            prune: q(PRUNE),
            delete: q(DELETE),
            job_register: q(JOB_REGISTER),
            job_advance: q(JOB_ADVANCE),
            job_release: q(JOB_RELEASE),
            job_set_paused: q(JOB_SET_PAUSED),
            job_list: q(JOB_LIST),
            slot_get: q(SLOT_GET),
            migrate: q(MIGRATE),
            ids: q(IDS),
            job_import: q(JOB_IMPORT),
            task_import: q(TASK_IMPORT),
            unique_upgrade: q(UNIQUE_UPGRADE),
            fair_upgrade: q(FAIR_UPGRADE),
            lock_acquire: l(LOCK_ACQUIRE),
            lock_extend: l(LOCK_EXTEND),
            lock_release: l(LOCK_RELEASE),
            lock_revoke: l(LOCK_REVOKE),
            lock_get: l(LOCK_GET),
            lock_upgrade: l(LOCK_UPGRADE),
        }
    }
}

/// The prelude as it is: without the feature `test-clock` the scripts read
/// the server's `TIME`, nothing else.
#[cfg(not(feature = "test-clock"))]
fn test_clock(prelude: &str) -> String {
    prelude.to_string()
}

/// What starts the test clock's argument, the last of every script call
/// in a build with the feature `test-clock` (see [`test_clock`]).
#[cfg(feature = "test-clock")]
pub(super) const TEST_CLOCK_MARK: &str = "baton-test-clock:";

/// The prelude with every `TIME` shifted by the test clock's offset
/// (feature `test-clock`, tests only). The client passes the offset (µs,
/// read from `<prefix>{baton}:test_clock`) as every script's last
/// argument, `baton-test-clock:<µs>` (`RedisBackend::invoke`); the
/// prelude takes it off `ARGV` before the script reads its arguments, so
/// the scripts walking `#ARGV` see theirs only. A script runs on its own
/// shard of a Redis Cluster, where the key is not, so it could not read
/// the offset itself. A call without the argument fails (it would
/// otherwise eat a real one).
#[cfg(feature = "test-clock")]
fn test_clock(prelude: &str) -> String {
    let time = format!(
        "local baton_test_offset = ARGV[#ARGV]\n\
         if type(baton_test_offset) ~= 'string' or string.sub(baton_test_offset, 1, {n}) ~= '{TEST_CLOCK_MARK}' then\n\
         \x20 return redis.error_reply('baton test clock: the offset argument is missing')\n\
         end\n\
         table.remove(ARGV)\n\
         baton_test_offset = tonumber(string.sub(baton_test_offset, {m})) or 0\n\
         local function baton_test_time()\n\
         \x20 local t = redis.call('TIME')\n\
         \x20 local us = tonumber(t[1]) * 1000000 + tonumber(t[2]) + baton_test_offset\n\
         \x20 local sec = math.floor(us / 1000000)\n\
         \x20 return {{sec, us - sec * 1000000}}\n\
         end\n",
        n = TEST_CLOCK_MARK.len(),
        m = TEST_CLOCK_MARK.len() + 1,
    );
    format!(
        "{time}{}",
        prelude.replace("redis.call('TIME')", "baton_test_time()")
    )
}
