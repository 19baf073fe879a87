//! baton's test kit: what the test binaries of every crate share.
//!
//! - [`free_port`], [`required`], [`installed`], [`need`]: finding tools
//!   and ports, and the one rule for a missing tool (a printed `SKIPPED`,
//!   or a panic when `BATON_REQUIRE_BACKENDS=1`).
//! - [`private`]: a private `redis-server` or `postgres` the test may stop,
//!   crash or serve over TLS.
//! - [`mariadb`]: a private `mariadbd` (own port, own data directory).
//! - [`process`]: a spawned server process killed when its guard drops.
//! - [`sentinel`]: a private Redis master, replica and three sentinels.
//! - [`certs`]: test certificates made with `openssl`.
//! - [`cluster`]: raw Redis connections, one node or a cluster, for tests
//!   that read keys behind the store's back.
//! - [`proxy`]: the fault proxy `baton chaos` uses (one copy of its source).
//!
//! A dev-dependency only: nothing here ships.

pub mod certs;
pub mod cluster;
pub mod mariadb;
pub mod private;
pub mod process;
#[path = "../../baton-cli/src/chaos/proxy.rs"]
pub mod proxy;
pub mod sentinel;

pub use mariadb::PrivateMariadb;
pub use private::{Kind, Private};

use std::net::TcpListener;
use std::process::{Command, Stdio};

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free loopback port: {e}"))
}

/// Whether a missing backend or tool fails the run (CI) instead of skipping.
pub fn required() -> bool {
    std::env::var("BATON_REQUIRE_BACKENDS").is_ok_and(|v| v == "1")
}

/// Whether `bin` is on `PATH`.
pub fn installed(bin: &str) -> bool {
    Command::new("which")
        .arg(bin)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether every one of `bins` is installed; if not, `what` is skipped
/// (said on stderr, past the harness's capture) — or, with
/// `BATON_REQUIRE_BACKENDS=1`, the test panics naming the missing tool.
pub fn need(what: &str, bins: &[&str]) -> bool {
    for b in bins {
        if !installed(b) {
            assert!(
                !required(),
                "{what}: {b} is not installed (BATON_REQUIRE_BACKENDS=1)"
            );
            skipped(&format!("{what}: {b} not installed"));
            return false;
        }
    }
    true
}

/// Say that a test (or part of one) was skipped, where the runner's output
/// capture does not hide it.
pub fn skipped(why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED {why}");
}
