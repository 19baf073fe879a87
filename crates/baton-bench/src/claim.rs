//! `baton-bench claim-scale`: the claim rate over a pending backlog
//! (batches, concurrent claimers), with PostgreSQL's plan and statistics.

use super::*;

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub(super) enum FinishMode {
    /// Finish each claimed task with HandBack: it returns to pending, so the
    /// backlog stays at exactly --pending for the whole run.
    Handback,
    /// Finish each claimed task as succeeded (the backlog shrinks).
    Succeed,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub(super) enum AnalyzeMode {
    None,
    Fresh,
    Both,
}

#[derive(Args)]
pub(super) struct ClaimArgs {
    #[command(flatten)]
    pub(super) common: Common,
    /// Pending tasks to insert before measuring.
    #[arg(long, default_value_t = 10_000)]
    pub(super) pending: u64,
    #[arg(long, default_value_t = 4)]
    pub(super) claimers: usize,
    /// Tasks per claim.
    #[arg(long, default_value_t = 10)]
    pub(super) batch: u32,
    /// Seconds per measurement round.
    #[arg(long, default_value_t = 10.0)]
    pub(super) duration: f64,
    /// How each claimed task is finished.
    #[arg(long, value_enum, default_value_t = FinishMode::Handback)]
    pub(super) finish: FinishMode,
    /// PostgreSQL: measure with no statistics (`none`), right after an
    /// ANALYZE (`fresh`), or first without and then with (`both`).
    #[arg(long, value_enum, default_value_t = AnalyzeMode::Both)]
    pub(super) analyze: AnalyzeMode,
    /// Measurement rounds per phase (after one bulk insert).
    #[arg(long, default_value_t = 3)]
    pub(super) rounds: usize,
    /// PostgreSQL: print EXPLAIN (ANALYZE, BUFFERS) of one claim (rolled back) to stderr.
    #[arg(long)]
    pub(super) explain: bool,
    #[arg(long, default_value_t = 10_000)]
    pub(super) insert_batch: u64,
}

pub(super) async fn pg_stats_state(ctx: &Ctx) -> Result<Value> {
    let mut c = ctx.pg().await?;
    let row: Option<(i64, i64, i64)> = sqlx::query_as(
        "SELECT n_live_tup, analyze_count, autoanalyze_count FROM pg_stat_user_tables \
         WHERE relname = $1",
    )
    .bind(ctx.tasks_table())
    .fetch_optional(&mut c)
    .await?;
    let stats_rows: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stats WHERE schemaname = current_schema() AND tablename = $1",
    )
    .bind(ctx.tasks_table())
    .fetch_one(&mut c)
    .await?;
    let reltuples: Option<f32> =
        sqlx::query_scalar("SELECT reltuples FROM pg_class WHERE oid = to_regclass($1)")
            .bind(format!("\"{}\"", ctx.tasks_table()))
            .fetch_optional(&mut c)
            .await?;
    Ok(match row {
        Some((live, an, auto)) => json!({
            "n_live_tup": live, "analyze_count": an, "autoanalyze_count": auto,
            "pg_stats_columns": stats_rows, "reltuples": reltuples,
        }),
        None => json!(null),
    })
}

/// EXPLAIN (ANALYZE, BUFFERS) of one claim (custom plan) and the generic
/// plan, each in a transaction that is rolled back: the library's own
/// claim statement.
pub(super) async fn pg_explain_claim(ctx: &Ctx, queue: &str, limit: u32) -> Result<String> {
    let mut c = ctx.pg().await?;
    let p = Some(ctx.prefix.as_str());
    let custom =
        baton::store::postgres::explain_claim(&mut c, p, queue, limit, false, true).await?;
    let generic =
        baton::store::postgres::explain_claim(&mut c, p, queue, limit, true, false).await?;
    Ok(format!(
        "EXPLAIN ANALYZE (custom):\n{custom}\nEXPLAIN (generic plan):\n{generic}"
    ))
}

pub(super) struct Round {
    pub(super) rate: f64,
    pub(super) claims_per_s: f64,
    pub(super) empty: u64,
    pub(super) claim_lat: Sorted,
    pub(super) finish_lat: Sorted,
}

