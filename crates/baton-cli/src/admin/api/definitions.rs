//! `/api/v1/jobs` writes: define a job in the store (`POST`), replace its
//! definition at a version (`PUT /api/v1/jobs/{name}`), delete it
//! (`DELETE`, admin). The definition is a `[[job]]` table's fields as
//! JSON, checked by the config file's own parser; every write is a
//! compare-and-set on the version (409 with the live version otherwise).

use super::*;
use baton::store::JobDefWrite;

/// The body of a create.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct CreateBody {
    /// The job's name.
    name: String,
    /// The `[[job]]` table's fields, without `name`.
    definition: Value,
    /// Who, as the caller says.
    by: Option<String>,
}

impl Form for CreateBody {
    const FORM: &'static str = r#"{"name": "report", "definition": {"every": "5m", "command": ["sh", "-c", "…"]}} (the definition holds a [[job]] table's fields), optionally with "by""#;
}

/// The body of an update.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct UpdateBody {
    /// The version replaced.
    version: i64,
    /// The new definition, whole.
    definition: Value,
    /// Who, as the caller says.
    by: Option<String>,
}

impl Form for UpdateBody {
    const FORM: &'static str = r#"{"version": 3, "definition": {"every": "10m", "command": ["true"]}} (version: the one in the store, as GET /api/v1/jobs shows), optionally with "by""#;
}

/// A write's answer: the version, or 409 / 404 naming the live version.
fn answer(name: &str, w: JobDefWrite, created: bool) -> Answer {
    match w {
        JobDefWrite::Written { version } => Ok(Json(json!({"name": name, "version": version}))),
        JobDefWrite::Conflict { current: Some(v) } => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("job {name:?} is at version {v} in the store; read it again and give \"version\": {v}"),
        )),
        JobDefWrite::Conflict { current: None } if created => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("job {name:?} is defined already"),
        )),
        JobDefWrite::Conflict { current: None } => Err(ApiError::not_found(format!(
            "no job {name:?} is defined in the store"
        ))),
    }
}

/// The definition checked as `baton serve` will read it: 400 naming the
/// field.
fn checked(name: &str, definition: &Value) -> Result<(), ApiError> {
    check_name("name", name)?;
    crate::stored_jobs::config_of(name, definition)
        .map(|_| ())
        .map_err(|e| ApiError::bad(&e.field, e.problem))
}

/// `POST /api/v1/jobs` with `{"name", "definition", "by"?}`.
pub async fn job_create(Extract(state): S, who: Who, Body(b): Body<CreateBody>) -> Answer {
    checked(&b.name, &b.definition)?;
    let by = who.recorded(b.by.as_deref());
    let w = schedule::definitions::create(&state.store, &b.name, &b.definition, &by).await?;
    tracing::info!(job = %b.name, by = %by, ?w, "admin API: job defined");
    answer(&b.name, w, true)
}

/// `PUT /api/v1/jobs/{name}` with `{"version", "definition", "by"?}`.
pub async fn job_update(
    Extract(state): S,
    PathText(name): PathText,
    who: Who,
    Body(b): Body<UpdateBody>,
) -> Answer {
    checked(&name, &b.definition)?;
    let by = who.recorded(b.by.as_deref());
    let w =
        schedule::definitions::update(&state.store, &name, &b.definition, b.version, &by).await?;
    tracing::info!(job = %name, by = %by, ?w, "admin API: job definition replaced");
    answer(&name, w, false)
}

/// `DELETE /api/v1/jobs/{name}?version=N`.
pub async fn job_delete(
    Extract(state): S,
    PathText(name): PathText,
    who: Who,
    q: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Answer {
    check_name("name", &name)?;
    let q = q.map_err(|e| ApiError::bad("query", e.body_text()))?.0;
    let version = match q.get("version") {
        None => None,
        Some(v) => Some(v.parse::<i64>().map_err(|_| {
            ApiError::bad(
                "version",
                format!(
                    "{:?} is not a version; use a whole number, as GET /api/v1/jobs shows",
                    clip(v)
                ),
            )
        })?),
    };
    if let Some(k) = q.keys().find(|k| *k != "version") {
        return Err(ApiError::bad(k, "is not a parameter here; use version"));
    }
    let by = who.recorded(None);
    let w = schedule::definitions::delete(&state.store, &name, version, &by).await?;
    tracing::info!(job = %name, by = %by, ?w, "admin API: job definition deleted");
    answer(&name, w, false)
}
