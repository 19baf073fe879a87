//! The conformance suite: one set of tests, run against every backend.
//!
//! Each test is an `async fn(TestStore)` in one of the modules below; the
//! `conformance!` macro instantiates it once per backend, as
//! `sqlite::NAME`, `postgres::NAME` and `redis::NAME`. Run one backend with
//! `cargo test -p baton --test conformance -- sqlite::`.
//!
//! A backend is done when this suite passes on it. Adding a backend is one
//! file in `src/store/` and one line in `backends!` below.
//!
//! Backends find their servers through `BATON_TEST_POSTGRES` (default
//! `postgres://postgres@127.0.0.1:5432/test`) and `BATON_TEST_REDIS`
//! (default `redis://127.0.0.1:6379`). A server that does not answer makes
//! its tests print one `SKIPPED` line and pass, unless
//! `BATON_REQUIRE_BACKENDS=1`, which makes them fail.

mod harness;
mod locks;

pub use harness::TestStore;

/// Instantiate every listed test for every backend.
macro_rules! conformance {
    ($($module:ident :: $name:ident),* $(,)?) => {
        backends! { $($module :: $name),* }
    };
}

macro_rules! backends {
    ($($module:ident :: $name:ident),*) => {
        mod sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $name() { crate::harness::run(crate::harness::Kind::Sqlite, crate::$module::$name).await } )* }
        mod postgres { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $name() { crate::harness::run(crate::harness::Kind::Postgres, crate::$module::$name).await } )* }
        mod redis { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $name() { crate::harness::run(crate::harness::Kind::Redis, crate::$module::$name).await } )* }
    };
}

conformance! {
    locks::grant_busy_release,
    locks::tokens_strictly_increase,
    locks::mutual_exclusion_16_contenders,
    locks::lapsed_holder_cannot_extend_or_release,
    locks::at_least_is_honoured,
    locks::at_most_lapses_a_dropped_lease,
    locks::keep_alive_extends_and_signals_loss,
    locks::wait_gets_the_lock_when_released,
    locks::client_clock_skew_changes_nothing,
    locks::list_and_get,
    locks::bad_input_is_refused,
}
