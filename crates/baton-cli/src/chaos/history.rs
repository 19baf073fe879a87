//! The append-only history of a chaos run, outside the store, and the
//! workload's effect helper (`baton chaos __effect`).
//!
//! Every process appends JSON lines to one file opened with `O_APPEND`; a
//! line is written with one `write(2)` of less than `PIPE_BUF` bytes, so
//! lines never interleave. Times are microseconds since the Unix epoch on
//! the host's real clock (the helper runs with libfaketime removed from
//! its environment), so every record is on one clock — except `killed`
//! records, appended by a worker (which may run under a skewed clock) once
//! a command it stopped has no live process left: the checker orders
//! those by their place in the file, not by their time.
//!
//! The fenced register is a file per resource holding the highest token it
//! accepted. A write takes `flock` on it, compares, stores and appends its
//! `write` record while still holding the lock, so the history's order of
//! one register's writes is the order the register saw them.

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// The history file's name in the run directory.
pub const HISTORY: &str = "history.jsonl";
/// The environment variable naming the instance a process belongs to.
pub const PROC_ENV: &str = "BATON_CHAOS_PROC";
/// The environment variable naming the history file a baton process
/// appends a `killed` record to when it stopped a command (a task's, a
/// lock-mode job's, `baton lock`'s) and saw its whole process group gone
/// (set by `baton chaos` on its instances).
pub const KILLED_ENV: &str = "BATON_CHAOS_HISTORY";

/// One line of the history.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Record {
    /// `begin`, `end`, `write`, `enqueue`, `fault`, `killed` (a worker
    /// stopped an attempt's command and saw its process group gone).
    pub op: String,
    /// Effects: `lock`, `task`, `job`, `lockjob`; faults: their kind.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// The instance (`w1.0`, `s2.1`, `l3.17`, `nemesis`, `producer`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub proc: String,
    /// A unique id per effect (begin, its writes and end share it).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub effect: String,
    /// Lock name, job name, register name or unique key.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// `BATON_FENCING_TOKEN` (lock grant or task claim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<i64>,
    /// `BATON_TASK_ID`, or the id an enqueue returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<i64>,
    /// `BATON_ATTEMPT`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// `BATON_SLOT`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub slot: String,
    /// The process group of an effect (its command's group), or of a
    /// `killed` command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<i64>,
    /// A `killed` record written by the command's supervisor (its stop-by
    /// deadline passed while baton was frozen): it names the group only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub supervisor: bool,
    /// A register write: whether the register took it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted: Option<bool>,
    /// A register write: the highest token the register held before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<i64>,
    /// Start (µs since the epoch, real clock). A `killed` record's time is
    /// the worker's clock, which a skew fault moves: the checker orders it
    /// by its place in the file instead.
    pub t: i64,
    /// End of a fault or an enqueue (µs); an effect's end is its `end` record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<i64>,
    /// Free text (a fault's target, an effect stopped by a signal).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
    /// An effect's `begin`: when its command's process started (µs since
    /// the epoch, real clock, to the kernel's 10 ms tick), which may be
    /// well before it could record `begin` (a pause that froze it on its
    /// way there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spawned: Option<i64>,
}

/// Microseconds since the Unix epoch, now.
pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// When this process started (µs since the epoch, real clock): its start
/// in clock ticks after boot (`/proc/self/stat`, field 22) against
/// `CLOCK_BOOTTIME` now. `None` where `/proc` does not say.
pub fn process_started_us() -> Option<i64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name (which may hold spaces): state is
    // field 3, so starttime (22) is the 20th of them.
    let ticks: i64 = stat
        .rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()?;
    // SAFETY: sysconf and clock_gettime only read; the timespec is local.
    let (hz, boot_us) = unsafe {
        let hz = libc::sysconf(libc::_SC_CLK_TCK);
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        if hz <= 0 || libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) != 0 {
            return None;
        }
        // `time_t` and `c_long` are not `i64` on every target.
        #[allow(clippy::unnecessary_cast)]
        (
            hz as i64,
            ts.tv_sec as i64 * 1_000_000 + ts.tv_nsec as i64 / 1_000,
        )
    };
    Some(now_us() - (boot_us - ticks * 1_000_000 / hz))
}

