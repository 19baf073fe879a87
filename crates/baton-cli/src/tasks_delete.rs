//! `baton tasks delete`: tasks by id, or the finished tasks a filter
//! matches (counted first; deleted with `--yes`).

use anyhow::Context;
use baton::queue::{DeleteOutcome, Queue};
use baton::store::{TaskFilter, TaskState};

use crate::{connect, note, outln, StoreArg, EXIT_CONFLICT, EXIT_NOT_FOUND, EXIT_USAGE};

/// Delete tasks: by id, or the finished tasks matching a filter.
#[derive(clap::Args, Debug)]
pub struct DeleteArgs {
    #[command(flatten)]
    store: StoreArg,
    /// Task ids. A task that is not running is deleted (a pending one is
    /// cancelled first; a schedule slot's run leaves its tombstone, so the
    /// slot does not run again); a running one is left alone (cancel it,
    /// then delete it once it has stopped).
    #[arg(value_parser = crate::queue_cmd::task_id_arg)]
    ids: Vec<i64>,
    /// Instead of ids: the finished tasks of this queue.
    #[arg(long)]
    queue: Option<String>,
    /// Instead of ids: the finished tasks in this state (succeeded,
    /// failed or cancelled; default all three).
    #[arg(long, value_parser = finished_state)]
    state: Option<TaskState>,
    /// Instead of ids: the finished runs of this scheduled job.
    #[arg(long)]
    job: Option<String>,
    /// Instead of ids: the finished tasks these search terms match.
    #[command(flatten)]
    search: crate::task_search::SearchArgs,
    /// Delete what the filter matches; without it, only count it.
    #[arg(long)]
    yes: bool,
}

fn finished_state(s: &str) -> Result<TaskState, String> {
    match s.parse::<TaskState>() {
        Ok(st) if st.is_terminal() => Ok(st),
        Ok(_) => Err(format!(
            "{s:?}: only finished tasks are deleted in bulk; use succeeded, failed or cancelled"
        )),
        Err(_) => Err(format!("{s:?}: use succeeded, failed or cancelled")),
    }
}

/// Run `baton tasks delete`.
pub async fn run(a: DeleteArgs) -> anyhow::Result<u8> {
    let filtered = a.queue.is_some() || a.state.is_some() || a.job.is_some() || a.search.any();
    if a.ids.is_empty() && !filtered {
        note!("baton: name task ids, or a filter (--queue, --state, --job, --kind, --key, --text, --since, --until) for a bulk delete");
        return Ok(EXIT_USAGE);
    }
    if !a.ids.is_empty() && filtered {
        note!("baton: give task ids or a filter (--queue, --state, --job, --kind, --key, --text, --since, --until), not both");
        return Ok(EXIT_USAGE);
    }
    let q = Queue::new(connect(&a.store).await.context("connecting to the store")?);
    if !a.ids.is_empty() {
        let mut code = 0;
        for id in a.ids {
            match q.delete(id).await? {
                DeleteOutcome::Deleted => {
                    let target = format!("id={id}");
                    crate::audit_cmd::record_cli(
                        q.store(),
                        None,
                        "tasks delete",
                        &target,
                        "deleted",
                    )
                    .await;
                    outln!("task {id} deleted")
                }
                DeleteOutcome::Running => {
                    note!("baton: task {id} is running; cancel it, then delete it once it has stopped");
                    code = EXIT_CONFLICT;
                }
                DeleteOutcome::NotFound => {
                    note!("baton: no task {id}");
                    if code == 0 {
                        code = EXIT_NOT_FOUND;
                    }
                }
            }
        }
        return Ok(code);
    }
    let mut filter = TaskFilter {
        queue: a.queue,
        state: a.state,
        job: a.job,
        ..TaskFilter::default()
    };
    a.search.apply(&mut filter)?;
    if !a.yes {
        let n = q
            .tasks_all(&filter)
            .await?
            .iter()
            .filter(|t| t.state.is_terminal())
            .count();
        outln!("{n} finished tasks match; run again with --yes to delete them");
        return Ok(0);
    }
    let gone = q.delete_finished(&filter).await?;
    let target = crate::task_search::filter_text(&filter);
    let done = format!("deleted {}", gone.len());
    crate::audit_cmd::record_cli(q.store(), None, "tasks delete (bulk)", &target, &done).await;
    outln!("deleted {} finished tasks", gone.len());
    Ok(0)
}
