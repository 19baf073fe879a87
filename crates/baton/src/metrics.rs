//! Prometheus metrics (feature `prometheus`): the text `baton serve
//! --listen` answers on `GET /metrics`, for a service that runs baton's
//! workers itself to answer the same, in the OpenMetrics text format
//! written by `prometheus-client` ([`CONTENT_TYPE`]).
//! `baton_tasks…`, `baton_queue…`, `baton_job…` and `baton_lock…` are the
//! store's view, read when scraped, so every instance reports the same
//! cluster-wide numbers (scrape one, or aggregate with `max`);
//! `baton_worker…` are this process's own workers (sum them), from their
//! [`WorkerCounters`]: attempts, histograms of claim latency, run duration
//! and slot → start lag, lease losses, heartbeat failures and store errors
//! by operation.

use std::collections::BTreeMap;

use crate::queue::{Histogram, Outcome, Queue, QueueCounters, WorkerCounters};
use crate::schedule;
use crate::Store;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// The `Content-Type` of [`render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// One labelled sample: label pairs and a value.
type Sample<'a> = (Vec<(&'static str, &'a str)>, f64);

/// Render every metric, or the store's error. `workers` are this process's
/// workers ([`Worker::counters`](crate::queue::Worker::counters)).
///
/// ```no_run
/// # async fn demo(store: baton::Store, worker: &baton::queue::Worker) -> Result<(), baton::Error> {
/// let text = baton::metrics::render(&store, &[worker.counters()]).await?;
/// // serve `text` with `Content-Type: baton::metrics::CONTENT_TYPE`
/// # Ok(()) }
/// ```
pub async fn render(store: &Store, workers: &[WorkerCounters]) -> Result<String, crate::Error> {
    use crate::store::TaskState;
    let stats = Queue::new(store.clone()).stats().await?;
    let jobs = schedule::job_statuses(store).await?;
    let locks = crate::lock::Locker::new(store.clone()).list().await?;
    let now = store.now().await?;
    let secs = |t: chrono::DateTime<chrono::Utc>| t.timestamp_millis() as f64 / 1000.0;
    let flag = |b: bool| if b { 1.0 } else { 0.0 };

    let mut out = Families::default();
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
        "baton_queue_paused",
        "1 if claiming from the queue is paused cluster-wide.",
        stats
            .iter()
            .map(|s| (vec![("queue", s.queue.as_str())], flag(s.paused))),
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
    let mut mine: BTreeMap<String, QueueCounters> = Default::default();
    let mut heartbeat_failures = 0u64;
    let mut store_errors: BTreeMap<&'static str, u64> = Default::default();
    for w in workers {
        for (queue, c) in w.snapshot() {
            let m = mine.entry(queue).or_default();
            m.running += c.running;
            m.busy += c.busy;
            for (o, n) in c.ended {
                *m.ended.entry(o).or_default() += n;
            }
            m.claim_latency.merge(&c.claim_latency);
            m.run_duration.merge(&c.run_duration);
            m.slot_lag.merge(&c.slot_lag);
            m.lease_losses += c.lease_losses;
        }
        let t = w.totals();
        heartbeat_failures += t.heartbeat_failures;
        for (op, n) in t.store_errors {
            *store_errors.entry(op).or_default() += n;
        }
    }
    counter(
        &mut out,
        "baton_worker_attempts",
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
    counter(
        &mut out,
        "baton_worker_busy_seconds",
        "Time this process's ended attempts took, from claim to outcome.",
        mine.iter()
            .map(|(q, c)| (vec![("queue", q.as_str())], c.busy.as_secs_f64())),
    );
    histogram(
        &mut out,
        "baton_worker_claim_duration_seconds",
        "How long each claim call the store answered took, by queue.",
        mine.iter().map(|(q, c)| (q.as_str(), &c.claim_latency)),
    );
    histogram(
        &mut out,
        "baton_worker_run_duration_seconds",
        "Each ended attempt's duration, from claim to outcome, by queue.",
        mine.iter().map(|(q, c)| (q.as_str(), &c.run_duration)),
    );
    histogram(
        &mut out,
        "baton_worker_slot_lag_seconds",
        "Scheduled tasks: from the task's due time (its slot plus jitter, or its trigger or retry) to the claim that started the attempt (store time), by queue.",
        mine.iter().map(|(q, c)| (q.as_str(), &c.slot_lag)),
    );
    counter(
        &mut out,
        "baton_worker_lease_losses",
        "Attempts whose lease was lost (nothing recorded; the task is rescued), by queue.",
        mine.iter()
            .map(|(q, c)| (vec![("queue", q.as_str())], c.lease_losses as f64)),
    );
    counter(
        &mut out,
        "baton_worker_heartbeat_failures",
        "Heartbeat calls that failed or got no answer in time.",
        [(vec![], heartbeat_failures as f64)],
    );
    counter(
        &mut out,
        "baton_worker_store_errors",
        "Store calls of this process's workers that failed, by operation.",
        // Every operation, zeros too.
        crate::queue::STORE_OPERATIONS.iter().map(|op| {
            let n = store_errors.get(op).copied().unwrap_or(0);
            (vec![("operation", *op)], n as f64)
        }),
    );
    counter(
        &mut out,
        "baton_store_identity_changes",
        "Times this process found its store was no longer the one it connected to (another \
         identity or none: it lost its data; its task id counter went down: restored from an \
         older backup). Each is logged once as an error and fails /readyz until a restart.",
        [(vec![], store.identity().changes() as f64)],
    );
    gauge(
        &mut out,
        "baton_store_read_only",
        "1 while the store refuses writes (a read-only server behind the URL: a standby, a \
         demoted primary, default_transaction_read_only or read_only set); /readyz fails then.",
        [(
            vec![],
            if store.read_only().is_some() {
                1.0
            } else {
                0.0
            },
        )],
    );

    let mut registry = Registry::default();
    registry.register_collector(Box::new(out));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).map_err(|_| {
        crate::Error::Invalid(crate::InvalidInput::new("metrics", "could not be encoded"))
    })?;
    Ok(text)
}

