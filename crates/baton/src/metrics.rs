//! Prometheus metrics (feature `prometheus`): the text `baton serve
//! --listen` answers on `GET /metrics`, for a service that runs baton's
//! workers itself to answer the same. A [`Scraper`] renders them, in the
//! OpenMetrics text format written by `prometheus-client` ([`CONTENT_TYPE`])
//! or in Prometheus' classic text format ([`TEXT_CONTENT_TYPE`]), as the
//! scraper's `Accept` header asks ([`Format::from_accept`]).
//!
//! `baton_tasks…`, `baton_queue…`, `baton_job…` and `baton_lock…` are the
//! store's view, read when scraped, so every instance reports the same
//! cluster-wide numbers (scrape one, or aggregate with `max`). When the
//! store does not answer in time, a scrape still succeeds: those gauges
//! are the last view read (never invented: absent until one read
//! succeeded), `baton_store_up` is 0, and
//! `baton_store_last_read_timestamp_seconds` says when the view was read.
//! `baton_worker…` are this process's own workers (sum them), from their
//! [`WorkerCounters`]: attempts, histograms of claim latency, run duration
//! and slot → start lag, lease losses, heartbeat failures and store errors
//! by operation; they never depend on the store answering.
//! `baton_build_info{version}` is 1.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use crate::queue::{Histogram, Outcome, Queue, QueueCounters, WorkerCounters};
use crate::schedule;
use crate::Store;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

/// The `Content-Type` of the OpenMetrics text ([`Format::OpenMetrics`]).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The `Content-Type` of Prometheus' classic text format
/// ([`Format::Text`]), what `promtool check metrics` reads.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// How long a scrape waits for the store's view by default
/// ([`Scraper::read_timeout`]): well within Prometheus' default scrape
/// timeout of 10 s.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// One labelled sample: label pairs and a value.
type Sample<'a> = (Vec<(&'static str, &'a str)>, f64);

/// A text format of the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// OpenMetrics 1.0 ([`CONTENT_TYPE`]): what Prometheus asks for first.
    #[default]
    OpenMetrics,
    /// Prometheus' classic text format 0.0.4 ([`TEXT_CONTENT_TYPE`]): for
    /// any other client (`curl`, `promtool check metrics`).
    Text,
}

impl Format {
    /// The format an `Accept` header asks for: OpenMetrics when it names
    /// `application/openmetrics-text` with a quality no lower than any
    /// `text/plain` (or wildcard) it names, else the classic text format
    /// (also without a header).
    ///
    /// ```
    /// use baton::metrics::Format;
    /// let prometheus = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
    /// assert_eq!(Format::from_accept(Some(prometheus)), Format::OpenMetrics);
    /// assert_eq!(Format::from_accept(Some("*/*")), Format::Text);
    /// assert_eq!(Format::from_accept(None), Format::Text);
    /// ```
    pub fn from_accept(accept: Option<&str>) -> Format {
        let (mut open, mut text) = (0.0_f64, 0.0_f64);
        for range in accept.unwrap_or_default().split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or_default().to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.strip_prefix("q="))
                .find_map(|q| q.parse::<f64>().ok())
                .unwrap_or(1.0);
            match media.as_str() {
                "application/openmetrics-text" => open = open.max(q),
                "text/plain" | "text/*" | "*/*" => text = text.max(q),
                _ => {}
            }
        }
        if open > 0.0 && open >= text {
            Format::OpenMetrics
        } else {
            Format::Text
        }
    }

    /// The `Content-Type` of text in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => CONTENT_TYPE,
            Format::Text => TEXT_CONTENT_TYPE,
        }
    }
}

/// The store's view as last read: its metric families and when.
#[derive(Debug, Clone)]
struct StoreView {
    families: Vec<Family>,
    read_at: SystemTime,
}

