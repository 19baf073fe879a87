//! Redis Sentinel: the `redis+sentinel://` URL and finding the master
//! through the sentinels.
//!
//! ```text
//! redis+sentinel://[user:password@]h1:26379,h2:26379/master-name[/db][?params]
//! rediss+sentinel://…   (TLS to the sentinels and to the master)
//! ```
//!
//! The user and password are the master's (the data nodes'), as in
//! `redis://`; the sentinels' own credentials, when they need any, are the
//! query parameters `sentinel_password` (and `sentinel_username` for an
//! ACL user), the names go-redis (`SentinelPassword`), ioredis
//! (`sentinelPassword`) and redis-rb / redis-client (`sentinel_password`)
//! give them. `rediss+sentinel://` takes `sslrootcert`, `sslcert` and
//! `sslkey` as `rediss://` does (see `tls.rs`), for both.
//!
//! Finding the master follows Redis's guidelines for sentinel clients: ask
//! each sentinel in turn (the one that answered last first) for
//! `SENTINEL get-master-addr-by-name`, connect there, and check with `ROLE`
//! that it is a master (the connection in `conn.rs` does the last two).
//! redis-rs's own `redis::sentinel` is not used: its calls take no
//! connection timeout (a sentinel or master that drops packets hangs the
//! lookup for the kernel's TCP timeout) and its TLS to the master cannot
//! take a CA of ours (`tls_params` is not settable), which `rediss://`
//! users rely on.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::error::StoreError;
use crate::store::redact;

/// The sentinels' default port.
const SENTINEL_PORT: u16 = 26379;
/// The query parameters a sentinel URL accepts.
const PARAMS: [&str; 5] = [
    "sentinel_password",
    "sentinel_username",
    "sslrootcert",
    "sslcert",
    "sslkey",
];
/// The accepted form, for error messages.
const FORM: &str = "redis+sentinel://[USER:PASSWORD@]HOST[:PORT][,HOST[:PORT]…]/MASTER-NAME[/DB] \
                    (rediss+sentinel:// for TLS; sentinels' port 26379 by default), \
                    e.g. redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster";

/// Whether `url` is a sentinel URL.
pub(super) fn is_sentinel_url(url: &str) -> bool {
    url.starts_with("redis+sentinel://") || url.starts_with("rediss+sentinel://")
}

/// A parsed sentinel URL: how to reach the sentinels, and how to open a
/// client for the master they name.
#[derive(Debug)]
pub(super) struct Sentinels {
    /// A client per sentinel (with the sentinels' credentials and TLS).
    clients: Vec<(String, redis::Client)>,
    /// The master's name at the sentinels.
    pub(super) master: String,
    /// `redis` or `rediss`.
    scheme: &'static str,
    /// The master's `user:password@` as written (percent-encoded), or empty.
    userinfo: String,
    /// The database index.
    pub(super) db: i64,
    /// The TLS parameters, as `?k=v&…` (or empty).
    tls_query: String,
    /// The sentinel that answered last, asked first next time.
    preferred: AtomicUsize,
    /// The connection to the sentinel that answered last, kept for the
    /// next question (the connection asks every second while calls flow).
    cached: tokio::sync::Mutex<Option<(usize, redis::aio::MultiplexedConnection)>>,
    /// The URL as shown in messages.
    shown: String,
}

