//! The dead man's switch: a `baton lock` / `baton work` / `baton serve`
//! process frozen (SIGSTOP of that process alone, not its command) while
//! its command runs. Nothing in the frozen process can stop the command at
//! the lease's end, so its supervisor must: the whole tree (a
//! SIGTERM-ignoring grandchild included) is gone before the lease ends by
//! the store's clock, and the instance that takes the lapsed lease over
//! never runs beside it. On every store that answers.

mod common;

use std::process::Child;
use std::time::{Duration, Instant};

use common::{read, signal, stderr, stdout, wait_for, Env};

per_backend! {
    frozen_lock_holder_is_killed_before_its_lease_ends,
    frozen_worker_is_killed_before_its_lease_ends,
    frozen_lock_mode_job_is_killed_before_its_lease_ends,
}

/// A command whose work runs in a grandchild that ignores SIGTERM (as in
/// `cli_stall`): bash writes its pid to `child-TAG.pid`, starts a second
/// bash (pid in `gc-TAG.pid`) appending `$EPOCHREALTIME` to `ledger-TAG`
/// every 50 ms, and waits. TAG is the first argument, else the task's
/// attempt.
const TREE: &str = r#"tag=${1:-$BATON_ATTEMPT}; echo $$ > "child-$tag.pid"; bash -c 'trap "" TERM; echo $$ > "gc-$0.pid"; while :; do echo "$EPOCHREALTIME" >> "ledger-$0"; sleep 0.05; done' "$tag" & wait"#;

/// `baton work` here: a 3 s lease, polled often.
const WORK_OPTS: [&str; 8] = [
    "--lease",
    "3s",
    "--poll",
    "200ms",
    "--shutdown-grace",
    "2s",
    "--grace",
    "500ms",
];

fn have_bash() -> bool {
    common::have(
        "bash",
        std::process::Command::new("bash")
            .args(["-c", "[ -n \"$EPOCHREALTIME\" ]"])
            .status()
            .is_ok_and(|s| s.success()),
    )
}

/// Wall-clock seconds written by bash's `$EPOCHREALTIME`, one per line.
fn stamps(e: &Env, file: &str) -> Vec<f64> {
    read(&e.path(file))
        .lines()
        .filter_map(|l| l.trim().replace(',', ".").parse().ok())
        .collect()
}

/// Whether a process is gone (or a zombie nobody has reaped yet).
fn dead(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// Wait up to `secs` for the child to exit; its exit code (None: a signal).
fn exit_within(child: &mut Child, secs: u64, what: &str) -> Option<i32> {
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st.code();
        }
        if t0.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            panic!("{what}: still running after {secs} s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A TOML basic string holding `s`.
fn toml_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// The current holder of lock `name`: its token and `lock_until`.
fn lock_holder<'a>(
    e: &'a Env,
    name: &'a str,
) -> impl AsyncFn() -> Option<(u64, chrono::DateTime<chrono::Utc>)> + 'a {
    async move || {
        let l = e.ts.store.backend().lock_get(name).await.unwrap()?;
        Some((l.token.0, l.lock_until))
    }
}

