//! `/api/v1/stats/series`: throughput, failures and latency over the last
//! hour, day or week from the store's rollup (the same on every instance,
//! across restarts).

use super::*;

/// `GET /api/v1/stats/series?range=1h|1d|1w&queue=&kind=&job=` (`job=`:
/// the tasks of one schedule job, however it was defined; a store-defined
/// job's tasks have kind `command`): `{range, step_secs, from, to,
/// points, totals, series}`, a point a bucket.
pub async fn stats_series(
    Extract(state): S,
    q: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Answer {
    let q = params(q, &["range", "queue", "kind", "job"])?;
    let range: baton::stats::Range = q
        .get("range")
        .map(|r| r.parse())
        .transpose()
        .map_err(|e: baton::InvalidInput| ApiError::bad(&e.field, e.problem))?
        .unwrap_or(baton::stats::Range::Hour);
    let nonempty = |k: &str| q.get(k).filter(|v| !v.is_empty()).cloned();
    let filter = baton::stats::SeriesFilter {
        queue: nonempty("queue"),
        kind: nonempty("kind"),
        job: nonempty("job"),
    };
    let s = baton::stats::series(&state.store, range, &filter).await?;
    Ok(Json(shapes::series(&s)))
}
