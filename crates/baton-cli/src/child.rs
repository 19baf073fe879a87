//! Running a user's command as a child process: environment, signal
//! forwarding, and stopping it with SIGTERM then SIGKILL after a grace.

use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

/// Spawn `argv` with extra environment. The child gets SIGKILL if baton
/// dies (so it never outlives the lease or the task claim that covers it).
pub fn spawn(
    argv: &[String],
    env: &[(&str, String)],
    capture_stderr: bool,
) -> anyhow::Result<Child> {
    let (prog, args) = argv.split_first().context("no command given after --")?;
    let mut cmd = Command::new(prog);
    cmd.args(args).kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    if capture_stderr {
        cmd.stderr(Stdio::piped());
    }
    // Own process group, so a terminal's Ctrl-C reaches only baton, which
    // forwards it once; and die with baton.
    cmd.process_group(0);
    // SAFETY: prctl is async-signal-safe and touches only this process.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().with_context(|| format!("cannot run {prog:?}"))
}

/// Send a signal to the child (if it still runs).
pub fn send(child: &Child, sig: libc::c_int) {
    if let Some(pid) = child.id() {
        // SAFETY: kill(2) with a pid we spawned; failure (already gone) is harmless.
        unsafe {
            libc::kill(pid as libc::pid_t, sig);
        }
    }
}

/// SIGTERM, then SIGKILL if it has not exited after `grace`. Returns the exit status.
pub async fn stop(child: &mut Child, grace: Duration) -> std::io::Result<std::process::ExitStatus> {
    send(child, libc::SIGTERM);
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            tracing::warn!("child did not exit within {grace:?} of SIGTERM; sending SIGKILL");
            send(child, libc::SIGKILL);
            child.wait().await
        }
    }
}

/// A shell-style exit code for a status: the code, or 128 + signal.
pub fn code_of(status: std::process::ExitStatus) -> u8 {
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