impl Sentinels {
    /// Parse a `redis+sentinel://` or `rediss+sentinel://` URL (nothing is
    /// connected). Errors name the part at fault and the accepted form.
    pub(super) fn parse(url: &str) -> Result<Sentinels, StoreError> {
        let shown = redact(url);
        let bad = |field: &str, problem: &str| {
            StoreError::Config(format!(
                "store URL {shown:?}: {field}: {problem}; use {FORM}"
            ))
        };
        let (scheme, rest) = match url.split_once("://") {
            Some(("redis+sentinel", rest)) => ("redis", rest),
            Some(("rediss+sentinel", rest)) => ("rediss", rest),
            _ => return Err(bad("scheme", "not redis+sentinel:// or rediss+sentinel://")),
        };
        let (before_query, query) = match rest.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match before_query.split_once('/') {
            Some((a, p)) => (a, p),
            None => (before_query, ""),
        };
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (format!("{u}@"), h),
            None => (String::new(), authority),
        };
        if hosts.is_empty() {
            return Err(bad("sentinels", "no sentinel host"));
        }
        let mut addrs = Vec::new();
        for h in hosts.split(',') {
            addrs.push(parse_host(h).map_err(|p| bad("sentinel host", &p))?);
        }
        let mut segments = path.split('/');
        let master = segments.next().unwrap_or_default();
        if master.is_empty() {
            return Err(bad(
                "master name",
                "missing (the name the sentinels monitor)",
            ));
        }
        let master = url::form_urlencoded::parse(format!("m={master}").as_bytes())
            .next()
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default();
        let db = match segments.next() {
            None | Some("") => 0,
            Some(d) => d.parse::<i64>().ok().filter(|d| *d >= 0).ok_or_else(|| {
                bad(
                    "database",
                    &format!("{d:?} is not a database index (0, 1, …)"),
                )
            })?,
        };
        if let Some(extra) = segments.find(|s| !s.is_empty()) {
            return Err(bad(
                "path",
                &format!("unexpected {extra:?} after the database"),
            ));
        }
        let mut sentinel_user = String::new();
        let mut sentinel_password = String::new();
        let mut tls = url::form_urlencoded::Serializer::new(String::new());
        let mut any_tls = false;
        for (k, v) in url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
            match &*k {
                "sentinel_password" => sentinel_password = v.into_owned(),
                "sentinel_username" => sentinel_user = v.into_owned(),
                "sslrootcert" | "sslcert" | "sslkey" => {
                    if scheme != "rediss" {
                        return Err(bad(&k, "TLS files need rediss+sentinel://"));
                    }
                    any_tls = true;
                    tls.append_pair(&k, &v);
                }
                other => {
                    return Err(bad(
                        "query",
                        &format!(
                            "unknown parameter {other:?}; accepted: {}",
                            PARAMS.join(", ")
                        ),
                    ))
                }
            }
        }
        let tls_query = if any_tls {
            format!("?{}", tls.finish())
        } else {
            String::new()
        };
        let sentinel_auth = if sentinel_password.is_empty() && sentinel_user.is_empty() {
            String::new()
        } else {
            let enc =
                |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
            format!("{}:{}@", enc(&sentinel_user), enc(&sentinel_password))
        };
        let mut clients = Vec::new();
        for (host, port) in addrs {
            let addr = join_host_port(&host, port);
            let client =
                super::tls::open_client(&format!("{scheme}://{sentinel_auth}{addr}{tls_query}"))
                    .map_err(|e| bad("sentinel", &format!("{addr}: {e}")))?;
            clients.push((addr, client));
        }
        let s = Sentinels {
            clients,
            master,
            scheme,
            userinfo,
            db,
            tls_query,
            preferred: AtomicUsize::new(0),
            cached: tokio::sync::Mutex::new(None),
            shown: shown.clone(),
        };
        // The master's client must open too (credentials, TLS files).
        s.node_client("127.0.0.1", 6379)
            .map_err(|e| bad("master", &e.to_string()))?;
        Ok(s)
    }

    /// A client for the master at `host:port`, with the URL's user,
    /// password, database and TLS files.
    pub(super) fn node_client(&self, host: &str, port: u16) -> Result<redis::Client, StoreError> {
        super::tls::open_client(&format!(
            "{}://{}{}/{}{}",
            self.scheme,
            self.userinfo,
            join_host_port(host, port),
            self.db,
            self.tls_query
        ))
    }

    /// Ask the sentinels, in turn, where the master is: `(host, port)` of
    /// the first answer. Each sentinel gets `timeout` to connect and answer.
    pub(super) async fn master_addr(
        &self,
        config: &redis::AsyncConnectionConfig,
        timeout: Duration,
    ) -> Result<(String, u16), redis::RedisError> {
        let mut cached = self.cached.lock().await;
        let question = || {
            let mut q = redis::cmd("SENTINEL");
            q.arg("get-master-addr-by-name").arg(&self.master);
            q
        };
        if let Some((_, c)) = cached.as_mut() {
            let q = question();
            let asked = q.query_async::<Option<(String, u16)>>(c);
            if let Ok(Ok(Some(found))) = tokio::time::timeout(timeout, asked).await {
                return Ok(found);
            }
            // Any other answer: ask them all, from the next one.
            *cached = None;
        }
        let n = self.clients.len();
        let first = self.preferred.load(Ordering::Relaxed) % n;
        let mut failures = Vec::new();
        let mut unknown = 0;
        for i in 0..n {
            let idx = (first + i) % n;
            let (addr, client) = &self.clients[idx];
            let ask = async {
                let mut c = client
                    .get_multiplexed_async_connection_with_config(config)
                    .await?;
                let found = question()
                    .query_async::<Option<(String, u16)>>(&mut c)
                    .await?;
                Ok::<_, redis::RedisError>((found, c))
            };
            match tokio::time::timeout(timeout, ask).await {
                Ok(Ok((Some(found), c))) => {
                    self.preferred.store(idx, Ordering::Relaxed);
                    *cached = Some((idx, c));
                    return Ok(found);
                }
                Ok(Ok((None, _))) => {
                    unknown += 1;
                    failures.push(format!(
                        "{addr}: monitors no master named {:?}",
                        self.master
                    ));
                }
                Ok(Err(e)) => failures.push(format!("{addr}: {e}")),
                Err(_) => failures.push(format!("{addr}: no answer within {timeout:?}")),
            }
        }
        let detail = format!(
            "{}: no sentinel named the master {:?} ({})",
            self.shown,
            self.master,
            failures.join("; ")
        );
        if unknown == n {
            // Every sentinel answered and none knows the name: the URL's
            // fault, not an outage.
            return Err(redis::RedisError::from((
                redis::ErrorKind::ClientError,
                "unknown sentinel master",
                format!("{detail}; check the master name (SENTINEL MASTERS lists them)"),
            )));
        }
        Err(redis::RedisError::from((
            redis::ErrorKind::IoError,
            "sentinels unreachable",
            detail,
        )))
    }
}

