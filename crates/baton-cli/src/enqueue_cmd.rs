//! `baton enqueue`: a command task, its unique key and options, and a
//! debounce or throttle on the key.

use std::time::Duration;

use anyhow::Context;
use baton::queue::{EnqueueOutcome, Queue, TaskBuilder};
use baton::Error;
use chrono::{DateTime, Utc};

use crate::values::{duration_arg, rfc3339_arg};
use crate::{command_task, connect, note, outln, StoreArg};

/// Arguments of `baton enqueue`.
#[derive(clap::Args, Debug)]
pub struct EnqueueArgs {
    #[command(flatten)]
    pub store: StoreArg,
    /// Queue name.
    #[arg(long, default_value = baton::queue::DEFAULT_QUEUE)]
    pub queue: String,
    /// Idempotency key: the same key returns the same task while it is
    /// unfinished. Compared with tasks of the same queue (all command
    /// tasks are one kind) unless `--unique-scope` widens it.
    #[arg(long, visible_alias = "unique-key")]
    pub key: Option<String>,
    /// What the key is compared with: kind-in-queue (default), queue,
    /// kind (every queue) or global (every task of the store, as before
    /// scopes). kind and global are refused on Redis, which keeps keys
    /// per queue.
    #[arg(long, value_name = "SCOPE", value_parser = unique_scope_arg)]
    pub unique_scope: Option<baton::queue::UniqueScope>,
    /// Make the command (the payload) part of the key: the same command
    /// enqueued again while its task is unfinished returns that task.
    #[arg(long)]
    pub unique_by_args: bool,
    /// Make this host's clock's time bucket part of the key (e.g. 1h:
    /// one task per key per UTC hour).
    #[arg(long, value_name = "PERIOD", value_parser = duration_arg)]
    pub unique_period: Option<Duration>,
    /// Keep the key taken after the task finished (until pruned): the
    /// same as `--unique-hold forever`.
    #[arg(long, conflicts_with = "unique_hold")]
    pub key_forever: bool,
    /// How long the key stays taken: unfinished (default: while the task
    /// is pending or running), until-failed (also once it succeeded; a
    /// task that failed for good or was cancelled frees it) or forever
    /// (until pruned).
    #[arg(long, value_name = "HOLD", value_parser = unique_hold_arg)]
    pub unique_hold: Option<baton::queue::UniqueHold>,
    /// Concurrency key (e.g. customer:42): a worker whose queue has a
    /// per-key cap (`--per-key-max-running`) runs at most that many tasks
    /// of one key at once, across every worker.
    #[arg(long, value_name = "KEY")]
    pub concurrency_key: Option<String>,
    /// Debounce on the unique key (e.g. 5s): run once, this long after
    /// the last enqueue of the key. A pending task holding the key takes
    /// this command and priority and is due this long from now (the same
    /// id is printed); a running one is left alone and a new task takes
    /// the key. Needs --key (or --unique-by-args); 1ms to 30d.
    #[arg(long, value_name = "DURATION", value_parser = duration_arg,
          conflicts_with_all = ["throttle", "delay", "at"])]
    pub debounce: Option<Duration>,
    /// Throttle on the unique key (e.g. 1h): at most one start per
    /// period. While a task with the key started less than this long ago
    /// (the store's clock), nothing is inserted: the task that started is
    /// printed, and a note says when the key is accepted again (exit
    /// 75, busy). Needs --key (or --unique-by-args); 1s to 366d.
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub throttle: Option<Duration>,
    /// Priority from -100 to 100; lower runs first.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = priority_arg)]
    pub priority: i32,
    /// Run no sooner than this long from now.
    #[arg(long, value_parser = duration_arg, conflicts_with = "at")]
    pub delay: Option<Duration>,
    /// Run no sooner than this instant (RFC 3339).
    #[arg(long, value_parser = rfc3339_arg)]
    pub at: Option<DateTime<Utc>>,
    /// Attempts in total.
    #[arg(long, default_value_t = baton::queue::DEFAULT_MAX_ATTEMPTS, allow_negative_numbers = true, value_parser = attempts_arg)]
    pub max_attempts: u32,
    /// Timeout per attempt.
    #[arg(long, value_parser = duration_arg)]
    pub timeout: Option<Duration>,
    /// The enqueuer's W3C trace context
    /// (`00-<trace id>-<span id>-<flags>`), kept on the task: its attempts'
    /// spans link to it (with the `otel` feature).
    #[arg(long, env = "TRACEPARENT")]
    pub traceparent: Option<String>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    /// The command to run, after `--`.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

