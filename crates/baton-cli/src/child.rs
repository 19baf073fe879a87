//! Running a user's command as a process tree: environment, signals to the
//! whole tree, stopping it with SIGTERM then SIGKILL after a grace, and
//! never leaving any of it behind.
//!
//! A command (a task, `baton lock`'s command, a job's action) is often a
//! wrapper — `sh -c '(work) ; :'`, a script that starts processes — so
//! signalling only the direct child, or `PR_SET_PDEATHSIG` on it, leaves
//! grandchildren running after the lease is lost or baton is killed. So
//! baton runs every command under a tiny **supervisor**: baton re-executes
//! itself (`/proc/self/exe`, which still works after the binary was
//! replaced on disk) as `baton __supervise FD GRACE_MS -- CMD…`, handled at
//! the very top of `main` before clap and tokio. The supervisor
//!
//! - leads a new process group (baton spawns it with `process_group(0)`),
//!   which the command and its descendants inherit: baton signals the
//!   *group* (`kill(-pgid, sig)`), and [`Proc`]'s drop guard SIGKILLs it;
//! - is a child subreaper (`PR_SET_CHILD_SUBREAPER`): orphaned descendants
//!   re-parent to it, so it reaps them and knows when the tree is empty;
//! - watches a pipe whose only write end is held by baton (`O_CLOEXEC`, so
//!   no other child inherits it): EOF means baton died, even by `kill -9`,
//!   and it then SIGTERMs the tree and SIGKILLs it after the grace;
//! - holds a **deadline** of its own (a dead man's switch): the lease's
//!   stop-by instant comes on its command line (`--stop-by NS`), read
//!   before the command starts, and baton writes each later one to the
//!   lifeline as the lease moves (see [`spawn`]); when that instant
//!   passes with no later one the supervisor SIGKILLs the whole tree
//!   (group and adopted orphans) by itself — so a frozen baton (SIGSTOP,
//!   starvation) never lets its command outlive the lease. A supervisor
//!   whose first deadline has already passed when it starts (baton was
//!   frozen between deciding to run the command and starting it) does not
//!   start the command at all; one started with no deadline waits for the
//!   command or EOF only;
//! - when the command exits, SIGTERMs what remains of the tree, SIGKILLs it
//!   after the grace, reaps it, and exits with the command's status (its
//!   code, or 128+signal) — so a command ends when it exits, whatever its
//!   children hold open; a command that cannot be executed exits 127 (not
//!   found) or 126 (not executable) with a message naming the program.
//!
//! Its handlers for SIGTERM/SIGINT/SIGHUP (it gets the group's signals too)
//! are real functions, reset to the default by `exec`; an ignored
//! disposition would have leaked into the command. Those signals are
//! blocked from the fork on, so one sent before the handlers exist waits.
//!
//! The deadline messages are 8 bytes, little-endian: an *absolute*
//! `CLOCK_MONOTONIC` instant in nanoseconds (system-wide, so baton's value
//! means the same to the supervisor); the latest one wins (it may move
//! earlier), 0 means "now". Absolute, not relative: a relative "N ms from
//! now" written by a baton that was frozen between computing and writing
//! it (or read late by a busy supervisor) would push the deadline past the
//! lease. baton converts its deadline reading the raw clock *before*
//! `Instant::now()`, so a pause between the two reads only moves the sent
//! instant earlier. Writes of 8 bytes to a pipe are atomic (≤ PIPE_BUF);
//! the write end is non-blocking, so a full pipe (a supervisor that does
//! not read) never blocks baton.
//!
//! This needs no privileges and works in containers. Known limit: a
//! descendant that leaves the group (`setsid`, `setpgid`) is missed by
//! group signals; the supervisor still kills it when it is its child or
//! becomes an orphan, but not if baton SIGKILLs the whole group first.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::process::{Child, ChildStderr, ChildStdout, Command};
use tokio::signal::unix::{signal, SignalKind};

/// The hidden subcommand that runs the supervisor.
pub const SUPERVISE: &str = "__supervise";