pub(super) async fn claim_round(
    store: &Store,
    queue: &'static str,
    a: &ClaimArgs,
) -> Result<Round> {
    let measure = Duration::from_secs_f64(a.duration);
    let claimed = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let end = t0 + measure;
    let mut set = tokio::task::JoinSet::new();
    for i in 0..a.claimers {
        let store = store.clone();
        let claimed = claimed.clone();
        let (batch, mode) = (a.batch, a.finish);
        set.spawn(async move {
            let worker = format!("bench-claimer-{i}");
            let b = store.backend();
            let mut claim_lat = Samples::new();
            let mut finish_lat = Samples::new();
            let mut empty = 0u64;
            let finish = match mode {
                FinishMode::Handback => Finish::HandBack,
                FinishMode::Succeed => Finish::Succeeded,
            };
            while Instant::now() < end {
                let c0 = Instant::now();
                let got = b
                    .task_claim(&TaskClaim {
                        queue,
                        worker: &worker,
                        limit: batch,
                        lease: Duration::from_secs(60),
                        max_running: None,
                        per_key_max_running: None,
                        buffered: 0,
                        fair: false,
                    })
                    .await?;
                claim_lat.push(c0.elapsed());
                if got.is_empty() {
                    empty += 1;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
                claimed.fetch_add(got.len() as u64, Ordering::Relaxed);
                for t in got {
                    let f0 = Instant::now();
                    let ok = b
                        .task_finish_many(&[(t.claim(), finish.clone())])
                        .await
                        .map(|r| r == [true])?;
                    finish_lat.push(f0.elapsed());
                    if !ok {
                        bail!("finish of task {} refused", t.id);
                    }
                }
            }
            Ok::<_, anyhow::Error>((claim_lat, finish_lat, empty))
        });
    }
    let mut claim_lat = Samples::new();
    let mut finish_lat = Samples::new();
    let mut empty = 0;
    while let Some(r) = set.join_next().await {
        let (c, f, e) = r.context("claimer panicked")??;
        claim_lat.merge(c);
        finish_lat.merge(f);
        empty += e;
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let n = claimed.load(Ordering::Relaxed);
    let claim_lat = claim_lat.finish();
    Ok(Round {
        rate: n as f64 / elapsed,
        claims_per_s: claim_lat.0.len() as f64 / elapsed,
        empty,
        claim_lat,
        finish_lat: finish_lat.finish(),
    })
}

pub(super) fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.is_empty() {
        f64::NAN
    } else {
        s[s.len() / 2]
    }
}

pub(super) async fn claim_bench(a: ClaimArgs) -> Result<()> {
    let ctx = Ctx::new(&a.common);
    let store = ctx.connect().await?;
    let kind = store.backend().kind();
    let queue = "claims";
    let q = Queue::new(store.clone());
    let insert_s = insert_jobs(&q, queue, a.pending, a.insert_batch).await?;
    let pg = ctx.is_postgres();
    // Phases: PostgreSQL runs with no statistics (fresh table; the shared
    // server has autovacuum off, and we record whether anything analyzed it)
    // and/or right after an ANALYZE.
    let phases: Vec<&str> = match (pg, a.analyze) {
        (false, _) => vec!["-"],
        (true, AnalyzeMode::None) => vec!["no-stats"],
        (true, AnalyzeMode::Fresh) => vec!["analyzed"],
        (true, AnalyzeMode::Both) => vec!["no-stats", "analyzed"],
    };
    for phase in phases {
        let mut stats_before = Value::Null;
        if pg {
            if phase == "analyzed" {
                let mut c = ctx.pg().await?;
                sqlx::query(&format!("ANALYZE \"{}\"", ctx.tasks_table()))
                    .execute(&mut c)
                    .await?;
            }
            stats_before = pg_stats_state(&ctx).await?;
            if a.explain {
                eprintln!(
                    "== {kind} pending={} {phase}\n{}",
                    a.pending,
                    pg_explain_claim(&ctx, queue, a.batch).await?
                );
            }
        }
        let mut rounds = Vec::new();
        for _ in 0..a.rounds {
            rounds.push(claim_round(&store, queue, &a).await?);
        }
        let stats_after = if pg {
            pg_stats_state(&ctx).await?
        } else {
            Value::Null
        };
        let rates: Vec<f64> = rounds.iter().map(|r| r.rate).collect();
        let med = median(&rates);
        let p50s: Vec<f64> = rounds.iter().map(|r| r.claim_lat.ms(50.0)).collect();
        let pending_after = q
            .stats()
            .await?
            .iter()
            .find(|s| s.queue == queue)
            .map(|s| s.pending)
            .unwrap_or(0);
        emit(
            json!({
                "bench": "claim-scale", "store": kind, "pending": a.pending, "claimers": a.claimers,
                "batch": a.batch, "phase": phase,
                "finish": match a.finish { FinishMode::Handback => "handback", FinishMode::Succeed => "succeed" },
                "insert_s": round3(insert_s), "insert_per_s": round1(a.pending as f64 / insert_s),
                "round_s": a.duration,
                "claimed_per_s_median": round1(med),
                "rounds": rounds.iter().map(|r| json!({
                    "claimed_per_s": round1(r.rate), "claims_per_s": round1(r.claims_per_s),
                    "empty_claims": r.empty, "claim_latency": r.claim_lat.json(),
                    "finish_latency": r.finish_lat.json(),
                })).collect::<Vec<_>>(),
                "pending_after": pending_after, "pg_stats_before": stats_before,
                "pg_stats_after": stats_after, "prefix": ctx.prefix,
            }),
            format!(
                "claim-scale {kind} pending={} {phase}: median {:.0} tasks claimed+finished/s over {} rounds {:?}, claim p50 {:?} ms (insert {:.0}/s)",
                a.pending,
                med,
                rounds.len(),
                rates.iter().map(|r| r.round() as i64).collect::<Vec<_>>(),
                p50s.iter().map(|x| round3(*x)).collect::<Vec<_>>(),
                a.pending as f64 / insert_s
            ),
        );
    }
    ctx.cleanup().await
}
