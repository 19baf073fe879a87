//! `baton-bench ceiling`: what the store itself can do for the work a
//! worker's no-op task costs it (issue 28 item 1), with baton's own schema
//! and backlog and no baton client in the way: `--clients` connections
//! each claim a batch of pending tasks in the claim index's order with
//! `FOR UPDATE SKIP LOCKED` (setting `running`, the attempt, `started_at`,
//! `lease_until`, `worker` and a new claim token) and commit, then finish
//! them with a compare-and-set on (id, claim token, `running`) setting
//! `succeeded` and `finished_at` and commit: the two transitions a worker
//! makes per task, two commits per batch. SQLite runs the same statements
//! from one process (one writer). Run it beside `queue-throughput` on the
//! same store to read baton's throughput as a share of the ceiling. Redis
//! runs baton's own claim and finish scripts, pipelined (`ceiling_redis`).

use super::*;

#[derive(Args)]
pub(super) struct CeilingArgs {
    #[command(flatten)]
    pub(super) common: Common,
    /// Tasks pre-inserted (through baton, into its own schema).
    #[arg(long, default_value_t = 200_000)]
    pub(super) jobs: u64,
    /// Connections claiming and finishing at once (SQLite: 1 writer).
    #[arg(long, default_value_t = 4)]
    pub(super) clients: usize,
    /// Tasks per claim.
    #[arg(long, default_value_t = 500)]
    pub(super) batch: u32,
    /// Tasks per `enqueue_many` call while pre-inserting.
    #[arg(long, default_value_t = 10_000)]
    pub(super) insert_batch: u64,
    /// PostgreSQL: finish the batch held and claim the next in one
    /// statement (one round trip and one commit a batch instead of two).
    #[arg(long)]
    pub(super) combined: bool,
    /// MySQL: the ceiling's statements moved toward baton's own, one
    /// difference at a time, to find which of them costs the server
    /// (comma-separated; any of them sends text batches, as baton does):
    /// `text` (text batches with literal values, nothing else changed),
    /// `rc` (`READ COMMITTED`), `walk2` (the locking select walks twice the
    /// batch, the claim takes the first half), `rows` (the select reads
    /// the candidates' whole rows), `token` (the claim's instant in a
    /// session variable, the fencing token `GREATEST(token + 1, now µs)`),
    /// `paused` (the select checks the queue's paused flag and
    /// `cancel_requested`), `cas` (the finish by (id, claim token) pairs,
    /// `lease_until` cleared, its changed-row count read), `ride` (the
    /// finish of the batch held opens the next claim's transaction).
    /// SQLite takes `rows` only: the claim answers every column a worker
    /// needs to run the task (kind, payload, attempt, …), not only the id
    /// and token.
    #[arg(long, value_delimiter = ',')]
    pub(super) shape: Vec<MyShape>,
}

/// One of [`CeilingArgs::shape`]'s differences.
#[derive(Clone, Copy, PartialEq, Eq, Debug, ValueEnum)]
pub(super) enum MyShape {
    Text,
    Rc,
    Walk2,
    Rows,
    Token,
    Paused,
    Cas,
    Ride,
}

/// The queue the ceiling's tasks are in.
const QUEUE: &str = "bench";

