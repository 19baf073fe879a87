//! Lock history on Redis: a list a lock beside its record,
//! `P{baton:lock:<name>}:hist` (the lock's hash tag), of records newest
//! first (`<token> \x1f <acquired ms> \x1f <released ms> \x1f <holder>`;
//! JSON objects before, still read), pushed by the release script itself (`lua/lock_release.lua`)
//! and trimmed there to [`LOCK_HISTORY_PER_LOCK`]; the prune drops records
//! past [`LOCK_HISTORY_RETENTION`].

use serde::Deserialize;

use super::{schema, RedisBackend};
use crate::error::StoreError;
use crate::store::{
    from_ms, ms, FencingToken, LockHistoryQuery, LockRecord, LockRelease, LOCK_HISTORY_PER_LOCK,
    LOCK_HISTORY_RETENTION,
};

/// Where lock `name`'s releases are listed.
fn hist_key(b: &RedisBackend, name: &str) -> String {
    format!("{}:hist", b.lock_key(name))
}

/// Release the lease and record the release, in one script; whether the
/// lease was current.
pub(super) async fn release(b: &RedisBackend, p: &LockRelease<'_>) -> Result<bool, StoreError> {
    let mut inv = b.scripts.lock_release.key(b.lock_key(p.name));
    inv.key(hist_key(b, p.name))
        .arg(p.token.0.to_string())
        .arg(ms(p.at_least))
        .arg(if p.record { LOCK_HISTORY_PER_LOCK } else { 0 });
    let v: i64 = b.invoke(&mut inv).await?;
    Ok(v == 1)
}

#[derive(Deserialize)]
struct Stored {
    name: String,
    holder: String,
    token: String,
    acquired_at: i64,
    released_at: i64,
}

/// The records of lock `name`, newest first.
async fn read(b: &RedisBackend, name: &str, limit: u32) -> Result<Vec<LockRecord>, StoreError> {
    let mut conn = b.conn.clone();
    let raw: Vec<String> = redis::cmd("LRANGE")
        .arg(hist_key(b, name))
        .arg(0)
        .arg(i64::from(limit) - 1)
        .query_async(&mut conn)
        .await?;
    raw.iter().map(|r| record(name, r)).collect()
}

/// One record as the release script pushed it: plain text, or a JSON
/// object (written before the records were plain).
fn record(name: &str, r: &str) -> Result<LockRecord, StoreError> {
    let bad = |e: String| StoreError::Corrupt(format!("lock history of {name:?}: {e}"));
    let s: Stored = if r.starts_with('{') {
        serde_json::from_str(r).map_err(|e| bad(e.to_string()))?
    } else {
        let mut f = r.splitn(4, '\u{1f}');
        let (Some(token), Some(acquired), Some(released), Some(holder)) =
            (f.next(), f.next(), f.next(), f.next())
        else {
            return Err(bad(format!("record {r:?}")));
        };
        let at = |v: &str| v.parse::<i64>().map_err(|_| bad(format!("time {v:?}")));
        Stored {
            name: name.to_string(),
            holder: holder.to_string(),
            token: token.to_string(),
            acquired_at: at(acquired)?,
            released_at: at(released)?,
        }
    };
    Ok(LockRecord {
        name: s.name,
        holder: s.holder,
        token: FencingToken(s.token.parse().map_err(|_| bad(s.token.clone()))?),
        acquired_at: from_ms(s.acquired_at)?,
        released_at: from_ms(s.released_at)?,
    })
}

pub(super) async fn list(
    b: &RedisBackend,
    q: &LockHistoryQuery,
) -> Result<Vec<LockRecord>, StoreError> {
    let names = match &q.name {
        Some(n) => vec![n.clone()],
        None => schema::lock_names(b).await?,
    };
    let mut all = Vec::new();
    for n in &names {
        all.extend(read(b, n, q.size()).await?);
    }
    all.sort_by(|x, y| (y.released_at, y.token, &y.name).cmp(&(x.released_at, x.token, &x.name)));
    all.truncate(q.size() as usize);
    Ok(all)
}

pub(super) async fn prune(b: &RedisBackend) -> Result<u64, StoreError> {
    use crate::store::Backend;
    let cutoff =
        b.now().await? - chrono::Duration::from_std(LOCK_HISTORY_RETENTION).unwrap_or_default();
    let mut gone = 0u64;
    for n in schema::lock_names(b).await? {
        let recs = read(b, &n, LOCK_HISTORY_PER_LOCK as u32).await?;
        let keep = recs.iter().take_while(|r| r.released_at >= cutoff).count();
        if keep == recs.len() {
            continue;
        }
        let mut conn = b.conn.clone();
        // (LTRIM to -1 would keep the whole list.)
        let mut cmd = redis::cmd(if keep == 0 { "DEL" } else { "LTRIM" });
        cmd.arg(hist_key(b, &n));
        if keep > 0 {
            cmd.arg(0).arg(keep as i64 - 1);
        }
        let _: () = cmd.query_async(&mut conn).await?;
        gone += (recs.len() - keep) as u64;
    }
    Ok(gone)
}
