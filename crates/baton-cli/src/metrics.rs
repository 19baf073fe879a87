//! Prometheus metrics for `baton serve --listen` (`GET /metrics`, text
//! exposition format 0.0.4). `baton_tasks…`, `baton_queue…`, `baton_job…`
//! and `baton_lock…` are the store's view, read when scraped, so every
//! instance reports the same cluster-wide numbers (scrape one, or aggregate
//! with `max`); `baton_worker…` are this process's own workers (sum them).

use std::fmt::Write;

use baton::queue::{Outcome, Queue, WorkerCounters};
use baton::schedule;
use baton::Store;

/// One labelled sample: label pairs and a value.
type Sample<'a> = (Vec<(&'static str, &'a str)>, f64);

/// Render every metric, or the store's error. `workers` are this process's
/// workers.
pub async fn render(store: &Store, workers: &[WorkerCounters]) -> Result<String, baton::Error> {
    use baton::store::TaskState;
    let stats = Queue::new(store.clone()).stats().await?;
    let jobs = schedule::job_statuses(store).await?;
    let locks = store.backend().lock_list().await?;
    let now = store.backend().now().await?;
    let secs = |t: chrono::DateTime<chrono::Utc>| t.timestamp_millis() as f64 / 1000.0;
    let flag = |b: bool| if b { 1.0 } else { 0.0 };

    let mut out = String::new();
    gauge(
        &mut out,
        "baton_tasks",
        "Tasks by queue and state (succeeded and cancelled until pruned).",
        stats.iter().flat_map(|s| {
            [
                ("pending", s.pending),
                ("running", s.running),
                ("succeeded", s.succeeded),
                ("failed", s.failed),
                ("cancelled", s.cancelled),
            ]
            .map(|(state, n)| {
                (
                    vec![("queue", s.queue.as_str()), ("state", state)],
                    n as f64,
                )
            })
        }),
    );
    gauge(
        &mut out,
        "baton_queue_oldest_pending_seconds",
        "Age of the oldest due pending task (0 when none waits), by store time.",
        stats.iter().map(|s| {
            let age = s.oldest_pending_ms.unwrap_or(0) as f64 / 1000.0;
            (vec![("queue", s.queue.as_str())], age)
        }),
    );
    gauge(
        &mut out,
        "baton_job_last_slot_timestamp_seconds",
        "The last slot the scheduler enqueued or skipped, as a Unix time.",
        jobs.iter().filter_map(|j| {
            let slot = j.state.last_slot?;
            Some((vec![("job", j.state.name.as_str())], secs(slot)))
        }),
    );
    gauge(
        &mut out,
        "baton_job_paused",
        "1 if the job is paused cluster-wide.",
        jobs.iter()
            .map(|j| (vec![("job", j.state.name.as_str())], flag(j.state.paused))),
    );
    gauge(
        &mut out,
        "baton_job_last_run_succeeded",
        "1 if the job's newest run succeeded, 0 if it failed or was cancelled (absent while pending or running).",
        jobs.iter().filter_map(|j| {
            let ok = match j.last_run.as_ref()?.state {
                TaskState::Succeeded => true,
                TaskState::Failed | TaskState::Cancelled => false,
                TaskState::Pending | TaskState::Running => return None,
            };
            Some((vec![("job", j.state.name.as_str())], flag(ok)))
        }),
    );
    gauge(
        &mut out,
        "baton_lock_held",
        "1 while the lock's lease is in force.",
        locks
            .iter()
            .map(|l| (vec![("name", l.name.as_str())], flag(l.held))),
    );
    gauge(
        &mut out,
        "baton_lock_fencing_token",
        "The fencing token of the lock's latest grant.",
        locks
            .iter()
            .map(|l| (vec![("name", l.name.as_str())], l.token.0 as f64)),
    );
    gauge(
        &mut out,
        "baton_store_time_seconds",
        "The store's clock when these metrics were read, as a Unix time.",
        [(vec![], secs(now))],
    );

    // This process's workers, summed per queue.
    let mut mine: std::collections::BTreeMap<String, baton::queue::QueueCounters> =
        Default::default();
    for w in workers {
        for (queue, c) in w.snapshot() {
            let m = mine.entry(queue).or_default();
            m.running += c.running;
            m.busy += c.busy;
            for (o, n) in c.ended {
                *m.ended.entry(o).or_default() += n;
            }
        }
    }
    family(
        &mut out,
        "baton_worker_attempts_total",
        "counter",
        "Attempts this process's workers ended, by queue and outcome.",
        mine.iter().flat_map(|(q, c)| {
            Outcome::ALL.map(|o| {
                let n = c.ended.get(&o).copied().unwrap_or(0);
                (
                    vec![("queue", q.as_str()), ("outcome", o.as_str())],
                    n as f64,
                )
            })
        }),
    );
    gauge(
        &mut out,
        "baton_worker_running",
        "Attempts running in this process now.",
        mine.iter()
            .map(|(q, c)| (vec![("queue", q.as_str())], c.running as f64)),
    );
    family(
        &mut out,
        "baton_worker_busy_seconds_total",
        "counter",
        "Time this process's ended attempts took, from claim to outcome.",
        mine.iter()
            .map(|(q, c)| (vec![("queue", q.as_str())], c.busy.as_secs_f64())),
    );
    Ok(out)
}

/// One gauge family (see [`family`]).
fn gauge<'a>(
    out: &mut String,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = Sample<'a>>,
) {
    family(out, name, "gauge", help, samples)
}

/// One metric family: its `# HELP` and `# TYPE` lines, then its samples.
fn family<'a>(
    out: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    samples: impl IntoIterator<Item = Sample<'a>>,
) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, value) in samples {
        sample(out, name, &labels, value);
    }
}

fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: f64) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{k}=\"{}\"", escape(v));
        }
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

/// Label values escape backslash, double quote and line feed.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_escape_label_values() {
        let mut out = String::new();
        sample(&mut out, "m", &[("a", "x\"y\\z\nw"), ("b", "ok")], 1.5);
        assert_eq!(out, "m{a=\"x\\\"y\\\\z\\nw\",b=\"ok\"} 1.5\n");
        let mut out = String::new();
        sample(&mut out, "m", &[], 3.0);
        assert_eq!(out, "m 3\n");
    }
}