pub(super) async fn ceiling_bench(a: CeilingArgs) -> Result<()> {
    if a.batch == 0 || a.clients == 0 {
        bail!("--batch and --clients: at least 1");
    }
    let ctx = Ctx::new(&a.common);
    let mysql = ctx.url.starts_with("mysql") || ctx.url.starts_with("mariadb");
    let lite_rows = ctx.url.starts_with("sqlite") && a.shape == [MyShape::Rows];
    if !a.shape.is_empty() && !mysql && !lite_rows {
        bail!("--shape: MySQL and MariaDB (any), SQLite (`rows` only)");
    }
    if a.combined && !ctx.is_postgres() {
        bail!("--combined: PostgreSQL only (the Redis ceiling pipelines its two scripts)");
    }
    let store = ctx.connect().await?;
    let kind = store.backend().kind();
    let q = Queue::new(store.clone());
    insert_keyed_jobs(&q, QUEUE, a.jobs, a.insert_batch, 0).await?;
    let done = Arc::new(AtomicU64::new(0));
    let (t0, cpu0) = (Instant::now(), cpu_s());
    let mut clients = tokio::task::JoinSet::new();
    let clients_n = if kind == "sqlite" { 1 } else { a.clients };
    for i in 0..clients_n {
        let (url, table, done) = (ctx.url.clone(), ctx.tasks_table(), done.clone());
        let prefix = ctx.prefix.clone();
        let (batch, worker, combined) = (a.batch, format!("ceiling-{i}"), a.combined);
        let shape = a.shape.clone();
        clients.spawn(async move {
            match kind {
                "postgres" if combined => pg_combined(&url, &table, batch, &worker, &done).await,
                "postgres" => pg_client(&url, &table, batch, &worker, &done).await,
                "mysql" if !shape.is_empty() => {
                    my_shaped(&url, &table, batch, &worker, &done, &shape).await
                }
                "mysql" => my_client(&url, &table, batch, &worker, &done).await,
                "sqlite" => {
                    let rows = shape.contains(&MyShape::Rows);
                    lite_client(&url, &table, batch, &worker, &done, rows).await
                }
                "redis" => {
                    crate::ceiling_redis::redis_client(&url, &prefix, QUEUE, batch, &worker, &done)
                        .await
                }
                other => bail!("no ceiling for the {other} store"),
            }
        });
    }
    while let Some(r) = clients.join_next().await {
        r.context("a ceiling client panicked")??;
    }
    let secs = t0.elapsed().as_secs_f64();
    let n = done.load(Ordering::Relaxed);
    if n != a.jobs {
        bail!("the clients finished {n} of {} tasks", a.jobs);
    }
    let jobs_per_s = n as f64 / secs;
    let cpu = cpu_us_per_task(cpu0, n);
    emit(
        json!({
            "bench": "ceiling", "store": kind, "jobs": n, "clients": clients_n,
            "batch": a.batch, "combined": a.combined,
            "shape": a.shape.iter().map(|s| format!("{s:?}").to_lowercase()).collect::<Vec<_>>(),
            "drain_s": round3(secs), "jobs_per_s": round1(jobs_per_s),
            "prefix": ctx.prefix, "client_cpu_us_per_task": cpu,
        }),
        format!(
            "ceiling {kind}: {n} tasks claimed and finished by {clients_n} client(s) in batches of {}: {jobs_per_s:.0} jobs/s ({secs:.2} s)",
            a.batch
        ),
    );
    ctx.cleanup().await
}

/// PostgreSQL: one autocommit statement per transition.
async fn pg_client(
    url: &str,
    table: &str,
    batch: u32,
    worker: &str,
    done: &AtomicU64,
) -> Result<()> {
    let mut c = sqlx::PgConnection::connect(url).await?;
    let t = format!("\"{table}\"");
    let (claim, finish) = (pg_claim(&t), pg_finish(&t, "$1", "$2"));
    loop {
        let rows: Vec<(i64, i64)> = sqlx::query_as(&claim)
            .bind(QUEUE)
            .bind(worker)
            .bind(i64::from(batch))
            .fetch_all(&mut c)
            .await?;
        if rows.is_empty() {
            return Ok(());
        }
        let (ids, tokens): (Vec<i64>, Vec<i64>) = rows.into_iter().unzip();
        let r = sqlx::query(&finish)
            .bind(&ids)
            .bind(&tokens)
            .execute(&mut c)
            .await?;
        done.fetch_add(r.rows_affected(), Ordering::Relaxed);
    }
}

/// PostgreSQL's bare claim of table `t`: `$1` queue, `$2` worker, `$3`
/// limit → (id, claim_token).
fn pg_claim(t: &str) -> String {
    format!(
        "UPDATE {t} SET state = 'running', attempt = attempt + 1, started_at = now(), \
             lease_until = now() + interval '30 seconds', worker = $2, \
             claim_token = claim_token + 1 \
         WHERE id IN (SELECT id FROM {t} \
             WHERE state = 'pending' AND queue = $1 AND run_at <= now() \
             ORDER BY priority, run_at, id LIMIT $3 FOR UPDATE SKIP LOCKED) \
         RETURNING id, claim_token"
    )
}