/// A hook run once the process group of a command that baton stopped
/// (SIGTERM/SIGKILL, or dropped while running) is seen gone.
pub type OnGone = Box<dyn FnOnce(libc::pid_t) + Send + 'static>;

/// What a command ran for: a task's attempt (id, attempt number) or a
/// lease's fencing token (a `baton lock` command, a lock-mode job's run).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RanFor {
    /// The task and attempt, for a task's command.
    pub task: Option<(i64, u32)>,
    /// The fencing token of the lease the command ran under.
    pub token: Option<i64>,
}

/// A process-wide hook told of every command baton stopped, once its
/// group is gone ([`Proc::report_stop`]), with what it ran for and its
/// group id.
pub type StopHook = fn(RanFor, libc::pid_t);

/// The one [`StopHook`] of this process, if any. Only `baton chaos`'s
/// instances set it (the verifier dates each death); in any other baton
/// process it stays empty and a stop reports to nothing.
static STOP_HOOK: std::sync::OnceLock<StopHook> = std::sync::OnceLock::new();

/// What a supervisor started by a process with a [`StopHook`] calls once
/// the tree it killed by itself at the lease's stop-by deadline is gone
/// (baton was frozen or gone), with the group id: `baton chaos` dates that
/// death in its history, as the stop hook does for baton's own stops.
pub type DeadlineKillHook = fn(libc::pid_t);

/// The supervisor's flag for "call the [`DeadlineKillHook`]".
const DATE_KILLS: &str = "--date-kills";

/// The supervisor's option carrying its first deadline (an absolute
/// `CLOCK_MONOTONIC` instant in nanoseconds, as the lifeline's messages).
const STOP_BY: &str = "--stop-by";

/// The supervisor's exit code when its first deadline had passed before
/// the command could start (the command never ran).
pub const NOT_STARTED: u8 = 125;

/// Set this process's [`StopHook`]; `false` if one was set already (the
/// first stays).
pub fn set_stop_hook(hook: StopHook) -> bool {
    STOP_HOOK.set(hook).is_ok()
}

/// How long baton looks for the group to be gone after stopping it.
const GONE_WITHIN: Duration = Duration::from_secs(5);

/// A running command: its supervisor and its process group.
pub struct Proc {
    child: Child,
    pgid: libc::pid_t,
    /// The write end of the supervisor's lifeline; closing it (baton dies)
    /// makes the supervisor stop the tree. Deadlines are written to it.
    /// The only strong reference: the follower holds a weak one, so
    /// dropping the `Proc` closes it.
    lifeline: Arc<OwnedFd>,
    /// Run when a group baton stopped is confirmed gone.
    on_gone: Option<OnGone>,
    /// Sends the supervisor each later deadline (see [`spawn`]).
    follower: Option<tokio::task::JoinHandle<()>>,
}

/// Which of a command's output streams baton reads (piped) rather than
/// leaves to the command (inherited: written straight to baton's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capture {
    /// Both inherited (`baton lock`: the command's output is the user's).
    Nothing,
    /// stderr piped (its tail becomes a failed task's error), stdout
    /// inherited.
    Stderr,
    /// Both piped (under `--log-format json`, where every line baton
    /// writes must be a JSON object).
    Both,
}