/// Renders the metrics of one process on each scrape, keeping the store's
/// last view so that a scrape during a store outage still answers: this
/// process's own metrics in full, the store's gauges from the last read
/// that succeeded, with `baton_store_up 0`. Each scrape's read of the
/// store is bounded by [`Scraper::read_timeout`], so a stalled store
/// cannot hang a scrape. Keep one per process (scrapes may run at once).
///
/// ```no_run
/// # async fn demo(store: baton::Store, worker: &baton::queue::Worker) -> Result<(), baton::Error> {
/// use baton::metrics::{Format, Scraper};
/// let scraper = Scraper::new(store);
/// // For each `GET /metrics`, with the request's `Accept` header:
/// let format = Format::from_accept(Some("application/openmetrics-text"));
/// let text = scraper.render(&[worker.counters()], format).await?;
/// // serve `text` with `Content-Type: format.content_type()`
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Scraper {
    store: Store,
    read_timeout: Duration,
    last: Mutex<Option<StoreView>>,
}

impl Scraper {
    /// A scraper of `store`'s view, with [`DEFAULT_READ_TIMEOUT`].
    pub fn new(store: Store) -> Scraper {
        Scraper {
            store,
            read_timeout: DEFAULT_READ_TIMEOUT,
            last: Mutex::new(None),
        }
    }

    /// How long each scrape waits for the store's view (all its reads
    /// together) before it serves the last view instead.
    pub fn read_timeout(mut self, limit: Duration) -> Scraper {
        self.read_timeout = limit;
        self
    }

    /// Render every metric in `format`. `workers` are this process's
    /// workers ([`Worker::counters`](crate::queue::Worker::counters)).
    /// The store failing or not answering in time does not fail it (see
    /// [`Scraper`]); it fails only if the text could not be encoded.
    pub async fn render(
        &self,
        workers: &[WorkerCounters],
        format: Format,
    ) -> Result<String, crate::Error> {
        let read = tokio::time::timeout(self.read_timeout, store_families(&self.store)).await;
        let fresh = match read {
            Ok(Ok(families)) => Some(families),
            Ok(Err(e)) => {
                tracing::debug!(error = %crate::error::chain(&e), "metrics: reading the store failed; serving its last view");
                None
            }
            Err(_) => {
                tracing::debug!(timeout = ?self.read_timeout, "metrics: the store did not answer in time; serving its last view");
                None
            }
        };
        let up = fresh.is_some();
        let view = {
            let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(families) = fresh {
                *last = Some(StoreView {
                    families,
                    read_at: SystemTime::now(),
                });
            }
            last.clone()
        };

        let mut out = Families::default();
        gauge(
            &mut out,
            "baton_build_info",
            "Always 1; its version label is this build's baton version.",
            [(vec![("version", env!("CARGO_PKG_VERSION"))], 1.0)],
        );
        gauge(
            &mut out,
            "baton_store_up",
            "1 if this scrape read the store's view; 0 if the store failed or did not answer in \
             time, and the store's gauges (baton_tasks, baton_queue_*, baton_job_*, baton_lock_*, \
             baton_store_time_seconds) are the last view read.",
            [(vec![], if up { 1.0 } else { 0.0 })],
        );
        gauge(
            &mut out,
            "baton_store_last_read_timestamp_seconds",
            "When the store's view these gauges show was read, as a Unix time by this process's \
             clock (absent until a read succeeded).",
            view.iter().map(|v| {
                let at = v
                    .read_at
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap_or_default();
                (vec![], at.as_millis() as f64 / 1000.0)
            }),
        );
        if let Some(v) = view {
            out.0.extend(v.families);
        }
        worker_families(&mut out, &self.store, workers);
        out.encode(format).map_err(|_| {
            crate::Error::Invalid(crate::InvalidInput::new("metrics", "could not be encoded"))
        })
    }
}

/// The store's view: its gauges, read now.
async fn store_families(store: &Store) -> Result<Vec<Family>, crate::Error> {
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
    key_families(&mut out, store, &stats).await?;
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

    Ok(out.0)
}

