//! The job set of a scheduler that also runs the definitions kept in the
//! store ([`Scheduler::definitions`](super::Scheduler::definitions)):
//! read the store's definition counter on a timer, and when it moved,
//! start, restart or stop each job's loops so that exactly the store's
//! jobs run, plus the scheduler's own jobs whose names the store does not
//! define (DESIGN.md D2).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::job::{Job, JobMode};
use super::lock_run::SlotFn;
use super::scheduler::{job_loops, random_upto, BEAT_JITTER};
use crate::clock::StoreClock;
use crate::error::InvalidInput;
use crate::store::{DefinitionSource, JobDef, Store};

/// Turns a stored definition into the job it runs.
pub(super) type Decode = Arc<dyn Fn(&JobDef) -> Result<Job, InvalidInput> + Send + Sync>;

/// The reload's settings.
pub(super) struct Definitions {
    pub(super) decode: Decode,
    pub(super) every: Duration,
}

/// How long a restart waits for the old loops of a job to end before it
/// starts the new ones anyway (the cursor compare-and-set keeps a slot
/// once whichever loop takes it).
const STOP_WAIT: Duration = Duration::from_secs(2);

/// How often the change counter is read when definition writes are
/// announced across processes (a lost announcement waits this long).
const ANNOUNCED_EVERY: Duration = Duration::from_secs(30);

/// Until a definitions change is announced on the wake-up channel (never,
/// without one; a lagging receiver, or a channel back after a gap, counts
/// as one: it may have missed it).
async fn announced(heard: &mut Option<tokio::sync::broadcast::Receiver<crate::store::Wake>>) {
    use tokio::sync::broadcast::error::RecvError;
    let Some(rx) = heard else {
        return std::future::pending().await;
    };
    loop {
        match rx.recv().await {
            Ok(w) if w.queue == crate::store::jobdefs::DEFINITIONS_WAKE || w.is_resync() => return,
            Ok(_) => {}
            Err(RecvError::Lagged(_)) => return,
            Err(RecvError::Closed) => {
                *heard = None;
                return std::future::pending().await;
            }
        }
    }
}