/// An open history file (O_APPEND).
pub struct History {
    file: std::fs::File,
}

impl History {
    /// Open (create) `dir/history.jsonl` for appending.
    pub fn open(dir: &Path) -> anyhow::Result<History> {
        let path = dir.join(HISTORY);
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening the history {}", path.display()))?;
        Ok(History { file })
    }

    /// Append one record as one line, in one write.
    pub fn append(&mut self, r: &Record) -> anyhow::Result<()> {
        let mut line = serde_json::to_vec(r)?;
        line.push(b'\n');
        self.file
            .write_all(&line)
            .context("appending to the history")
    }
}

/// The [`crate::child::StopHook`] `baton chaos`'s instances install
/// (`baton chaos __instance`, [`install_stop_hook`]): append a `killed`
/// record once baton stopped a command and no process of its group is
/// alive — for a task's attempt, or for the holder of a fencing token (a
/// lock-mode job's run, a `baton lock` command). It is appended after that
/// was seen, so every record after it in the file was written after the
/// command's death.
fn date_death(ran: crate::child::RanFor, pgid: libc::pid_t) {
    let Some(path) = std::env::var_os(KILLED_ENV) else {
        return;
    };
    if let Err(e) = append_killed(Path::new(&path), ran.task, ran.token, i64::from(pgid)) {
        tracing::warn!(task = ?ran.task, token = ?ran.token, "chaos history: {e:#}");
    }
}

/// The [`crate::child::DeadlineKillHook`]: a chaos instance's supervisor
/// killed its command's tree by itself at the lease's stop-by deadline
/// (its baton frozen) and saw it gone: append a `killed` record for the
/// group, marked `supervisor`, so the death is dated when it happened, not
/// when the frozen baton wakes and sees it. Does nothing outside a chaos
/// run (no [`KILLED_ENV`]).
pub fn date_deadline_kill(pgid: libc::pid_t) {
    let Some(path) = std::env::var_os(KILLED_ENV) else {
        return;
    };
    let rec = Record {
        op: "killed".into(),
        proc: std::env::var(PROC_ENV).unwrap_or_default(),
        group: Some(i64::from(pgid)),
        supervisor: true,
        t: now_us(),
        ..Default::default()
    };
    let appended = OpenOptions::new()
        .append(true)
        .open(&path)
        .map_err(anyhow::Error::from)
        .and_then(|file| History { file }.append(&rec));
    if let Err(e) = appended {
        eprintln!("baton: supervisor: chaos history: {e:#}");
    }
}

/// Make this process a chaos instance: every command it stops is dated in
/// the run's history ([`KILLED_ENV`]). Called only by `baton chaos
/// __instance`, never by a production command.
pub fn install_stop_hook() {
    crate::child::set_stop_hook(date_death);
}

fn append_killed(
    path: &Path,
    task: Option<(i64, u32)>,
    token: Option<i64>,
    group: i64,
) -> anyhow::Result<()> {
    let file = OpenOptions::new()
        .append(true)
        .open(path)
        .with_context(|| format!("opening the history {}", path.display()))?;
    History { file }.append(&Record {
        op: "killed".into(),
        proc: std::env::var(PROC_ENV).unwrap_or_default(),
        task: task.map(|(t, _)| t),
        attempt: task.map(|(_, a)| a),
        token,
        group: Some(group),
        t: now_us(),
        ..Default::default()
    })
}

