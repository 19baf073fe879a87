//! How a server store's connection pool is sized (PostgreSQL, MySQL): its
//! largest size ([`StoreOptions::max_connections`], or the URL's
//! `pool_size`), and how it shrinks back when the load that grew it is
//! gone.
//!
//! sqlx hands out idle connections first in, first out, so a pool used
//! once a second keeps every connection it ever opened busy often enough
//! that none reaches its idle timeout: a `baton serve` that needed five at
//! start held five for ever. Here the pool keeps the recent peak instead:
//! a connection returned while the pool holds more connections than were
//! ever in use at once in the last one to two [`StoreOptions::idle_timeout`]s
//! is closed (one per return, so it shrinks gently), down to one. sqlx's
//! own idle timeout still closes connections of a pool nobody uses at all.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::pool::PoolOptions;
use sqlx::{Connection, Database, Pool};

use super::StoreOptions;
use crate::error::StoreError;

/// The URL parameter that sizes the pool (`?pool_size=N`), the name
/// `--pool-size` and the config's `pool_size` use too. PostgreSQL URLs
/// also take `pool_max_conns`, pgxpool's name (River's driver), so a URL
/// written for a Go service sizes baton's pool the same way.
pub const POOL_SIZE_PARAM: &str = "pool_size";

/// The largest pool size a URL or option may ask for.
pub const MAX_POOL_SIZE: u32 = 10_000;

/// A connection idle at least this long is pinged before it is handed
/// out. Busier connections are not: sqlx's default pings on every
/// checkout, one extra round trip in front of every statement. A
/// connection that broke while busy fails its next statement once (the
/// caller sees [`StoreError::Unavailable`]) and is then dropped.
const IDLE_PING: Duration = Duration::from_secs(1);

/// Whether `key` names the pool size in a URL of this scheme.
pub(crate) fn is_pool_size_key(key: &str, postgres: bool) -> bool {
    key == POOL_SIZE_PARAM || (postgres && key == "pool_max_conns")
}

/// A pool size as a URL parameter gives it: 1 to [`MAX_POOL_SIZE`].
pub(crate) fn parse_pool_size(url: &str, key: &str, value: &str) -> Result<u32, StoreError> {
    match value.parse::<u32>() {
        Ok(n) if (1..=MAX_POOL_SIZE).contains(&n) => Ok(n),
        _ => Err(StoreError::Config(format!(
            "store URL {:?}: {key}={value:?}: use a number of connections from 1 to {MAX_POOL_SIZE}, e.g. {key}=4",
            super::redact(url)
        ))),
    }
}

/// The pool size a store URL names (`pool_size=N`; on PostgreSQL also
/// `pool_max_conns=N`), if any. It wins over
/// [`StoreOptions::max_connections`]. A bad value is
/// [`StoreError::Config`] naming the parameter.
///
/// ```
/// use baton::store::url_pool_size;
/// assert_eq!(url_pool_size("postgres://db/app?pool_size=4").unwrap(), Some(4));
/// assert_eq!(url_pool_size("postgres://db/app?pool_max_conns=8").unwrap(), Some(8));
/// assert_eq!(url_pool_size("mysql://db/app").unwrap(), None);
/// assert!(url_pool_size("postgres://db/app?pool_size=0").is_err());
/// ```
pub fn url_pool_size(url: &str) -> Result<Option<u32>, StoreError> {
    let postgres = url.starts_with("postgres://") || url.starts_with("postgresql://");
    let Some((_, query)) = url.split_once('?') else {
        return Ok(None);
    };
    let mut size = None;
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        if is_pool_size_key(&k, postgres) {
            size = Some(parse_pool_size(url, &k, &v)?);
        }
    }
    Ok(size)
}

/// The recent peak of connections in use at once: the current window's
/// and the previous one's.
struct Peaks {
    start: Instant,
    current: u32,
    previous: u32,
}

/// The shrinking policy of one pool (see the module docs).
pub(crate) struct Shrink<DB: Database> {
    /// The pool, once built; taken out when the backend is dropped (the
    /// pool's release hook holds this, so the pool would otherwise hold
    /// itself).
    pool: Mutex<Option<Pool<DB>>>,
    window: Duration,
    peaks: Mutex<Peaks>,
}

/// `m` locked: a poisoned lock only means another thread panicked
/// holding it.
pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<DB: Database> Shrink<DB> {
    /// Whether the connection being returned stays in the pool.
    fn keep(&self) -> bool {
        let Some(pool) = lock(&self.pool).clone() else {
            return true;
        };
        let size = pool.size();
        // In use: every connection not idle, the one returned included.
        let busy = size.saturating_sub(u32::try_from(pool.num_idle()).unwrap_or(u32::MAX));
        let mut p = lock(&self.peaks);
        let now = Instant::now();
        let age = now.saturating_duration_since(p.start);
        if age >= self.window {
            p.previous = if age >= self.window * 2 { 0 } else { p.current };
            p.current = 0;
            p.start = now;
        }
        p.current = p.current.max(busy);
        size <= p.current.max(p.previous).max(1)
    }
}

/// Detaches the pool from its [`Shrink`] when the backend holding this
/// is dropped, so the pool can be dropped too.
pub(crate) struct Sized<DB: Database>(Arc<Shrink<DB>>);

impl<DB: Database> Sized<DB> {
    /// Hand the built pool to its shrinking policy.
    pub(crate) fn attach(&self, pool: &Pool<DB>) {
        *lock(&self.0.pool) = Some(pool.clone());
    }
}

impl<DB: Database> Drop for Sized<DB> {
    fn drop(&mut self) {
        lock(&self.0.pool).take();
    }
}

/// The pool options every server backend starts from: at most the URL's
/// `pool_size` or `opts.max_connections`, none kept open for nothing
/// (`min_connections(0)`, shrinking as the module docs say), acquire bounded
/// by `opts.connect_timeout`, a ping only before handing out a connection
/// idle for a second or more. The backend adds its session setup; call
/// [`Sized::attach`] with the pool once it is built.
pub(crate) fn pool_options<DB: Database>(
    opts: &StoreOptions,
    url_size: Option<u32>,
    recycle: Arc<crate::store::Recycle>,
) -> (PoolOptions<DB>, Sized<DB>) {
    let window = opts.idle_timeout;
    let shrink = Arc::new(Shrink {
        pool: Mutex::new(None),
        window,
        peaks: Mutex::new(Peaks {
            start: Instant::now(),
            current: 0,
            previous: 0,
        }),
    });
    let hook = shrink.clone();
    let options = PoolOptions::<DB>::new()
        .max_connections(url_size.unwrap_or(opts.max_connections).max(1))
        .min_connections(0)
        .idle_timeout(window * 2)
        .acquire_timeout(opts.connect_timeout)
        .test_before_acquire(false)
        .before_acquire(move |conn, meta| {
            // Opened before a read-only refusal: it may be on the demoted
            // server; connect again.
            let stale = recycle.stale(meta.age);
            Box::pin(async move {
                if stale {
                    return Ok(false);
                }
                if meta.idle_for >= IDLE_PING {
                    conn.ping().await?;
                }
                Ok(true)
            })
        })
        .after_release(move |_, _| {
            let keep = hook.keep();
            Box::pin(async move { Ok(keep) })
        });
    (options, Sized(shrink))
}