/// A sample's value.
#[derive(Debug)]
enum Value {
    Gauge(f64),
    Counter(f64),
    Histogram {
        sum: f64,
        count: u64,
        buckets: Vec<(f64, u64)>,
    },
}

/// One metric family as read at a scrape.
#[derive(Debug)]
struct Family {
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    samples: Vec<(Vec<(String, String)>, Value)>,
}

/// The metrics of one scrape, encoded by prometheus-client.
#[derive(Debug, Default)]
struct Families(Vec<Family>);

impl prometheus_client::collector::Collector for Families {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.0 {
            let mut metric = encoder.encode_descriptor(f.name, f.help, None, f.kind)?;
            for (labels, value) in &f.samples {
                encode_sample(&mut metric, labels, value)?;
            }
        }
        Ok(())
    }
}

fn encode_sample(
    metric: &mut MetricEncoder<'_>,
    labels: &Vec<(String, String)>,
    value: &Value,
) -> Result<(), std::fmt::Error> {
    if labels.is_empty() {
        return encode_value(metric, value);
    }
    encode_value(&mut metric.encode_family(labels)?, value)
}

fn encode_value(m: &mut MetricEncoder<'_>, value: &Value) -> Result<(), std::fmt::Error> {
    match value {
        Value::Gauge(v) => m.encode_gauge(v),
        Value::Counter(v) => {
            m.encode_counter::<prometheus_client::encoding::NoLabelSet, _, f64>(v, None)
        }
        Value::Histogram {
            sum,
            count,
            buckets,
        } => m.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            *sum, *count, buckets, None,
        ),
    }
}

fn push<'a>(
    out: &mut Families,
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    samples: impl IntoIterator<Item = (Vec<(&'static str, &'a str)>, Value)>,
) {
    let samples = samples
        .into_iter()
        .map(|(labels, v)| {
            let labels = labels
                .into_iter()
                .map(|(k, v)| (k.to_string(), escape(v)))
                .collect();
            (labels, v)
        })
        .collect();
    out.0.push(Family {
        name,
        help,
        kind,
        samples,
    });
}

/// One gauge family.
fn gauge<'a>(
    out: &mut Families,
    name: &'static str,
    help: &'static str,
    samples: impl IntoIterator<Item = Sample<'a>>,
) {
    let samples = samples.into_iter().map(|(l, v)| (l, Value::Gauge(v)));
    push(out, name, help, MetricType::Gauge, samples)
}

/// One counter family; its samples are named `{name}_total`.
fn counter<'a>(
    out: &mut Families,
    name: &'static str,
    help: &'static str,
    samples: impl IntoIterator<Item = Sample<'a>>,
) {
    let samples = samples.into_iter().map(|(l, v)| (l, Value::Counter(v)));
    push(out, name, help, MetricType::Counter, samples)
}

/// One histogram family, a histogram per queue.
fn histogram<'a>(
    out: &mut Families,
    name: &'static str,
    help: &'static str,
    per_queue: impl IntoIterator<Item = (&'a str, &'a Histogram)>,
) {
    let samples = per_queue.into_iter().map(|(q, h)| {
        // prometheus-client takes each bucket's own count (it sums them)
        // and writes `+Inf` for `f64::MAX`.
        let bounds = crate::queue::counters::BUCKETS
            .iter()
            .copied()
            .chain([f64::MAX]);
        let value = Value::Histogram {
            sum: h.sum,
            count: h.count,
            buckets: bounds.zip(h.counts.iter().copied()).collect(),
        };
        (vec![("queue", q)], value)
    });
    push(out, name, help, MetricType::Histogram, samples)
}

/// Label values escape backslash, double quote and line feed
/// (prometheus-client writes them as given).
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Label values are escaped, counters end in `_total`, histograms
    /// have cumulative `le` buckets, and the text ends with `# EOF`.
    #[test]
    fn families_encode_as_openmetrics() {
        let mut out = Families::default();
        gauge(
            &mut out,
            "m",
            "A gauge.",
            [(vec![("a", "x\"y")], 1.5), (vec![("a", "b\\c\nd")], 2.0)],
        );
        counter(&mut out, "c", "A counter.", [(vec![], 3.0)]);
        let mut h = Histogram::default();
        h.observe(std::time::Duration::from_millis(2));
        h.observe(std::time::Duration::from_secs(2));
        histogram(&mut out, "h_seconds", "A histogram.", [("q", &h)]);
        let mut registry = Registry::default();
        registry.register_collector(Box::new(out));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("# TYPE m gauge\n"), "{text}");
        assert!(text.contains("m{a=\"x\\\"y\"} 1.5\n"), "{text}");
        assert!(text.contains("m{a=\"b\\\\c\\nd\"} 2.0\n"), "{text}");
        assert!(text.contains("# TYPE c counter\nc_total 3.0\n"), "{text}");
        assert!(text.contains("# TYPE h_seconds histogram\n"), "{text}");
        for (le, n) in [
            ("0.001", 0),
            ("0.0025", 1),
            ("1.0", 1),
            ("2.5", 2),
            ("+Inf", 2),
        ] {
            let line = format!("h_seconds_bucket{{le=\"{le}\",queue=\"q\"}} {n}\n");
            assert!(text.contains(&line), "{line} in {text}");
        }
        assert!(text.contains("h_seconds_count{queue=\"q\"} 2\n"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
