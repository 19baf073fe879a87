//! A TCP fault proxy, used by `baton chaos` (in the `baton` binary) and by
//! the tests (through `baton-testkit`, a dev-dependency only): put it in
//! front of a store and make the
//! path between a client and the store pass, go *dark* (connections stay
//! open but no byte passes either way until it heals: a stall, not a
//! close), be *cut* (every connection closed, new ones refused), or slow
//! (latency added to every chunk), or lose the reply to one request
//! ([`Proxy::lose_reply_to`]: the server runs it, the client sees its
//! connection drop).
//!
//! It runs on a thread of its own with its own runtime, so a test can use
//! it from sync or async code, and a `baton` child process can connect to
//! [`Proxy::url`] while the test flips the mode.
//!
//! A crate of its own (tokio only) so that the production binary and the
//! test kit share one copy without the test kit entering the binary.
//!
//! ```no_run
//! use baton_proxy::{Mode, Proxy};
//! let proxy = Proxy::try_start("127.0.0.1:5432")?;
//! let url = proxy.url("postgres://postgres@127.0.0.1:5432/test");
//! proxy.set(Mode::Dark);
//! # Ok::<(), std::io::Error>(())
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward everything.
    Pass,
    /// Keep connections open and pass no byte either way (a stall: what
    /// was sent is delivered when the path heals); new connections are
    /// accepted into the same silence.
    Dark,
    /// Close every connection; accept and close new ones at once.
    Cut,
}

struct State {
    mode: Mode,
    latency: Duration,
    /// Lose the reply to the next request carrying these bytes.
    lose_reply: Option<Vec<u8>>,
}

/// A running proxy. Dropping it stops it and closes every connection.
pub struct Proxy {
    addr: SocketAddr,
    upstream: String,
    state: Arc<Mutex<State>>,
    changed: watch::Sender<u64>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// Listen on a free loopback port and forward to `upstream` (`host:port`);
    /// panics if it cannot (for tests: see [`Proxy::try_start`]).
    pub fn start(upstream: &str) -> Proxy {
        Self::try_start(upstream).expect("start the fault proxy")
    }

    /// Listen on a free loopback port and forward to `upstream` (`host:port`).
    pub fn try_start(upstream: &str) -> std::io::Result<Proxy> {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        // The runtime is built here, so a failure is an error, not a panic.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let state = Arc::new(Mutex::new(State {
            mode: Mode::Pass,
            latency: Duration::ZERO,
            lose_reply: None,
        }));
        let (changed, rx) = watch::channel(0u64);
        let (stop, stop_rx) = tokio::sync::oneshot::channel();
        let (st, up) = (state.clone(), upstream.to_string());
        let thread = std::thread::spawn(move || {
            rt.block_on(async move {
                let Ok(listener) = TcpListener::from_std(std_listener) else {
                    return;
                };
                tokio::select! {
                    _ = accept_loop(listener, up, st, rx) => {}
                    _ = stop_rx => {}
                }
            });
            // Dropping the runtime drops every connection task (and socket).
            rt.shutdown_background();
        });
        Ok(Proxy {
            addr,
            upstream: upstream.to_string(),
            state,
            changed,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `url` with its `host:port` (the upstream given to [`Proxy::start`])
    /// replaced by the proxy's.
    ///
    /// # Panics
    /// When `url` does not name the upstream (a caller's mistake: build the
    /// upstream from the URL with [`host_port`]).
    pub fn url(&self, url: &str) -> String {
        assert!(
            url.contains(&self.upstream),
            "{url} does not name {}",
            self.upstream
        );
        url.replacen(&self.upstream, &self.addr.to_string(), 1)
    }

    /// Switch the mode; takes effect on every open connection.
    pub fn set(&self, mode: Mode) {
        lock(&self.state).mode = mode;
        self.changed.send_modify(|n| *n += 1);
    }

    /// Delay every forwarded chunk by `latency`.
    pub fn latency(&self, latency: Duration) {
        lock(&self.state).latency = latency;
        self.changed.send_modify(|n| *n += 1);
    }

    /// Lose the reply to the next request that carries `marker` (once):
    /// the chunk with it reaches the server, which runs the request; the
    /// next bytes the server sends on that connection (its reply) are
    /// dropped and the connection is closed both ways. The client sees
    /// what a connection lost after its request left looks like: an
    /// error, for a request that took effect.
    pub fn lose_reply_to(&self, marker: &[u8]) {
        assert!(!marker.is_empty(), "an empty marker would match anything");
        lock(&self.state).lose_reply = Some(marker.to_vec());
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A loopback port that was free a moment ago (bound and released).
///
/// ```
/// let port = baton_proxy::free_port()?;
/// assert_ne!(port, 0);
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The state, also after a panic elsewhere poisoned its mutex.
fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// `host:port` of a store URL (`scheme://[user[:pw]@]host:port[/…]`).
pub fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    rest[..end].to_string()
}

async fn accept_loop(
    listener: TcpListener,
    upstream: String,
    state: Arc<Mutex<State>>,
    changed: watch::Receiver<u64>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        if lock(&state).mode == Mode::Cut {
            drop(client);
            continue;
        }
        let (up, st, ch) = (upstream.clone(), state.clone(), changed.clone());
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(&up).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            // Set once a request whose reply is to be lost has gone up.
            let deaf = Arc::new(AtomicBool::new(false));
            // Either direction ending (or a cut) ends both.
            tokio::select! {
                _ = pump(cr, sw, st.clone(), ch.clone(), Dir::Up(deaf.clone())) => {}
                _ = pump(sr, cw, st, ch, Dir::Down(deaf)) => {}
            }
        });
    }
}

