//! `baton queues`: list the queues (counts, paused, the last pause or
//! resume with its note, the limits their workers declared), show the
//! load of a queue's concurrency keys, pause or resume one cluster-wide
//! with a note.

use std::time::Duration;

use anyhow::Context;
use baton::queue::Queue;
use baton::Error;

use crate::output::{self, Align, Table};
use crate::pause_args::{pause_note, PauseNoteArgs};
use crate::{connect, outln};

/// Arguments of `baton queues`.
#[derive(clap::Args, Debug)]
pub struct QueuesArgs {
    #[command(subcommand)]
    pub cmd: Option<QueuesCmd>,
    #[command(flatten)]
    pub store: crate::StoreArg,
    /// Print JSON (the list).
    #[arg(long, global = true)]
    pub json: bool,
}

/// `baton queues pause|resume`.
#[derive(clap::Subcommand, Debug)]
pub enum QueuesCmd {
    /// Stop every worker of the cluster claiming the queue's tasks (running
    /// tasks finish; enqueue is still accepted).
    Pause {
        /// The queue's name.
        queue: String,
        #[command(flatten)]
        why: PauseNoteArgs,
    },
    /// Resume a paused queue; its workers are woken.
    Resume {
        /// The queue's name.
        queue: String,
        #[command(flatten)]
        why: PauseNoteArgs,
    },
    /// The load of the queue's concurrency keys: the busiest keys (most
    /// running, then most pending) with their running and pending tasks,
    /// against the queue's declared per-key cap.
    Keys {
        /// The queue's name.
        queue: String,
        /// How many keys to list (1 to 1000).
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
}

/// Run `baton queues …`: 0 done (also when the queue already was in that
/// state), 2 for a bad name or note.
pub async fn queues(a: QueuesArgs) -> anyhow::Result<u8> {
    let Some(cmd) = a.cmd else {
        return list(&a.store, a.json).await;
    };
    let (queue, why, paused) = match cmd {
        QueuesCmd::Pause { queue, why } => (queue, why, true),
        QueuesCmd::Resume { queue, why } => (queue, why, false),
        QueuesCmd::Keys { queue, limit } => return keys(&a.store, &queue, limit, a.json).await,
    };
    baton::names::validate_name("QUEUE", &queue).map_err(Error::from)?;
    let by = why.recorded_by();
    let note = pause_note(&why, &by).map_err(Error::from)?;
    let q = Queue::new(connect(&a.store).await.context("connecting to the store")?);
    let action = if paused {
        "queues pause"
    } else {
        "queues resume"
    };
    if paused {
        q.pause_with(&queue, note).await?;
        outln!(
            "queue {queue} paused (by {by}): no worker claims its tasks until `baton queues resume {queue}`"
        );
    } else {
        q.resume_with(&queue, note).await?;
        outln!("queue {queue} resumed (by {by})");
    }
    let who = why.who();
    let target = format!("name={queue}");
    crate::audit_cmd::record_cli(q.store(), Some(&who), action, &target, "done").await;
    Ok(0)
}

/// `baton queues`: a row a queue.
async fn list(store: &crate::StoreArg, json: bool) -> anyhow::Result<u8> {
    let q = Queue::new(connect(store).await.context("connecting to the store")?);
    print(&q.stats().await?, json)?;
    Ok(0)
}

/// The queues' counts, paused flags and last pause or resume, as `baton
/// queues` and `baton tasks stats` print them: a table, or with `json`
/// the admin API's `/api/v1/queues` rows without the throughput it
/// samples.
pub fn print(stats: &[baton::store::QueueStats], json: bool) -> anyhow::Result<()> {
    if json {
        let rows: Vec<_> = stats.iter().map(crate::shapes::queue).collect();
        output::json(&serde_json::Value::Array(rows))?;
        return Ok(());
    }
    let mut t = Table::new(&[
        ("QUEUE", Align::Left),
        ("PENDING", Align::Right),
        ("RUNNING", Align::Right),
        ("SUCCEEDED", Align::Right),
        ("FAILED", Align::Right),
        ("CANCELLED", Align::Right),
        ("OLDEST_DUE", Align::Right),
        ("PAUSED", Align::Left),
        ("LIMITS", Align::Left),
        ("PAUSE NOTE", Align::Left),
    ]);
    for s in stats {
        let age = s
            .oldest_pending_ms
            .map(|ms| baton::format_duration(Duration::from_millis(ms)))
            .unwrap_or_else(|| "-".into());
        t.row(vec![
            s.queue.clone(),
            s.pending.to_string(),
            s.running.to_string(),
            s.succeeded.to_string(),
            s.failed.to_string(),
            s.cancelled.to_string(),
            age,
            if s.paused { "paused" } else { "-" }.into(),
            s.limits
                .as_ref()
                .map(|d| d.limits.describe())
                .unwrap_or_else(|| "-".into()),
            crate::shapes::pause_text(s.pause_change.as_ref()),
        ]);
    }
    t.print()?;
    Ok(())
}

/// `baton queues keys QUEUE`: a row a key, busiest first (under a rate
/// per key also its starts in the window and its next allowed start),
/// then the totals (exit 2 for a bad name or limit).
async fn keys(store: &crate::StoreArg, queue: &str, limit: u32, json: bool) -> anyhow::Result<u8> {
    let q = Queue::new(connect(store).await.context("connecting to the store")?);
    let load = q.keys(queue, limit).await?;
    if json {
        output::json(&serde_json::to_value(&load)?)?;
        return Ok(0);
    }
    let cap = load.per_key_max_running;
    let mut cols = vec![
        ("KEY", Align::Left),
        ("RUNNING", Align::Right),
        ("PENDING", Align::Right),
        ("AT CAP", Align::Left),
    ];
    let rated = load.per_key_rate.is_some();
    if rated {
        cols.extend([("IN WINDOW", Align::Right), ("NEXT START", Align::Left)]);
    }
    let mut t = Table::new(&cols);
    for k in &load.keys {
        let at_cap = match cap {
            Some(c) if k.running >= u64::from(c) => "yes",
            Some(_) => "-",
            None => "",
        };
        let mut row = vec![
            k.key.clone(),
            k.running.to_string(),
            k.pending.to_string(),
            at_cap.into(),
        ];
        if rated {
            let (used, next) = crate::shapes::key_rate_text(k.rate.as_ref());
            row.extend([used, next]);
        }
        t.row(row);
    }
    t.print()?;
    let cap = cap.map_or_else(
        || "no per-key cap declared".to_string(),
        |c| format!("per-key cap {c}"),
    );
    let rate = match &load.per_key_rate {
        Some(r) => format!(
            "; rate per key {r}, {} listed key(s) held back by it",
            load.keys_rate_held
        ),
        None => String::new(),
    };
    outln!(
        "{} keys running, {} keys pending ({cap}{rate}){}",
        load.keys_running,
        load.keys_pending,
        if load.truncated {
            "; pending counted over the first 10000 pending tasks"
        } else {
            ""
        }
    );
    Ok(0)
}
