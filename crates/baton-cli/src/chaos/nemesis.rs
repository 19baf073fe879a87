//! The nemesis: seeded faults (kill -9, pause, freeze, cut, dark,
//! latency, restart, skew) injected into the instances, their process
//! trees and the store's connection, always healed at the end.

use super::*;

/// Inject the enabled faults on a seeded schedule until `stop`; leave
/// everything healed.
pub(super) async fn nemesis(
    run: Arc<Run>,
    proxy: Option<Arc<proxy::Proxy>>,
    private: Arc<Mutex<Option<server::Private>>>,
    enabled: Vec<String>,
    seed: u64,
    stop: CancellationToken,
) {
    let mut rng = Rng(seed);
    if enabled.is_empty() {
        return;
    }
    // Sleep `ms`, or less if the run ends.
    let nap = |ms: u64| {
        let stop = stop.clone();
        async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
            }
        }
    };
    nap(1500).await;
    // Faults come in rounds: each round is every enabled kind once, in a
    // seeded random order, so a short run still meets each kind.
    let mut round: Vec<String> = Vec::new();
    while !stop.is_cancelled() {
        if round.is_empty() {
            round = enabled.clone();
            for i in (1..round.len()).rev() {
                let j = rng.range(0, i as u64 + 1) as usize;
                round.swap(i, j);
            }
        }
        let Some(kind) = round.pop() else { return };
        let t = now_us();
        let mut target = String::new();
        match kind.as_str() {
            "kill-9" | "pause" | "freeze" => {
                let mut live: Vec<(String, u32)> = run
                    .lock_live()
                    .iter()
                    .map(|(k, v)| (k.clone(), *v))
                    .collect();
                live.sort();
                if kind == "freeze" {
                    // Freeze one that is running a command (it has a
                    // supervisor child): the case the fault is for.
                    let busy: Vec<(String, u32)> = live
                        .iter()
                        .filter(|(_, pid)| signal_tree(*pid, 0).len() > 1)
                        .cloned()
                        .collect();
                    if !busy.is_empty() {
                        live = busy;
                    }
                }
                if live.is_empty() {
                    nap(500).await;
                    continue;
                }
                let (label, pid) = live[rng.range(0, live.len() as u64) as usize].clone();
                target = label;
                if kind == "kill-9" {
                    // SAFETY: kill(2) on a process this run started.
                    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                } else if kind == "freeze" {
                    // Freeze the baton process alone, past its lease: its
                    // commands run on, and only their supervisors' own
                    // deadlines can stop them before the lease lapses (a
                    // command outliving it would overlap the next holder,
                    // which the checker does not excuse).
                    // SAFETY: kill(2) on a process this run started.
                    unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
                    tokio::time::sleep(Duration::from_millis(rng.range(3500, 5000))).await;
                    // SAFETY: as above.
                    unsafe { libc::kill(pid as i32, libc::SIGCONT) };
                } else {
                    // Freeze the instance and its commands past the lease.
                    let pids = signal_tree(pid, libc::SIGSTOP);
                    tokio::time::sleep(Duration::from_millis(rng.range(3500, 5000))).await;
                    for p in pids {
                        // SAFETY: kill(2) on processes we froze.
                        unsafe { libc::kill(p, libc::SIGCONT) };
                    }
                }
            }
            "cut" | "dark" | "latency" => {
                let Some(p) = &proxy else { continue };
                match kind.as_str() {
                    "cut" => p.set(proxy::Mode::Cut),
                    "dark" => p.set(proxy::Mode::Dark),
                    _ => p.latency(Duration::from_millis(rng.range(20, 200))),
                }
                let ms = if kind == "dark" {
                    rng.range(3000, 5000)
                } else {
                    rng.range(1000, 3000)
                };
                tokio::time::sleep(Duration::from_millis(ms)).await;
                p.set(proxy::Mode::Pass);
                p.latency(Duration::ZERO);
            }
            "restart" => {
                let ps = private.clone();
                let down = rng.range(500, 2000);
                let res = tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
                    let mut g = ps.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(p) = g.as_mut() {
                        p.stop();
                        std::thread::sleep(Duration::from_millis(down));
                        p.start()?;
                    }
                    Ok(())
                })
                .await;
                if let Ok(Err(e)) | Err(e) = res.map_err(anyhow::Error::from) {
                    tracing::warn!("chaos: restart: {e:#}");
                }
            }
            "failover" => {
                let ps = private.clone();
                let crash = rng.range(0, 2) == 1;
                let down = Duration::from_millis(rng.range(500, 2000));
                let res = tokio::task::spawn_blocking(move || -> anyhow::Result<u16> {
                    let mut g = ps.lock().unwrap_or_else(|p| p.into_inner());
                    match g.as_mut() {
                        Some(p) => p.failover(crash, down),
                        None => Ok(0),
                    }
                })
                .await;
                match res.map_err(anyhow::Error::from) {
                    Ok(Ok(old)) => {
                        target = format!(
                            "{} master :{old}",
                            if crash { "crashed" } else { "switched over" }
                        );
                    }
                    Ok(Err(e)) | Err(e) => tracing::warn!("chaos: failover: {e:#}"),
                }
            }
            _ => {}
        }
        run.record(Record {
            op: "fault".into(),
            kind,
            proc: target,
            t,
            until: Some(now_us()),
            ..Default::default()
        });
        nap(rng.range(800, 2500)).await;
    }
}

/// Send `sig` to `pid` and every descendant (parents first; 0 sends
/// nothing, to list them); returns them.
pub(super) fn signal_tree(pid: u32, sig: i32) -> Vec<i32> {
    let mut parent: Vec<(i32, i32)> = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // The fields after the command name (which may hold spaces).
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        if let Some(pp) = rest.split_whitespace().nth(1).and_then(|s| s.parse().ok()) {
            parent.push((p, pp));
        }
    }
    let mut tree = vec![pid as i32];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(parent.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    for &p in &tree {
        // SAFETY: kill(2) on a process of this run's tree.
        unsafe { libc::kill(p, sig) };
    }
    tree
}
