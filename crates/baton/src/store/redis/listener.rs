//! Wake-ups: one pub/sub connection per backend, subscribed to `B wake`,
//! reconnecting with backoff, turning each message into a [`Wake`] on the
//! backend's broadcast channel.

use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

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
    tokio::spawn(listen(
        b.client.clone(),
        b.wake_channel(),
        tx.clone(),
        stop.clone(),
        ready_tx,
    ));
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

/// Hold a pub/sub connection subscribed to the wake channel and forward its
/// messages, reconnecting with backoff until `stop` fires.
async fn listen(
    client: redis::Client,
    channel: String,
    tx: broadcast::Sender<Wake>,
    stop: CancellationToken,
    ready: watch::Sender<bool>,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let res = tokio::select! {
            _ = stop.cancelled() => return,
            r = listen_once(&client, &channel, &tx, &ready, &mut backoff) => r,
        };
        ready.send_replace(false);
        match res {
            Ok(()) => tracing::warn!("redis: wake-up subscription ended; reconnecting"),
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

async fn listen_once(
    client: &redis::Client,
    channel: &str,
    tx: &broadcast::Sender<Wake>,
    ready: &watch::Sender<bool>,
    backoff: &mut Duration,
) -> Result<(), redis::RedisError> {
    let mut pubsub = tokio::time::timeout(CONNECT_TIMEOUT, client.get_async_pubsub())
        .await
        .map_err(|_| {
            redis::RedisError::from((redis::ErrorKind::IoError, "pub/sub connect timed out"))
        })??;
    pubsub.subscribe(channel).await?;
    ready.send_replace(true);
    *backoff = Duration::from_millis(100);
    let mut stream = pubsub.on_message();
    while let Some(msg) = stream.next().await {
        if let Ok(payload) = msg.get_payload::<String>() {
            // No receivers is fine: nobody is waiting right now.
            let _ = tx.send(Wake::parse(&payload));
        }
    }
    Ok(())
}
