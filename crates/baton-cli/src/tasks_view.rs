//! How `baton tasks list` and `baton tasks show` print tasks as text
//! (`--json` goes through [`crate::shapes::task`]).

use baton::store::TaskInfo;

use crate::outln;
use crate::output::{self, Align, Table};
use crate::queue_cmd::unique_text;

/// `tasks list`: one row a task.
pub fn print_list(list: &[TaskInfo]) -> anyhow::Result<()> {
    let mut t = Table::new(&[
        ("ID", Align::Right),
        ("STATE", Align::Left),
        ("QUEUE", Align::Left),
        ("ATTEMPT", Align::Right),
        ("RUN_AT", Align::Left),
        ("CONC_KEY", Align::Left),
        ("UNIQUE_KEY", Align::Left),
        ("COMMAND/KIND", Align::Left),
    ]);
    for task in list {
        let what = match task.payload.get("argv") {
            Some(argv) => argv.to_string(),
            None => task.kind.clone(),
        };
        t.row(vec![
            task.id.to_string(),
            task.state.to_string(),
            task.queue.clone(),
            format!("{}/{}", task.attempt, task.max_attempts),
            output::ts(task.run_at),
            task.concurrency_key.clone().unwrap_or_else(|| "-".into()),
            unique_text(task).unwrap_or_else(|| "-".into()),
            what,
        ]);
    }
    t.print()?;
    Ok(())
}

/// `tasks show`: the task's fields, then each failed attempt.
pub fn print_task(t: &TaskInfo) -> anyhow::Result<()> {
    outln!(
        "task {} ({}) on queue {:?}, kind {:?}",
        t.id,
        t.state,
        t.queue,
        t.kind
    );
    let mut f = vec![
        ("payload", t.payload.to_string()),
        ("attempt", format!("{} of {}", t.attempt, t.max_attempts)),
        ("priority", t.priority.to_string()),
        ("created", output::ts(t.created_at)),
        ("run at", output::ts(t.run_at)),
        ("started", output::ts_or_dash(t.started_at)),
        ("finished", output::ts_or_dash(t.finished_at)),
        ("lease until", output::ts_or_dash(t.lease_until)),
    ];
    if let Some(w) = &t.worker {
        f.push(("worker", w.clone()));
    }
    if let Some(k) = unique_text(t) {
        f.push(("unique key", k));
    }
    if let Some(k) = &t.concurrency_key {
        f.push(("concurrency key", k.clone()));
    }
    // The last error (or a skipped slot's reason, which no attempt made).
    if let Some(e) = &t.last_error {
        f.push(("last error", e.clone()));
    }
    if let (Some(j), Some(s)) = (&t.job, t.slot) {
        f.push(("job slot", format!("{j} @ {}", output::ts(s))));
    }
    if let Some(p) = &t.progress {
        f.push(("progress", p.to_string()));
    }
    output::fields(&f)?;
    for e in &t.errors {
        let ran = e
            .started_at
            .and_then(|s| (e.at - s).to_std().ok())
            .map(|d| format!(" after {}", baton::format_duration(d)))
            .unwrap_or_default();
        let on = e
            .worker
            .as_deref()
            .map(|w| format!(" on {w}"))
            .unwrap_or_default();
        outln!(
            "  attempt {} failed at {}{on}{ran}: {}",
            e.attempt,
            output::ts(e.at),
            e.error
        );
    }
    Ok(())
}