/// Spawn `argv` with extra environment under a supervisor (see the module
/// docs). After the command exits, leftovers of its tree get SIGTERM, then
/// SIGKILL after `grace`; the same happens if baton dies.
///
/// With `stop_by` (a lease's or an attempt's) the supervisor's dead man's
/// switch is armed from its start: its first deadline is read here, before
/// the supervisor is spawned, and goes on its command line, so a baton
/// frozen at any point after this call cannot leave the command running
/// past it (and a supervisor that starts after it does not start the
/// command: exit [`NOT_STARTED`]); each later instant is sent as the lease
/// is extended.
pub fn spawn(
    argv: &[String],
    env: &[(&str, String)],
    capture: Capture,
    grace: Duration,
    mut stop_by: Option<baton::lock::StopBy>,
) -> anyhow::Result<Proc> {
    let (prog, _) = argv.split_first().context("no command given after --")?;
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two fds into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("creating the supervisor's pipe");
    }
    // SAFETY: both fds were just created and are owned by nobody else.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // A supervisor that stopped reading must never block baton.
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(write.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(write.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
    let exe = if std::path::Path::new("/proc/self/exe").exists() {
        std::path::PathBuf::from("/proc/self/exe")
    } else {
        std::env::current_exe().context("finding the baton executable")?
    };
    let mut cmd = Command::new(exe);
    // Shown by ps as `baton __supervise …`, not `/proc/self/exe …`.
    cmd.arg0("baton")
        .arg(SUPERVISE)
        .arg(read.as_raw_fd().to_string())
        .arg(grace.as_millis().to_string());
    // A process with a stop hook (a `baton chaos` instance) has its
    // supervisor date the kills it makes by itself, too.
    if STOP_HOOK.get().is_some() {
        cmd.arg(DATE_KILLS);
    }
    if let Some(s) = stop_by.as_mut() {
        cmd.arg(STOP_BY).arg(monotonic_ns(s.get()).to_string());
    }
    cmd.arg("--").args(argv);
    for (k, v) in env {
        cmd.env(k, v);
    }
    if capture != Capture::Nothing {
        cmd.stderr(Stdio::piped());
    }
    if capture == Capture::Both {
        cmd.stdout(Stdio::piped());
    }
    // A group of its own: a terminal's Ctrl-C reaches only baton, which
    // forwards it once, and the tree can be signalled as one.
    cmd.process_group(0);
    let rfd = read.as_raw_fd();
    // SAFETY: only async-signal-safe calls (fcntl, sigprocmask) on this
    // process's own state between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            // The read end survives the exec (the write end does not).
            if libc::fcntl(rfd, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Held until the supervisor has its handlers (see module docs).
            let set = stop_signals();
            if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .with_context(|| format!("cannot start the supervisor for {prog:?}"))?;
    drop(read);
    let pgid = child
        .id()
        .context("the supervisor exited before it was seen")? as libc::pid_t;
    let mut proc = Proc {
        child,
        pgid,
        lifeline: Arc::new(write),
        on_gone: None,
        follower: None,
    };
    if let Some(s) = stop_by {
        proc.follow(s);
    }
    Ok(proc)
}

/// `at` as an absolute `CLOCK_MONOTONIC` instant in nanoseconds. The raw
/// clock is read before `Instant::now()`, so a pause between the reads
/// only moves the result earlier (safe for a deadline).
fn monotonic_ns(at: tokio::time::Instant) -> u64 {
    let raw = monotonic_now();
    let now = tokio::time::Instant::now();
    let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    if at >= now {
        raw.saturating_add(ns(at - now))
    } else {
        raw.saturating_sub(ns(now - at)).max(1)
    }
}

/// `CLOCK_MONOTONIC` now, in nanoseconds.
fn monotonic_now() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into a local timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Write one deadline message (see the module docs). A supervisor that is
/// gone needs none; a full pipe (one that stopped reading) is only logged:
/// the supervisor then acts on the last deadline it read, never a later one.
fn send_deadline(fd: &OwnedFd, at: tokio::time::Instant) {
    let msg = monotonic_ns(at).to_le_bytes();
    // SAFETY: write(2) of a local 8-byte buffer to our pipe.
    let n = unsafe { libc::write(fd.as_raw_fd(), msg.as_ptr().cast(), msg.len()) };
    if n != msg.len() as isize {
        let e = std::io::Error::last_os_error();
        // EPIPE: the supervisor is gone (its command ended); nothing to tell.
        if e.raw_os_error() != Some(libc::EPIPE) {
            tracing::warn!(error = %e, "could not send the supervisor its deadline");
        }
    }
}

impl Proc {
    /// Keep the supervisor's dead man's switch on `stop_by`: each instant
    /// after the one last read from it (its first went on the supervisor's
    /// command line) is sent as the lease is extended, and the supervisor
    /// SIGKILLs the whole tree by itself once the latest one passes —
    /// whether or not this process is still scheduled.
    fn follow(&mut self, mut stop_by: baton::lock::StopBy) {
        // A move between the first read and now is seen as a change.
        let fd = Arc::downgrade(&self.lifeline);
        self.follower = Some(tokio::spawn(async move {
            while let Some(at) = stop_by.changed().await {
                let Some(fd) = fd.upgrade() else { return };
                send_deadline(&fd, at);
            }
        }));
    }

    /// Send `sig` to the command's whole process group (while it runs).
    pub fn signal(&self, sig: libc::c_int) {
        if self.child.id().is_some() {
            // SAFETY: kill(2) on the group we created; failure (already
            // gone) is harmless.
            unsafe {
                libc::kill(-self.pgid, sig);
            }
        }
    }

    /// The captured stderr, if requested (once).
    pub fn take_stderr(&mut self) -> Option<ChildStderr> {
        self.child.stderr.take()
    }

    /// The captured stdout, if requested (once).
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.child.stdout.take()
    }

    /// Wait until the command and its whole tree are gone; its status.
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.child.wait().await
    }

    /// Run `hook` (with the group id) once a stop of this command by baton
    /// ([`Proc::stop`], [`Proc::kill`], or dropping it while it runs) has
    /// left no live process in its group. Not run when the command exits
    /// by itself, nor if the group is not seen gone within 5 s.
    pub fn on_gone(&mut self, hook: OnGone) {
        self.on_gone = Some(hook);
    }

    /// Tell the process's [`StopHook`] (when one is set) once a stop of
    /// this command by baton left its group gone, as [`Proc::on_gone`]
    /// does; without a hook this does nothing.
    pub fn report_stop(&mut self, ran: RanFor) {
        if let Some(hook) = STOP_HOOK.get().copied() {
            self.on_gone(Box::new(move |pgid| hook(ran, pgid)));
        }
    }

    /// SIGKILL the group and wait for it: for the supervisor, then (at
    /// most 5 s) until no process of the group is alive.
    pub async fn kill(&mut self) -> std::io::Result<ExitStatus> {
        self.signal(libc::SIGKILL);
        let status = self.child.wait().await;
        self.confirm_gone().await;
        status
    }

    /// SIGTERM the group, then SIGKILL if it has not ended after `grace`;
    /// returns once the group is gone (or after at most 5 s more).
    pub async fn stop(&mut self, grace: Duration) -> std::io::Result<ExitStatus> {
        self.signal(libc::SIGTERM);
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => {
                self.confirm_gone().await;
                status
            }
            Err(_) => {
                tracing::warn!("command did not exit within {grace:?} of SIGTERM; sending SIGKILL");
                self.kill().await
            }
        }
    }

    /// Wait until the group is gone, then run the `on_gone` hook.
    async fn confirm_gone(&mut self) {
        if group_gone(self.pgid, GONE_WITHIN).await {
            if let Some(hook) = self.on_gone.take() {
                hook(self.pgid);
            }
        } else {
            tracing::warn!(
                pgid = self.pgid,
                "processes of the command's group still alive {GONE_WITHIN:?} after it was killed"
            );
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(f) = self.follower.take() {
            f.abort();
        }
        // Not yet reaped: the group is ours; kill it (tokio reaps later).
        if self.child.id().is_some() {
            self.signal(libc::SIGKILL);
            if let (Some(hook), Ok(rt)) =
                (self.on_gone.take(), tokio::runtime::Handle::try_current())
            {
                let pgid = self.pgid;
                rt.spawn(async move {
                    if group_gone(pgid, GONE_WITHIN).await {
                        hook(pgid);
                    }
                });
            }
        }
    }
}

