//! The "dark holder" scenario of `cli_stall` (the store goes dark through a
//! fault proxy) and `cli_freeze` (the baton process alone is SIGSTOPped):
//! a holder whose command is a tree with a SIGTERM-ignoring grandchild
//! loses its store or its own process; its supervisor must stop the whole
//! tree before the lease ends by the store's clock, and the second holder
//! that takes the lapsed lease over never runs beside it.

use std::process::Child;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::proxy::{Mode, Proxy};
use super::{dead, epoch_now, ledger_edges, read, signal, stamps, stderr, stdout, wait_for, Env};

/// A command whose work runs in a grandchild: bash (the child, pid in
/// `child-TAG.pid`) starts a second bash in the background (the
/// grandchild, pid in `gc-TAG.pid`, appending `$EPOCHREALTIME` to
/// `ledger-TAG` every 50 ms) and waits for it. The grandchild ignores
/// SIGTERM, as work that needs its time to stop would: only a SIGKILL
/// ends it. TAG is the first argument (`bash -c TREE _ TAG`), else the
/// task's attempt (`BATON_ATTEMPT`).
pub const TREE: &str = r#"tag=${1:-$BATON_ATTEMPT}; echo $$ > "child-$tag.pid"; bash -c 'trap "" TERM; echo $$ > "gc-$0.pid"; while :; do echo "$EPOCHREALTIME" >> "ledger-$0"; sleep 0.05; done' "$tag" & wait"#;

/// `baton work` in these scenarios: a 3 s lease, polled often.
pub const WORK_OPTS: [&str; 8] = [
    "--lease",
    "3s",
    "--poll",
    "200ms",
    "--shutdown-grace",
    "2s",
    "--grace",
    "500ms",
];

/// What befalls the first holder.
#[derive(Clone, Copy)]
pub enum Fault<'a> {
    /// It reaches its store through this proxy, which goes dark (stalls:
    /// connections stay open, nothing is refused or answered).
    Dark(&'a Proxy),
    /// Its baton process alone is SIGSTOPped (its supervisor and command
    /// run on).
    Freeze,
}

impl Fault<'_> {
    /// The first holder, as the failure messages name it.
    fn who(&self) -> &'static str {
        match self {
            Fault::Dark(_) => "the first holder",
            Fault::Freeze => "the frozen holder",
        }
    }

    /// The moment of the fault, as the failure messages name it.
    fn since(&self) -> &'static str {
        match self {
            Fault::Dark(_) => "its store went dark",
            Fault::Freeze => "the freeze",
        }
    }
}

/// The current holder's fencing token (a task's attempt) and lease end.
pub type Held = (u64, DateTime<Utc>);