/// One freeze scenario. `start(tag)` starts a holder whose command is
/// [`TREE`] tagged `tag`; `holder()` reads the current holder's fencing
/// token (a task's attempt) and lease end from the store. The first holder
/// runs its command a while (its lease extended), then is SIGSTOPped alone
/// and a second one is started. The first command's child and grandchild
/// must be gone before the first lease's end by the store's clock (the
/// latest end its extensions left), the second holder takes over with a
/// higher token, and its command writes only after the first tree's last
/// write. Returns both holders (the first still stopped).
async fn frozen_holder_is_killed_in_time(
    e: &Env,
    start: impl Fn(&str) -> Child,
    holder: impl AsyncFn() -> Option<(u64, chrono::DateTime<chrono::Utc>)>,
) -> (Child, Child) {
    let first = start("1");
    wait_for(20, "the first holder's grandchild to write", || {
        !stamps(e, "ledger-1").is_empty()
    });
    let pid = |f: &str| read(&e.path(f)).trim().to_string();
    let (child, gc) = (pid("child-1.pid"), pid("gc-1.pid"));
    assert!(
        !child.is_empty() && !gc.is_empty() && !dead(&child) && !dead(&gc),
        "the first holder's child ({child:?}) and grandchild ({gc:?}) run"
    );
    let mut lease_end = None;
    let mut token = None;
    let mut watch_lease = async || {
        if let Some((t, until)) = holder().await {
            if token.is_none_or(|first| first == t) {
                token = Some(t);
                lease_end = lease_end.max(Some(until));
            }
        }
    };
    // Extensions or heartbeats move the lease on a few times; then freeze
    // the baton process alone (its supervisor and command run on).
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(1500) {
        watch_lease().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    signal(&first, libc::SIGSTOP);
    let second = start("2");
    let t0 = Instant::now();
    while !(dead(&child) && dead(&gc)) {
        watch_lease().await;
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "the frozen holder's tree still runs 15 s after the freeze (child dead: {}, grandchild dead: {})",
            dead(&child),
            dead(&gc)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let gone_at = e.ts.store.now().await.unwrap();
    let lease_end = lease_end.expect("the first holder's lease was seen");
    assert!(
        gone_at < lease_end,
        "the frozen holder's tree was still running {} ms after its lease ended by the store's clock",
        (gone_at - lease_end).num_milliseconds()
    );
    wait_for(30, "the second holder's command to write", || {
        !stamps(e, "ledger-2").is_empty()
    });
    let last1 = stamps(e, "ledger-1").into_iter().fold(0.0, f64::max);
    let first2 = stamps(e, "ledger-2")
        .into_iter()
        .fold(f64::INFINITY, f64::min);
    assert!(
        last1 < first2,
        "the frozen holder's grandchild wrote {:.3} s after the second holder's first write: overlap",
        last1 - first2
    );
    let (now, _) = holder().await.expect("the second holder");
    assert!(
        now > token.expect("the first token"),
        "the second holder's fencing token rises"
    );
    (first, second)
}

async fn frozen_lock_holder_is_killed_before_its_lease_ends(e: Env) {
    if !have_bash() {
        return;
    }
    let name = "freeze-lock";
    let (mut first, mut second) = frozen_holder_is_killed_in_time(
        &e,
        |tag| {
            let mut args = vec!["lock", name, "--at-most", "3s", "--grace", "1s"];
            if tag == "2" {
                args.extend_from_slice(&["--wait", "30s"]);
            }
            args.extend_from_slice(&["--", "bash", "-c", TREE, "_", tag]);
            e.spawn_logged(&args)
        },
        lock_holder(&e, name),
    )
    .await;
    // Thawed, the first holder finds its command killed and its lease
    // gone: it exits non-zero.
    signal(&first, libc::SIGCONT);
    let code = exit_within(&mut first, 15, "the thawed baton lock");
    assert_ne!(code, Some(0), "a holder whose lease lapsed does not exit 0");
    signal(&second, libc::SIGTERM);
    exit_within(&mut second, 15, "the second baton lock after SIGTERM");
}

async fn frozen_worker_is_killed_before_its_lease_ends(e: Env) {
    if !have_bash() {
        return;
    }
    let out = e.run(&["enqueue", "--max-attempts", "5", "--", "bash", "-c", TREE]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let id: i64 = stdout(&out).trim().parse().expect("enqueue prints the id");
    let backend = e.ts.store.backend();
    let holder = async || {
        let t = backend.task_get(id).await.unwrap().expect("the task");
        (t.state == baton::store::TaskState::Running).then(|| {
            (
                u64::from(t.attempt),
                t.lease_until.expect("a running task's lease"),
            )
        })
    };
    let work: Vec<&str> = std::iter::once("work").chain(WORK_OPTS).collect();
    let (mut first, mut second) =
        frozen_holder_is_killed_in_time(&e, |_| e.spawn_logged(&work), holder).await;
    signal(&first, libc::SIGCONT);
    signal(&first, libc::SIGTERM);
    exit_within(&mut first, 15, "the thawed baton work after SIGTERM");
    signal(&second, libc::SIGTERM);
    exit_within(&mut second, 15, "the second baton work after SIGTERM");
}

async fn frozen_lock_mode_job_is_killed_before_its_lease_ends(e: Env) {
    if !have_bash() {
        return;
    }
    let name = "freeze-job";
    let (mut first, mut second) = frozen_holder_is_killed_in_time(
        &e,
        |tag| {
            let cfg = format!(
                "[[job]]\nname = \"{name}\"\nevery = \"1s\"\nmode = \"lock\"\nat_most = \"3s\"\n\
                 command = [\"bash\", \"-c\", {}, \"_\", \"{tag}\"]\n",
                toml_str(TREE)
            );
            let file = format!("serve-{tag}.toml");
            std::fs::write(e.path(&file), cfg).unwrap();
            e.spawn_logged(&[
                "serve",
                "--config",
                &file,
                "--grace",
                "1s",
                "--shutdown-grace",
                "1s",
            ])
        },
        lock_holder(&e, name),
    )
    .await;
    signal(&first, libc::SIGCONT);
    signal(&first, libc::SIGTERM);
    exit_within(&mut first, 15, "the thawed baton serve after SIGTERM");
    signal(&second, libc::SIGTERM);
    exit_within(&mut second, 15, "the second baton serve after SIGTERM");
}
