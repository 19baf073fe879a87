//! The first seed, scaled down: a fixed-delay daemon loop that several
//! instances run, guarded by the lease lock `daemon-runner` with
//! `at_most = 15m` and `at_least = 30s` (ShedLock's lockAtMostFor /
//! lockAtLeastFor). Only one instance runs each cycle; the others skip.
//!
//! Time is scaled by `SCALE` (default 1/60: the 30-second delay becomes
//! 0.5 s, at_least 0.5 s, at_most 15 s) so it runs in seconds.
//!
//! ```text
//! cargo run -p baton --example daemon_lock                      # embedded SQLite
//! cargo run -p baton --example daemon_lock -- redis://127.0.0.1:6379
//! cargo run -p baton --example daemon_lock -- postgres://postgres@127.0.0.1:5432/test
//! ```

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton::lock::{LockOptions, Locker};
use baton::Store;

const INSTANCES: usize = 4;
const CYCLES: u32 = 6;
const SCALE: f64 = 1.0 / 60.0;

fn scaled(secs: f64) -> Duration {
    Duration::from_secs_f64(secs * SCALE)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "sqlite://daemon_lock.db".into());
    let opts = LockOptions::new(scaled(15.0 * 60.0)) // lockAtMostFor = PT15M
        .at_least(scaled(30.0)); // lockAtLeastFor = PT30S
    let fixed_delay = scaled(30.0); // @Scheduled(fixedDelay = 30s)
    let runs = Arc::new(AtomicU32::new(0));
    println!("{INSTANCES} instances on {url}; each cycle exactly one runs scanAllChannels");

    let mut pods = Vec::new();
    for pod in 0..INSTANCES {
        // Each "pod" has its own connection to the store, like a separate process.
        let locker = Locker::new(Store::connect(&url).await?);
        let runs = runs.clone();
        pods.push(tokio::spawn(async move {
            let mut ran = 0;
            for cycle in 0..CYCLES {
                let outcome = locker
                    .run("daemon-runner", &opts, |lease| async move {
                        println!(
                            "cycle {cycle}: pod {pod} runs scanAllChannels (token {})",
                            lease.token()
                        );
                        tokio::time::sleep(scaled(5.0)).await; // the scan itself
                    })
                    .await;
                match outcome {
                    Ok(Some(())) => {
                        ran += 1;
                        runs.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(None) => {} // another pod holds the lock: skip (no-op)
                    Err(e) => eprintln!("pod {pod}: {e}"),
                }
                tokio::time::sleep(fixed_delay).await;
            }
            ran
        }));
    }
    let mut per_pod = Vec::new();
    for p in pods {
        per_pod.push(p.await?);
    }
    println!(
        "runs per pod: {per_pod:?}; total {}",
        runs.load(Ordering::SeqCst)
    );
    Ok(())
}
