//! Wake-ups: one pub/sub connection per backend, subscribed to `B wake`,
//! reconnecting with backoff, turning each message into a [`Wake`] on the
//! backend's broadcast channel. It subscribes on the server the command
//! connection is to (`conn.rs`), and moves when that one moves (a
//! failover): a demoted master would still pass on what its new master
//! publishes, but a dead one passes on nothing.

use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::cluster::Conn;
use super::conn::MasterConn;
use super::{Listener, RedisBackend, CONNECT_TIMEOUT};
use crate::store::Wake;

/// A receiver of the backend's wake-ups; the first call starts the
/// listener and waits (briefly) until it has subscribed.
pub(super) async fn subscribe(b: &RedisBackend) -> broadcast::Receiver<Wake> {
    let mut guard = b.wake.lock().await;
    if let Some(w) = guard.as_ref() {
        return w.tx.subscribe();
    }
    let (tx, rx) = broadcast::channel(1024);
    let stop = CancellationToken::new();
    let (ready_tx, mut ready_rx) = watch::channel(false);
    let source = match (&b.conn, &b.client) {
        (Conn::Single(c), _) => Some(Source::Follow(c.as_ref().clone())),
        // A cluster's connect always gives its seed node's client.
        (Conn::Cluster(_), client) => client.clone().map(Source::Fixed),
    };
    if let Some(source) = source {
        tokio::spawn(listen(
            source,
            b.wake_channel(),
            tx.clone(),
            stop.clone(),
            ready_tx,
        ));
    }
    *guard = Some(Listener {
        tx,
        _stop: stop.drop_guard(),
    });
    drop(guard);
    // Give the listener a moment to subscribe so a wake-up sent right
    // after this returns is not missed; it is only a hint either way.
    let _ = tokio::time::timeout(CONNECT_TIMEOUT, ready_rx.wait_for(|r| *r)).await;
    rx
}

/// Where the wake-up subscription connects.
enum Source {
    /// Where the command connection to one server is, moving with it.
    Follow(MasterConn),
    /// A cluster's seed node (pub/sub messages reach every node).
    Fixed(redis::Client),
}

/// Hold a pub/sub connection subscribed to the wake channel and forward its
/// messages, reconnecting with backoff until `stop` fires.
async fn listen(
    conn: Source,
    channel: String,
    tx: broadcast::Sender<Wake>,
    stop: CancellationToken,
    ready: watch::Sender<bool>,
) {
    let mut backoff = Duration::from_millis(100);
    let mut subscribed_before = false;
    loop {
        let res = tokio::select! {
            _ = stop.cancelled() => return,
            r = listen_once(&conn, &channel, &tx, &ready, &mut backoff, subscribed_before) => r,
        };
        subscribed_before = subscribed_before || res.is_ok();
        ready.send_replace(false);
        match res {
            Ok(true) => {
                tracing::debug!(
                    "redis: the command connection moved; the wake-up subscription follows"
                );
                continue;
            }
            Ok(false) => tracing::warn!("redis: wake-up subscription ended; reconnecting"),
            Err(e) => {
                tracing::warn!("redis: wake-up subscription failed: {e}; retrying in {backoff:?}")
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// Subscribe on the command connection's server and forward until the
/// subscription ends (`Ok(false)`) or the command connection moves to
/// another server (`Ok(true)`).
async fn listen_once(
    conn: &Source,
    channel: &str,
    tx: &broadcast::Sender<Wake>,
    ready: &watch::Sender<bool>,
    backoff: &mut Duration,
    again: bool,
) -> Result<bool, redis::RedisError> {
    let (client, mut moved) = match conn {
        Source::Fixed(client) => (client.clone(), None),
        Source::Follow(conn) => {
            let mut moved = conn.generation();
            let client = tokio::time::timeout(CONNECT_TIMEOUT, conn.client())
                .await
                .map_err(|_| {
                    redis::RedisError::from((
                        redis::ErrorKind::IoError,
                        "no writable server found in time",
                    ))
                })??;
            moved.borrow_and_update();
            (client, Some(moved))
        }
    };
    let mut pubsub = tokio::time::timeout(CONNECT_TIMEOUT, client.get_async_pubsub())
        .await
        .map_err(|_| {
            redis::RedisError::from((redis::ErrorKind::IoError, "pub/sub connect timed out"))
        })??;
    pubsub.subscribe(channel).await?;
    ready.send_replace(true);
    if again {
        // Back after a gap: what was published meanwhile was missed.
        let _ = tx.send(Wake::resync());
    }
    *backoff = Duration::from_millis(100);
    let mut stream = pubsub.on_message();
    loop {
        tokio::select! {
            msg = stream.next() => match msg {
                Some(msg) => {
                    if let Ok(payload) = msg.get_payload::<String>() {
                        // No receivers is fine: nobody is waiting right now.
                        let _ = tx.send(Wake::parse(&payload));
                    }
                }
                None => return Ok(false),
            },
            changed = async {
                match moved.as_mut() {
                    Some(m) => m.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            } => return Ok(changed),
        }
    }
}