/// PostgreSQL's bare finish of table `t` (alias `t`): the compare-and-set
/// on (id, claim token, `running`) of the pairs in the arrays `ids` and
/// `tokens` (parameter names).
fn pg_finish(t: &str, ids: &str, tokens: &str) -> String {
    format!(
        "UPDATE {t} AS t SET state = 'succeeded', finished_at = now() \
         FROM UNNEST({ids}::int8[], {tokens}::int8[]) AS c(id, token) \
         WHERE t.id = c.id AND t.claim_token = c.token AND t.state = 'running'"
    )
}

/// PostgreSQL, `--combined`: one statement a batch finishes the batch
/// held (the same compare-and-set) and claims the next; its rows are the
/// claimed (id, token) pairs and one row (-1, finished count).
async fn pg_combined(
    url: &str,
    table: &str,
    batch: u32,
    worker: &str,
    done: &AtomicU64,
) -> Result<()> {
    let mut c = sqlx::PgConnection::connect(url).await?;
    let t = format!("\"{table}\"");
    let sql = format!(
        "WITH f AS ({} RETURNING t.id), cl AS ({}) \
         SELECT id, claim_token FROM cl UNION ALL SELECT -1, count(*) FROM f",
        pg_finish(&t, "$4", "$5"),
        pg_claim(&t)
    );
    let (mut ids, mut tokens): (Vec<i64>, Vec<i64>) = (Vec::new(), Vec::new());
    loop {
        let rows: Vec<(i64, i64)> = sqlx::query_as(&sql)
            .bind(QUEUE)
            .bind(worker)
            .bind(i64::from(batch))
            .bind(&ids)
            .bind(&tokens)
            .fetch_all(&mut c)
            .await?;
        let n = rows.iter().find(|r| r.0 == -1).map_or(0, |r| r.1);
        if n != ids.len() as i64 {
            bail!("finish: {n} of {} compare-and-sets held", ids.len());
        }
        done.fetch_add(n as u64, Ordering::Relaxed);
        (ids, tokens) = rows.into_iter().filter(|r| r.0 != -1).unzip();
        if ids.is_empty() {
            return Ok(());
        }
    }
}

/// MySQL/MariaDB: the claim reads the batch `FOR UPDATE SKIP LOCKED` and
/// updates it in one transaction; the finish is one autocommit statement
/// on (id, worker, `running`).
async fn my_client(
    url: &str,
    table: &str,
    batch: u32,
    worker: &str,
    done: &AtomicU64,
) -> Result<()> {
    let url = url.replacen("mariadb://", "mysql://", 1);
    let mut c = sqlx::MySqlConnection::connect(&url).await?;
    let t = format!("`{table}`");
    let pick = format!(
        "SELECT id FROM {t} WHERE state = 'pending' AND queue = ? AND run_at <= NOW(6) \
         ORDER BY priority, run_at, id LIMIT ? FOR UPDATE SKIP LOCKED"
    );
    loop {
        let mut tx = c.begin().await?;
        let ids: Vec<i64> = sqlx::query_scalar(&pick)
            .bind(QUEUE)
            .bind(i64::from(batch))
            .fetch_all(&mut *tx)
            .await?;
        if ids.is_empty() {
            tx.commit().await?;
            return Ok(());
        }
        let list = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
        sqlx::query(&format!(
            "UPDATE {t} SET state = 'running', attempt = attempt + 1, started_at = NOW(6), \
                 lease_until = NOW(6) + INTERVAL 30 SECOND, worker = ?, \
                 claim_token = claim_token + 1 WHERE id IN ({list})"
        ))
        .bind(worker)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        let r = sqlx::query(&format!(
            "UPDATE {t} SET state = 'succeeded', finished_at = NOW(6) \
             WHERE id IN ({list}) AND worker = ? AND state = 'running'"
        ))
        .bind(worker)
        .execute(&mut c)
        .await?;
        done.fetch_add(r.rows_affected(), Ordering::Relaxed);
    }
}