/// One job's loops, and where its definition came from.
struct Running {
    /// The store's version of it; `None`: the scheduler's own job.
    version: Option<i64>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// What should run: per name, the store's version (`None`: the
/// scheduler's own job), the job and its lock-mode function.
type Wanted = HashMap<String, (Option<i64>, Job, Option<SlotFn>)>;

/// Run until `shutdown`, then stop every job's loops and wait for them.
pub(super) async fn run(
    store: Store,
    clock: StoreClock,
    own: Vec<(Job, Option<SlotFn>)>,
    defs: Definitions,
    shutdown: CancellationToken,
) {
    let mut running: HashMap<String, Running> = HashMap::new();
    // Each stored version decoded once: its job, or the refusal (logged
    // once).
    let mut decoded: HashMap<(String, i64), Option<Job>> = HashMap::new();
    let mut seen: Option<i64> = None;
    // Definition writes are announced on the store's wake-up channel: read
    // at once when one is heard, and on the timer as a safety net — a
    // slow one where the channel spans processes (PostgreSQL's LISTEN,
    // Redis pub/sub), `every` where it is this process's only.
    let mut heard = tokio::select! {
        r = store.backend().wake_subscribe() => r.ok(),
        _ = shutdown.cancelled() => None,
    };
    let timer = if store.backend().wakes_across_processes() && heard.is_some() {
        defs.every.max(ANNOUNCED_EVERY)
    } else {
        defs.every
    };
    loop {
        // The reads race the shutdown: a store that does not answer must
        // not hold up a stop (a call may wait for the store's deadline).
        let read = async {
            match store.backend().jobdef_revision().await {
                Ok(rev) if seen == Some(rev) => {}
                Ok(rev) => match store.backend().jobdef_list().await {
                    Ok(list) => {
                        let wanted = wanted(&list, &own, &defs, &mut decoded);
                        apply(&store, &clock, wanted, &mut running, &shutdown).await;
                        seen = Some(rev);
                    }
                    Err(e) => {
                        crate::store::warn_unless_read_only!(e, error = %crate::error::chain(&e), "cannot read the job definitions; retrying");
                    }
                },
                Err(e) => {
                    crate::store::warn_unless_read_only!(e, error = %crate::error::chain(&e), "cannot read the job definitions' revision; retrying");
                }
            }
        };
        tokio::select! {
            _ = read => {}
            _ = shutdown.cancelled() => break,
        }
        store.note_upkeep(1);
        tokio::select! {
            _ = tokio::time::sleep(timer + random_upto(BEAT_JITTER)) => {}
            _ = announced(&mut heard) => {}
            _ = shutdown.cancelled() => break,
        }
    }
    for (_, r) in running.drain() {
        r.stop.cancel();
        let _ = r.task.await;
    }
}

/// The jobs that should run now: each live definition that decodes (as a
/// durable job whose slots start at the definition's store time), and
/// each own job the store does not define.
fn wanted(
    list: &[JobDef],
    own: &[(Job, Option<SlotFn>)],
    defs: &Definitions,
    decoded: &mut HashMap<(String, i64), Option<Job>>,
) -> Wanted {
    let mut out = Wanted::new();
    let mut stored = HashSet::new();
    for def in list.iter().filter(|d| !d.deleted) {
        stored.insert(def.name.as_str());
        let job = decoded
            .entry((def.name.clone(), def.version))
            .or_insert_with(|| decode(def, defs))
            .clone();
        if let Some(job) = job {
            out.insert(def.name.clone(), (Some(def.version), job, None));
        }
    }
    for (job, f) in own {
        if let Some(def) = list.iter().find(|d| !d.deleted && d.name == job.name) {
            let key = (format!("own\0{}", def.name), def.version);
            if decoded.insert(key, None).is_none() {
                tracing::info!(job = %job.name, version = def.version, "the store defines this job: its definition runs, not this instance's own");
            }
            continue;
        }
        // Back after the store's definition was deleted: it governs the
        // slots after the delete, as a definition does those after it.
        let mut job = job.clone();
        if let Some(gone) = list.iter().find(|d| d.deleted && d.name == job.name) {
            job.start_at = Some(
                job.start_at
                    .map_or(gone.updated_at, |s| s.max(gone.updated_at)),
            );
        }
        out.insert(job.name.clone(), (None, job, f.clone()));
    }
    out
}

/// `def` as the job it runs, `None` (logged) when it cannot run.
fn decode(def: &JobDef, defs: &Definitions) -> Option<Job> {
    let refuse = |problem: String| {
        tracing::error!(job = %def.name, version = def.version, %problem, "the job's definition in the store cannot run; fix it with an update");
        None
    };
    let mut job = match (defs.decode)(def) {
        Ok(j) => j,
        Err(e) => return refuse(e.to_string()),
    };
    if job.mode != JobMode::Durable {
        return refuse("a job kept in the store runs in durable mode only".into());
    }
    job.name = def.name.clone();
    // The definition governs the slots after it was written.
    job.start_at = Some(
        job.start_at
            .map_or(def.updated_at, |s| s.max(def.updated_at)),
    );
    if let Err(e) = job.validate() {
        return refuse(e.to_string());
    }
    Some(job)
}

/// Stop the jobs no longer wanted or changed, and start the new ones.
async fn apply(
    store: &Store,
    clock: &StoreClock,
    mut wanted: Wanted,
    running: &mut HashMap<String, Running>,
    shutdown: &CancellationToken,
) {
    let stale: Vec<String> = running
        .iter()
        .filter(|(name, r)| wanted.get(*name).is_none_or(|(v, _, _)| *v != r.version))
        .map(|(name, _)| name.clone())
        .collect();
    for name in stale {
        if let Some(r) = running.remove(&name) {
            r.stop.cancel();
            if tokio::time::timeout(STOP_WAIT, r.task).await.is_err() {
                tracing::debug!(job = %name, "the job's old loops are still ending");
            }
            if !wanted.contains_key(&name) {
                tracing::info!(job = %name, "job stopped: its definition was deleted");
            }
        }
    }
    for (name, (version, job, f)) in wanted.drain() {
        if running.contains_key(&name) {
            continue;
        }
        let stop = shutdown.child_token();
        // Each loop says which definition it runs, so the store refuses it
        // the slots a newer one governs until this reload catches up.
        let source = Some(version.map_or(DefinitionSource::Own, DefinitionSource::Stored));
        let Some(loops) = job_loops(store.clone(), clock.clone(), job, f, source, stop.clone())
        else {
            continue;
        };
        if let Some(v) = version {
            tracing::info!(job = %name, version = v, "running the job's definition from the store");
        }
        running.insert(
            name,
            Running {
                version,
                stop,
                task: tokio::spawn(loops),
            },
        );
    }
}