/// `baton enqueue`.
pub async fn enqueue(a: EnqueueArgs) -> anyhow::Result<u8> {
    command_task::check_argv(&a.command)
        .map_err(|problem| Error::from(baton::InvalidInput::new("COMMAND", problem)))?;
    let mut t = TaskBuilder::new(command_task::KIND, command_task::payload(&a.command))
        .queue(&a.queue)
        .priority(a.priority)
        .max_attempts(a.max_attempts);
    let keyed = a.key.is_some() || a.unique_by_args || a.unique_period.is_some();
    for (flag, given) in [
        ("--unique-scope", a.unique_scope.is_some()),
        ("--key-forever", a.key_forever),
        ("--unique-hold", a.unique_hold.is_some()),
    ] {
        if given && !keyed {
            return Err(Error::from(baton::InvalidInput::new(
                flag,
                "applies to a unique key; give --key (--unique-key), --unique-by-args or \
                 --unique-period too",
            ))
            .into());
        }
    }
    t = unique_args(
        t,
        a.key.as_deref(),
        &baton::queue::UniqueOpts {
            scope: a.unique_scope.unwrap_or_default(),
            by_args: a.unique_by_args,
            period: a.unique_period,
            hold: a
                .unique_hold
                .unwrap_or(baton::queue::UniqueHold::forever(a.key_forever)),
        },
    );
    if let Some(d) = a.delay {
        t = t.delay(d);
    }
    if let Some(d) = a.debounce {
        t = t.debounce(d);
    }
    if let Some(p) = a.throttle {
        t = t.throttle(p);
    }
    if let Some(at) = a.at {
        t = t.run_at(at);
    }
    if let Some(d) = a.timeout {
        t = t.timeout(d);
    }
    if let Some(tp) = &a.traceparent {
        t = t.traceparent(tp);
    }
    if let Some(k) = &a.concurrency_key {
        t = t.concurrency_key(k);
    }
    // Validate before connecting, so bad input never touches the store.
    t.clone().build().map_err(Error::from)?;
    let store = connect(&a.store).await.context("connecting to the store")?;
    let e = Queue::new(store).enqueue(t).await?;
    if a.json {
        outln!("{}", crate::shapes::enqueued(&e));
    } else {
        outln!("{}", e.id);
    }
    let key = unique_shown(a.key.as_deref());
    match e.outcome {
        EnqueueOutcome::Inserted => {}
        EnqueueOutcome::Existing => note!(
            "baton: the unique key {key} is taken by task {}; nothing was inserted",
            e.id
        ),
        EnqueueOutcome::Debounced => note!(
            "baton: debounced: pending task {} of the key {key} takes this command and is due \
             {} from now",
            e.id,
            baton::format_duration(a.debounce.unwrap_or_default())
        ),
        EnqueueOutcome::Throttled { until } => {
            note!(
                "baton: throttled: task {} of the key {key} started within the last {}; \
                 nothing was inserted; the key is accepted again from {}",
                e.id,
                baton::format_duration(a.throttle.unwrap_or_default()),
                crate::output::ts(until)
            );
            return Ok(crate::EXIT_BUSY);
        }
    }
    Ok(0)
}

/// `t` with the caller's unique key (if any) and its options, as `baton
/// enqueue` and the admin API take them.
pub fn unique_args(
    t: TaskBuilder,
    key: Option<&str>,
    opts: &baton::queue::UniqueOpts,
) -> TaskBuilder {
    let t = t.unique(opts.clone());
    match key {
        Some(k) => t.unique_key(k),
        None => t,
    }
}

/// The caller's key as a message names it.
fn unique_shown(key: Option<&str>) -> String {
    match key {
        Some(k) => format!("{k:?}"),
        None => "(by args or period)".into(),
    }
}

/// Parse `--unique-scope`.
fn unique_scope_arg(s: &str) -> Result<baton::queue::UniqueScope, String> {
    s.parse().map_err(|e: baton::InvalidInput| e.problem)
}

fn unique_hold_arg(s: &str) -> Result<baton::queue::UniqueHold, String> {
    s.parse().map_err(|e: baton::InvalidInput| e.problem)
}

/// Parse `--priority`: a whole number from -100 to 100.
fn priority_arg(s: &str) -> Result<i32, String> {
    match s.trim().parse::<i32>() {
        Ok(n) if (-100..=100).contains(&n) => Ok(n),
        _ => Err(format!(
            "{s:?} is not a priority; use a whole number from -100 to 100 (lower runs first)"
        )),
    }
}

/// Parse `--max-attempts`: a whole number (the library checks 1 to 10000
/// and names its field `max_attempts`).
fn attempts_arg(s: &str) -> Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(n) => Ok(n),
        _ => Err(format!(
            "{s:?} is not a number of attempts; use a whole number from 1 to 10000"
        )),
    }
}