/// Poll (every 10 ms, for at most `within`) until no live process is in
/// group `pgid`; whether it was seen gone. Zombies count as gone: a
/// zombie runs nothing.
pub async fn group_gone(pgid: libc::pid_t, within: Duration) -> bool {
    let until = Instant::now() + within;
    loop {
        if !group_alive(pgid) {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether any process of group `pgid` is alive (not a zombie).
fn group_alive(pgid: libc::pid_t) -> bool {
    // SAFETY: kill(2) with signal 0 only checks for the group's existence.
    if unsafe { libc::kill(-pgid, 0) } != 0
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    {
        return false;
    }
    // Members remain (perhaps only zombies): look at each one's state.
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return true;
    };
    for entry in dir.flatten() {
        if !entry
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid pgrp …"; comm may hold spaces and parens.
        let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let f: Vec<&str> = after.split_whitespace().take(3).collect();
        let (Some(state), Some(pgrp)) = (f.first(), f.get(2)) else {
            continue;
        };
        if pgrp.parse::<libc::pid_t>().ok() == Some(pgid) && !matches!(*state, "Z" | "X" | "x") {
            return true;
        }
    }
    false
}

/// A shell-style exit code for a status: the code, or 128 + signal.
pub fn code_of(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => c.clamp(0, 255) as u8,
        (None, Some(sig)) => (128 + sig).clamp(0, 255) as u8,
        _ => 1,
    }
}

/// SIGINT / SIGTERM / SIGHUP received by baton.
pub struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    /// Start listening.
    pub fn new() -> anyhow::Result<Signals> {
        Ok(Signals {
            int: signal(SignalKind::interrupt()).context("SIGINT handler")?,
            term: signal(SignalKind::terminate()).context("SIGTERM handler")?,
            hup: signal(SignalKind::hangup()).context("SIGHUP handler")?,
        })
    }

    /// The next signal, as its number.
    pub async fn recv(&mut self) -> libc::c_int {
        tokio::select! {
            _ = self.int.recv() => libc::SIGINT,
            _ = self.term.recv() => libc::SIGTERM,
            _ = self.hup.recv() => libc::SIGHUP,
        }
    }
}