/// Read every record of a run directory's history (a torn last line, from
/// a process killed mid-write, is skipped).
pub fn read(dir: &Path) -> anyhow::Result<Vec<Record>> {
    let path = dir.join(HISTORY);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading the history {}", path.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

/// Arguments of the hidden `baton chaos __effect` helper that the
/// workload's shell wrappers run.
#[derive(clap::Args, Debug)]
pub struct EffectArgs {
    /// The run directory (history and registers).
    #[arg(long)]
    pub dir: PathBuf,
    /// `lock`, `task`, `job` or `lockjob`.
    #[arg(long)]
    pub kind: String,
    /// The lock's or job's name.
    #[arg(long, default_value = "")]
    pub name: String,
    /// How long the effect lasts, in milliseconds.
    #[arg(long, default_value_t = 300)]
    pub hold_ms: u64,
    /// Write to the register without comparing tokens (`--unsafe`).
    #[arg(long)]
    pub unfenced: bool,
}

fn env_i64(name: &str) -> Option<i64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// `baton chaos __effect`: record `begin`, write the fenced register, hold,
/// write it again, record `end` (also when stopped by SIGTERM/SIGINT, then
/// exit 143/130). Exits 0 even when the register refused the write: the
/// refusal is the resource protecting itself, recorded for the checker.
pub async fn effect(a: EffectArgs) -> anyhow::Result<u8> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut h = History::open(&a.dir)?;
    let task = env_i64("BATON_TASK_ID");
    let token = env_i64("BATON_FENCING_TOKEN");
    let slot = std::env::var("BATON_SLOT").unwrap_or_default();
    let base = Record {
        kind: a.kind.clone(),
        proc: std::env::var(PROC_ENV).unwrap_or_default(),
        effect: format!("{}-{}", std::process::id(), now_us()),
        name: a.name.clone(),
        token,
        task,
        attempt: env_i64("BATON_ATTEMPT").map(|v| v as u32),
        slot,
        // SAFETY: getpgrp(2) has no arguments and cannot fail.
        group: Some(i64::from(unsafe { libc::getpgrp() })),
        ..Default::default()
    };
    // A task's attempts share its register; lock holders share the lock's.
    let register = match task {
        Some(id) => format!("task-{id}"),
        None => format!("{}-{}", a.kind, a.name),
    };
    h.append(&Record {
        op: "begin".into(),
        t: now_us(),
        spawned: process_started_us(),
        ..base.clone()
    })?;
    let write = |h: &mut History| -> anyhow::Result<()> {
        match token {
            Some(tok) => write_fenced(h, &a.dir, &register, tok, !a.unfenced, &base),
            None => Ok(()),
        }
    };
    write(&mut h)?;
    let code = tokio::select! {
        _ = tokio::time::sleep(Duration::from_millis(a.hold_ms)) => {
            write(&mut h)?;
            0
        }
        _ = term.recv() => 143,
        _ = int.recv() => 130,
    };
    h.append(&Record {
        op: "end".into(),
        t: now_us(),
        note: if code == 0 {
            String::new()
        } else {
            format!("stopped by signal {}", code - 128)
        },
        ..base
    })?;
    Ok(code)
}

/// Write `token` to the register `name` under `flock`: refused when the
/// register holds a higher token (`fenced`), recorded either way.
fn write_fenced(
    h: &mut History,
    dir: &Path,
    name: &str,
    token: i64,
    fenced: bool,
    base: &Record,
) -> anyhow::Result<()> {
    let regs = dir.join("registers");
    std::fs::create_dir_all(&regs)?;
    let path = regs.join(name);
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening the register {}", path.display()))?;
    // SAFETY: flock(2) on a descriptor we own; released when `f` closes.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(std::io::Error::last_os_error()).context("flock on the register");
    }
    let mut text = String::new();
    f.read_to_string(&mut text)?;
    let last: Option<i64> = text.trim().parse().ok();
    let accepted = !fenced || last.is_none_or(|l| token >= l);
    if accepted {
        f.seek(SeekFrom::Start(0))?;
        f.set_len(0)?;
        f.write_all(token.to_string().as_bytes())?;
    }
    h.append(&Record {
        op: "write".into(),
        name: name.to_string(),
        accepted: Some(accepted),
        last,
        t: now_us(),
        ..base.clone()
    })
}
