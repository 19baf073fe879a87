//! What every benchmark shares: the common flags (store, prefix,
//! runtime), a connected context with a fresh prefix, samples and their
//! percentiles, the one JSON line plus one human line each run prints,
//! and bulk inserts.

use super::*;

#[derive(Args, Clone)]
pub(super) struct Common {
    /// Store URL: sqlite://PATH, postgres://…, mysql://…, redis://…
    #[arg(long)]
    pub(super) store: String,
    /// Table / key prefix (default: `bench_<random>_`).
    #[arg(long)]
    pub(super) prefix: Option<String>,
    /// Connections per store handle (SQL pools).
    #[arg(long, default_value_t = 16)]
    pub(super) pool: u32,
    /// Keep the PostgreSQL or MySQL tables afterwards (default: drop them).
    #[arg(long)]
    pub(super) keep: bool,
    /// PostgreSQL: delete succeeded tasks in their finish
    /// (`StoreOptions::keep_succeeded = false`) instead of keeping them.
    #[arg(long)]
    pub(super) delete_succeeded: bool,
    /// The tokio runtime the bench runs on: `multi` (one worker thread per
    /// core, what `#[tokio::main]` gives) or `current` (one thread).
    #[arg(long, value_enum, default_value_t = Flavor::Multi)]
    pub(super) runtime: Flavor,
}

/// A tokio runtime flavor.
#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
pub(super) enum Flavor {
    /// `new_multi_thread`: a worker thread per core.
    Multi,
    /// `new_current_thread`: everything on the calling thread.
    Current,
}

/// A knob forced on or off.
#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
pub(super) enum OnOff {
    /// On.
    On,
    /// Off.
    Off,
}

pub(super) fn random_prefix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mixed = (nanos as u64) ^ (u64::from(std::process::id()) << 40);
    // splitmix64 finaliser, so close timestamps give unrelated prefixes
    let mut z = mixed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    format!("bench_{:08x}_", z as u32)
}

pub(super) struct Ctx {
    pub(super) url: String,
    pub(super) prefix: String,
    pub(super) pool: u32,
    pub(super) keep: bool,
    pub(super) delete_succeeded: bool,
}

impl Ctx {
    pub(super) fn new(c: &Common) -> Ctx {
        Ctx {
            url: c.store.clone(),
            prefix: c.prefix.clone().unwrap_or_else(random_prefix),
            pool: c.pool,
            keep: c.keep,
            delete_succeeded: c.delete_succeeded,
        }
    }

    pub(super) async fn connect(&self) -> Result<Store> {
        Store::connect_with(
            &self.url,
            StoreOptions {
                prefix: Some(self.prefix.clone()),
                max_connections: self.pool,
                migrate: true,
                keep_succeeded: !self.delete_succeeded,
                ..Default::default()
            },
        )
        .await
        .with_context(|| format!("connecting to {}", baton::store::redact(&self.url)))
    }

    pub(super) fn is_postgres(&self) -> bool {
        self.url.starts_with("postgres://") || self.url.starts_with("postgresql://")
    }

    pub(super) fn tasks_table(&self) -> String {
        format!("{}tasks", self.prefix)
    }

    pub(super) async fn pg(&self) -> Result<sqlx::PgConnection> {
        sqlx::PgConnection::connect(&self.url)
            .await
            .context("opening a diagnostic PostgreSQL connection")
    }

    pub(super) fn is_mysql(&self) -> bool {
        self.url.starts_with("mysql://") || self.url.starts_with("mariadb://")
    }

    /// Drop this run's PostgreSQL or MySQL tables (SQLite files and Redis
    /// keys are removed by scripts/bench.sh).
    pub(super) async fn cleanup(&self) -> Result<()> {
        if self.keep {
            return Ok(());
        }
        if self.is_mysql() {
            let url = self.url.replacen("mariadb://", "mysql://", 1);
            let mut c = sqlx::MySqlConnection::connect(&url)
                .await
                .context("opening a MySQL connection to drop the bench tables")?;
            for t in ["meta", "locks", "tasks", "jobs", "queues"] {
                sqlx::query(&format!("DROP TABLE IF EXISTS `{}{t}`", self.prefix))
                    .execute(&mut c)
                    .await?;
            }
            // The fair claim's stored procedure (schema step 20 → 21).
            sqlx::query(&format!(
                "DROP PROCEDURE IF EXISTS `{}fair_claim`",
                self.prefix
            ))
            .execute(&mut c)
            .await?;
            return Ok(());
        }
        if self.url.starts_with("redis://") || self.url.starts_with("rediss://") {
            return self.cleanup_redis().await;
        }
        if let Some(rest) = self.url.strip_prefix("redis+cluster://") {
            return self.cleanup_redis_cluster(rest).await;
        }
        if !self.is_postgres() {
            return Ok(());
        }
        let mut c = self.pg().await?;
        let p = &self.prefix;
        for t in ["meta", "locks", "tasks", "jobs", "queues"] {
            sqlx::query(&format!("DROP TABLE IF EXISTS \"{p}{t}\""))
                .execute(&mut c)
                .await?;
        }
        sqlx::query(&format!("DROP SEQUENCE IF EXISTS \"{p}tasks_id_seq\""))
            .execute(&mut c)
            .await?;
        // The fair claim function (schema step 19 → 20).
        sqlx::query(&format!("DROP FUNCTION IF EXISTS \"{p}fair_claim\""))
            .execute(&mut c)
            .await?;
        Ok(())
    }

