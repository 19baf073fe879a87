//! `/api/v1/locks`: the locks, and an operator's force-release.

use super::*;

/// `GET /api/v1/locks`.
pub async fn locks(Extract(state): S) -> Answer {
    let list = Locker::new(state.store.clone()).list().await?;
    Ok(Json(Value::Array(list.iter().map(shapes::lock).collect())))
}

/// `GET /api/v1/locks/history?name=&limit=`: released leases, newest
/// first (`{records: [{name, holder, token, acquired_at, released_at}]}`).
pub async fn lock_history(
    Extract(state): S,
    q: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Answer {
    let q = params(q, &["name", "limit"])?;
    let limit = match q.get("limit") {
        None => 50,
        Some(l) => l
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=1000).contains(n))
            .ok_or_else(|| ApiError::bad("limit", format!("{l:?} is not 1 to 1000")))?,
    };
    let query = baton::store::LockHistoryQuery {
        name: q.get("name").filter(|n| !n.is_empty()).cloned(),
        limit,
    };
    let records = Locker::new(state.store.clone()).history(&query).await?;
    Ok(Json(
        json!({"records": records.iter().map(shapes::lock_record).collect::<Vec<_>>()}),
    ))
}

/// The body of a force-release: the token the caller saw.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ReleaseBody {
    token: Option<u64>,
}

impl Form for ReleaseBody {
    const FORM: &'static str =
        r#"{"token": N} with N the current holder's fencing token, as GET /api/v1/locks shows it"#;
}

/// `POST /api/v1/locks/{name}/release` with `{"token": N}`: revoke the
/// lease, only if N is still the current grant's token (409 otherwise, so a
/// newer holder is never released by mistake). The holder's extensions are
/// refused from then on and the lock is free at `min(lock_until, now +
/// RELEASE_BOUND)` (30 s), the answer's `free_at`: not at once, so the
/// holder (which confirms its lease at least every 5 s) stops its work
/// before anyone else can be granted the lock.
pub async fn lock_release(
    Extract(state): S,
    PathText(name): PathText,
    Body(b): Body<ReleaseBody>,
) -> Answer {
    check_name("name", &name)?;
    let Some(token) = b.token else {
        return Err(ApiError::bad(
            "token",
            format!("is missing; send {}", ReleaseBody::FORM),
        ));
    };
    let locker = Locker::new(state.store.clone());
    let Some(info) = locker.get(&name).await? else {
        return Err(ApiError::not_found(format!("no lock {name:?}")));
    };
    if let Some(free_at) = locker.revoke(&name, FencingToken(token)).await? {
        tracing::info!(lock = %name, token, free_at = %baton::format_time(free_at), "admin: lock force-released (revoked; its holder stops, then the lock is free)");
        return Ok(Json(json!({
            "name": name,
            "token": token,
            "released": true,
            "free_at": crate::output::ts(free_at),
            "note": format!(
                "the lease is revoked: its holder stops its work within {} and the lock is free at free_at",
                baton::format_duration(baton::lock::RELEASE_BOUND)
            ),
        })));
    }
    let why = if info.token.0 != token {
        format!(
            "token {token} is not the current one: lock {name:?} was granted token {} to {}",
            info.token.0, info.holder
        )
    } else {
        format!("lock {name:?} (token {token}) is no longer held: its lease lapsed")
    };
    Err(ApiError::new(StatusCode::CONFLICT, why))
}
