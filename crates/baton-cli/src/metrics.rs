//! Prometheus metrics for `baton serve --listen` (`GET /metrics`, text
//! exposition format 0.0.4): the store's view of queues, jobs and locks,
//! read when scraped, so every instance reports the same cluster-wide
//! numbers (scrape one, or aggregate with `max`).

use std::fmt::Write;

use baton::queue::Queue;
use baton::schedule;
use baton::Store;

/// Render every metric, or the store's error.
pub async fn render(store: &Store) -> Result<String, baton::Error> {
    let mut out = String::new();
    let stats = Queue::new(store.clone()).stats().await?;
    let now = store.backend().now().await?;
    family(
        &mut out,
        "baton_tasks",
        "gauge",
        "Tasks by queue and state (succeeded and cancelled until pruned).",
    );
    for s in &stats {
        for (state, n) in [
            ("pending", s.pending),
            ("running", s.running),
            ("succeeded", s.succeeded),
            ("failed", s.failed),
            ("cancelled", s.cancelled),
        ] {
            sample(
                &mut out,
                "baton_tasks",
                &[("queue", &s.queue), ("state", state)],
                n as f64,
            );
        }
    }
    family(
        &mut out,
        "baton_queue_oldest_pending_seconds",
        "gauge",
        "Age of the oldest due pending task (0 when none waits), by store time.",
    );
    for s in &stats {
        let age = s.oldest_pending_ms.unwrap_or(0) as f64 / 1000.0;
        sample(
            &mut out,
            "baton_queue_oldest_pending_seconds",
            &[("queue", &s.queue)],
            age,
        );
    }

    let jobs = schedule::job_statuses(store).await?;
    family(
        &mut out,
        "baton_job_last_slot_timestamp_seconds",
        "gauge",
        "The last slot the scheduler enqueued or skipped, as a Unix time.",
    );
    for j in &jobs {
        if let Some(slot) = j.state.last_slot {
            let t = slot.timestamp_millis() as f64 / 1000.0;
            sample(
                &mut out,
                "baton_job_last_slot_timestamp_seconds",
                &[("job", &j.state.name)],
                t,
            );
        }
    }
    family(
        &mut out,
        "baton_job_paused",
        "gauge",
        "1 if the job is paused cluster-wide.",
    );
    for j in &jobs {
        let v = if j.state.paused { 1.0 } else { 0.0 };
        sample(&mut out, "baton_job_paused", &[("job", &j.state.name)], v);
    }
    family(
        &mut out,
        "baton_job_last_run_succeeded",
        "gauge",
        "1 if the job's newest run succeeded, 0 if it failed or was cancelled (absent while pending or running).",
    );
    for j in &jobs {
        let Some(run) = &j.last_run else { continue };
        let v = match run.state {
            baton::store::TaskState::Succeeded => 1.0,
            baton::store::TaskState::Failed | baton::store::TaskState::Cancelled => 0.0,
            _ => continue,
        };
        sample(
            &mut out,
            "baton_job_last_run_succeeded",
            &[("job", &j.state.name)],
            v,
        );
    }

    let locks = store.backend().lock_list().await?;
    family(
        &mut out,
        "baton_lock_held",
        "gauge",
        "1 while the lock's lease is in force.",
    );
    for l in &locks {
        sample(
            &mut out,
            "baton_lock_held",
            &[("name", &l.name)],
            if l.held { 1.0 } else { 0.0 },
        );
    }
    family(
        &mut out,
        "baton_lock_fencing_token",
        "gauge",
        "The fencing token of the lock's latest grant.",
    );
    for l in &locks {
        sample(
            &mut out,
            "baton_lock_fencing_token",
            &[("name", &l.name)],
            l.token.0 as f64,
        );
    }
    family(
        &mut out,
        "baton_store_time_seconds",
        "gauge",
        "The store's clock when these metrics were read, as a Unix time.",
    );
    sample(
        &mut out,
        "baton_store_time_seconds",
        &[],
        now.timestamp_millis() as f64 / 1000.0,
    );
    Ok(out)
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
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
