//! Overlap policies through `baton serve` (issue 26's checked-by): three
//! instances on one store, a 1 s job whose runs last 2.5 s. Each run
//! writes its start and end (ns, the machine's clock) to `runs`.

use crate::cli_serve::{serve, stop};
use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{read, stdout, Env};

per_backend! {
    buffer_one_runs_back_to_back_without_overlap,
    cancel_other_never_runs_two_at_once,
    terminate_other_kills_the_previous_run_at_once,
}

/// The job under `overlap`; the command records its end even when stopped
/// (SIGTERM reaches the whole tree: `sleep` ends, then the trap takes
/// 0.8 s to stop, like a run that cleans up, and writes its end), so a run
/// started before the previous one has stopped shows as an overlap.
fn config(overlap: &str) -> String {
    format!(
        r#"
[[queue]]
name = "default"
concurrency = 4
lease = "3s"

[[job]]
name = "slow"
every = "1s"
overlap = "{overlap}"
command = ["sh", "-c", "trap 'sleep 0.8; echo stop $BATON_SLOT $(date +%s%N) >> runs; exit 143' TERM; echo start $BATON_SLOT $(date +%s%N) >> runs; sleep 2.5 & wait $!; echo end $BATON_SLOT $(date +%s%N) >> runs"]
"#
    )
}

/// One run: its slot, start and end (ns since the epoch; none when it was
/// killed before its trap could write), and whether it was stopped
/// (SIGTERM) rather than ending by itself.
#[derive(Debug)]
struct Run {
    slot: chrono::DateTime<chrono::Utc>,
    start: i64,
    end: Option<i64>,
    stopped: bool,
}

/// The runs, by start (the trap writes the end of a stopped one).
fn runs(e: &Env) -> Vec<Run> {
    // slot → (start, (end, stopped)).
    type Lines = (Option<i64>, Option<(i64, bool)>);
    let mut by_slot: BTreeMap<String, Lines> = BTreeMap::new();
    for l in read(&e.path("runs")).lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        let [what, slot, at] = f[..] else {
            panic!("bad line {l:?}")
        };
        let at: i64 = at.parse().unwrap();
        let r = by_slot.entry(slot.to_string()).or_default();
        let twice = if what == "start" {
            r.0.replace(at).is_some()
        } else {
            r.1.replace((at, what == "stop")).is_some()
        };
        assert!(!twice, "slot {slot} has two {what} lines: ran twice");
    }
    let mut out: Vec<Run> = by_slot
        .into_iter()
        .map(|(slot, (s, end))| Run {
            slot: slot.parse().expect("BATON_SLOT is RFC 3339"),
            start: s.unwrap_or_else(|| panic!("slot {slot} ended but never started")),
            end: end.map(|(at, _)| at),
            stopped: end.is_some_and(|(_, stopped)| stopped),
        })
        .collect();
    out.sort_by_key(|r| r.start);
    out
}

/// Three `baton serve` running the job under `overlap` for `secs`; its runs.
fn three_serves(e: &Env, overlap: &str, secs: u64) -> Vec<Run> {
    let cfg = config(overlap);
    let kids: Vec<_> = (0..3).map(|_| serve(e, &cfg, &[])).collect();
    std::thread::sleep(Duration::from_secs(secs));
    stop(kids);
    std::thread::sleep(Duration::from_millis(300));
    runs(e)
}

/// No two runs at once: each starts only after the one before ended
/// (every run wrote its end).
fn assert_no_overlap(runs: &[Run]) {
    for w in runs.windows(2) {
        let Some(end) = w[0].end else {
            panic!("slot {} started but never ended: {runs:#?}", w[0].slot)
        };
        assert!(
            w[1].start >= end,
            "slot {} started {} ms before slot {} ended: {runs:#?}",
            w[1].slot,
            (end - w[1].start) / 1_000_000,
            w[0].slot
        );
        assert!(w[1].slot > w[0].slot, "runs out of slot order: {runs:#?}");
    }
}

/// The job's cancelled tasks' reasons.
fn cancelled_reasons(e: &Env) -> Vec<String> {
    let out = e.run(&[
        "tasks",
        "list",
        "--job",
        "slow",
        "--state",
        "cancelled",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|t| t["last_error"].as_str().unwrap_or("").to_string())
        .collect()
}

async fn buffer_one_runs_back_to_back_without_overlap(e: Env) {
    let runs = three_serves(&e, "buffer_one", 18);
    assert!(runs.len() >= 5, "too few runs: {runs:#?}");
    assert_no_overlap(&runs);
    // Nothing is stopped but the last run, by the shutdown.
    let stopped = runs.iter().filter(|r| r.stopped).count();
    assert!(stopped <= 1, "buffered runs were stopped: {runs:#?}");
    for w in runs.windows(2) {
        // Back to back: the waiting slot starts as the previous ends.
        let idle_ms = (w[1].start - w[0].end.unwrap_or(i64::MAX)) / 1_000_000;
        assert!(
            idle_ms < 1_000,
            "{idle_ms} ms idle before slot {}: {runs:#?}",
            w[1].slot
        );
        // Every other slot (or every third, when the wait crosses a slot).
        let gap = (w[1].slot - w[0].slot).num_seconds();
        assert!(
            (1..=3).contains(&gap),
            "slots {} → {}: {runs:#?}",
            w[0].slot,
            w[1].slot
        );
    }
    // The slots not run say why.
    let reasons = cancelled_reasons(&e);
    assert!(
        reasons.iter().filter(|r| r.contains("buffer_one")).count() >= 3,
        "{reasons:?}"
    );
    let out = e.run(&["jobs", "--config", "baton.toml"]);
    assert!(stdout(&out).contains("buffer_one"), "{}", stdout(&out));
}

async fn cancel_other_never_runs_two_at_once(e: Env) {
    let runs = three_serves(&e, "cancel_other", 14);
    assert!(runs.len() >= 4, "too few runs: {runs:#?}");
    assert_no_overlap(&runs);
    // Runs are stopped by the next slot (most before their 2.5 s are up).
    let stopped = runs.iter().filter(|r| r.stopped).count();
    assert!(stopped * 2 >= runs.len(), "runs not stopped: {runs:#?}");
    // Each stopped run is recorded cancelled.
    let reasons = cancelled_reasons(&e);
    assert!(reasons.len() + 1 >= runs.len(), "{reasons:?} {runs:#?}");
}

async fn terminate_other_kills_the_previous_run_at_once(e: Env) {
    let runs = three_serves(&e, "terminate_other", 12);
    assert!(runs.len() >= 4, "too few runs: {runs:#?}");
    // Killed at once: no replaced run lived the 0.8 s its trap needs to
    // write "stop" (the last one may, stopped by the shutdown's grace).
    let (last, replaced) = runs.split_last().unwrap();
    assert!(
        replaced.iter().all(|r| r.end.is_none()),
        "a replaced run was stopped gracefully: {runs:#?}"
    );
    assert!(last.end.is_none() || last.stopped, "{runs:#?}");
    // Never two at once, by the store's records: each run started after
    // the one before had finished.
    let out = e.run(&["tasks", "list", "--job", "slow", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let mut ran: Vec<(String, String)> = v
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| {
            let start = t["started_at"].as_str()?.to_string();
            Some((start, t["finished_at"].as_str().unwrap_or("~").to_string()))
        })
        .collect();
    ran.sort();
    assert!(ran.len() >= 4, "{ran:?}");
    for w in ran.windows(2) {
        assert!(
            w[1].0 >= w[0].1,
            "a run started before the previous finished: {ran:?}"
        );
    }
}
