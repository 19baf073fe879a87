//! Redis Cluster: the `redis+cluster://` and `rediss+cluster://` URLs, the
//! cluster connection (redis-rs's async cluster client, which follows
//! `MOVED` and `ASK` redirections and refreshes its slot map), and
//! [`Conn`], the one connection type the backend holds — a single node's
//! (`conn.rs`: it follows the writable server, through Sentinel too) or a
//! cluster's connection — so every call site is
//! the same for both.
//!
//! On a cluster each command and each script goes to the node serving its
//! first key's slot; a script touches only keys of one hash tag (see the
//! key layout in the module doc of `super`), so it runs whole on one shard.
//! `EVALSHA` answered `NOSCRIPT` (the script not yet loaded on that node)
//! falls back to `EVAL` as on one node. Reads of every key of a kind
//! (`SCAN`) go to every master in turn ([`Conn::scan`]).

use std::collections::HashMap;

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Pipeline, RedisFuture, Value};

use super::tls::TLS_PARAMS;
use crate::error::StoreError;
use crate::store::{redact, StoreOptions};

/// The connection the backend holds: one node or a cluster.
#[derive(Clone)]
pub(super) enum Conn {
    /// One Redis server (`redis://`, `rediss://`); boxed, as it is much
    /// larger than the cluster's handle.
    Single(Box<super::conn::MasterConn>),
    /// A Redis Cluster (`redis+cluster://`, `rediss+cluster://`).
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.as_mut().req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.as_mut().req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.as_ref().get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

impl Conn {
    /// Every key matching `pattern` (a `SCAN MATCH` pattern): on a cluster,
    /// scanned on every master in turn.
    pub(super) async fn scan(&self, pattern: &str) -> Result<Vec<String>, StoreError> {
        match self {
            Conn::Single(c) => {
                scan_node(pattern, |cmd| {
                    let mut c = c.as_ref().clone();
                    async move { cmd.query_async::<Value>(&mut c).await }
                })
                .await
            }
            Conn::Cluster(c) => {
                let mut out = Vec::new();
                for (host, port) in masters(c).await? {
                    let c = c.clone();
                    out.extend(
                        scan_node(pattern, |cmd| {
                            let mut c = c.clone();
                            let routing =
                                RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                                    host: host.clone(),
                                    port,
                                });
                            async move { c.route_command(&cmd, routing).await }
                        })
                        .await?,
                    );
                }
                Ok(out)
            }
        }
    }
}