/// Which way a [`pump`] copies, with the connection's "lose the next
/// reply" flag.
enum Dir {
    /// Client to server: sets the flag after sending a marked request.
    Up(Arc<AtomicBool>),
    /// Server to client: with the flag set, drops what it reads and ends
    /// the connection.
    Down(Arc<AtomicBool>),
}

/// Whether `chunk` contains `marker`.
fn carries(chunk: &[u8], marker: &[u8]) -> bool {
    chunk.windows(marker.len()).any(|w| w == marker)
}

/// Copy `from` to `to` chunk by chunk, as the mode says; returns on EOF,
/// an error or a cut.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    state: Arc<Mutex<State>>,
    mut changed: watch::Receiver<u64>,
    dir: Dir,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let mode = lock(&state).mode;
        match mode {
            Mode::Cut => return,
            // Dark: read nothing (bytes wait in the kernel's buffers, as
            // unacknowledged TCP segments would) until the mode changes.
            // Dropping bytes mid-stream would corrupt the protocol's
            // framing after the path heals, which no real network does.
            Mode::Dark => {
                if changed.changed().await.is_err() {
                    return;
                }
                continue;
            }
            Mode::Pass => {}
        }
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            r = changed.changed() => {
                if r.is_err() {
                    return;
                }
                continue; // re-check for a cut
            }
        };
        // A marked request: it goes up, and the reply is lost (the flag is
        // set right after the write, before this single-threaded runtime
        // can run the other direction, so no earlier reply is taken for
        // it).
        let mut marked = false;
        let (mode, latency) = {
            let mut s = lock(&state);
            match &dir {
                Dir::Up(_) => {
                    if s.lose_reply
                        .as_deref()
                        .is_some_and(|m| carries(&buf[..n], m))
                    {
                        s.lose_reply = None;
                        marked = true;
                    }
                }
                Dir::Down(deaf) => {
                    if deaf.load(Ordering::SeqCst) {
                        // The reply (the server ran the request): dropped,
                        // and the connection with it.
                        return;
                    }
                }
            }
            (s.mode, s.latency)
        };
        match mode {
            Mode::Cut => return,
            // Read just before the path went dark: deliver it late.
            Mode::Dark | Mode::Pass => {
                if !latency.is_zero() {
                    tokio::time::sleep(latency).await;
                }
                if to.write_all(&buf[..n]).await.is_err() {
                    return;
                }
                if let (true, Dir::Up(deaf)) = (marked, &dir) {
                    deaf.store(true, Ordering::SeqCst);
                }
            }
        }
    }
}