// ---- the supervisor process (synchronous, no tokio) ----

fn stop_signals() -> libc::sigset_t {
    // SAFETY: sigset manipulation on a local value.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

extern "C" fn wake(_: libc::c_int) {}

/// If this process was started as the supervisor (`baton __supervise …`),
/// run it and return its exit code; `None` for a normal `baton` run.
/// `on_deadline_kill` is called only when the process that started it has
/// a [`StopHook`] (see [`DeadlineKillHook`]).
pub fn supervise_if_asked(on_deadline_kill: DeadlineKillHook) -> Option<u8> {
    let args: Vec<OsString> = std::env::args_os().collect();
    if args.get(1).map(OsString::as_os_str) != Some(OsStr::new(SUPERVISE)) {
        return None;
    }
    Some(match supervise(&args[2..], on_deadline_kill) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("baton: supervisor: {e}");
            1
        }
    })
}

/// The supervisor's command line after `__supervise`.
struct SuperviseArgs<'a> {
    fd: RawFd,
    grace: Duration,
    date_kills: bool,
    /// The first deadline (`CLOCK_MONOTONIC` ns), if baton gave one.
    stop_by: Option<u64>,
    prog: &'a OsString,
    rest: &'a [OsString],
}

/// Parse `FD GRACE_MS [--date-kills] [--stop-by NS] -- CMD...`.
fn supervise_args(args: &[OsString]) -> Option<SuperviseArgs<'_>> {
    let num = |a: &OsString| a.to_str()?.parse::<u64>().ok();
    let fd = RawFd::try_from(num(args.first()?)?).ok()?;
    let grace = Duration::from_millis(num(args.get(1)?)?);
    let (mut date_kills, mut stop_by) = (false, None);
    let mut i = 2;
    loop {
        match args.get(i)?.to_str()? {
            "--" => break,
            DATE_KILLS => date_kills = true,
            STOP_BY => {
                i += 1;
                stop_by = Some(num(args.get(i)?)?);
            }
            _ => return None,
        }
        i += 1;
    }
    let (prog, rest) = args[i + 1..].split_first()?;
    Some(SuperviseArgs {
        fd,
        grace,
        date_kills,
        stop_by,
        prog,
        rest,
    })
}

