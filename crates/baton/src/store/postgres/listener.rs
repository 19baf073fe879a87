//! Wake-ups: one `LISTEN` session per backend, on its own one-connection
//! pool, reconnecting with backoff, turning each `pg_notify` payload into a
//! [`Wake`] on the backend's broadcast channel.

use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::{PgBackend, PoolMode, CONNECT_TIMEOUT};
use crate::store::Wake;

/// A receiver of the backend's wake-ups; the first call starts the
/// listener. Each call waits (at most [`CONNECT_TIMEOUT`]) until the
/// session listens, so a wake-up sent right after it returns is not
/// missed (a definitions write made just after a scheduler started would
/// wait for its 30 s timer, a task for the next poll); it is only a hint
/// either way.
pub(super) async fn subscribe(b: &PgBackend) -> broadcast::Receiver<Wake> {
    let rx = b.wake.subscribe();
    let ready = b.listener.get_or_init(|| {
        let (ready_tx, ready_rx) = watch::channel(false);
        // Behind a transaction pooler a LISTEN session cannot live: listen
        // on the direct connection the URL names, or not at all (workers
        // poll; their poll interval is the wake-up latency then).
        let target = match b.mode {
            PoolMode::Transaction => match &b.listen {
                Some(direct) => direct.clone(),
                None => {
                    tracing::info!(channel = %b.names.chan, "behind a transaction pooler without listen_host/listen_port: no LISTEN, workers poll");
                    ready_tx.send_replace(true);
                    return ready_rx;
                }
            },
            PoolMode::Direct | PoolMode::Session => b.connect.clone(),
        };
        // Its own one-connection pool, so the long-lived LISTEN session
        // never takes a slot from the operations' pool.
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(CONNECT_TIMEOUT)
            .connect_lazy_with(target);
        tokio::spawn(listen_loop(
            pool,
            b.names.chan.clone(),
            b.wake.clone(),
            b.shutdown.clone(),
            ready_tx,
        ));
        ready_rx
    });
    let mut ready = ready.clone();
    let _ = tokio::time::timeout(CONNECT_TIMEOUT, ready.wait_for(|r| *r)).await;
    rx
}

async fn listen_loop(
    pool: PgPool,
    chan: String,
    wake: broadcast::Sender<Wake>,
    shutdown: CancellationToken,
    ready: watch::Sender<bool>,
) {
    let mut backoff = Duration::from_millis(100);
    let max_backoff = Duration::from_secs(10);
    let mut first = true;
    loop {
        let attempt = async {
            let mut l = PgListener::connect_with(&pool).await?;
            l.listen(&chan).await?;
            Ok::<_, sqlx::Error>(l)
        };
        let mut listener = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = attempt => match r {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(channel = %chan, error = %crate::error::chain(&e), retry_in = ?backoff,
                        "postgres LISTEN failed; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(max_backoff);
                    continue;
                }
            }
        };
        tracing::debug!(channel = %chan, "postgres LISTEN established");
        ready.send_replace(true);
        if !std::mem::replace(&mut first, false) {
            // Back after a gap: what was announced meanwhile was missed.
            let _ = wake.send(Wake::resync());
        }
        backoff = Duration::from_millis(100);
        loop {
            let r = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = listener.try_recv() => r,
            };
            match r {
                Ok(Some(note)) => {
                    // No receivers is fine: nobody is waiting right now.
                    let _ = wake.send(Wake::parse(note.payload()));
                }
                Ok(None) => {
                    // Reconnect here rather than inside `PgListener` (its
                    // next `try_recv` would), so the session is known to
                    // listen again before the resync wake-up goes out.
                    tracing::warn!(channel = %chan,
                        "postgres LISTEN connection lost; reconnecting (notifications may have been missed)");
                    break;
                }
                Err(e) => {
                    tracing::warn!(channel = %chan, error = %crate::error::chain(&e), retry_in = ?backoff,
                        "postgres LISTEN connection failed; reconnecting");
                    break;
                }
            }
        }
        drop(listener);
        ready.send_replace(false);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(max_backoff);
    }
}
