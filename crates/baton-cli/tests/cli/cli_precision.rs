//! Slots start on time: three `baton serve` on one store run an `every =
//! "1s"` durable job (overlap forbid, the default) for about 12 s. Each
//! slot's task is enqueued for its slot and announced with that due time, so
//! a worker starts it when the slot comes rather than at its next poll
//! (which used to make every slot 0.7-1.9 s late, and every few slots
//! "skipped" because the previous one was still pending).

use crate::common;

use std::collections::BTreeMap;
use std::process::Child;
use std::time::Duration;

use common::{read, signal, stderr, stdout, Env};

per_backend! {
    three_instances_start_each_slot_on_time,
}

const CONFIG: &str = r#"
[[queue]]
name = "default"
concurrency = 2

[[job]]
name = "tick"
every = "1s"
command = ["sh", "-c", "echo \"$BATON_SLOT $(date +%s.%N)\" >> ledger"]
"#;

/// Start − slot, p99 bound. Generous for this loaded machine (the tight
/// goal, p99 ≤ 50 ms, is checked by `baton-bench schedule-precision`); the
/// poll-driven lateness this guards against was 700-1900 ms.
const P99_BOUND: Duration = Duration::from_millis(300);

fn serve(e: &Env, i: usize) -> Child {
    let log = std::fs::File::create(e.path(&format!("serve-{i}.log"))).unwrap();
    e.cmd(&[
        "serve",
        "--config",
        "baton.toml",
        "--listen",
        "127.0.0.1:0",
        "--shutdown-grace",
        "1s",
    ])
    .env("BATON_LOG", "info")
    .stdout(std::process::Stdio::null())
    .stderr(log)
    .spawn()
    .unwrap()
}

async fn three_instances_start_each_slot_on_time(e: Env) {
    std::fs::write(e.path("baton.toml"), CONFIG).unwrap();
    let mut kids: Vec<Child> = (0..3).map(|i| serve(&e, i)).collect();
    std::thread::sleep(Duration::from_secs(13));
    for k in &kids {
        signal(k, libc::SIGTERM);
    }
    for k in &mut kids {
        let st = k.wait().unwrap();
        // 143: shut down by the SIGTERM.
        assert!(
            st.success() || st.code() == Some(143) || st.code().is_none(),
            "serve exits: {st:?}"
        );
    }
    // slot -> start times (store and host clocks are the same machine's).
    let mut runs: BTreeMap<chrono::DateTime<chrono::Utc>, Vec<f64>> = BTreeMap::new();
    for l in read(&e.path("ledger")).lines() {
        let (slot, at) = l.trim().split_once(' ').expect("slot and start");
        let slot: chrono::DateTime<chrono::Utc> = slot.parse().expect("BATON_SLOT is RFC 3339");
        runs.entry(slot)
            .or_default()
            .push(at.parse().expect("date +%s.%N"));
    }
    assert!(runs.len() >= 8, "only {} slots ran: {runs:?}", runs.len());
    let slots: Vec<_> = runs.keys().copied().collect();
    for w in slots.windows(2) {
        assert_eq!(
            (w[1] - w[0]).num_seconds(),
            1,
            "gap between {} and {}",
            w[0],
            w[1]
        );
    }
    let mut late: Vec<f64> = Vec::new();
    for (slot, at) in &runs {
        assert_eq!(at.len(), 1, "slot {slot} ran {} times", at.len());
        let slot_s = slot.timestamp_micros() as f64 / 1e6;
        late.push(at[0] - slot_s);
    }
    late.sort_by(f64::total_cmp);
    let p99 = late[((late.len() as f64 * 0.99).ceil() as usize).clamp(1, late.len()) - 1];
    let p50 = late[late.len().div_ceil(2) - 1];
    eprintln!(
        "slot -> start: p50 {:.1} ms, p99 {:.1} ms over {} slots",
        p50 * 1e3,
        p99 * 1e3,
        late.len()
    );
    assert!(
        late[0] > -0.005,
        "a slot started {:.1} ms before its time",
        -late[0] * 1e3
    );
    assert!(
        p99 < P99_BOUND.as_secs_f64(),
        "slot -> start p99 {:.1} ms (p50 {:.1} ms): {:?}",
        p99 * 1e3,
        p50 * 1e3,
        runs.iter()
            .map(|(s, at)| format!(
                "{} +{:.1} ms",
                s.format("%H:%M:%S"),
                (at[0] - s.timestamp_micros() as f64 / 1e6) * 1e3
            ))
            .collect::<Vec<_>>()
    );
    // No slot was recorded as skipped (overlap = skip finding the previous
    // slot's task still pending).
    let out = e.run(&[
        "tasks", "list", "--job", "tick", "--limit", "1000", "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let list: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let tasks = list.as_array().unwrap();
    assert!(tasks.len() >= runs.len());
    let skipped: Vec<_> = tasks
        .iter()
        .filter(|t| t["state"] == "cancelled")
        .map(|t| t["slot"].clone())
        .collect();
    assert!(skipped.is_empty(), "slots skipped: {skipped:?}");
}
