//! Jobs defined at run time: definitions kept in the store, created,
//! changed and deleted by any process, run by every scheduler that reads
//! them ([`Scheduler::definitions`](super::Scheduler::definitions)).
//!
//! A definition is a JSON document (at most
//! [`MAX_JOBDEF_BYTES`]) whose meaning is
//! the application's: the scheduler turns it into a [`Job`](super::Job)
//! with the function it was given. `baton` keeps a `[[job]]` table there,
//! parsed by the same code as its config file. Every write is a
//! compare-and-set on the definition's version (DESIGN.md D1), so two
//! operators cannot overwrite each other's change unseen.
//!
//! ```no_run
//! # async fn demo() -> Result<(), baton::Error> {
//! use baton::schedule::definitions;
//! use baton::store::JobDefWrite;
//! let store = baton::Store::connect("sqlite://app.db").await?;
//! let spec = serde_json::json!({"every": "5m", "kind": "report"});
//! let JobDefWrite::Written { version } =
//!     definitions::create(&store, "report", &spec, "ana").await?
//! else {
//!     panic!("report is defined already");
//! };
//! let spec = serde_json::json!({"every": "10m", "kind": "report"});
//! definitions::update(&store, "report", &spec, version, "ana").await?;
//! definitions::delete(&store, "report", None, "ana").await?;
//! # Ok(()) }
//! ```

use crate::error::{Error, InvalidInput};
use crate::names::validate_name;
use crate::store::{JobDef, JobDefDelete, JobDefPut, JobDefWrite, Store, MAX_JOBDEF_BYTES};

/// The longest author (`by`) kept with a definition, in bytes.
pub const MAX_DEFINED_BY_LEN: usize = crate::store::MAX_PAUSE_BY_LEN;

/// Check a definition before it is written: the job's name (1 to 255
/// bytes), the document (a JSON object of at most
/// [`MAX_JOBDEF_BYTES`]), the author (at most [`MAX_DEFINED_BY_LEN`]
/// bytes, no control characters). The document's fields are the caller's
/// to check.
pub fn validate(name: &str, spec: &serde_json::Value, by: &str) -> Result<(), InvalidInput> {
    validate_name("job name", name)?;
    if !spec.is_object() {
        return Err(InvalidInput::new(
            "definition",
            "is not a JSON object; give the job's fields as one object, e.g. {\"every\": \"5m\"}",
        ));
    }
    let len = spec.to_string().len();
    if len > MAX_JOBDEF_BYTES {
        return Err(InvalidInput::new(
            "definition",
            format!("is {len} bytes of JSON; at most {MAX_JOBDEF_BYTES}"),
        ));
    }
    if by.len() > MAX_DEFINED_BY_LEN || by.chars().any(char::is_control) {
        return Err(InvalidInput::new(
            "by",
            format!("give at most {MAX_DEFINED_BY_LEN} bytes without control characters"),
        ));
    }
    Ok(())
}

/// Create `name`'s definition (version 1, or the version after its
/// tombstone when it was deleted before). [`JobDefWrite::Conflict`] with
/// the live version when the name is defined already.
pub async fn create(
    store: &Store,
    name: &str,
    spec: &serde_json::Value,
    by: &str,
) -> Result<JobDefWrite, Error> {
    put(store, name, spec, None, by).await
}

/// Replace version `version` of `name`'s definition; the change reaches
/// every scheduler within its reload period and applies from the job's
/// next slot. [`JobDefWrite::Conflict`] (nothing written) when `version`
/// is not the live version.
pub async fn update(
    store: &Store,
    name: &str,
    spec: &serde_json::Value,
    version: i64,
    by: &str,
) -> Result<JobDefWrite, Error> {
    put(store, name, spec, Some(version), by).await
}

/// Create (`expected: None`) or update (`Some(version)`).
pub async fn put(
    store: &Store,
    name: &str,
    spec: &serde_json::Value,
    expected: Option<i64>,
    by: &str,
) -> Result<JobDefWrite, Error> {
    validate(name, spec, by)?;
    Ok(store
        .backend()
        .jobdef_put(&JobDefPut {
            name,
            spec,
            expected,
            by,
        })
        .await?)
}

/// Delete `name`'s definition (only version `expected` when given): the
/// job stops on every scheduler within its reload period (a run in
/// progress finishes); its state (cursor, past runs) stays in the store.
pub async fn delete(
    store: &Store,
    name: &str,
    expected: Option<i64>,
    by: &str,
) -> Result<JobDefWrite, Error> {
    validate(name, &serde_json::json!({}), by)?;
    Ok(store
        .backend()
        .jobdef_delete(&JobDefDelete { name, expected, by })
        .await?)
}

/// Every live definition (no tombstones), by name.
pub async fn list(store: &Store) -> Result<Vec<JobDef>, Error> {
    let mut all = store.backend().jobdef_list().await?;
    all.retain(|d| !d.deleted);
    Ok(all)
}

/// `name`'s live definition, if any.
pub async fn get(store: &Store, name: &str) -> Result<Option<JobDef>, Error> {
    validate_name("job name", name)?;
    Ok(list(store).await?.into_iter().find(|d| d.name == name))
}
