//! `baton queues`: list the queues (counts, paused, the last pause or
//! resume with its note), pause or resume one cluster-wide with a note.

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
            crate::shapes::pause_text(s.pause_change.as_ref()),
        ]);
    }
    t.print()?;
    Ok(())
}
