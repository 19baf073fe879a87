//! baton's test kit: what the test binaries of every crate share.
//!
//! - [`clock`]: the test clock: shift a store's own clock instead of
//!   sleeping.
//! - [`harness`]: an isolated store of each backend for one test
//!   ([`harness::TestStore`]), and [`per_backend!`], which instantiates a
//!   test once per backend (`sqlite::NAME`, `postgres::NAME`, …).
//! - [`free_port`], [`required`], [`installed`], [`need`]: finding tools
//!   and ports, and the one rule for a missing tool (a printed `SKIPPED`,
//!   or a panic when `BATON_REQUIRE_BACKENDS=1`).
//! - [`private`]: a private `redis-server` or `postgres` the test may stop,
//!   crash or serve over TLS.
//! - [`mariadb`]: a private `mariadbd` (own port, own data directory).
//! - [`process`]: a spawned server process killed when its guard drops.
//! - [`sentinel`]: a private Redis master, replica and three sentinels.
//! - [`certs`]: test certificates made with `openssl`.
//! - [`redis_cluster`]: a private 3-master Redis Cluster.
//! - [`cluster`]: raw Redis connections, one node or a cluster, for tests
//!   that read keys behind the store's back.
//! - [`proxy`]: the fault proxy `baton chaos` uses (the `baton-proxy` crate).
//! - [`wait`]: waiting on a condition with a deadline instead of sleeping.
//!
//! A dev-dependency only: nothing here ships.

pub mod certs;
pub mod clock;
pub mod cluster;
pub mod harness;
pub mod mariadb;
pub mod private;
pub mod process;
pub mod redis_cluster;
pub mod sentinel;
pub mod wait;

/// The fault proxy `baton chaos` uses (re-exported from `baton-proxy`).
pub use baton_proxy as proxy;

pub use mariadb::PrivateMariadb;
pub use private::{Kind, Private};
pub use redis_cluster::PrivateCluster;

use std::process::{Command, Stdio};

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    proxy::free_port().unwrap_or_else(|e| panic!("no free loopback port: {e}"))
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

/// Instantiate tests once per backend, as `sqlite::NAME`, `postgres::NAME`,
/// `redis::NAME` and `mysql::NAME` (run one backend with
/// `cargo test … -- sqlite::`).
///
/// `run` is an `async fn(harness::Kind, test)` of the calling crate that
/// gives `test` what it takes (a [`harness::TestStore`]: see
/// [`harness::run`]; the CLI tests' own environment), `threads` the
/// runtime's worker threads. Tests are named `module::name` (the function
/// `module::name` of the module the macro is called in) or `name` (its
/// function `name`).
///
/// ```ignore
/// baton_testkit::per_backend! {
///     run: baton_testkit::harness::run, threads: 4;
///     locks::grant_busy_release,
///     queue::finish_is_compare_and_set,
/// }
/// ```
#[macro_export]
macro_rules! per_backend {
    (run: $run:path, threads: $n:literal; $($module:ident :: $name:ident),* $(,)?) => {
        $crate::per_backend! { @each $run, $n, [sqlite Sqlite] [postgres Postgres] [redis Redis] [mysql Mysql]; ($(($module :: $name) $name),*) }
    };
    (run: $run:path, threads: $n:literal; $($name:ident),* $(,)?) => {
        $crate::per_backend! { @each $run, $n, [sqlite Sqlite] [postgres Postgres] [redis Redis] [mysql Mysql]; ($(($name) $name),*) }
    };
    (@each $run:path, $n:literal, $([$backend:ident $kind:ident])*; $tests:tt) => {
        $( $crate::per_backend! { @one $run, $n, $backend, $kind; $tests } )*
    };
    (@one $run:path, $n:literal, $backend:ident, $kind:ident; ($(($($f:ident)::+) $name:ident),*)) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = $n)]
                async fn $name() {
                    $run($crate::harness::Kind::$kind, super::$($f)::+).await
                }
            )*
        }
    };
}
