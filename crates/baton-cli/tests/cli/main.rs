//! The CLI tests: the real `baton` binary against an isolated store of
//! each backend, one module per area (`cli_lock::…`, `cli_serve::…`), all
//! in this one test binary so that cargo builds and links it once and its
//! tests share the runner's threads. Run one area with
//! `cargo test -p baton-cli --test cli -- cli_lock::`.

#[macro_use]
mod common;

mod cli_admin;
mod cli_bad_input;
mod cli_chaos;
mod cli_charts;
mod cli_checked_by;
mod cli_cluster;
mod cli_debounce;
mod cli_dynjobs;
mod cli_edges;
mod cli_first_hour;
mod cli_fleet_budget;
mod cli_freeze;
mod cli_key_rate;
mod cli_keys;
mod cli_lock;
mod cli_logs;
/// Spans exported over OTLP (`--features otel`).
#[cfg(feature = "otel")]
mod cli_otel;
mod cli_outage;
mod cli_overlap;
mod cli_pause_notes;
mod cli_pgbouncer;
mod cli_precision;
mod cli_queue;
mod cli_rate;
mod cli_read_only;
mod cli_release;
mod cli_sentinel;
mod cli_serve;
mod cli_skew;
mod cli_stall;
mod cli_store_forgot;
mod cli_store_resolution;
mod cli_tree;