/// The declared limits of each queue and, for the queues whose workers
/// limit or interleave concurrency keys, how many keys have tasks running
/// and pending and how many are at their cap (one `queue_keys` read a
/// such queue; the keys at the cap counted among the 1000 busiest), and
/// under a rate per key how many of those its rate holds back and the
/// starts in the window of the (at most 10) keys with the most.
async fn key_families(
    out: &mut Families,
    store: &Store,
    stats: &[crate::store::QueueStats],
) -> Result<(), crate::Error> {
    let declared: Vec<_> = stats
        .iter()
        .filter_map(|s| Some((s.queue.as_str(), &s.limits.as_ref()?.limits)))
        .collect();
    gauge(
        out,
        "baton_queue_limit",
        "A limit the queue's workers declared: max_running (whole queue) or per_key_max_running.",
        declared.iter().flat_map(|(q, l)| {
            [
                ("max_running", l.max_running),
                ("per_key_max_running", l.per_key_max_running),
            ]
            .into_iter()
            .filter_map(move |(name, v)| {
                Some((vec![("queue", *q), ("limit", name)], f64::from(v?)))
            })
        }),
    );
    // The declared cap is on the stats already: one `queue_keys` read a
    // queue, not `Queue::keys` (which reads every declaration again).
    let mut loads = Vec::new();
    let mut now = None;
    for (queue, l) in declared {
        let rate = l
            .per_key_rate
            .as_deref()
            .and_then(|r| crate::queue::RateLimit::parse("per_key_rate", r).ok());
        if l.per_key_max_running.is_some() || l.fair || rate.is_some() {
            let query = crate::store::QueueKeysQuery {
                queue,
                limit: crate::store::MAX_KEYS_PAGE,
            };
            let mut load = store.backend().queue_keys(&query).await?;
            load.per_key_max_running = l.per_key_max_running;
            if let Some(rate) = rate {
                let at = match now {
                    Some(at) => at,
                    None => *now.insert(store.now().await?),
                };
                load.apply_rate(rate.max(), rate.per(), at);
                load.per_key_rate = l.per_key_rate.clone();
            }
            loads.push(load);
        }
    }
    gauge(
        out,
        "baton_queue_keys",
        "Concurrency keys of the queue with tasks running or pending (queues with a per-key cap or fair claiming).",
        loads.iter().flat_map(|k| {
            [("running", k.keys_running), ("pending", k.keys_pending)]
                .map(|(state, n)| (vec![("queue", k.queue.as_str()), ("state", state)], n as f64))
        }),
    );
    gauge(
        out,
        "baton_queue_keys_at_cap",
        "Concurrency keys of the queue running as many tasks as the per-key cap allows.",
        loads.iter().filter_map(|k| {
            let cap = u64::from(k.per_key_max_running?);
            let n = k.keys.iter().filter(|x| x.running >= cap).count();
            Some((vec![("queue", k.queue.as_str())], n as f64))
        }),
    );
    let rated = || loads.iter().filter(|k| k.per_key_rate.is_some());
    gauge(
        out,
        "baton_queue_keys_rate_held",
        "Concurrency keys of the queue whose rate per key holds their next start back now (among the 1000 busiest).",
        rated().map(|k| (vec![("queue", k.queue.as_str())], k.keys_rate_held as f64)),
    );
    gauge(
        out,
        "baton_queue_key_rate_starts",
        "Starts in the current window of the queue's rate per key, for the keys with the most (at most 10 a queue).",
        rated().flat_map(|k| {
            let mut top: Vec<_> = k
                .keys
                .iter()
                .filter_map(|x| Some((x.key.as_str(), x.rate?.started_in_window)))
                .filter(|(_, n)| *n > 0)
                .collect();
            top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
            top.truncate(10);
            top.into_iter()
                .map(move |(key, n)| (vec![("queue", k.queue.as_str()), ("key", key)], f64::from(n)))
        }),
    );
    Ok(())
}

