//! `baton work` and `baton lock` when the store goes dark, and `baton work`
//! on a second SIGTERM, as a user runs them: real processes, a fault proxy
//! between baton and its store (PostgreSQL, Redis, MySQL), commands that
//! write timestamps.

mod common;
#[path = "../src/chaos/proxy.rs"]
mod proxy;

use std::process::Child;
use std::time::{Duration, Instant};

use common::{read, signal, stderr, stdout, wait_for, Env, Kind};
use proxy::{host_port, Mode, Proxy};

per_backend! {
    second_sigterm_hands_the_task_back_now,
}

/// Tests behind the fault proxy (the stores reached over the network).
macro_rules! behind_proxy {
    ($($name:ident),* $(,)?) => {
        $(mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                if let Some(e) = crate::common::Env::new(crate::Kind::Postgres).await {
                    crate::$name(e).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis() {
                if let Some(e) = crate::common::Env::new(crate::Kind::Redis).await {
                    crate::$name(e).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mysql() {
                if let Some(e) = crate::common::Env::new(crate::Kind::Mysql).await {
                    crate::$name(e).await
                }
            }
        })*
    };
}

behind_proxy! {
    dark_store_never_overlaps,
    dark_store_stops_the_whole_tree_before_the_lease,
    dark_store_stops_a_locked_commands_tree_before_the_lapse,
    dark_store_stops_a_lock_mode_jobs_tree_before_the_lapse,
}

fn enqueue(e: &Env, extra: &[&str], cmd: &[&str]) -> i64 {
    let mut args = vec!["enqueue"];
    args.extend_from_slice(extra);
    args.push("--");
    args.extend_from_slice(cmd);
    let out = e.run(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    stdout(&out).trim().parse().expect("enqueue prints the id")
}

fn show(e: &Env, id: i64) -> serde_json::Value {
    let out = e.run(&["tasks", "show", &id.to_string(), "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    serde_json::from_str(&stdout(&out)).unwrap()
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

/// Wall-clock seconds written by bash's `$EPOCHREALTIME`, one per line.
fn stamps(e: &Env, file: &str) -> Vec<f64> {
    read(&e.path(file))
        .lines()
        .filter_map(|l| l.trim().replace(',', ".").parse().ok())
        .collect()
}

fn epoch_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn have_bash() -> bool {
    common::have(
        "bash",
        std::process::Command::new("bash")
            .args(["-c", "[ -n \"$EPOCHREALTIME\" ]"])
            .status()
            .is_ok_and(|s| s.success()),
    )
}

const APPEND: &str =
    r#"while :; do echo "$EPOCHREALTIME" >> "ledger-$BATON_ATTEMPT"; sleep 0.05; done"#;

/// `baton work` in the dark-store tests: a 3 s lease, polled often.
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

async fn dark_store_never_overlaps(e: Env) {
    if !have_bash() {
        return;
    }
    let proxy = Proxy::start(&host_port(&e.ts.url));
    let via_proxy = proxy.url(&e.ts.url);
    let id = enqueue(&e, &["--max-attempts", "5"], &["bash", "-c", APPEND]);
    let mut args = vec!["work", "--store", &via_proxy];
    args.extend_from_slice(&WORK_OPTS);
    let mut w1 = e.spawn_logged(&args);
    wait_for(20, "attempt 1 to start", || {
        !stamps(&e, "ledger-1").is_empty()
    });
    // Heartbeats through the proxy renew the lease a few times; then dark.
    std::thread::sleep(Duration::from_millis(1500));
    proxy.set(Mode::Dark);
    let dark = epoch_now();
    let mut args = vec!["work"];
    args.extend_from_slice(&WORK_OPTS);
    let mut w2 = e.spawn_logged(&args);
    wait_for(30, "attempt 2 to start on the healthy path", || {
        !stamps(&e, "ledger-2").is_empty()
    });

    // SIGTERM to the worker whose store is still dark: it exits in time.
    let t0 = Instant::now();
    signal(&w1, libc::SIGTERM);
    let code = exit_within(&mut w1, 15, "baton work on a dark store after SIGTERM");
    let took = t0.elapsed();

    let last1 = stamps(&e, "ledger-1").into_iter().fold(0.0, f64::max);
    let first2 = stamps(&e, "ledger-2")
        .into_iter()
        .fold(f64::INFINITY, f64::min);
    assert!(
        last1 < first2,
        "attempt 1 wrote {:.3} s after attempt 2's first write: overlap",
        last1 - first2
    );
    assert!(
        last1 < dark + 3.3,
        "attempt 1 wrote {:.3} s after the store went dark, past its 3 s lease",
        last1 - dark
    );
    assert!(took < Duration::from_secs(10), "exit took {took:?}");
    assert_eq!(code, Some(143), "exit 128 + SIGTERM");
    assert_eq!(show(&e, id)["attempt"], 2);
    signal(&w2, libc::SIGTERM);
    assert_eq!(exit_within(&mut w2, 15, "the healthy worker"), Some(143));
}

/// A command whose work runs in a grandchild: bash (the child, pid in
/// `child-TAG.pid`) starts a second bash in the background (the
/// grandchild, pid in `gc-TAG.pid`, appending `$EPOCHREALTIME` to
/// `ledger-TAG` every 50 ms) and waits for it. The grandchild ignores
/// SIGTERM, as work that needs its time to stop would: only a SIGKILL
/// ends it. TAG is the first argument (`bash -c TREE _ TAG`), else the
/// task's attempt (`BATON_ATTEMPT`).
const TREE: &str = r#"tag=${1:-$BATON_ATTEMPT}; echo $$ > "child-$tag.pid"; bash -c 'trap "" TERM; echo $$ > "gc-$0.pid"; while :; do echo "$EPOCHREALTIME" >> "ledger-$0"; sleep 0.05; done' "$tag" & wait"#;

/// "Work never outlives its lease" for the whole process tree, under a
/// store that stalls rather than refuses: `baton work` reaches its store
/// through a fault proxy that goes dark (connections stay open, nothing is
/// answered) while the task's command and its grandchild run (see
/// [`dark_holder_stops_in_time`]); a second worker runs attempt 2.
async fn dark_store_stops_the_whole_tree_before_the_lease(e: Env) {
    if !have_bash() {
        return;
    }
    let id = enqueue(&e, &["--max-attempts", "5"], &["bash", "-c", TREE]);
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
    let (mut first, mut second, proxy) = dark_holder_stops_in_time(
        &e,
        |store, _| {
            let mut args = vec!["work"];
            if let Some(s) = store {
                args.extend_from_slice(&["--store", s]);
            }
            args.extend_from_slice(&WORK_OPTS);
            e.spawn_logged(&args)
        },
        holder,
    )
    .await;
    sigterm_exits_while_stalled(&mut first, "baton work with its store stalled");
    drop(proxy);
    signal(&second, libc::SIGTERM);
    exit_within(&mut second, 15, "baton work after SIGTERM");
}

/// The same promise for `baton lock NAME -- CMD`: the dark holder exits on
/// its own, non-zero.
async fn dark_store_stops_a_locked_commands_tree_before_the_lapse(e: Env) {
    if !have_bash() {
        return;
    }
    let name = "stall-lock";
    let (mut first, mut second, _proxy) = dark_holder_stops_in_time(
        &e,
        |store, tag| {
            let mut args = vec!["lock", name, "--at-most", "3s", "--grace", "1s"];
            if let Some(s) = store {
                args.extend_from_slice(&["--store", s]);
            }
            if tag == "2" {
                args.extend_from_slice(&["--wait", "30s"]);
            }
            args.extend_from_slice(&["--", "bash", "-c", TREE, "_", tag]);
            e.spawn_logged(&args)
        },
        lock_holder(&e, name),
    )
    .await;
    let code = exit_within(&mut first, 15, "baton lock on a dark store");
    assert_ne!(
        code,
        Some(0),
        "a holder that lost its lease does not exit 0"
    );
    signal(&second, libc::SIGTERM);
    exit_within(&mut second, 15, "the second baton lock after SIGTERM");
}

/// And for a lock-mode job of `baton serve` (`mode = "lock"`): its run's
/// command is stopped before the job's lease could lapse, not from the
/// moment the lease is found lost (which, under a stalled store, is its
/// deadline: a SIGTERM-ignoring tree then ran `--grace` past the lease).
async fn dark_store_stops_a_lock_mode_jobs_tree_before_the_lapse(e: Env) {
    if !have_bash() {
        return;
    }
    let name = "stall-job";
    let (mut first, mut second, proxy) = dark_holder_stops_in_time(
        &e,
        |store, tag| {
            let cfg = format!(
                "[[job]]\nname = \"{name}\"\nevery = \"1s\"\nmode = \"lock\"\nat_most = \"3s\"\n\
                 command = [\"bash\", \"-c\", {}, \"_\", \"{tag}\"]\n",
                toml_str(TREE)
            );
            let file = format!("serve-{tag}.toml");
            std::fs::write(e.path(&file), cfg).unwrap();
            let mut args = vec![
                "serve",
                "--config",
                &file,
                "--grace",
                "2s",
                "--shutdown-grace",
                "1s",
            ];
            if let Some(s) = store {
                args.extend_from_slice(&["--store", s]);
            }
            e.spawn_logged(&args)
        },
        lock_holder(&e, name),
    )
    .await;
    // The stalled instance (its run stopped at the lapse, its outcome not
    // written) and the healthy one, which stops its run (the
    // SIGTERM-ignoring tree), both exit on SIGTERM.
    sigterm_exits_while_stalled(&mut first, "baton serve with its store stalled");
    drop(proxy);
    signal(&second, libc::SIGTERM);
    exit_within(&mut second, 15, "baton serve after SIGTERM");
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

/// A TOML basic string holding `s`.
fn toml_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// One dark-store scenario for a holder (a worker's attempt or a lock's
/// holder) whose command is [`TREE`]: `start(store, tag)` starts a holder
/// (through `store`, or on the direct connection) whose command is tagged
/// `tag`, and `holder()` reads the current holder's fencing token (for a
/// task, its attempt) and lease end from the store, directly. The first holder reaches its store through
/// a fault proxy that goes dark (stalls: nothing refused) while its
/// command's child and grandchild run. Both are gone before its lease ends
/// by the store's clock (the latest end its heartbeats or keep-alive left);
/// a second holder started on a healthy connection takes over after the
/// lapse, with a higher fencing token, and its command writes only after
/// the first tree's last write. Returns both holders, still to be stopped,
/// and the proxy, still dark.
async fn dark_holder_stops_in_time(
    e: &Env,
    start: impl Fn(Option<&str>, &str) -> Child,
    holder: impl AsyncFn() -> Option<(u64, chrono::DateTime<chrono::Utc>)>,
) -> (Child, Child, Proxy) {
    let proxy = Proxy::start(&host_port(&e.ts.url));
    let via_proxy = proxy.url(&e.ts.url);
    let first = start(Some(&via_proxy), "1");
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
    // Heartbeats or the keep-alive extend the lease through the proxy;
    // then dark.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(1500) {
        watch_lease().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    proxy.set(Mode::Dark);
    let dark = epoch_now();
    let second = start(None, "2");
    let t0 = Instant::now();
    while !(dead(&child) && dead(&gc)) {
        watch_lease().await;
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "the first holder's tree still runs 15 s after its store went dark (child dead: {}, grandchild dead: {})",
            dead(&child),
            dead(&gc)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let gone_at = e.ts.store.now().await.unwrap();
    let lease_end = lease_end.expect("the first holder's lease was seen");
    assert!(
        gone_at < lease_end,
        "the first holder's tree was still running {} ms after its lease ended by the store's clock",
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
        "the first holder's grandchild wrote {:.3} s after the second holder's first write: overlap",
        last1 - first2
    );
    assert!(
        last1 < dark + 3.0,
        "the first holder's grandchild wrote {:.3} s after the store went dark, past its 3 s lease",
        last1 - dark
    );
    let (now, _) = holder().await.expect("the second holder");
    assert!(
        now > token.expect("the first token"),
        "the second holder's fencing token rises"
    );
    (first, second, proxy)
}

/// A SIGTERM to a daemon whose store has stalled (the proxy still dark):
/// it exits within [`STALLED_EXIT_S`], not after retrying writes that get
/// no answer.
fn sigterm_exits_while_stalled(child: &mut Child, what: &str) {
    let t0 = Instant::now();
    signal(child, libc::SIGTERM);
    exit_within(child, STALLED_EXIT_S, what);
    eprintln!("{what}: exited {:?} after SIGTERM", t0.elapsed());
}

/// See [`sigterm_exits_while_stalled`]: the daemons' shutdown grace (2 s at
/// most in these tests) and a few seconds for what it abandons.
const STALLED_EXIT_S: u64 = 8;

/// Whether a process is gone (or a zombie nobody has reaped yet).
fn dead(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

async fn second_sigterm_hands_the_task_back_now(e: Env) {
    if !have_bash() {
        return;
    }
    // A command that ignores SIGTERM and would run for a long time.
    let script = r#"echo $$ > pid; trap 'echo TERM >> terms' TERM; while :; do sleep 0.1; done"#;
    let id = enqueue(&e, &["--max-attempts", "3"], &["bash", "-c", script]);
    let mut w = e.spawn_logged(&[
        "work",
        "--poll",
        "200ms",
        "--shutdown-grace",
        "60s",
        "--grace",
        "30s",
    ]);
    wait_for(20, "the task to start", || !read(&e.path("pid")).is_empty());
    let pid = read(&e.path("pid")).trim().to_string();
    signal(&w, libc::SIGTERM);
    // The first SIGTERM waits for the task (60 s grace); the second stops it now.
    std::thread::sleep(Duration::from_millis(1000));
    assert!(w.try_wait().unwrap().is_none(), "one SIGTERM is graceful");
    let t0 = Instant::now();
    signal(&w, libc::SIGTERM);
    let code = exit_within(&mut w, 15, "baton work after a second SIGTERM");
    assert_eq!(code, Some(143), "exit 128 + SIGTERM");
    assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());
    let t = show(&e, id);
    assert_eq!(t["state"], "pending", "handed back: {t}");
    assert_eq!(t["attempt"], 0, "the attempt is not counted: {t}");
    assert!(
        read(&e.path("terms")).contains("TERM"),
        "the command was asked to stop first"
    );
    wait_for(5, "the command to be stopped", || dead(&pid));
}
