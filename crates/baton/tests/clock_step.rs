//! A host clock step on SQLite (DESIGN.md C1): SQLite's store clock is the
//! host's wall clock, so a forward step (an NTP correction after a VM
//! resume) makes a live claim's lease look lapsed. A process that ran
//! across the step sees it (wall against monotonic time) and its rescue
//! allows for it: the live claim is not taken, and a dead one still is,
//! within its lease plus the step.
//!
//! The step is made with libfaketime (the `faketime` package): the test
//! runs itself again with the library preloaded, its offset read from a
//! file the test rewrites (monotonic time left alone), so the store's
//! clock (SQLite's `unixepoch()`) and the process's wall clock step
//! together, as on a real host. Without libfaketime it prints `SKIPPED`.

use std::time::Duration;

use baton::queue::TaskBuilder;
use baton::store::{TaskClaim, TaskHeartbeatMany};
use baton::Store;

const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";
/// Set in the child run: the path of the offset file.
const CHILD: &str = "BATON_CLOCK_STEP_FILE";
const LEASE: Duration = Duration::from_millis(1500);
const STEP_S: u64 = 4;

#[test]
fn a_stepped_host_does_not_rescue_a_live_claim() {
    if let Some(file) = std::env::var_os(CHILD) {
        return child(std::path::PathBuf::from(file));
    }
    if !std::path::Path::new(LIBFAKETIME).exists() {
        assert!(
            std::env::var_os("BATON_REQUIRE_BACKENDS").is_none(),
            "{LIBFAKETIME} not found (apt-get install faketime)"
        );
        eprintln!("SKIPPED clock_step: {LIBFAKETIME} not found (apt-get install faketime)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("offset");
    std::fs::write(&file, "+0\n").unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "a_stepped_host_does_not_rescue_a_live_claim",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, &file)
        .env("LD_PRELOAD", LIBFAKETIME)
        .env("FAKETIME_TIMESTAMP_FILE", &file)
        .env("FAKETIME_NO_CACHE", "1")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .output()
        .unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the stepped run failed:\n{text}");
    assert!(
        text.contains("CHILD DONE"),
        "the child did not run:\n{text}"
    );
}

fn child(file: std::path::PathBuf) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("step.db").display());
        let store = Store::connect(&url).await.unwrap();
        let b = store.backend();
        let task = TaskBuilder::new("k", serde_json::json!({}))
            .queue("q")
            .build()
            .unwrap();
        b.task_insert_many(&[task]).await.unwrap();
        let claimed = b
            .task_claim(&TaskClaim {
                queue: "q",
                worker: "alive",
                limit: 1,
                lease: LEASE,
                max_running: None,
                per_key_max_running: None,
                buffered: 0,
                fair: false,
            })
            .await
            .unwrap();
        assert_eq!(claimed.len(), 1);
        let claim = claimed[0].claim();
        let lock = |holder: &'static str| baton::store::LockAcquire {
            name: "daemon",
            holder,
            at_most: LEASE,
        };
        assert!(matches!(
            b.lock_acquire(&lock("first")).await.unwrap(),
            baton::store::Acquire::Granted { .. }
        ));
        let before = store.now().await.unwrap();

        // The host's clock steps forward by more than the lease.
        std::fs::write(&file, format!("+{STEP_S}\n")).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let after = store.now().await.unwrap();
        assert!(
            after - before >= chrono::Duration::seconds(STEP_S as i64 - 1),
            "libfaketime did not step the store's clock: {before} -> {after}"
        );

        // The rescue right after the step leaves the live claim alone
        // (without the step guard it would take it: lease_until is long
        // past by the stepped clock).
        let r = b.task_rescue_many().await.unwrap();
        assert_eq!(r.requeued, 0, "a live claim was rescued after a clock step");
        // Nor is a lock's live lease taken over.
        assert!(
            matches!(
                b.lock_acquire(&lock("second")).await.unwrap(),
                baton::store::Acquire::Busy(_)
            ),
            "a live lock lease was granted again after a clock step"
        );
        // The worker heartbeats on time: its lease is in the new clock's
        // terms, and still not rescued.
        tokio::time::sleep(LEASE / 3).await;
        let hb = b
            .task_heartbeat_many(&TaskHeartbeatMany {
                claims: &[claim],
                lease: LEASE,
            })
            .await
            .unwrap();
        assert_eq!(hb, [baton::store::Heartbeat::Extended]);
        let r = b.task_rescue_many().await.unwrap();
        assert_eq!(r.requeued, 0);

        // Then the worker dies: the task is rescued within its lease plus
        // the step (the documented bound), not lost.
        let died = tokio::time::Instant::now();
        let bound = LEASE + Duration::from_secs(STEP_S) + Duration::from_millis(1500);
        loop {
            let r = b.task_rescue_many().await.unwrap();
            if r.requeued == 1 {
                let took = died.elapsed();
                assert!(
                    took >= LEASE,
                    "rescued {took:?} after the last heartbeat, before the lease ended"
                );
                break;
            }
            assert!(
                died.elapsed() < bound,
                "a dead claim was not rescued within lease + step"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        println!("CHILD DONE");
    });
}
