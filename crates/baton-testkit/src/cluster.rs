//! Raw Redis connections for tests that read or write keys behind the
//! store's back, on one node (`redis://`) or a Redis Cluster
//! (`redis+cluster://h1:p1,h2:p2,…`, as `scripts/redis-cluster-ci.sh`
//! starts one): [`connect`] gives a [`RedisConn`] that runs a command on
//! the node serving its key, and [`RedisConn::keys`] / [`RedisConn::del`]
//! that work across a cluster's nodes.

use redis::aio::ConnectionLike;
use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// A connection to one Redis server or to a cluster.
#[derive(Clone)]
pub enum RedisConn {
    /// One server.
    Single(redis::aio::MultiplexedConnection),
    /// A cluster (commands follow MOVED / ASK).
    Cluster(redis::cluster_async::ClusterConnection),
}

/// Connect to `url`: `redis://…` or `redis+cluster://h1:p1,h2:p2`.
/// Panics when it cannot (a test helper).
pub async fn connect(url: &str) -> RedisConn {
    if let Some(rest) = url.strip_prefix("redis+cluster://") {
        let hosts = rest.split(['/', '?']).next().unwrap_or_default();
        let nodes: Vec<String> = hosts.split(',').map(|h| format!("redis://{h}")).collect();
        let c = redis::cluster::ClusterClient::new(nodes)
            .unwrap_or_else(|e| panic!("cluster client for {url}: {e}"));
        RedisConn::Cluster(
            c.get_async_connection()
                .await
                .unwrap_or_else(|e| panic!("connect to the cluster {url}: {e}")),
        )
    } else {
        RedisConn::Single(
            redis::Client::open(url)
                .unwrap_or_else(|e| panic!("redis client for {url}: {e}"))
                .get_multiplexed_async_connection()
                .await
                .unwrap_or_else(|e| panic!("connect to {url}: {e}")),
        )
    }
}

impl RedisConn {
    /// Every key matching `pattern` (`KEYS`, on every master of a cluster).
    pub async fn keys(&mut self, pattern: &str) -> Vec<String> {
        let mut cmd = redis::cmd("KEYS");
        cmd.arg(pattern);
        match self {
            RedisConn::Single(c) => cmd.query_async(c).await.expect("KEYS"),
            RedisConn::Cluster(c) => {
                let v = c
                    .route_command(
                        &cmd,
                        RoutingInfo::MultiNode((
                            MultipleNodeRoutingInfo::AllMasters,
                            Some(ResponsePolicy::CombineArrays),
                        )),
                    )
                    .await
                    .expect("KEYS on every master");
                redis::from_redis_value(&v).expect("KEYS reply")
            }
        }
    }

    /// Delete `keys` (one `DEL` per key, as a cluster needs for keys of
    /// several slots); returns how many existed.
    pub async fn del(&mut self, keys: &[String]) -> i64 {
        let mut n = 0;
        for k in keys {
            let d: i64 = redis::cmd("DEL")
                .arg(k)
                .query_async(self)
                .await
                .expect("DEL");
            n += d;
        }
        n
    }
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Single(c) => c.req_packed_command(cmd),
            RedisConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConn::Single(c) => c.req_packed_commands(cmd, offset, count),
            RedisConn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Single(c) => c.get_db(),
            RedisConn::Cluster(c) => c.get_db(),
        }
    }
}
