//! Wake-ups: one `LISTEN` session per backend, on its own one-connection
//! pool, reconnecting with backoff, turning each `pg_notify` payload into a
//! [`Wake`] on the backend's broadcast channel.

use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::{PgBackend, PoolMode, CONNECT_TIMEOUT};
use crate::store::Wake;

/// A receiver of the backend's wake-ups; the first call starts the
/// listener. It returns at once: wake-ups sent before the session listens
/// are missed, so once it listens (the first time, and again after a
/// gap) it sends a resync wake-up ([`Wake::resync`]) and whoever waits
/// looks again (a definitions write made just after a scheduler started
/// waited for its 30 s timer before).
pub(super) fn subscribe(b: &PgBackend) -> broadcast::Receiver<Wake> {
    let rx = b.wake.subscribe();
    b.listener.get_or_init(|| {
        // Behind a transaction pooler a LISTEN session cannot live: listen
        // on the direct connection the URL names, or not at all (workers
        // poll; their poll interval is the wake-up latency then).
        let target = match b.mode {
            PoolMode::Transaction => match &b.listen {
                Some(direct) => direct.clone(),
                None => {
                    tracing::info!(channel = %b.names.chan, "behind a transaction pooler without listen_host/listen_port: no LISTEN, workers poll");
                    return;
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
        ));
    });
    rx
}

async fn listen_loop(
    pool: PgPool,
    chan: String,
    wake: broadcast::Sender<Wake>,
    shutdown: CancellationToken,
) {
    let mut backoff = Duration::from_millis(100);
    let max_backoff = Duration::from_secs(10);
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
        // What was announced before it listened (at its start, or in a
        // gap) was missed: its subscribers look again.
        let _ = wake.send(Wake::resync());
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
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(max_backoff);
    }
}