/// One scenario. `start(store, tag)` starts a holder (through `store`, or
/// on the direct connection) whose command is [`TREE`] tagged `tag`, and
/// `holder()` reads the current holder's fencing token and lease end from
/// the store, directly. The first holder runs its command a while (its
/// lease extended by heartbeats or the keep-alive), then meets `fault`
/// and a second holder is started on a healthy connection. The first
/// command's child and grandchild must be gone before the first lease's
/// end by the store's clock (the latest end its extensions left); the
/// second holder takes over with a higher token, and its command writes
/// only after the first tree's last write (for [`Fault::Dark`], also
/// within the 3 s lease of the store going dark). Returns both holders,
/// still to be stopped (a frozen one still stopped; the proxy still dark).
pub async fn holder_stops_in_time(
    e: &Env,
    fault: Fault<'_>,
    start: impl Fn(Option<&str>, &str) -> Child,
    holder: impl AsyncFn() -> Option<Held>,
) -> (Child, Child) {
    let via_proxy = match fault {
        Fault::Dark(proxy) => Some(proxy.url(&e.ts.url)),
        Fault::Freeze => None,
    };
    let first = start(via_proxy.as_deref(), "1");
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
    // Heartbeats or the keep-alive move the lease on a few times; then
    // the fault.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(1500) {
        watch_lease().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let dark = match fault {
        Fault::Dark(proxy) => {
            proxy.set(Mode::Dark);
            Some(epoch_now())
        }
        Fault::Freeze => {
            signal(&first, libc::SIGSTOP);
            None
        }
    };
    let second = start(None, "2");
    let (who, since) = (fault.who(), fault.since());
    let t0 = Instant::now();
    while !(dead(&child) && dead(&gc)) {
        watch_lease().await;
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "{who}'s tree still runs 15 s after {since} (child dead: {}, grandchild dead: {})",
            dead(&child),
            dead(&gc)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let gone_at = e.ts.store.now().await.unwrap();
    let lease_end = lease_end.expect("the first holder's lease was seen");
    assert!(
        gone_at < lease_end,
        "{who}'s tree was still running {} ms after its lease ended by the store's clock",
        (gone_at - lease_end).num_milliseconds()
    );
    wait_for(30, "the second holder's command to write", || {
        !stamps(e, "ledger-2").is_empty()
    });
    let (last1, first2) = ledger_edges(e);
    assert!(
        last1 < first2,
        "{who}'s grandchild wrote {:.3} s after the second holder's first write: overlap",
        last1 - first2
    );
    if let Some(dark) = dark {
        assert!(
            last1 < dark + 3.0,
            "{who}'s grandchild wrote {:.3} s after the store went dark, past its 3 s lease",
            last1 - dark
        );
    }
    let (now, _) = holder().await.expect("the second holder");
    assert!(
        now > token.expect("the first token"),
        "the second holder's fencing token rises"
    );
    (first, second)
}

/// The current holder of lock `name`: its token and `lock_until`.
pub fn lock_holder<'a>(e: &'a Env, name: &'a str) -> impl AsyncFn() -> Option<Held> + 'a {
    async move || {
        let l = e.ts.store.backend().lock_get(name).await.unwrap()?;
        Some((l.token.0, l.lock_until))
    }
}

/// Task `id` while it runs: its attempt and `lease_until`.
pub fn task_holder(e: &Env, id: i64) -> impl AsyncFn() -> Option<Held> + '_ {
    async move || {
        let t = e.ts.store.backend().task_get(id).await.unwrap();
        let t = t.expect("the task");
        (t.state == baton::store::TaskState::Running).then(|| {
            (
                u64::from(t.attempt),
                t.lease_until.expect("a running task's lease"),
            )
        })
    }
}

/// `baton enqueue --max-attempts 5 -- bash -c TREE`: the task's id.
pub fn enqueue_tree(e: &Env) -> i64 {
    let out = e.run(&["enqueue", "--max-attempts", "5", "--", "bash", "-c", TREE]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    stdout(&out).trim().parse().expect("enqueue prints the id")
}

/// Starts `baton work [--store S] WORK_OPTS` (the task's attempt tags
/// its [`TREE`]).
pub fn work(e: &Env) -> impl Fn(Option<&str>, &str) -> Child + '_ {
    move |store, _| {
        let mut args = vec!["work"];
        if let Some(s) = store {
            args.extend_from_slice(&["--store", s]);
        }
        args.extend_from_slice(&WORK_OPTS);
        e.spawn_logged(&args)
    }
}

/// Starts `baton lock NAME --at-most 3s --grace 1s [--store S] -- bash -c
/// TREE _ TAG`; the second holder (tag 2) waits for the lock up to 30 s.
pub fn lock<'a>(e: &'a Env, name: &'a str) -> impl Fn(Option<&str>, &str) -> Child + 'a {
    move |store, tag| {
        let mut args = vec!["lock", name, "--at-most", "3s", "--grace", "1s"];
        if let Some(s) = store {
            args.extend_from_slice(&["--store", s]);
        }
        if tag == "2" {
            args.extend_from_slice(&["--wait", "30s"]);
        }
        args.extend_from_slice(&["--", "bash", "-c", TREE, "_", tag]);
        e.spawn_logged(&args)
    }
}

/// Starts `baton serve --config serve-TAG.toml --grace GRACE
/// --shutdown-grace 1s [--store S]` with one lock-mode job `name` (every
/// 1 s, at most 3 s) whose command is [`TREE`] tagged TAG.
pub fn serve<'a>(
    e: &'a Env,
    name: &'a str,
    grace: &'a str,
) -> impl Fn(Option<&str>, &str) -> Child + 'a {
    move |store, tag| {
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
            grace,
            "--shutdown-grace",
            "1s",
        ];
        if let Some(s) = store {
            args.extend_from_slice(&["--store", s]);
        }
        e.spawn_logged(&args)
    }
}

/// A TOML basic string holding `s`.
pub fn toml_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}
