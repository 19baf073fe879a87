//! The command connection: one multiplexed connection to the writable
//! Redis server, found directly (`redis://`, `rediss://`) or through the
//! sentinels (`redis+sentinel://`, see `sentinel.rs`), and replaced when it
//! stops being one.
//!
//! [`MasterConn`] is the backend's connection to one writable server (inside
//! `cluster.rs`'s `Conn::Single`; it is a [`ConnectionLike`]), so the
//! backend's calls do not know which kind of URL they run on.
//! A connection is dropped, and the next call connects anew (asking the
//! sentinels again, or resolving the host name again), when a call on it
//! fails with a broken or refused connection, a timeout, or `READONLY` (a
//! demoted master), and when its server's `ROLE` — checked on connect and
//! again at most every [`ROLE_EVERY`] while calls flow — is not `master`:
//! a demoted master still answers reads, so without the check a process
//! that only reads (an idle worker's claims find nothing to write) would
//! stay on it. For a sentinel URL the sentinels are asked again at the
//! same pace, over one kept connection: after a failover the old master
//! answers as a master until the sentinels reconfigure it (up to 10 s
//! later), and writes sent there meanwhile would be lost. A connect that fails is remembered for [`RETRY_GAP`], and
//! calls in that time fail at once with its error instead of each waiting
//! a connect timeout: the layers above back off on the (retryable) error.
//!
//! A replica found this way fails the call with `ErrorKind::ReadOnly`,
//! which the library reports as [`crate::StoreError::ReadOnly`].
//!
//! With `wait_replicas=N` in the URL (any Redis URL), every call but a
//! known read is followed, in the same round trip, by `WAIT N timeout`:
//! the call succeeds only once N replicas have its writes, so a failover
//! (which promotes the replica with the most data) keeps every write the
//! caller was told of. A call that N replicas did not acknowledge within
//! the timeout fails with `StoreError::ReadOnly` (its writes are on the
//! master, and may or may not survive a failover; the layers above treat
//! it as not done and retry, as after a lost reply). See docs/GUIDE.md.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, Value};
use tokio::sync::watch;

use super::sentinel::Sentinels;
use crate::error::StoreError;

/// How often the server's role is checked again while calls flow.
pub(super) const ROLE_EVERY: Duration = Duration::from_secs(1);
/// How long a failed connect is answered from memory.
const RETRY_GAP: Duration = Duration::from_millis(250);
/// The URL parameter asking for `WAIT` after each write.
const WAIT_PARAM: &str = "wait_replicas";
/// The longest `WAIT` (it is also at most half the response timeout).
const WAIT_MAX: Duration = Duration::from_secs(5);
/// Commands that never write: no `WAIT` after them.
const READS: [&str; 9] = [
    "TIME", "GET", "MGET", "HGETALL", "ROLE", "PING", "CONFIG", "SCRIPT", "SMEMBERS",
];

/// `WAIT`'s arguments: replicas and timeout (ms).
#[derive(Clone, Copy, Debug)]
struct Wait {
    replicas: u32,
    timeout_ms: u64,
}

/// Where the writable server is.
pub(super) enum Target {
    /// The URL's own server (its host name is resolved on each connect).
    Direct(redis::Client),
    /// The master the sentinels name.
    Sentinel(Sentinels),
}

impl Target {
    /// The target of a store URL, and its `wait_replicas` (see the
    /// module doc), taken out of the URL.
    pub(super) fn from_url(url: &str) -> Result<(Target, u32), StoreError> {
        let (url, wait) = take_wait_param(url)?;
        let target = if super::sentinel::is_sentinel_url(&url) {
            Target::Sentinel(Sentinels::parse(&url)?)
        } else {
            Target::Direct(super::tls::open_client(&url)?)
        };
        Ok((target, wait))
    }
}