/// One node's keys matching `pattern`, by `SCAN` through `send`.
async fn scan_node<F, Fut>(pattern: &str, send: F) -> Result<Vec<String>, StoreError>
where
    F: Fn(Cmd) -> Fut,
    Fut: std::future::Future<Output = redis::RedisResult<Value>>,
{
    let mut cursor: u64 = 0;
    let mut keys = Vec::new();
    loop {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000);
        let (next, found): (u64, Vec<String>) = redis::from_redis_value(&send(cmd).await?)?;
        keys.extend(found);
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// The cluster's masters (host, port), from `CLUSTER SHARDS`' view as the
/// client's slot map has it: `CLUSTER SLOTS` asked of any node.
async fn masters(c: &ClusterConnection) -> Result<Vec<(String, u16)>, StoreError> {
    let mut c = c.clone();
    let v: Vec<Value> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(&mut c)
        .await?;
    let mut out: Vec<(String, u16)> = Vec::new();
    for range in v {
        // [start, end, [host, port, id, ...] (the master), replicas...]
        let Value::Array(r) = range else { continue };
        let Some(Value::Array(master)) = r.get(2) else {
            continue;
        };
        let host: Option<String> = master.first().and_then(|h| redis::from_redis_value(h).ok());
        let port: Option<i64> = master.get(1).and_then(|p| redis::from_redis_value(p).ok());
        if let (Some(host), Some(port)) = (host, port.and_then(|p| u16::try_from(p).ok())) {
            if !out.iter().any(|(h, p)| *h == host && *p == port) {
                out.push((host, port));
            }
        }
    }
    if out.is_empty() {
        return Err(StoreError::Backend(
            "redis cluster: CLUSTER SLOTS names no master (is every slot assigned?)".into(),
        ));
    }
    Ok(out)
}

/// Whether `url` names a Redis Cluster.
pub(super) fn is_cluster_url(url: &str) -> bool {
    url.starts_with("redis+cluster://") || url.starts_with("rediss+cluster://")
}

/// A parsed cluster URL.
#[derive(Debug)]
pub(super) struct ClusterUrl {
    /// One single-node URL per seed node (`redis://` or `rediss://`, with
    /// the user and password), without the TLS files.
    pub nodes: Vec<String>,
    /// The TLS files named in the query (see [`TLS_PARAMS`]).
    pub files: HashMap<&'static str, String>,
    /// The first seed node's URL with the whole query: the client of the
    /// wake-up subscription (pub/sub messages reach every node of a
    /// cluster).
    pub pubsub: String,
}

/// The form a cluster URL takes, for messages.
const FORM: &str = "redis+cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…] (or rediss+cluster:// \
                    for TLS), e.g. redis+cluster://10.0.0.1:7000,10.0.0.2:7001";

/// Parse `redis+cluster://[user:password@]h1:7000,h2:7001[/0][?query]`.
pub(super) fn parse(url: &str) -> Result<ClusterUrl, StoreError> {
    let bad = |e: &dyn std::fmt::Display| {
        StoreError::Config(format!("redis URL {:?}: {e}; use {FORM}", redact(url)))
    };
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| bad(&"not a cluster URL"))?;
    let node_scheme = match scheme {
        "redis+cluster" => "redis",
        "rediss+cluster" => "rediss",
        _ => return Err(bad(&"not a cluster URL")),
    };
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if !matches!(path, "" | "/" | "/0") {
        return Err(bad(&format!(
            "database {:?}: a Redis Cluster has database 0 only",
            path.trim_start_matches('/')
        )));
    }
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), authority),
    };
    let mut files = HashMap::new();
    let mut rest_query = Vec::new();
    if let Some(q) = query {
        for (k, v) in url::form_urlencoded::parse(q.as_bytes()) {
            match TLS_PARAMS.iter().find(|p| **p == k) {
                Some(p) => {
                    files.insert(*p, v.into_owned());
                }
                None => rest_query.push((k.into_owned(), v.into_owned())),
            }
        }
    }
    if !files.is_empty() && node_scheme != "rediss" {
        return Err(bad(
            &"sslrootcert, sslcert and sslkey need a rediss+cluster:// URL",
        ));
    }
    let mut nodes = Vec::new();
    for host in hosts.split(',') {
        if host.is_empty() {
            return Err(bad(&"an empty host in the host list"));
        }
        let node = format!("{node_scheme}://{userinfo}{host}");
        let parsed = url::Url::parse(&node).map_err(|e| bad(&format!("host {host:?}: {e}")))?;
        if parsed.host_str().is_none_or(|h| h.is_empty()) {
            return Err(bad(&format!("host {host:?}: no host name")));
        }
        nodes.push(node);
    }
    let mut pubsub = url::Url::parse(&nodes[0]).map_err(|e| bad(&e))?;
    if let Some(q) = query {
        pubsub.set_query(Some(q));
    }
    let nodes = nodes
        .into_iter()
        .map(|n| {
            if rest_query.is_empty() {
                return Ok(n);
            }
            let mut u = url::Url::parse(&n).map_err(|e| bad(&e))?;
            u.query_pairs_mut().extend_pairs(&rest_query);
            Ok(u.to_string())
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    Ok(ClusterUrl {
        nodes,
        files,
        pubsub: pubsub.to_string(),
    })
}

/// Connect to the cluster `url` names: the command connection, and the
/// client of the wake-up subscription (its first seed node).
pub(super) async fn connect(
    url: &str,
    opts: &StoreOptions,
) -> Result<(Conn, redis::Client), StoreError> {
    let parsed = parse(url)?;
    let bad = |e: &dyn std::fmt::Display| {
        StoreError::Config(format!("redis URL {:?}: {e}; use {FORM}", redact(url)))
    };
    let pubsub = super::tls::open_client(&parsed.pubsub)?;
    let mut builder = redis::cluster::ClusterClientBuilder::new(parsed.nodes.clone())
        .connection_timeout(opts.connect_timeout)
        .response_timeout(opts.statement_timeout)
        .retries(4)
        .min_retry_wait(50)
        .max_retry_wait(500);
    if !parsed.files.is_empty() {
        builder = with_certs(builder, &parsed.files).map_err(|e| bad(&e))?;
    }
    let client = builder.build().map_err(|e| bad(&e))?;
    let conn = tokio::time::timeout(opts.connect_timeout * 3, client.get_async_connection())
        .await
        .map_err(|_| {
            StoreError::Unavailable(format!("redis cluster {}: connect timed out", redact(url)))
        })?
        .map_err(|e| {
            StoreError::Unavailable(format!(
                "redis cluster {}: cannot reach the cluster through its seed nodes: {e}",
                redact(url)
            ))
        })?;
    Ok((Conn::Cluster(conn), pubsub))
}

#[cfg(feature = "tls")]
fn with_certs(
    builder: redis::cluster::ClusterClientBuilder,
    files: &HashMap<&'static str, String>,
) -> Result<redis::cluster::ClusterClientBuilder, String> {
    Ok(builder.certs(super::tls::certificates(files)?))
}

#[cfg(not(feature = "tls"))]
fn with_certs(
    _builder: redis::cluster::ClusterClientBuilder,
    _files: &HashMap<&'static str, String>,
) -> Result<redis::cluster::ClusterClientBuilder, String> {
    Err("this build of baton has no TLS (cargo feature `tls`)".into())
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn cluster_urls_parse_into_seed_nodes_or_say_the_form() {
        let u = parse("redis+cluster://u:pw@h1:7000,h2:7001/0?protocol=resp2").unwrap();
        assert_eq!(
            u.nodes,
            [
                "redis://u:pw@h1:7000?protocol=resp2",
                "redis://u:pw@h2:7001?protocol=resp2"
            ]
        );
        assert_eq!(u.pubsub, "redis://u:pw@h1:7000?protocol=resp2");
        let t = parse("rediss+cluster://h1:7000?sslrootcert=/ca.pem").unwrap();
        assert_eq!(t.nodes, ["rediss://h1:7000"]);
        assert_eq!(
            t.files.get("sslrootcert").map(String::as_str),
            Some("/ca.pem")
        );
        for (url, says) in [
            ("redis+cluster://h1:7000/3", "database 0 only"),
            ("redis+cluster://h1:7000,,h2:1", "empty host"),
            ("redis+cluster://h1:7000?sslcert=/c", "rediss+cluster://"),
            ("redis+cluster://h1:notaport", "host \"h1:notaport\""),
        ] {
            let e = parse(url).unwrap_err().to_string();
            assert!(
                e.contains(says) && e.contains("redis+cluster://[USER"),
                "{url}: {e}"
            );
        }
        let e = parse("redis+cluster://u:secret@h1:7000/9")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("secret"), "{e}");
    }
}