fn supervise(args: &[OsString], on_deadline_kill: DeadlineKillHook) -> Result<u8, String> {
    const USAGE: &str =
        "internal use: baton __supervise FD GRACE_MS [--date-kills] [--stop-by NS] -- CMD...";
    let a = supervise_args(args).ok_or(USAGE)?;
    let (fd, grace, stop_by, prog, rest) = (a.fd, a.grace, a.stop_by, a.prog, a.rest);
    let on_deadline_kill = a.date_kills.then_some(on_deadline_kill);
    // SAFETY: process-wide setup of this single-threaded process: signal
    // handlers (a no-op function: it only interrupts ppoll), the
    // subreaper flag, close-on-exec on the lifeline.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = wake as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGCHLD] {
            libc::sigaction(s, &sa, std::ptr::null_mut());
        }
        let mut set = stop_signals();
        libc::sigaddset(&mut set, libc::SIGCHLD);
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
            return Err(format!(
                "PR_SET_CHILD_SUBREAPER: {}",
                std::io::Error::last_os_error()
            ));
        }
        libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
    }
    let me = std::process::id() as libc::pid_t;
    // Started after its first deadline (baton was frozen or starved
    // between deciding to run the command and starting this process): the
    // lease may be gone, so the command must not start at all.
    if stop_by.is_some_and(|d| monotonic_now() >= d) {
        eprintln!(
            "baton: supervisor: the lease's stop-by deadline passed before the command could start; not starting it"
        );
        return Ok(NOT_STARTED);
    }
    // Our handlers reset to the default on exec; the blocked mask would
    // not, so the command gets an empty one.
    let mut command = std::process::Command::new(prog);
    command.args(rest);
    // SAFETY: sigprocmask is async-signal-safe and touches only the child.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            if libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = match command.spawn() {
        Ok(c) => c,
        Err(e) => {
            let code = match e.kind() {
                std::io::ErrorKind::NotFound => 127,
                _ => 126,
            };
            eprintln!("baton: cannot run {:?}: {e}", prog.to_string_lossy());
            return Ok(code);
        }
    };
    let pid = child.id() as libc::pid_t;
    let mut status: Option<libc::c_int> = None;
    // The deadline baton gave last (CLOCK_MONOTONIC ns), if any.
    let mut deadline: Option<u64> = stop_by;
    let mut pending = Vec::new();
    let mut expired = false;
    // Wait for the command, for baton's death, or for the deadline.
    loop {
        if reap(pid, &mut status) == Children::None || status.is_some() {
            break;
        }
        let left = deadline.map(|d| Duration::from_nanos(d.saturating_sub(monotonic_now())));
        if left == Some(Duration::ZERO) {
            expired = true;
            break;
        }
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        if wait_for_event(Some(&mut p), left) && p.revents != 0 {
            match read_lifeline(fd, &mut pending) {
                Lifeline::Closed => break,
                Lifeline::Open(Some(d)) => deadline = Some(d),
                Lifeline::Open(None) => {}
            }
        }
    }
    let term_until = if expired {
        eprintln!(
            "baton: supervisor: the lease's stop-by deadline passed with no extension from baton; killing the command's whole tree"
        );
        sweep(me, libc::SIGKILL);
        Instant::now()
    } else {
        // Whatever remains of the tree: SIGTERM, SIGKILL after the grace
        // (or at the deadline, if that comes first).
        // SAFETY: kill(2) on our own group (we ignore our own SIGTERM).
        unsafe { libc::kill(-me, libc::SIGTERM) };
        sweep(me, libc::SIGTERM);
        let by_deadline = deadline
            .map(|d| Instant::now() + Duration::from_nanos(d.saturating_sub(monotonic_now())));
        let by_grace = Instant::now() + grace;
        by_deadline.map_or(by_grace, |d| d.min(by_grace))
    };
    let give_up = term_until + Duration::from_secs(5);
    loop {
        if reap(pid, &mut status) == Children::None {
            break;
        }
        let now = Instant::now();
        if now >= give_up {
            eprintln!(
                "baton: supervisor: some processes of the command would not die; leaving them"
            );
            break;
        }
        if now >= term_until {
            sweep(me, libc::SIGKILL);
            wait_for_event(None, Some(Duration::from_millis(20)));
        } else {
            wait_for_event(None, Some(term_until - now));
        }
    }
    if expired {
        if let Some(hook) = on_deadline_kill {
            hook(me);
        }
    }
    Ok(match status {
        Some(s) if libc::WIFEXITED(s) => libc::WEXITSTATUS(s) as u8,
        Some(s) if libc::WIFSIGNALED(s) => (128 + libc::WTERMSIG(s)).clamp(0, 255) as u8,
        _ => 1,
    })
}