/// `host[:port]` or `[v6]:port` of one sentinel.
fn parse_host(h: &str) -> Result<(String, u16), String> {
    let (host, port) = if let Some(rest) = h.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("{h:?}: an IPv6 address needs its closing ']'"))?;
        (host, after.strip_prefix(':'))
    } else {
        match h.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (h, None),
        }
    };
    if host.is_empty() {
        return Err(format!("{h:?}: empty host"));
    }
    let port = match port {
        None => SENTINEL_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{h:?}: port {p:?} is not a number from 1 to 65535"))?,
    };
    Ok((host.to_string(), port))
}

/// `host:port`, with an IPv6 host in brackets.
pub(super) fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(url: &str) -> String {
        match Sentinels::parse(url) {
            Ok(_) => panic!("{url} parsed"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_sentinel_url_parses_into_its_parts() {
        let s = Sentinels::parse(
            "redis+sentinel://app:s%40cret@h1:26380,h2,[::1]:26381/my-master/3?sentinel_password=x",
        )
        .unwrap();
        let addrs: Vec<&str> = s.clients.iter().map(|(a, _)| a.as_str()).collect();
        assert_eq!(addrs, ["h1:26380", "h2:26379", "[::1]:26381"]);
        assert_eq!(s.master, "my-master");
        assert_eq!(s.db, 3);
        let info = s.node_client("10.0.0.9", 6380).unwrap();
        let info = info.get_connection_info();
        assert_eq!(info.redis.db, 3);
        assert_eq!(info.redis.username.as_deref(), Some("app"));
        assert_eq!(info.redis.password.as_deref(), Some("s@cret"));
        assert_eq!(info.addr.to_string(), "10.0.0.9:6380");
        // The sentinels get their own password, not the master's.
        let sentinel = s.clients[0].1.get_connection_info();
        assert_eq!(sentinel.redis.password.as_deref(), Some("x"));
        assert_eq!(sentinel.redis.db, 0);
        assert!(!s.shown.contains("s%40cret"), "{}", s.shown);
    }

    #[test]
    fn a_bad_sentinel_url_names_the_part_and_the_form() {
        for (url, part) in [
            ("redis+sentinel:///mymaster", "sentinels: no sentinel host"),
            ("redis+sentinel://h1:26379", "master name: missing"),
            ("redis+sentinel://h1:0/m", "sentinel host"),
            ("redis+sentinel://h1:x/m", "is not a number"),
            ("redis+sentinel://h1,/m", "empty host"),
            ("redis+sentinel://h1/m/zero", "database"),
            ("redis+sentinel://h1/m/0/x", "path"),
            (
                "redis+sentinel://h1/m?sslrootcert=/ca.pem",
                "need rediss+sentinel://",
            ),
            (
                "redis+sentinel://h1/m?password=x",
                "unknown parameter \"password\"",
            ),
            ("redis+sentinel://[::1/m", "closing ']'"),
        ] {
            let e = err(url);
            assert!(e.contains(part), "{url}: {e}");
            assert!(
                e.contains("redis+sentinel://[USER:PASSWORD@]HOST"),
                "{url}: {e}"
            );
        }
        let e = err("redis+sentinel://u:hidden@h1/m/zero");
        assert!(!e.contains("hidden"), "{e}");
    }
}
