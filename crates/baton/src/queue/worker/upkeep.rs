//! Upkeep: rescue of expired leases (with the store identity check),
//! pruning (finished tasks past the retention, the rollup, lock history,
//! the audit log), the throughput rollup's flush, the waiting-slot sweep
//! (`release_sweep.rs`) and readings of the store's clock, each on a timer
//! of its own.

use super::*;

/// How often a worker re-reads the store's clock for its timers.
pub(super) const CLOCK_RECALIBRATION: Duration = Duration::from_secs(60);

/// Rescue (with the store identity check when one is due), prune and the
/// store clock, each on its own timer, half a poll interval off the poll
/// ticker's beat (a call of each at the same instant would need two
/// connections). A rescue that requeues tasks pokes every queue.
pub(super) async fn upkeep_loop(
    shared: Arc<Shared>,
    pokes: Vec<Arc<Notify>>,
    clock: Arc<std::sync::OnceLock<StoreClock>>,
) {
    let cfg = &shared.config;
    // Defaults are whole numbers of ticks, so every upkeep call stays half
    // a tick off the claims (5 s of 2 s ticks would land every other
    // rescue on a claim, which then needs a second connection).
    let on_beat =
        |d: Duration| d.max(cfg.tick()).div_duration_f64(cfg.tick()).ceil() as u32 * cfg.tick();
    let rescue_every = cfg
        .rescue_interval
        .unwrap_or_else(|| on_beat(cfg.upkeep_base() * 5));
    let prune_every = on_beat(cfg.upkeep_base() * 300);
    let start = Instant::now() + cfg.tick() / 2;
    let mut rescue = tokio::time::interval_at(start + rescue_every, rescue_every);
    rescue.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut prune = tokio::time::interval_at(start + prune_every, prune_every);
    prune.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let flush_every = on_beat(cfg.upkeep_base() * super::rollup::FLUSH_EVERY);
    let mut flush = tokio::time::interval_at(start + flush_every, flush_every);
    flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let sweep_every = on_beat(cfg.upkeep_base() * super::release_sweep::SWEEP_POLLS);
    let mut sweep = tokio::time::interval_at(start + sweep_every, sweep_every);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first reading half a poll in; until one succeeds, retry each second.
    let mut recal = tokio::time::interval_at(start, CLOCK_RECALIBRATION);
    recal.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = recal.tick() => match clock.get() {
                Some(c) => {
                    c.recalibrate_if_suspended().await;
                    c.recalibrate_best_of(3).await;
                    shared.store.note_upkeep(3);
                }
                None => match StoreClock::new(shared.store.clone()).await {
                    Ok(c) => {
                        c.recalibrate_best_of(2).await;
                        shared.store.note_upkeep(3);
                        let _ = clock.set(c);
                    }
                    Err(e) => {
                        shared.counters.store_error("now");
                        tracing::warn!(error = %crate::error::chain(&e), "reading the store's clock failed; retrying");
                        recal.reset_after(Duration::from_secs(1));
                    }
                },
            },
            _ = rescue.tick(), if cfg.rescue => {
                match shared.upkeep(shared.store.backend().task_rescue_many()).await {
                    Ok(r) if r.requeued + r.failed + r.cancelled > 0 => {
                        tracing::info!(requeued = r.requeued, failed = r.failed, cancelled = r.cancelled, "rescued expired leases");
                        pokes.iter().for_each(|p| p.notify_one());
                    }
                    Ok(_) => {}
                    Err(e) => {
                        shared.counters.store_error("task_rescue_many");
                        crate::store::warn_unless_read_only!(e, error = %crate::error::chain(&e), "rescue failed")
                    }
                }
                // Is it still the store we connected to? Read every
                // IDENTITY_CHECK (every other rescue at the default
                // cadence; one check serves every clone of the store). A
                // change (a store that lost its data or went back in time)
                // is logged by the check, once; here only a failed read is
                // said.
                if shared.store.identity().take_due(IDENTITY_CHECK) {
                    if let Err(e) = shared.upkeep(shared.store.check_identity()).await {
                        shared.counters.store_error("store_identity");
                        tracing::debug!(error = %crate::error::chain(&e), "reading the store's identity failed");
                    }
                }
                // A store that refused writes: does it take them again?
                // (Claims resume by themselves; this clears the mark and
                // says so once.)
                if shared.store.read_only().is_some() {
                    if let Err(e) = shared.upkeep(shared.store.check_writable()).await {
                        tracing::debug!(error = %crate::error::chain(&e), "probing whether the store takes writes failed");
                    }
                }
            }
            _ = flush.tick() => super::rollup::flush(&shared).await,
            _ = sweep.tick() => super::release_sweep::sweep(&shared).await,
            _ = prune.tick() => {
                if let Some(keep) = cfg.retention {
                    prune_step(&shared, "task_prune_many", "finished tasks", shared.store.backend().task_prune_many(keep)).await;
                }
                prune_step(&shared, "stats_prune_many", "throughput rollup buckets", shared.store.backend().stats_prune_many()).await;
                prune_step(&shared, "lock_history_prune_many", "lock releases", shared.store.backend().lock_history_prune_many()).await;
                prune_step(&shared, "audit_prune_many", "audit records", shared.store.backend().audit_prune_many(crate::audit::RETENTION)).await;
                prune_step(&shared, "jobdef_prune_many", "job definition tombstones", shared.store.backend().jobdef_prune_many(crate::store::jobdefs::TOMBSTONE_RETENTION)).await;
            }
        }
    }
}

/// One prune call of the prune tick: counted as upkeep, what it deleted
/// logged, a failure counted under `operation` and logged.
async fn prune_step(
    shared: &Shared,
    operation: &'static str,
    what: &str,
    call: impl std::future::Future<Output = Result<u64, StoreError>>,
) {
    match shared.upkeep(call).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(pruned = n, "pruned {what}"),
        Err(e) => {
            shared.counters.store_error(operation);
            crate::store::warn_unless_read_only!(e, error = %crate::error::chain(&e), "pruning {what} failed")
        }
    }
}
