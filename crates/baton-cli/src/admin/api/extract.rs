//! How requests are read: JSON bodies ([`Body`], each with its accepted
//! [`Form`] for the error message) and path parameters ([`PathText`],
//! [`TaskId`]), refused with one line naming the field.

use super::*;

/// A request body the API accepts: its JSON shape, for error messages.
pub trait Form: serde::de::DeserializeOwned + Default {
    /// The accepted body, as one line (e.g. `{"token": N}`).
    const FORM: &'static str;
}

/// A JSON body of type `T`; an empty body is `T::default()`. Refused with
/// one line naming the field and the accepted form: 413 over
/// [`crate::admin::MAX_BODY_BYTES`], 400 for JSON that is malformed, of the wrong
/// type, or has a field `T` does not know.
pub struct Body<T>(pub(super) T);

impl<S: Send + Sync, T: Form> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            let status = e.status();
            if status == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError {
                    status,
                    message: format!(
                        "the body is larger than {} bytes (1 MiB); send at most that: {}",
                        crate::admin::MAX_BODY_BYTES,
                        T::FORM
                    ),
                    field: Some("body".into()),
                }
            } else {
                ApiError {
                    status,
                    message: format!(
                        "the body could not be read ({}); send {}",
                        e.body_text(),
                        T::FORM
                    ),
                    field: Some("body".into()),
                }
            }
        })?;
        parse_body(&bytes).map(Body)
    }
}

/// Parse a JSON body into `T` (see [`Body`]).
fn parse_body<T: Form>(bytes: &Bytes) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    // serde would also take a struct from an array (`["true"]` as its
    // first field): every body is an object.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::bad(
            "body",
            format!("the body is not a JSON object; send {}", T::FORM),
        ));
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let e = e.into_inner();
        // The problem without serde's " at line L column C" (the field
        // says where).
        let msg = e.to_string();
        let msg = msg
            .rsplit_once(" at line ")
            .map_or(msg.as_str(), |(m, _)| m);
        let named = msg
            .split('`')
            .nth(1)
            .filter(|_| msg.starts_with("unknown field") || msg.starts_with("missing field"));
        let field = match named {
            Some(f) => f.to_string(),
            None if e.is_syntax() || e.is_eof() || path == "." => "body".to_string(),
            None => path,
        };
        let what = if e.is_syntax() || e.is_eof() {
            "is not JSON"
        } else {
            "is not accepted"
        };
        ApiError::bad(
            &field,
            format!("the body {what} ({}); send {}", clip(msg), T::FORM),
        )
    })
}

/// At most 100 characters of `s`, for echoing input back.
pub(super) fn clip(s: &str) -> String {
    match s.char_indices().nth(100) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// The one path parameter (a job, queue or lock name, or a task id) as
/// text; 400 when it is not UTF-8.
pub struct PathText(pub(super) String);

impl<S: Send + Sync> FromRequestParts<S> for PathText {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Path::<String>::from_request_parts(parts, state)
            .await
            .map(|Path(s)| PathText(s))
            .map_err(|e| {
                ApiError::bad(
                    "path",
                    format!(
                        "{}; use a name of printable UTF-8 text, percent-encoded",
                        e.body_text()
                    ),
                )
            })
    }
}

/// A task id from the path (`/api/v1/tasks/{id}`); 400 naming `id` when
/// it is not a positive whole number.
pub struct TaskId(pub(super) i64);

impl<S: Send + Sync> FromRequestParts<S> for TaskId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let PathText(raw) = PathText::from_request_parts(parts, state).await?;
        raw.parse::<i64>()
            .ok()
            .filter(|&id| id > 0)
            .map(TaskId)
            .ok_or_else(|| {
                ApiError::bad(
                    "id",
                    format!(
                        "{:?} is not a task id; use a positive whole number, as GET /api/v1/tasks shows",
                        clip(&raw)
                    ),
                )
            })
    }
}

pub(super) fn check_name(field: &str, name: &str) -> Result<(), ApiError> {
    baton::names::validate_name(field, name).map_err(|e| ApiError::bad(&e.field, e.problem))
}

pub(super) fn rfc3339(field: &str, s: &str) -> Result<DateTime<Utc>, ApiError> {
    crate::values::rfc3339_arg(s).map_err(|e| ApiError::bad(field, e))
}

pub(super) fn duration(field: &str, s: &str) -> Result<Duration, ApiError> {
    crate::values::duration_arg(s).map_err(|e| ApiError::bad(field, e))
}

/// The header the dashboard's page sends with its writes, so a pause or
/// resume records `via dashboard` rather than `via api`.
pub const SOURCE_HEADER: &str = "x-baton-source";

/// Who made a change, as a pause or resume records it: the caller's
/// credential ([`crate::admin::auth::Caller`]) and where the request came
/// from (`dashboard` when the page says so in [`SOURCE_HEADER`], else
/// `api`).
pub struct Who {
    caller: String,
    source: &'static str,
}

impl Who {
    /// The author to record: `NAME (CALLER via SOURCE)` when the body
    /// names someone, else `CALLER via SOURCE`.
    pub(super) fn recorded(&self, name: Option<&str>) -> String {
        match name {
            Some(n) => format!("{n} ({} via {})", self.caller, self.source),
            None => format!("{} via {}", self.caller, self.source),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Who {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let caller = parts
            .extensions
            .get::<crate::admin::auth::Caller>()
            .map_or_else(|| "api:unknown".to_string(), |c| c.0.clone());
        let dashboard = parts
            .headers
            .get(SOURCE_HEADER)
            .is_some_and(|v| v.as_bytes() == b"dashboard");
        Ok(Who {
            caller,
            source: if dashboard { "dashboard" } else { "api" },
        })
    }
}

/// The body of a pause or resume (of a job or a queue).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct PauseBody {
    /// Why (at most 1000 bytes).
    note: Option<String>,
    /// Who, as the caller says; recorded with the credential and source.
    by: Option<String>,
}

impl Form for PauseBody {
    const FORM: &'static str =
        r#"no body, {} or {"note": "why (at most 1000 bytes)", "by": "who"} (both optional)"#;
}

impl PauseBody {
    /// The change's note and recorded author (`by`, made by
    /// [`Who::recorded`]), checked: a bad one is 400 naming `note` or
    /// `by`.
    pub(super) fn note<'a>(&'a self, by: &'a str) -> Result<baton::store::PauseNote<'a>, ApiError> {
        let n = baton::store::PauseNote {
            note: self.note.as_deref(),
            by: Some(by),
        };
        n.validate()
            .map_err(|e| ApiError::bad(&e.field, e.problem))?;
        Ok(n)
    }

    /// The name the body gives, if any.
    pub(super) fn by(&self) -> Option<&str> {
        self.by.as_deref()
    }

    /// The note the body gives, if any.
    pub(super) fn note_text(&self) -> Option<&str> {
        self.note.as_deref()
    }
}
