//! Jobs as the store knows them: pause and resume, one job's state,
//! every job with its latest run.

use crate::error::Error;
use crate::names::validate_name;
use crate::store::{PauseNote, Store};

/// Pause (or resume) a job cluster-wide: while paused, no instance
/// enqueues its slots. False if the store has never seen the job. The
/// change is recorded without a note or author; see [`set_paused_with`].
pub async fn set_paused(store: &Store, job: &str, paused: bool) -> Result<bool, Error> {
    set_paused_with(store, job, paused, PauseNote::default()).await
}

/// [`set_paused`] recording `note` (why, and who) with the store's time as
/// the job's [`PauseChange`](crate::store::PauseChange), shown by `baton
/// jobs`, the admin API and the dashboard. A note or author too long or
/// holding control characters is refused naming the field.
///
/// ```no_run
/// # async fn demo() -> Result<(), baton::Error> {
/// use baton::store::PauseNote;
/// let store = baton::Store::connect("sqlite://app.db").await?;
/// let why = PauseNote::default().note("upstream API down").by("ops@host-1 via app");
/// baton::schedule::set_paused_with(&store, "nightly-report", true, why).await?;
/// # Ok(()) }
/// ```
pub async fn set_paused_with(
    store: &Store,
    job: &str,
    paused: bool,
    note: PauseNote<'_>,
) -> Result<bool, Error> {
    validate_name("job name", job)?;
    note.validate()?;
    Ok(store
        .backend()
        .job_set_paused(&crate::store::JobSetPaused { job, paused, note })
        .await?)
}

/// A job as the store knows it, with its latest run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct JobStatus {
    /// Cursor and pause flag.
    #[serde(flatten)]
    pub state: crate::store::JobState,
    /// The newest task of this job (its latest run or trigger), if any.
    pub last_run: Option<crate::store::TaskInfo>,
}

/// The state the store keeps of `job` (its cursor, queue and pause flag,
/// as the schedulers that ran it registered it); `None` when no scheduler
/// registered a job of that name in this store.
///
/// ```no_run
/// # async fn demo() -> Result<(), baton::Error> {
/// let store = baton::Store::connect("sqlite://app.db").await?;
/// if let Some(j) = baton::schedule::job_state(&store, "nightly-report").await? {
///     println!("last slot {:?}, paused: {}", j.last_slot, j.paused);
/// }
/// # Ok(()) }
/// ```
pub async fn job_state(store: &Store, job: &str) -> Result<Option<crate::store::JobState>, Error> {
    validate_name("job name", job)?;
    Ok(store.backend().job_get(job).await?)
}

/// Every job the store knows, with its latest run.
pub async fn job_statuses(store: &Store) -> Result<Vec<JobStatus>, Error> {
    let b = store.backend();
    let mut out = Vec::new();
    for state in b.job_list().await? {
        let last_run = b
            .task_list(&crate::store::TaskFilter {
                job: Some(state.name.clone()),
                limit: 1,
                ..Default::default()
            })
            .await?
            .pop();
        out.push(JobStatus { state, last_run });
    }
    Ok(out)
}
