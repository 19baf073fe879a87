//! `baton work` and `baton lock` when the store goes dark, and `baton work`
//! on a second SIGTERM, as a user runs them: real processes, a fault proxy
//! between baton and its store (PostgreSQL, Redis, MySQL), commands that
//! write timestamps.

use crate::common;

use std::process::Child;
use std::time::{Duration, Instant};

use common::holder::{self, holder_stops_in_time, lock_holder, task_holder, Fault, WORK_OPTS};
use common::proxy::{host_port, Mode, Proxy};
use common::{
    dead, epoch_now, exit_within, have_bash, ledger_edges, read, signal, sigterm_within, stamps,
    stderr, stdout, wait_for, Env, Kind,
};

per_backend! {
    second_sigterm_hands_the_task_back_now,
}

/// Tests behind the fault proxy (the stores reached over the network).
macro_rules! behind_proxy {
    ($($name:ident),* $(,)?) => {
        $(mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                if let Some(e) = crate::common::Env::new(super::Kind::Postgres).await {
                    super::$name(e).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis() {
                if let Some(e) = crate::common::Env::new(super::Kind::Redis).await {
                    super::$name(e).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mysql() {
                if let Some(e) = crate::common::Env::new(super::Kind::Mysql).await {
                    super::$name(e).await
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

const APPEND: &str =
    r#"while :; do echo "$EPOCHREALTIME" >> "ledger-$BATON_ATTEMPT"; sleep 0.05; done"#;

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

    let (last1, first2) = ledger_edges(&e);
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
    assert_eq!(sigterm_within(&mut w2, 15, "the healthy worker"), Some(143));
}

/// "Work never outlives its lease" for the whole process tree, under a
/// store that stalls rather than refuses: `baton work` reaches its store
/// through a fault proxy that goes dark (connections stay open, nothing is
/// answered) while the task's command and its grandchild run (see
/// [`holder_stops_in_time`] with [`Fault::Dark`]); a second worker runs attempt 2.
async fn dark_store_stops_the_whole_tree_before_the_lease(e: Env) {
    if !have_bash() {
        return;
    }
    let id = holder::enqueue_tree(&e);
    let proxy = Proxy::start(&host_port(&e.ts.url));
    let (mut first, mut second) = holder_stops_in_time(
        &e,
        Fault::Dark(&proxy),
        holder::work(&e),
        task_holder(&e, id),
    )
    .await;
    sigterm_exits_while_stalled(&mut first, "baton work with its store stalled");
    drop(proxy);
    sigterm_within(&mut second, 15, "baton work after SIGTERM");
}

/// The same promise for `baton lock NAME -- CMD`: the dark holder exits on
/// its own, non-zero.
async fn dark_store_stops_a_locked_commands_tree_before_the_lapse(e: Env) {
    if !have_bash() {
        return;
    }
    let name = "stall-lock";
    let proxy = Proxy::start(&host_port(&e.ts.url));
    let (mut first, mut second) = holder_stops_in_time(
        &e,
        Fault::Dark(&proxy),
        holder::lock(&e, name),
        lock_holder(&e, name),
    )
    .await;
    let code = exit_within(&mut first, 15, "baton lock on a dark store");
    assert_ne!(
        code,
        Some(0),
        "a holder that lost its lease does not exit 0"
    );
    sigterm_within(&mut second, 15, "the second baton lock after SIGTERM");
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
    let proxy = Proxy::start(&host_port(&e.ts.url));
    let (mut first, mut second) = holder_stops_in_time(
        &e,
        Fault::Dark(&proxy),
        holder::serve(&e, name, "2s"),
        lock_holder(&e, name),
    )
    .await;
    // The stalled instance (its run stopped at the lapse, its outcome not
    // written) and the healthy one, which stops its run (the
    // SIGTERM-ignoring tree), both exit on SIGTERM.
    sigterm_exits_while_stalled(&mut first, "baton serve with its store stalled");
    drop(proxy);
    sigterm_within(&mut second, 15, "baton serve after SIGTERM");
}

/// A SIGTERM to a daemon whose store has stalled (the proxy still dark):
/// it exits within [`STALLED_EXIT_S`], not after retrying writes that get
/// no answer.
fn sigterm_exits_while_stalled(child: &mut Child, what: &str) {
    let t0 = Instant::now();
    sigterm_within(child, STALLED_EXIT_S, what);
    eprintln!("{what}: exited {:?} after SIGTERM", t0.elapsed());
}

/// See [`sigterm_exits_while_stalled`]: the daemons' shutdown grace (2 s at
/// most in these tests) and a few seconds for what it abandons.
const STALLED_EXIT_S: u64 = 8;

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