/// `url` without its `wait_replicas=N` parameter, and N (0 without one).
fn take_wait_param(url: &str) -> Result<(String, u32), StoreError> {
    let Some((head, query)) = url.split_once('?') else {
        return Ok((url.to_string(), 0));
    };
    let mut wait = 0;
    let mut rest = Vec::new();
    for part in query.split('&') {
        match part.split_once('=') {
            Some((WAIT_PARAM, v)) => {
                wait = v.parse::<u32>().ok().filter(|n| *n <= 16).ok_or_else(|| {
                    StoreError::Config(format!(
                        "store URL {:?}: {WAIT_PARAM}: {v:?} is not a number of replicas; \
                         use 0 to 16, e.g. ?{WAIT_PARAM}=1 (each write waits until that many \
                         replicas have it)",
                        crate::store::redact(url)
                    ))
                })?;
            }
            _ => rest.push(part),
        }
    }
    let url = if rest.is_empty() {
        head.to_string()
    } else {
        format!("{head}?{}", rest.join("&"))
    };
    Ok((url, wait))
}

/// A live connection and what it is to.
#[derive(Clone)]
struct Live {
    conn: MultiplexedConnection,
    client: redis::Client,
    /// Which connection this is (the generation counter's value).
    id: u64,
    /// `host:port`, for messages.
    addr: String,
}

struct State {
    live: Option<Live>,
    /// The last connect's failure, when it is recent.
    failed: Option<(Instant, ErrorKind, String)>,
    /// When the role was last checked (or a check started).
    role_checked: Instant,
}

struct Shared {
    target: Target,
    config: AsyncConnectionConfig,
    connect_timeout: Duration,
    state: Mutex<State>,
    /// One connect at a time; the others wait for its outcome.
    connecting: tokio::sync::Mutex<()>,
    /// Bumped with each new connection, so the wake-up listener follows.
    generation: watch::Sender<u64>,
    next_id: AtomicU64,
    /// The server refuses `ROLE` (an ACL without it, a renamed command):
    /// then only `READONLY` replies reveal a replica.
    no_role: AtomicBool,
    db: i64,
    /// `WAIT` after each write, when asked for.
    wait: Option<Wait>,
}

/// The command connection (cheap to clone; every clone shares it).
#[derive(Clone)]
pub(super) struct MasterConn {
    shared: Arc<Shared>,
}

/// Whether an error means "this connection is not to the writable server
/// any more": drop it and connect anew.
fn drops_connection(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_unrecoverable_error()
        || matches!(e.kind(), ErrorKind::ReadOnly | ErrorKind::MasterDown)
        || e.code() == Some("NOREPLICAS")
}

