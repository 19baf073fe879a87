//! `baton-bench`: the benchmark harness for baton.
//!
//! Every subcommand takes `--store URL` and `--prefix` (default: a fresh
//! random one, so runs never collide), runs one measurement and prints one
//! JSON line (starting with `{`) followed by one human line (starting with
//! `#`). Repetition, medians and side-by-side comparisons with the stores'
//! own ceilings live in `scripts/bench.sh`; results are in
//! `docs/BENCHMARKS.md`.

/// The `baton` binary's allocator (see its `main.rs`), so a run measures
/// the queue as it runs there.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use baton::lock::{LockOptions, Locker};
use baton::queue::{Queue, TaskBuilder, TaskError, Worker, WorkerConfig};
use baton::store::{Acquire, Finish, LockAcquire, TaskClaim};
use baton::{Store, StoreOptions};
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::{json, Value};
use sqlx::Connection;
use tokio_util::sync::CancellationToken;

mod ceiling;
mod ceiling_redis;
mod claim;
mod fair;
mod fleet;
mod harness;
mod latency;
mod lock;
mod precision;
mod throughput;

use claim::*;
use harness::*;
use latency::*;
use lock::*;
use precision::*;
use throughput::*;

#[derive(Parser)]
#[command(name = "baton-bench", about = "Benchmarks for baton's locks and queue")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Acquire + release loops on distinct (uncontended) lock names.
    Lock(LockArgs),
    /// Pre-insert jobs, then drain them with several workers (graphile-worker's perfTest shape).
    QueueThroughput(ThroughputArgs),
    /// Enqueue one job at a time; measure enqueue -> handler start.
    Latency(LatencyArgs),
    /// Claim rate (batches of --batch, --claimers at once) over a pending backlog.
    ClaimScale(ClaimArgs),
    /// Scheduling precision: N instances (scheduler + worker, each on its own
    /// store handle) run a durable `every` job; slot -> handler start latency
    /// and skipped / missed / doubled slots.
    SchedulePrecision(PrecisionArgs),
    /// A fleet: N instances (scheduler + worker, each on a store of its
    /// own) on one store, idle then under a trickle: server connections,
    /// transactions or commands a second, slot lag.
    Fleet(fleet::FleetArgs),
    /// Fair claiming: a backlog of one key, then a few tasks of another;
    /// their start latency with fair claiming off and on, against the same
    /// tasks on an empty queue.
    FairLatency(fair::FairArgs),
    /// The store's own ceiling for a no-op task's work (claim and finish
    /// in batches with bare statements on baton's schema), to run beside
    /// `queue-throughput` (PostgreSQL, MySQL, SQLite; Redis: baton's own
    /// claim and finish scripts, pipelined).
    Ceiling(ceiling::CeilingArgs),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let common = match &cli.cmd {
        Cmd::Lock(a) => &a.common,
        Cmd::QueueThroughput(a) => &a.common,
        Cmd::Latency(a) => &a.common,
        Cmd::ClaimScale(a) => &a.common,
        Cmd::SchedulePrecision(a) => &a.common,
        Cmd::Fleet(a) => &a.common,
        Cmd::FairLatency(a) => &a.common,
        Cmd::Ceiling(a) => &a.common,
    };
    let rt = match common.runtime {
        Flavor::Multi => tokio::runtime::Builder::new_multi_thread(),
        Flavor::Current => tokio::runtime::Builder::new_current_thread(),
    }
    .enable_all()
    .build()
    .context("building the tokio runtime")?;
    rt.block_on(async move {
        match cli.cmd {
            Cmd::Lock(a) => lock_bench(a).await,
            Cmd::QueueThroughput(a) => throughput_bench(a).await,
            Cmd::Latency(a) => latency_bench(a).await,
            Cmd::ClaimScale(a) => claim_bench(a).await,
            Cmd::SchedulePrecision(a) => precision_bench(a).await,
            Cmd::Fleet(a) => fleet::fleet_bench(a).await,
            Cmd::FairLatency(a) => fair::fair_bench(a).await,
            Cmd::Ceiling(a) => ceiling::ceiling_bench(a).await,
        }
    })
}
