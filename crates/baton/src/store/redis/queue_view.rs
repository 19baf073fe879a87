//! A queue's declared limits (the index hash `P{baton}:qlimits`) and its
//! keys' load on Redis (`lua/queue_view.lua`, `store::queue_view`).

use std::time::Duration;

use redis::Value;
use serde::Deserialize;

use super::RedisBackend;
use crate::error::StoreError;
use crate::store::{
    from_ms, DeclaredLimits, KeyLoad, QueueDeclare, QueueKeys, QueueKeysQuery, QueueLimits,
    KEYS_SCAN_MAX,
};

/// One declaration as the hash keeps it.
#[derive(Deserialize)]
struct Stored {
    limits: String,
    by: String,
    at: i64,
}

fn declared(queue: &str, text: &str) -> Result<DeclaredLimits, StoreError> {
    let s: Stored = serde_json::from_str(text)
        .map_err(|e| StoreError::Corrupt(format!("queue limits of {queue:?}: {e}")))?;
    Ok(DeclaredLimits {
        queue: queue.to_string(),
        limits: QueueLimits::decode(&s.limits)?,
        by: s.by,
        at: from_ms(s.at)?,
    })
}

pub(super) async fn declare(
    b: &RedisBackend,
    d: &QueueDeclare<'_>,
) -> Result<Option<DeclaredLimits>, StoreError> {
    let old: Option<String> = b
        .q(
            &b.scripts.queue_view,
            sargs!["declare", d.queue, d.limits.encode(), d.by],
        )
        .await?;
    old.map(|t| declared(d.queue, &t)).transpose()
}

pub(super) async fn list(b: &RedisBackend) -> Result<Vec<DeclaredLimits>, StoreError> {
    let flat: Vec<String> = read_retry!(b.q(&b.scripts.queue_view, sargs!["list"]).await)?;
    let mut out = flat
        .chunks(2)
        .filter_map(|c| match c {
            [q, t] => Some(declared(q, t)),
            _ => None,
        })
        .collect::<Result<Vec<_>, _>>()?;
    out.sort_by(|a, c| a.queue.cmp(&c.queue));
    Ok(out)
}

pub(super) async fn keys(
    b: &RedisBackend,
    q: &QueueKeysQuery<'_>,
) -> Result<QueueKeys, StoreError> {
    let reply: Vec<Value> = read_retry!(
        b.qs(
            q.queue,
            &b.scripts.queue_view,
            sargs!["keys", q.queue, KEYS_SCAN_MAX],
        )
        .await
    )?;
    let num = |v: &Value| -> Result<u64, StoreError> {
        match v {
            Value::Int(n) => Ok(u64::try_from(*n).unwrap_or(0)),
            other => Err(StoreError::Corrupt(format!("queue keys: {other:?}"))),
        }
    };
    let Some((first, rest)) = reply.split_first() else {
        return Err(StoreError::Corrupt("queue keys: empty reply".into()));
    };
    let truncated = num(first)? == 1;
    let loads = rest
        .chunks(3)
        .map(|c| match c {
            [k, r, p] => Ok(KeyLoad {
                key: redis::from_redis_value(k)
                    .map_err(|e| StoreError::Corrupt(format!("queue keys: {e}")))?,
                running: num(r)?,
                pending: num(p)?,
                recent_starts: Vec::new(),
                rate: None,
            }),
            _ => Err(StoreError::Corrupt("queue keys: a short entry".into())),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut out = QueueKeys::from_loads(q.queue, loads, q.limit, truncated);
    // The listed keys' start logs under a rate per key (`krate:<key>`,
    // scores in ms), in one pipeline on the queue's slot.
    if !out.keys.is_empty() {
        let base = b.qbase(q.queue);
        let mut pipe = redis::pipe();
        for k in &out.keys {
            pipe.cmd("ZRANGE")
                .arg(format!("{base}krate:{}", k.key))
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES");
        }
        let mut conn = b.conn.clone();
        let logs: Vec<Vec<(String, f64)>> = pipe.query_async(&mut conn).await?;
        let names: Vec<String> = out.keys.iter().map(|k| k.key.clone()).collect();
        let us = |log: Vec<(String, f64)>| -> Vec<i64> {
            log.into_iter()
                .map(|(_, ms)| (ms as i64).saturating_mul(1000))
                .collect()
        };
        crate::store::put_starts(
            &mut out.keys,
            names.into_iter().zip(logs.into_iter().map(us)),
        )?;
    }
    Ok(out)
}