impl MasterConn {
    /// A connection to `target`; nothing is connected until the first call
    /// (or [`MasterConn::connect_now`]).
    pub(super) fn new(
        target: Target,
        wait_replicas: u32,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> MasterConn {
        let wait = (wait_replicas > 0).then(|| Wait {
            replicas: wait_replicas,
            timeout_ms: u64::try_from((response_timeout / 2).min(WAIT_MAX).as_millis())
                .unwrap_or(1000)
                .max(1),
        });
        let db = match &target {
            Target::Direct(c) => c.get_connection_info().redis.db,
            Target::Sentinel(s) => s.db,
        };
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(connect_timeout)
            .set_response_timeout(response_timeout);
        MasterConn {
            shared: Arc::new(Shared {
                target,
                config,
                connect_timeout,
                state: Mutex::new(State {
                    live: None,
                    failed: None,
                    role_checked: Instant::now(),
                }),
                connecting: tokio::sync::Mutex::new(()),
                generation: watch::channel(0).0,
                next_id: AtomicU64::new(1),
                no_role: AtomicBool::new(false),
                db,
                wait,
            }),
        }
    }

    /// The database index of the URL.
    pub(super) fn db(&self) -> i64 {
        self.shared.db
    }

    /// Connect now (at startup), failing with the connect's error.
    pub(super) async fn connect_now(&self) -> Result<(), RedisError> {
        self.live().await.map(|_| ())
    }

    /// A client for the server the current connection is to (connecting
    /// first if there is none): the wake-up listener subscribes there.
    pub(super) async fn client(&self) -> Result<redis::Client, RedisError> {
        Ok(self.live().await?.client)
    }

    /// A receiver that changes with each new connection.
    pub(super) fn generation(&self) -> watch::Receiver<u64> {
        self.shared.generation.subscribe()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock only means a panic elsewhere; the state is
        // still consistent (each write is one assignment).
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The live connection, connecting (or re-checking its role) first
    /// when due.
    async fn live(&self) -> Result<Live, RedisError> {
        let (live, check_role) = {
            let mut st = self.state();
            match st.live.clone() {
                Some(l) => {
                    let due = !self.shared.no_role.load(Ordering::Relaxed)
                        && st.role_checked.elapsed() >= ROLE_EVERY;
                    if due {
                        // One caller checks; the others go on meanwhile.
                        st.role_checked = Instant::now();
                    }
                    (Some(l), due)
                }
                None => (None, false),
            }
        };
        if let Some(l) = live {
            if !check_role {
                return Ok(l);
            }
            let mut c = l.conn.clone();
            if let Some(named) = self.sentinels_moved(&l).await {
                self.drop_live(
                    l.id,
                    &format!("the sentinels now name {named} as the master"),
                );
                return self.connect().await;
            }
            match self.role(&mut c).await {
                Ok(true) => return Ok(l),
                Ok(false) => {
                    self.drop_live(l.id, &format!("{} is no longer the master (ROLE)", l.addr));
                }
                Err(e) => {
                    let drop = drops_connection(&e);
                    if drop {
                        self.drop_live(l.id, &e.to_string());
                    }
                    return Err(e);
                }
            }
        }
        self.connect().await
    }

    /// For a sentinel URL: the master the sentinels name now, when it is
    /// not the one `l` is to. A demoted master may answer as a master for
    /// a while (the sentinels reconfigure it when they next look, up to
    /// 10 s later), so its `ROLE` alone would keep writes going to it.
    /// Sentinels that do not answer change nothing here: the connection
    /// stays while its server answers as a master.
    async fn sentinels_moved(&self, l: &Live) -> Option<String> {
        let Target::Sentinel(s) = &self.shared.target else {
            return None;
        };
        match s
            .master_addr(&self.shared.config, self.shared.connect_timeout)
            .await
        {
            Ok((host, port)) => {
                let named = super::sentinel::join_host_port(&host, port);
                (named != l.addr).then_some(named)
            }
            Err(e) => {
                tracing::debug!(error = %e, "redis: could not ask the sentinels again");
                None
            }
        }
    }

    /// Whether the server on `c` is a master; `Ok(true)` too when it
    /// refuses `ROLE` (remembered: not asked again).
    async fn role(&self, c: &mut MultiplexedConnection) -> Result<bool, RedisError> {
        if self.shared.no_role.load(Ordering::Relaxed) {
            return Ok(true);
        }
        match redis::cmd("ROLE").query_async::<Vec<Value>>(c).await {
            Ok(v) => Ok(v
                .first()
                .and_then(|r| redis::from_redis_value::<String>(r).ok())
                .is_some_and(|r| r.eq_ignore_ascii_case("master"))),
            Err(e) if drops_connection(&e) => Err(e),
            Err(e) => {
                tracing::debug!(error = %e, "redis: ROLE refused; a replica shows only by READONLY replies");
                self.shared.no_role.store(true, Ordering::Relaxed);
                Ok(true)
            }
        }
    }

    /// Forget connection `id` (if it is still the live one), saying why once.
    fn drop_live(&self, id: u64, why: &str) {
        let mut st = self.state();
        if st.live.as_ref().is_some_and(|l| l.id == id) {
            let addr = st.live.take().map(|l| l.addr).unwrap_or_default();
            tracing::warn!(server = %addr, reason = %why, "redis: leaving the connection; finding the writable server again");
        }
    }

    /// Connect anew (one caller at a time; a recent failure is answered
    /// from memory).
    async fn connect(&self) -> Result<Live, RedisError> {
        let _one = self.shared.connecting.lock().await;
        {
            let st = self.state();
            if let Some(l) = &st.live {
                return Ok(l.clone());
            }
            if let Some((at, kind, detail)) = &st.failed {
                if at.elapsed() < RETRY_GAP {
                    return Err(RedisError::from((*kind, "redis", detail.clone())));
                }
            }
        }
        let attempt = tokio::time::timeout(self.shared.connect_timeout * 3, self.open()).await;
        let res = match attempt {
            Ok(r) => r,
            Err(_) => Err(RedisError::from((
                ErrorKind::IoError,
                "redis",
                format!(
                    "connect timed out after {}",
                    crate::format_duration(self.shared.connect_timeout * 3)
                ),
            ))),
        };
        let mut st = self.state();
        match res {
            Ok((conn, client, addr)) => {
                let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
                let live = Live {
                    conn,
                    client,
                    id,
                    addr,
                };
                let was_down = st.failed.take().is_some();
                st.live = Some(live.clone());
                st.role_checked = Instant::now();
                drop(st);
                if id > 1 || was_down {
                    tracing::info!(server = %live.addr, "redis: connected to the writable server");
                }
                self.shared.generation.send_replace(id);
                Ok(live)
            }
            Err(e) => {
                let detail = e
                    .detail()
                    .map(str::to_string)
                    .unwrap_or_else(|| e.to_string());
                tracing::debug!(error = %e, "redis: connect failed");
                st.failed = Some((Instant::now(), e.kind(), detail));
                Err(e)
            }
        }
    }

    /// Find the server, connect, and check that it is a master.
    async fn open(&self) -> Result<(MultiplexedConnection, redis::Client, String), RedisError> {
        let (client, addr) = match &self.shared.target {
            Target::Direct(c) => (c.clone(), c.get_connection_info().addr.to_string()),
            Target::Sentinel(s) => {
                let (host, port) = s
                    .master_addr(&self.shared.config, self.shared.connect_timeout)
                    .await?;
                let client = s.node_client(&host, port).map_err(|e| {
                    RedisError::from((ErrorKind::InvalidClientConfig, "redis", e.to_string()))
                })?;
                (client, super::sentinel::join_host_port(&host, port))
            }
        };
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&self.shared.config)
            .await?;
        if !self.role(&mut conn).await? {
            let detail = match &self.shared.target {
                Target::Direct(_) => format!(
                    "the server at {addr} is a replica; waiting for the URL to reach a master"
                ),
                Target::Sentinel(s) => format!(
                    "the sentinels name {addr} as master {:?}, but it answers as a replica \
                     (a failover in progress?)",
                    s.master
                ),
            };
            return Err(RedisError::from((ErrorKind::ReadOnly, "redis", detail)));
        }
        Ok((conn, client, addr))
    }

    /// After a call on `live`: drop the connection when the error says so.
    fn after(&self, live: &Live, e: &RedisError) {
        if drops_connection(e) {
            let why = match (e.kind(), e.detail()) {
                (ErrorKind::ReadOnly, Some(d)) => format!("read-only: {d}"),
                _ => e.to_string(),
            };
            self.drop_live(live.id, &why);
        }
    }
}

/// Whether `cmd` is one of [`READS`].
fn is_read(cmd: &Cmd) -> bool {
    match cmd.args_iter().next() {
        Some(redis::Arg::Simple(name)) => READS
            .iter()
            .any(|r| r.as_bytes().eq_ignore_ascii_case(name)),
        _ => false,
    }
}

/// `cmd` then `WAIT`, in one round trip: `cmd`'s reply when enough
/// replicas acknowledged it.
async fn with_wait(
    conn: &mut MultiplexedConnection,
    cmd: &Cmd,
    wait: Wait,
) -> Result<Value, RedisError> {
    let mut p = redis::pipe();
    p.add_command(cmd.clone())
        .cmd("WAIT")
        .arg(wait.replicas)
        .arg(wait.timeout_ms);
    let mut replies = conn.req_packed_commands(&p, 0, 2).await?.into_iter();
    let reply = replies.next().unwrap_or(Value::Nil).extract_error()?;
    let wait_reply = replies.next().unwrap_or(Value::Nil);
    let acked = match redis::from_redis_value::<i64>(&wait_reply) {
        Ok(n) => n,
        Err(_) => {
            // An error instead of a count: the server left the WAIT, e.g.
            // `UNBLOCKED` when it was made a replica meanwhile (a
            // failover). The write ran; whether a replica has it is
            // unknown.
            let why = match wait_reply.extract_error() {
                Err(e) => e.to_string(),
                Ok(v) => format!("{v:?}"),
            };
            return Err(RedisError::from((
                ErrorKind::ReadOnly,
                "redis",
                format!(
                    "the WAIT after the write answered {why:?}, not how many replicas have \
                     it ({WAIT_PARAM}); it is on the server but a failover may lose it"
                ),
            )));
        }
    };
    if acked < i64::from(wait.replicas) {
        return Err(RedisError::from((
            ErrorKind::ReadOnly,
            "redis",
            format!(
                "the write reached {acked} of the {} replicas {WAIT_PARAM} asks for within {} ms \
                 (WAIT); it is on the master but a failover may lose it",
                wait.replicas, wait.timeout_ms
            ),
        )));
    }
    Ok(reply)
}

impl ConnectionLike for MasterConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut live = self.live().await?;
            let r = match self.shared.wait {
                Some(w) if !is_read(cmd) => with_wait(&mut live.conn, cmd, w).await,
                _ => live.conn.req_packed_command(cmd).await,
            };
            if let Err(e) = &r {
                self.after(&live, e);
            }
            r
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let mut live = self.live().await?;
            let mut r = live.conn.req_packed_commands(cmd, offset, count).await;
            if let (Ok(_), Some(w)) = (&r, self.shared.wait) {
                // The pipeline's writes are this connection's latest: one
                // WAIT covers them all (a round trip more, for the rare
                // pipelined batch).
                if let Err(e) = with_wait(&mut live.conn, &redis::cmd("PING"), w).await {
                    r = Err(e);
                }
            }
            if let Err(e) = &r {
                self.after(&live, e);
            }
            r
        })
    }

    fn get_db(&self) -> i64 {
        self.shared.db
    }
}

#[cfg(test)]
mod tests {
    use super::take_wait_param;

    #[test]
    fn wait_replicas_is_taken_out_of_the_url() {
        let (url, n) = take_wait_param("redis://h:6379/0?wait_replicas=2").unwrap();
        assert_eq!((url.as_str(), n), ("redis://h:6379/0", 2));
        let (url, n) =
            take_wait_param("rediss+sentinel://s1/m?sslrootcert=/ca.pem&wait_replicas=1").unwrap();
        assert_eq!(
            (url.as_str(), n),
            ("rediss+sentinel://s1/m?sslrootcert=/ca.pem", 1)
        );
        assert_eq!(take_wait_param("redis://h").unwrap().1, 0);
        for bad in ["x", "17", "-1", ""] {
            let e = take_wait_param(&format!("redis://:pw@h/?wait_replicas={bad}")).unwrap_err();
            let m = e.to_string();
            assert!(m.contains("wait_replicas") && m.contains("0 to 16"), "{m}");
            assert!(!m.contains(":pw@"), "{m}");
        }
    }
}
