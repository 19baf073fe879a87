//! The workload: the instances kept running (restarted after a kill)
//! and stopped at the end, the lock contenders, and the producer of
//! command tasks.

use super::*;

/// Keep every instance running (restart one the nemesis killed) until
/// `drained`; then SIGTERM them all and wait (SIGKILL after 20 s). Once
/// `quiesce` is cancelled the schedulers (`s…`) are stopped the same way
/// and not restarted, and `schedulers_gone` is sent when they have exited.
pub(super) async fn supervise(
    run: Arc<Run>,
    instances: Vec<Instance>,
    quiesce: CancellationToken,
    schedulers_gone: tokio::sync::oneshot::Sender<()>,
    drained: CancellationToken,
) {
    let mut kids: Vec<(String, u32, Option<tokio::process::Child>)> = instances
        .iter()
        .map(|(l, _, _)| (l.clone(), 0, None))
        .collect();
    let mut schedulers_gone = Some(schedulers_gone);
    loop {
        if quiesce.is_cancelled() && schedulers_gone.is_some() {
            let mut schedulers: Vec<_> = kids
                .iter_mut()
                .filter(|(label, _, _)| label.starts_with('s'))
                .collect();
            stop_all(&run, &mut schedulers).await;
            for (_, _, child) in schedulers {
                *child = None;
            }
            if let Some(tx) = schedulers_gone.take() {
                let _ = tx.send(());
            }
        }
        for (n, (label, gen, child)) in kids.iter_mut().enumerate() {
            if quiesce.is_cancelled() && label.starts_with('s') {
                continue;
            }
            let dead = match child {
                None => true,
                Some(c) => !matches!(c.try_wait(), Ok(None)),
            };
            if dead {
                if child.is_some() {
                    run.lock_live().remove(&format!("{label}.{gen}"));
                    *gen += 1;
                }
                let (_, args, env) = &instances[n];
                match run.spawn(&format!("{label}.{gen}"), args, false, env) {
                    Ok(c) => *child = Some(c),
                    Err(e) => tracing::warn!("chaos: {e:#}"),
                }
            }
        }
        tokio::select! {
            _ = drained.cancelled() => break,
            _ = tokio::time::sleep(Duration::from_millis(300)) => {}
        }
    }
    let mut all: Vec<_> = kids.iter_mut().collect();
    stop_all(&run, &mut all).await;
}

/// SIGTERM these instances (thawed first) and wait; SIGKILL after 20 s.
pub(super) async fn stop_all(
    run: &Run,
    kids: &mut [&mut (String, u32, Option<tokio::process::Child>)],
) {
    for (label, gen, child) in kids.iter_mut().map(|k| &mut **k) {
        run.lock_live().remove(&format!("{label}.{gen}"));
        if let Some(pid) = child.as_ref().and_then(|c| c.id()) {
            signal_tree(pid, libc::SIGCONT);
            // SAFETY: kill(2) on a child we spawned and have not reaped.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
    }
    for (_, _, child) in kids.iter_mut().map(|k| &mut **k) {
        if let Some(c) = child {
            if tokio::time::timeout(Duration::from_secs(20), c.wait())
                .await
                .is_err()
            {
                let _ = c.kill().await;
            }
        }
    }
}

/// Contend for the lock: `baton lock chaos-lock -- sh -c '…'` in a loop
/// (with `--unsafe`, the command without the lock, and a made-up token).
pub(super) async fn lock_loop(run: Arc<Run>, i: u64, seed: u64, stop: CancellationToken) {
    let mut rng = Rng(seed);
    let mut n = 0;
    while !stop.is_cancelled() {
        n += 1;
        let label = format!("l{i}.{n}");
        // Mostly short holds; some longer than a keep-alive period, so a
        // holder frozen alone (`freeze`) may have its command outlive the
        // lease unless its supervisor kills it.
        let hold = if rng.range(0, 4) == 0 {
            rng.range(3000, 5000)
        } else {
            rng.range(200, 600)
        };
        let wrapper = run.wrapper("lock", LOCK, hold);
        let child = if run.unsafe_ {
            let argv = ["sh".to_string(), "-c".to_string(), wrapper];
            let token = rng.range(1, 1000).to_string();
            run.spawn(&label, &argv, true, &[("BATON_FENCING_TOKEN", token)])
        } else {
            let argv: Vec<String> = [
                "lock",
                LOCK,
                "--at-most",
                "3s",
                "--grace",
                "1s",
                "--wait",
                "5s",
                "--",
                "sh",
                "-c",
                &wrapper,
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            run.spawn(&label, &argv, false, &[])
        };
        match child {
            Ok(mut c) => {
                tokio::select! {
                    _ = c.wait() => {}
                    // A stuck holder (frozen, store dark) is waited for
                    // only so long after the run; then it is killed.
                    _ = async { stop.cancelled().await; tokio::time::sleep(Duration::from_secs(15)).await } => {
                        if let Some(pid) = c.id() { signal_tree(pid, libc::SIGCONT); }
                        let _ = c.kill().await;
                    }
                }
            }
            Err(e) => tracing::warn!("chaos: {e:#}"),
        }
        run.lock_live().remove(&label);
        tokio::time::sleep(Duration::from_millis(rng.range(20, 200))).await;
    }
}

/// Enqueue unique-keyed command tasks, re-sending some keys (T4); with
/// `keys` > 0 each has one of that many concurrency keys (T5).
pub(super) async fn produce(
    run: Arc<Run>,
    store: baton::Store,
    keys: u32,
    seed: u64,
    stop: CancellationToken,
) {
    let mut rng = Rng(seed);
    let q = Queue::new(store);
    let mut n = 0u64;
    while !stop.is_cancelled() {
        let key = if n > 0 && rng.range(0, 3) == 0 {
            format!("chaos-k{}", rng.range(1, n + 1))
        } else {
            n += 1;
            format!("chaos-k{n}")
        };
        // Mostly short tasks; some longer than a heartbeat interval.
        let hold = if rng.range(0, 4) == 0 {
            rng.range(1500, 4000)
        } else {
            rng.range(100, 800)
        };
        let argv = serde_json::json!({ "argv": ["sh", "-c", run.wrapper("task", &key, hold)] });
        // Kind "command": a task `baton work` runs as a command.
        let mut t = TaskBuilder::new("command", argv)
            .queue(QUEUE)
            .max_attempts(5);
        if !run.unsafe_ {
            t = t.unique_key(&key).unique_forever(true);
        }
        if keys > 0 {
            t = t.concurrency_key(format!("chaos-c{}", rng.range(1, u64::from(keys) + 1)));
        }
        let t0 = now_us();
        let res = tokio::time::timeout(Duration::from_secs(10), q.enqueue(t)).await;
        let task = match res {
            Ok(Ok(e)) => Some(e.id),
            Ok(Err(e)) => {
                tracing::warn!("chaos: enqueue {key}: {e}");
                None
            }
            Err(_) => None,
        };
        run.record(Record {
            op: "enqueue".into(),
            proc: "producer".into(),
            name: key,
            task,
            t: t0,
            until: Some(now_us()),
            ..Default::default()
        });
        tokio::time::sleep(Duration::from_millis(rng.range(100, 300))).await;
    }
}