#[derive(PartialEq)]
enum Children {
    Some,
    None,
}

/// Reap every exited child (the command and adopted orphans), recording
/// the command's status.
fn reap(cmd: libc::pid_t, status: &mut Option<libc::c_int>) -> Children {
    loop {
        let mut st: libc::c_int = 0;
        // SAFETY: waitpid on our own children.
        let r = unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG) };
        if r == cmd {
            *status = Some(st);
        } else if r == 0 {
            return Children::Some;
        } else if r < 0 {
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => {}
                _ => return Children::None, // ECHILD
            }
        }
    }
}

/// Sleep in ppoll with all signals open (a SIGCHLD or a stop signal
/// interrupts it). True if `fd` became ready.
fn wait_for_event(fd: Option<&mut libc::pollfd>, timeout: Option<Duration>) -> bool {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs() as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    // SAFETY: a local empty mask, an optional pollfd and timespec that
    // outlive the call.
    unsafe {
        let mut open: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut open);
        let (ptr, n) = match fd {
            Some(p) => (p as *mut libc::pollfd, 1),
            None => (std::ptr::null_mut(), 0),
        };
        let tsp = ts
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const libc::timespec);
        libc::ppoll(ptr, n, tsp, &open) > 0
    }
}

/// What a read of the lifeline found.
enum Lifeline {
    /// baton closed its end (it died): EOF, or a read error.
    Closed,
    /// Still open; the latest complete deadline message, if one came.
    Open(Option<u64>),
}

/// Read what baton wrote to the lifeline: deadline messages (8 bytes,
/// little-endian; `pending` keeps a partial one), or EOF.
fn read_lifeline(fd: RawFd, pending: &mut Vec<u8>) -> Lifeline {
    let mut b = [0u8; 256];
    // SAFETY: reading into a local buffer.
    let n = unsafe { libc::read(fd, b.as_mut_ptr().cast(), b.len()) };
    if n == 0 {
        return Lifeline::Closed;
    }
    if n < 0 {
        return match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) | Some(libc::EAGAIN) => Lifeline::Open(None),
            _ => Lifeline::Closed,
        };
    }
    pending.extend_from_slice(&b[..n as usize]);
    let mut latest = None;
    while pending.len() >= 8 {
        let mut m = [0u8; 8];
        m.copy_from_slice(&pending[..8]);
        pending.drain(..8);
        latest = Some(u64::from_le_bytes(m));
    }
    Lifeline::Open(latest)
}

/// Send `sig` to every process of our group and every child of ours
/// (adopted orphans that left the group), except ourselves.
fn sweep(me: libc::pid_t, sig: libc::c_int) {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid pgrp …"; comm may hold spaces and parens.
        let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let f: Vec<&str> = after.split_whitespace().take(3).collect();
        let (ppid, pgrp) = match (f.get(1), f.get(2)) {
            (Some(a), Some(b)) => (a.parse().unwrap_or(0), b.parse().unwrap_or(0)),
            _ => continue,
        };
        if ppid == me || pgrp == me {
            // SAFETY: kill(2) on a process of our tree.
            unsafe { libc::kill(pid, sig) };
        }
    }
}