/// This process's own metrics: its workers' counters, summed per queue,
/// and what it knows of its store without asking it.
fn worker_families(out: &mut Families, store: &Store, workers: &[WorkerCounters]) {
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
            m.trigger_lag.merge(&c.trigger_lag);
            m.lease_losses += c.lease_losses;
        }
        let t = w.totals();
        heartbeat_failures += t.heartbeat_failures;
        for (op, n) in t.store_errors {
            *store_errors.entry(op).or_default() += n;
        }
    }
    counter(
        out,
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
        out,
        "baton_worker_running",
        "Attempts running in this process now.",
        mine.iter()
            .map(|(q, c)| (vec![("queue", q.as_str())], c.running as f64)),
    );
    counter(
        out,
        "baton_worker_busy_seconds",
        "Time this process's ended attempts took, from claim to outcome.",
        mine.iter()
            .map(|(q, c)| (vec![("queue", q.as_str())], c.busy.as_secs_f64())),
    );
    histogram(
        out,
        "baton_worker_claim_duration_seconds",
        "How long each claim call the store answered took, by queue.",
        mine.iter().map(|(q, c)| (q.as_str(), &c.claim_latency)),
    );
    histogram(
        out,
        "baton_worker_run_duration_seconds",
        "Each ended attempt's duration, from claim to outcome, by queue.",
        mine.iter().map(|(q, c)| (q.as_str(), &c.run_duration)),
    );
    histogram(
        out,
        "baton_worker_slot_lag_seconds",
        "Scheduled tasks the scheduler ran on time: from the task's due time (its slot plus jitter, or its retry) to the claim that started the attempt (store time), by queue.",
        mine.iter().map(|(q, c)| (q.as_str(), &c.slot_lag)),
    );
    histogram(
        out,
        "baton_worker_slot_trigger_lag_seconds",
        "Scheduled tasks run by a trigger or backfill (due before their slot or over an hour after it): from the due time to the claim that started the attempt (store time), by queue.",
        mine.iter().map(|(q, c)| (q.as_str(), &c.trigger_lag)),
    );
    counter(
        out,
        "baton_worker_lease_losses",
        "Attempts whose lease was lost (nothing recorded; the task is rescued), by queue.",
        mine.iter()
            .map(|(q, c)| (vec![("queue", q.as_str())], c.lease_losses as f64)),
    );
    counter(
        out,
        "baton_worker_heartbeat_failures",
        "Heartbeat calls that failed or got no answer in time.",
        [(vec![], heartbeat_failures as f64)],
    );
    counter(
        out,
        "baton_worker_store_errors",
        "Store calls of this process's workers that failed, by operation.",
        // Every operation, zeros too.
        crate::queue::STORE_OPERATIONS.iter().map(|op| {
            let n = store_errors.get(op).copied().unwrap_or(0);
            (vec![("operation", *op)], n as f64)
        }),
    );
    counter(
        out,
        "baton_store_identity_changes",
        "Times this process found its store was no longer the one it connected to (another \
         identity or none: it lost its data; its task id counter went down: restored from an \
         older backup). Each is logged once as an error and fails /readyz until a restart.",
        [(vec![], store.identity().changes() as f64)],
    );
    gauge(
        out,
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
}

/// A sample's value.
#[derive(Debug, Clone)]
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
#[derive(Debug, Clone)]
struct Family {
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    samples: Vec<(Vec<(String, String)>, Value)>,
}

/// The metrics of one scrape.
#[derive(Debug, Default)]
struct Families(Vec<Family>);

impl Families {
    /// The text of these families in `format`.
    fn encode(self, format: Format) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        match format {
            Format::OpenMetrics => {
                let mut registry = Registry::default();
                registry.register_collector(Box::new(self));
                prometheus_client::encoding::text::encode(&mut text, &registry)?;
            }
            Format::Text => self.encode_text(&mut text)?,
        }
        Ok(text)
    }

    /// Prometheus' classic text format 0.0.4: a counter's family is named
    /// with its `_total`, histogram buckets are cumulative, no `# EOF`.
    fn encode_text(&self, out: &mut String) -> Result<(), std::fmt::Error> {
        for f in &self.0 {
            let (name, kind) = match f.kind {
                MetricType::Counter => (format!("{}_total", f.name), "counter"),
                MetricType::Histogram => (f.name.to_string(), "histogram"),
                _ => (f.name.to_string(), "gauge"),
            };
            let help = f.help.replace('\\', "\\\\").replace('\n', "\\n");
            writeln!(out, "# HELP {name} {help}")?;
            writeln!(out, "# TYPE {name} {kind}")?;
            for (labels, value) in &f.samples {
                match value {
                    Value::Gauge(v) | Value::Counter(v) => {
                        writeln!(out, "{name}{} {}", text_labels(labels, None), number(*v))?
                    }
                    Value::Histogram {
                        sum,
                        count,
                        buckets,
                    } => {
                        let mut seen = 0;
                        for (le, n) in buckets {
                            seen += n;
                            let le = number(if *le == f64::MAX { f64::INFINITY } else { *le });
                            let labels = text_labels(labels, Some(&le));
                            writeln!(out, "{name}_bucket{labels} {seen}")?;
                        }
                        let labels = text_labels(labels, None);
                        writeln!(out, "{name}_sum{labels} {}", number(*sum))?;
                        writeln!(out, "{name}_count{labels} {count}")?;
                    }
                }
            }
        }
        Ok(())
    }
}