/// MySQL in text batches, with [`CeilingArgs::shape`]'s differences from
/// [`my_client`] (each one of baton's own statements' traits).
async fn my_shaped(
    url: &str,
    table: &str,
    batch: u32,
    worker: &str,
    done: &AtomicU64,
    shape: &[MyShape],
) -> Result<()> {
    use sqlx::{Executor, Row};
    let on = |s: MyShape| shape.contains(&s);
    let url = url.replacen("mariadb://", "mysql://", 1);
    let mut c = sqlx::MySqlConnection::connect(&url).await?;
    let t = format!("`{table}`");
    let begin = if on(MyShape::Rc) {
        "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION"
    } else {
        "START TRANSACTION"
    };
    let now = if on(MyShape::Token) { "@bt" } else { "NOW(6)" };
    let set_t = if on(MyShape::Token) {
        "SET @bt = NOW(6); "
    } else {
        ""
    };
    let t_us = if on(MyShape::Token) {
        ", TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', @bt) AS t_us"
    } else {
        ""
    };
    let cols = if on(MyShape::Rows) {
        "id, claim_token, queue, kind, payload, priority, attempt, max_attempts, timeout_ms, \
         run_at, lease_until, job, slot, traceparent, CAST(attempt + 1 < max_attempts AS SIGNED) AS spare"
    } else {
        "id, claim_token"
    };
    let paused = if on(MyShape::Paused) {
        format!(
            " AND cancel_requested = 0 AND NOT EXISTS (SELECT 1 FROM `{}queues` \
             WHERE queue = '{QUEUE}' AND paused = 1)",
            table.trim_end_matches("tasks")
        )
    } else {
        String::new()
    };
    let walk = if on(MyShape::Walk2) { 2 * batch } else { batch };
    let token_set = if on(MyShape::Token) {
        "GREATEST(claim_token + 1, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', @bt))"
    } else {
        "claim_token + 1"
    };
    // The batch held (id, its new token), finished next.
    let mut held: Vec<(i64, i64)> = Vec::new();
    let finish_sql = |held: &[(i64, i64)]| -> String {
        let ids = held
            .iter()
            .map(|(i, _)| i.to_string())
            .collect::<Vec<_>>()
            .join(",");
        if on(MyShape::Cas) {
            let pairs = held
                .iter()
                .map(|(i, k)| format!("({i}, {k})"))
                .collect::<Vec<_>>()
                .join(", ");
            format!(
                "SET @bf = NOW(6); UPDATE {t} FORCE INDEX (PRIMARY) SET state = 'succeeded', \
                     finished_at = @bf, lease_until = NULL \
                 WHERE id IN ({ids}) AND state = 'running' AND (id, claim_token) IN ({pairs}); \
                 SELECT ROW_COUNT() AS finished_n; "
            )
        } else {
            format!(
                "UPDATE {t} SET state = 'succeeded', finished_at = NOW(6) \
                 WHERE id IN ({ids}) AND worker = '{worker}' AND state = 'running'; \
                 SELECT ROW_COUNT() AS finished_n; "
            )
        }
    };
    let count = |rows: &[sqlx::mysql::MySqlRow]| -> Result<u64> {
        let mut n = 0;
        for r in rows {
            if r.columns().first().map(sqlx::Column::name) == Some("finished_n") {
                n += u64::try_from(r.try_get::<i64, _>(0)?)?;
            }
        }
        Ok(n)
    };
    loop {
        let ride = if on(MyShape::Ride) && !held.is_empty() {
            finish_sql(&held)
        } else {
            String::new()
        };
        let rows = c
            .fetch_all(sqlx::raw_sql(&format!(
                "{begin}; {ride}{set_t}SELECT {cols}{t_us} FROM {t} WHERE state = 'pending' \
                     AND queue = '{QUEUE}' AND run_at <= NOW(6){paused} \
                 ORDER BY priority, run_at, id LIMIT {walk} FOR UPDATE SKIP LOCKED"
            )))
            .await?;
        if !ride.is_empty() {
            done.fetch_add(count(&rows)?, Ordering::Relaxed);
            held.clear();
        }
        let mut picked = Vec::new();
        for r in rows
            .iter()
            .filter(|r| r.columns().first().map(sqlx::Column::name) == Some("id"))
        {
            if picked.len() < batch as usize {
                let token = r.try_get::<i64, _>("claim_token")? + 1;
                // Baton computes the new token from the row and the instant.
                let token = if on(MyShape::Token) {
                    token.max(r.try_get::<i64, _>("t_us")?)
                } else {
                    token
                };
                picked.push((r.try_get::<i64, _>("id")?, token));
            }
        }
        if picked.is_empty() {
            c.execute("COMMIT").await?;
            return Ok(());
        }
        let ids = picked
            .iter()
            .map(|(i, _)| i.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let lease = if on(MyShape::Token) {
            "@bt + INTERVAL 30000000 MICROSECOND"
        } else {
            "NOW(6) + INTERVAL 30 SECOND"
        };
        c.execute(sqlx::raw_sql(&format!(
            "UPDATE {t} SET state = 'running', attempt = attempt + 1, started_at = {now}, \
                 lease_until = {lease}, worker = '{worker}', claim_token = {token_set} \
             WHERE id IN ({ids}); COMMIT"
        )))
        .await?;
        held = picked;
        if !on(MyShape::Ride) {
            let rows = c
                .fetch_all(sqlx::raw_sql(&format!(
                    "{begin}; {}COMMIT",
                    finish_sql(&held)
                )))
                .await?;
            done.fetch_add(count(&rows)?, Ordering::Relaxed);
            held.clear();
        }
    }
}

/// SQLite: one writer; each transition one `BEGIN IMMEDIATE` transaction
/// and one statement, at baton's `synchronous = NORMAL`. With `rows` the
/// claim answers each task's whole row, every column read.
async fn lite_client(
    url: &str,
    table: &str,
    batch: u32,
    worker: &str,
    done: &AtomicU64,
    rows: bool,
) -> Result<()> {
    // Baton's own durability setting (`synchronous = NORMAL` in WAL mode,
    // `store::sqlite`): sqlx's default is FULL, an fsync of the WAL at
    // every commit, which baton does not pay.
    let opts = <sqlx::sqlite::SqliteConnectOptions as std::str::FromStr>::from_str(url)?
        .synchronous(sqlx::sqlite::SqliteSynchronous::Normal);
    let mut c = sqlx::SqliteConnection::connect_with(&opts).await?;
    let t = format!("\"{table}\"");
    let now = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";
    let claim = format!(
        "UPDATE {t} SET state = 'running', attempt = attempt + 1, started_at = {now}, \
             lease_until = {now} + 30000, worker = ?2, claim_token = claim_token + 1 \
         WHERE id IN (SELECT id FROM {t} \
             WHERE state = 'pending' AND queue = ?1 AND run_at <= {now} \
             ORDER BY priority, run_at, id LIMIT ?3) \
         RETURNING {}id, claim_token",
        if rows {
            "queue, kind, payload, priority, attempt, max_attempts, timeout_ms, run_at, \
             lease_until, job, slot, traceparent, "
        } else {
            ""
        }
    );
    // One set-based finish a batch (as baton's own finish is): the
    // claimed (id, token) pairs as a JSON array.
    let finish = format!(
        "UPDATE {t} SET state = 'succeeded', finished_at = {now} \
         WHERE state = 'running' AND (id, claim_token) IN \
             (SELECT value ->> 0, value ->> 1 FROM json_each(?1))"
    );
    loop {
        let mut tx = c.begin_with("BEGIN IMMEDIATE").await?;
        let answer = sqlx::query(&claim)
            .bind(QUEUE)
            .bind(worker)
            .bind(i64::from(batch))
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        let rows = answer
            .iter()
            .map(|r| lite_claimed(r, rows))
            .collect::<Result<Vec<(i64, i64)>>>()?;
        if rows.is_empty() {
            return Ok(());
        }
        let pairs = serde_json::to_string(&rows)?;
        let mut tx = c.begin_with("BEGIN IMMEDIATE").await?;
        let n = sqlx::query(&finish)
            .bind(pairs)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        done.fetch_add(n, Ordering::Relaxed);
    }
}

/// The columns besides (id, claim token) a worker needs to run a task,
/// as the SQLite ceiling's claim answers them with `--shape rows`.
type LiteRow = (
    String,
    String,
    String,
    i64,
    i64,
    i64,
    Option<i64>,
    i64,
    i64,
    Option<String>,
    Option<i64>,
    Option<String>,
);

/// A task the SQLite ceiling claimed: its (id, claim token), with `rows`
/// after reading every other column (the answer's first ones) as a worker
/// would.
fn lite_claimed(r: &sqlx::sqlite::SqliteRow, rows: bool) -> Result<(i64, i64)> {
    use sqlx::{FromRow, Row};
    if rows {
        let _: LiteRow = FromRow::from_row(r)?;
    }
    Ok((r.try_get("id")?, r.try_get("claim_token")?))
}