    /// [`Ctx::cleanup_redis`] on a Redis Cluster (`hosts` the URL after
    /// its scheme): the prefix's keys of every master, deleted one by one.
    pub(super) async fn cleanup_redis_cluster(&self, hosts: &str) -> Result<()> {
        use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
        let hosts = hosts.split(['/', '?']).next().unwrap_or_default();
        let nodes: Vec<String> = hosts.split(',').map(|h| format!("redis://{h}")).collect();
        let mut c = redis::cluster::ClusterClient::new(nodes)
            .context("opening the Redis Cluster to clean up")?
            .get_async_connection()
            .await
            .context("connecting to the Redis Cluster to clean up")?;
        let mut keys_cmd = redis::cmd("KEYS");
        keys_cmd.arg(format!("{}*", self.prefix));
        let v = c
            .route_command(
                &keys_cmd,
                RoutingInfo::MultiNode((
                    MultipleNodeRoutingInfo::AllMasters,
                    Some(ResponsePolicy::CombineArrays),
                )),
            )
            .await?;
        let keys: Vec<String> = redis::from_redis_value(&v)?;
        for k in keys {
            let _: () = redis::cmd("UNLINK").arg(&k).query_async(&mut c).await?;
        }
        Ok(())
    }

    /// Delete every key of this run's prefix (a shared Redis otherwise
    /// keeps a throughput run's tens of thousands of keys, and listing
    /// locks there scans them all).
    pub(super) async fn cleanup_redis(&self) -> Result<()> {
        let client = redis::Client::open(self.url.as_str()).context("opening Redis to clean up")?;
        let mut c = client
            .get_multiplexed_async_connection()
            .await
            .context("connecting to Redis to clean up")?;
        let pattern = format!("{}*", self.prefix);
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(10_000)
                .query_async(&mut c)
                .await?;
            if !keys.is_empty() {
                let _: () = redis::cmd("UNLINK").arg(&keys).query_async(&mut c).await?;
            }
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }
}

/// Latency samples in nanoseconds.
pub(super) struct Samples(pub(super) Vec<u64>);

impl Samples {
    pub(super) fn new() -> Samples {
        Samples(Vec::new())
    }
    pub(super) fn push(&mut self, d: Duration) {
        self.0.push(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }
    pub(super) fn merge(&mut self, other: Samples) {
        self.0.extend(other.0);
    }
    pub(super) fn finish(mut self) -> Sorted {
        self.0.sort_unstable();
        Sorted(self.0)
    }
}

pub(super) struct Sorted(pub(super) Vec<u64>);

impl Sorted {
    /// Nearest-rank percentile, in milliseconds.
    pub(super) fn ms(&self, p: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        let rank = ((p / 100.0) * self.0.len() as f64).ceil() as usize;
        let i = rank.clamp(1, self.0.len()) - 1;
        self.0[i] as f64 / 1e6
    }
    pub(super) fn json(&self) -> Value {
        json!({
            "n": self.0.len(),
            "p50_ms": round3(self.ms(50.0)),
            "p90_ms": round3(self.ms(90.0)),
            "p99_ms": round3(self.ms(99.0)),
            "max_ms": round3(self.ms(100.0)),
        })
    }
}

pub(super) fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

pub(super) fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

pub(super) fn emit(v: Value, human: String) {
    println!("{v}");
    println!("# {human}");
}

pub(super) async fn insert_jobs(q: &Queue, queue: &str, n: u64, batch: u64) -> Result<f64> {
    insert_keyed_jobs(q, queue, n, batch, 0).await
}

/// [`insert_jobs`], task `i` with the concurrency key `k{i % keys}` when
/// `keys` > 0 (the keys round-robin through the backlog).
pub(super) async fn insert_keyed_jobs(
    q: &Queue,
    queue: &str,
    n: u64,
    batch: u64,
    keys: u64,
) -> Result<f64> {
    let t0 = Instant::now();
    let mut done = 0;
    while done < n {
        let k = batch.min(n - done);
        let tasks: Vec<TaskBuilder> = (done..done + k)
            .map(|i| {
                let t = TaskBuilder::new("noop", json!({ "id": i })).queue(queue);
                if keys > 0 {
                    t.concurrency_key(format!("k{}", i % keys))
                } else {
                    t
                }
            })
            .collect();
        let out = q.enqueue_many(tasks).await.context("enqueue_many")?;
        if out.len() as u64 != k {
            bail!("enqueue_many returned {} results for {k} tasks", out.len());
        }
        done += k;
    }
    Ok(t0.elapsed().as_secs_f64())
}

/// This process's CPU time (user + system) so far in seconds, from
/// `/proc/self/stat` (Linux; 10 ms ticks), or `None` elsewhere: a
/// bench's client CPU is the difference across its measured phase.
pub(super) fn cpu_s() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command (which may hold spaces) in parentheses.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split(' ').collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// Client CPU µs per task across a phase that began at `cpu0` (from
/// [`cpu_s`]) and finished `n` tasks; JSON null when unknown.
pub(super) fn cpu_us_per_task(cpu0: Option<f64>, n: u64) -> Value {
    match (cpu0, cpu_s()) {
        (Some(a), Some(b)) if n > 0 => json!(round1((b - a) * 1e6 / n as f64)),
        _ => Value::Null,
    }
}