impl prometheus_client::collector::Collector for Families {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.0 {
            // A name ending in `_seconds` gets its `# UNIT` line
            // (prometheus-client appends the unit to the name given).
            let (name, unit) = match f.name.strip_suffix("_seconds") {
                Some(base) => (base, Some(&Unit::Seconds)),
                None => (f.name, None),
            };
            let mut metric = encoder.encode_descriptor(name, f.help, unit, f.kind)?;
            for (labels, value) in &f.samples {
                encode_sample(&mut metric, labels, value)?;
            }
        }
        Ok(())
    }
}

/// `{k="v",…}` (values are escaped already), with `le` last if given;
/// nothing without labels.
fn text_labels(labels: &[(String, String)], le: Option<&str>) -> String {
    let mut pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    if let Some(le) = le {
        pairs.push(format!("le=\"{le}\""));
    }
    if pairs.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", pairs.join(","))
    }
}

/// A sample value as the text format writes it (`+Inf`, `-Inf`, `NaN`).
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
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
        let text = out.encode(Format::OpenMetrics).unwrap();
        assert!(text.contains("# TYPE m gauge\n"), "{text}");
        assert!(text.contains("m{a=\"x\\\"y\"} 1.5\n"), "{text}");
        assert!(text.contains("m{a=\"b\\\\c\\nd\"} 2.0\n"), "{text}");
        assert!(text.contains("# TYPE c counter\nc_total 3.0\n"), "{text}");
        assert!(
            text.contains("# TYPE h_seconds histogram\n# UNIT h_seconds seconds\n"),
            "{text}"
        );
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

    /// The classic text format: a counter's family is its `_total`
    /// series, help and label values escaped, histogram buckets
    /// cumulative with `le` last, no `# EOF`.
    #[test]
    fn families_encode_as_classic_text() {
        let mut out = Families::default();
        gauge(
            &mut out,
            "m",
            "A gauge\\ with\nlines.",
            [(vec![("a", "x\"y")], 1.5)],
        );
        counter(&mut out, "c", "A counter.", [(vec![], 3.0)]);
        gauge(&mut out, "e", "Empty.", []);
        let mut h = Histogram::default();
        h.observe(std::time::Duration::from_millis(2));
        h.observe(std::time::Duration::from_secs(2));
        histogram(&mut out, "h_seconds", "A histogram.", [("q", &h)]);
        let text = out.encode(Format::Text).unwrap();
        assert!(
            text.starts_with(
                "# HELP m A gauge\\\\ with\\nlines.\n# TYPE m gauge\nm{a=\"x\\\"y\"} 1.5\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("# HELP c_total A counter.\n# TYPE c_total counter\nc_total 3\n"),
            "{text}"
        );
        assert!(text.contains("# TYPE e gauge\n# HELP h_seconds"), "{text}");
        for (le, n) in [
            ("0.001", 0),
            ("0.0025", 1),
            ("1", 1),
            ("2.5", 2),
            ("+Inf", 2),
        ] {
            let line = format!("h_seconds_bucket{{queue=\"q\",le=\"{le}\"}} {n}\n");
            assert!(text.contains(&line), "{line} in {text}");
        }
        assert!(
            text.contains("h_seconds_sum{queue=\"q\"} 2.002\n"),
            "{text}"
        );
        assert!(text.ends_with("h_seconds_count{queue=\"q\"} 2\n"), "{text}");
    }

    /// What Prometheus, curl and a client preferring text ask for.
    #[test]
    fn accept_picks_the_format() {
        let f = |a: &str| Format::from_accept(Some(a));
        assert_eq!(f("application/openmetrics-text; version=0.0.1,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"), Format::OpenMetrics);
        assert_eq!(
            f("text/plain;version=0.0.4;q=0.9,application/openmetrics-text;q=0.5"),
            Format::Text
        );
        assert_eq!(f("application/openmetrics-text;q=0"), Format::Text);
        assert_eq!(f("application/json"), Format::Text);
        assert_eq!(f("*/*"), Format::Text);
        assert_eq!(Format::Text.content_type(), TEXT_CONTENT_TYPE);
    }
}
