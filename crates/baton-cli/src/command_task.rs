//! Command tasks: a task of kind `command` whose payload is
//! `{"argv": [...]}`, run as a child process. Exit 0 is success; anything
//! else fails the attempt with the tail of the child's stderr.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton::queue::worker::StopReason;
use baton::queue::{TaskContext, TaskError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::child;

/// The task kind of command tasks.
pub const KIND: &str = "command";
/// How much of a failed command's stderr is kept as the task's error.
const TAIL: usize = 2000;

/// How much of a failed command's stdout its error keeps (the last bytes),
/// after the stderr tail.
const STDOUT_TAIL: usize = 1000;

/// The payload of a command task.
pub fn payload(argv: &[String]) -> serde_json::Value {
    serde_json::json!({ "argv": argv })
}

/// Check a command before it is stored: a program to run (not empty or
/// blank) and no NUL byte in any argument (the OS cannot pass one, so
/// every attempt would fail). The problem, for an error naming the field
/// (`command` in the config and the API, `COMMAND` on the CLI).
///
/// ```ignore
/// assert!(check_argv(&["echo".into(), "hi".into()]).is_ok());
/// assert!(check_argv(&["".into()]).is_err());
/// ```
pub fn check_argv(argv: &[String]) -> Result<(), String> {
    const FORM: &str = "give the program and its arguments, e.g. [\"sh\", \"-c\", \"…\"]";
    match argv.first() {
        None => return Err(format!("is empty; {FORM}")),
        Some(p) if p.trim().is_empty() => {
            return Err(format!(
                "names no program (its first element is blank); {FORM}"
            ))
        }
        Some(_) => {}
    }
    if let Some(i) = argv.iter().position(|a| a.contains('\0')) {
        return Err(format!(
            "element {i} contains a NUL byte, which no program can receive in its arguments; remove it"
        ));
    }
    Ok(())
}

fn argv_of(ctx: &TaskContext) -> Result<Vec<String>, TaskError> {
    let v = ctx.task().payload.get("argv").cloned().unwrap_or_default();
    let argv: Vec<String> = serde_json::from_value(v).map_err(|_| {
        TaskError::permanent("payload has no \"argv\": [string, ...]; not a command task")
    })?;
    if argv.is_empty() {
        return Err(TaskError::permanent("payload \"argv\" is empty"));
    }
    Ok(argv)
}

/// Run a command task (argv from its payload) to completion.
pub async fn run(ctx: TaskContext, grace: Duration) -> Result<(), TaskError> {
    let argv = argv_of(&ctx)?;
    run_argv(ctx, argv, grace).await
}

/// Run `argv` for a task to completion, with `BATON_TASK_ID`,
/// `BATON_ATTEMPT`, `BATON_FENCING_TOKEN` (the claim's token), `BATON_QUEUE` (and `BATON_JOB`, `BATON_SLOT` for a
/// job's run) in its environment. On a stop signal (lease lost, cancel,
/// shutdown, timeout) the child gets SIGTERM, then SIGKILL after `grace`.
pub async fn run_argv(
    ctx: TaskContext,
    argv: Vec<String>,
    grace: Duration,
) -> Result<(), TaskError> {
    run_argv_stopping(ctx, argv, grace, grace).await
}

/// [`run_argv`], giving the tree `cancel_grace` instead of `grace` when
/// the stop is a cancel (zero for a job under `overlap =
/// "terminate_other"`: its process tree is killed at once).
pub async fn run_argv_stopping(
    ctx: TaskContext,
    argv: Vec<String>,
    grace: Duration,
    cancel_grace: Duration,
) -> Result<(), TaskError> {
    let t = ctx.task();
    let mut env = vec![
        ("BATON_TASK_ID", t.id.to_string()),
        ("BATON_ATTEMPT", t.attempt.to_string()),
        ("BATON_FENCING_TOKEN", t.token.to_string()),
        ("BATON_QUEUE", t.queue.clone()),
    ];
    if let Some(job) = &t.job {
        env.push(("BATON_JOB", job.clone()));
    }
    if let Some(slot) = t.slot {
        env.push(("BATON_SLOT", crate::runtime::slot_text(slot)));
    }
    let id = t.id;
    let stop = async {
        ctx.stopped().await;
        let reason = ctx.stop_reason();
        tracing::info!(
            task = id,
            reason = reason.map(StopReason::as_str),
            "stopping the command"
        );
        match reason {
            Some(StopReason::Cancelled) => cancel_grace,
            _ => grace,
        }
    };
    let stop_by = Some(ctx.watch_stop_by());
    run_command(&argv, &env, stop, grace, RanFor::Task(&ctx), stop_by).await
}

/// What a command runs for.
#[derive(Clone, Copy)]
pub enum RanFor<'a> {
    /// A task's attempt: its id and attempt on the stop record, its exit
    /// code on its `task ended` line.
    Task(&'a TaskContext),
    /// A lock-mode slot: its exit code on its `run ended` line.
    Slot(&'a baton::schedule::SlotRun),
    /// Nothing that logs an exit code.
    Nothing,
}

/// Run `argv` with `env` until it exits, or until `stop` resolves: then
/// SIGTERM to its whole process tree, SIGKILL after the grace `stop`
/// resolved with (`grace` is what the tree gets once the command exits). Exit 0 is
/// success; otherwise an error with the exit code and the tail of its
/// stderr (which is also passed through: as it is, or under
/// `--log-format json` line by line as log events, with stdout too). The
/// command ends when it exits:
/// what remains of its tree is stopped the same way (see `child`), and
/// stderr is drained for at most [`DRAIN`] after that, however long a
/// stray process holds it open. Shared by command tasks and job actions.
/// The exit code goes on the `task ended` or `run ended` log line of what
/// it ran for (`ran_for`).
/// With `stop_by` (the lease's or attempt's) the supervisor kills the tree
/// by itself once it passes unextended, even if baton is frozen.
pub async fn run_command(
    argv: &[String],
    env: &[(&str, String)],
    stop: impl std::future::Future<Output = Duration>,
    grace: Duration,
    ran_for: RanFor<'_>,
    stop_by: Option<baton::lock::StopBy>,
) -> Result<(), TaskError> {
    let json = crate::output::json_logs();
    // A task's stdout is read too (its tail goes into a failure's error)
    // and written on to baton's stdout; other commands' stdout (`baton
    // lock`, lock-mode runs) is theirs, passed through untouched.
    let capture = if json || matches!(ran_for, RanFor::Task(_)) {
        child::Capture::Both
    } else {
        child::Capture::Stderr
    };
    let mut proc = child::spawn(argv, env, capture, grace, stop_by)
        .map_err(|e| TaskError::retry(format!("{e:#}")))?;
    // Tell the process's stop hook (set under `baton chaos` only).
    let token = env
        .iter()
        .find(|(k, _)| *k == "BATON_FENCING_TOKEN")
        .and_then(|(_, v)| v.parse().ok());
    proc.report_stop(child::RanFor {
        task: match ran_for {
            RanFor::Task(c) => Some((c.task().id, c.task().attempt)),
            _ => None,
        },
        token,
    });
    let kept = Arc::new(Mutex::new(Vec::new()));
    let kept_out = Arc::new(Mutex::new(Vec::new()));
    let mut tee = copy_output(proc.take_stderr(), Stream::Stderr, json, Some(kept.clone()));
    let mut tee_out = copy_output(
        proc.take_stdout(),
        Stream::Stdout,
        json,
        Some(kept_out.clone()),
    );
    let status = tokio::select! {
        st = proc.wait() => st,
        g = stop => proc.stop(g).await,
    }
    .map_err(|e| TaskError::retry(format!("waiting for {:?}: {e}", argv[0])))?;
    // Both drained within one DRAIN, however long a stray process holds
    // either open.
    let drained = tokio::time::timeout(DRAIN, async {
        let _ = (&mut tee).await;
        let _ = (&mut tee_out).await;
    });
    if drained.await.is_err() {
        tee.abort();
        tee_out.abort();
    }
    let taken = |k: &Mutex<Vec<u8>>| match k.lock() {
        Ok(g) => g.clone(),
        Err(p) => p.into_inner().clone(),
    };
    let (kept, kept_out) = (taken(&kept), taken(&kept_out));
    let code = i32::from(child::code_of(status));
    match ran_for {
        RanFor::Task(c) => c.set_exit_code(code),
        RanFor::Slot(r) => r.set_exit_code(code),
        RanFor::Nothing => {}
    }
    outcome(status, kept, kept_out)
}

/// How long output is still copied after the command's tree is gone.
const DRAIN: Duration = Duration::from_millis(500);

/// The longest output line logged as one (a longer one is split).
const MAX_LINE: usize = 16 * 1024;

/// Which of the command's streams a reader copies.
#[derive(Debug, Clone, Copy)]
enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// Read the child's `stream` until it closes, a line at a time, so that
/// a line of the command's never splits one of baton's log lines or is
/// split by one. Under `--log-format json` each line becomes a log event
/// of its own (target `baton::command`, field `stream`, in the task's
/// span), so every line baton writes stays a JSON object; otherwise each
/// line goes to baton's own stdout or stderr, as the command wrote it (an
/// unterminated last line gets its newline). A reader given `kept` keeps the stream's tail
/// there for the error message.
fn copy_output(
    source: Option<impl tokio::io::AsyncRead + Unpin + Send + 'static>,
    stream: Stream,
    json: bool,
    kept: Option<Arc<Mutex<Vec<u8>>>>,
) -> tokio::task::JoinHandle<()> {
    use tracing::Instrument;
    let copy = async move {
        let Some(mut source) = source else { return };
        let mut buf = [0u8; 4096];
        let mut line = Vec::new();
        while let Ok(n) = source.read(&mut buf).await {
            if n == 0 {
                break;
            }
            let chunk = &buf[..n];
            if let Some(kept) = &kept {
                keep_tail(kept, chunk);
            }
            for &b in chunk {
                line.push(b);
                if b == b'\n' || line.len() >= MAX_LINE {
                    emit_line(stream, json, &line).await;
                    line.clear();
                }
            }
        }
        if !line.is_empty() {
            emit_line(stream, json, &line).await;
        }
    };
    tokio::spawn(copy.instrument(tracing::Span::current()))
}

/// One line of a command's output (with its newline, if it had one): a
/// log event, or written through whole.
async fn emit_line(stream: Stream, json: bool, line: &[u8]) {
    if json {
        let text = String::from_utf8_lossy(line);
        let text = text.strip_suffix('\n').unwrap_or(&text);
        let text = text.strip_suffix('\r').unwrap_or(text);
        tracing::info!(target: "baton::command", stream = stream.name(), "{text}");
        return;
    }
    let whole = if line.ends_with(b"\n") {
        std::borrow::Cow::Borrowed(line)
    } else {
        std::borrow::Cow::Owned([line, b"\n"].concat())
    };
    let _ = match stream {
        Stream::Stdout => tokio::io::stdout().write_all(&whole).await,
        Stream::Stderr => tokio::io::stderr().write_all(&whole).await,
    };
}

/// Append `chunk` to `kept`, keeping about the last [`TAIL`] bytes.
fn keep_tail(kept: &Mutex<Vec<u8>>, chunk: &[u8]) {
    let mut k = match kept.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    k.extend_from_slice(chunk);
    if k.len() > 2 * TAIL {
        let cut = k.len() - TAIL;
        k.drain(..cut);
    }
}

/// Exit 0 is success; otherwise an error with the code, stderr's tail
/// (its last [`TAIL`] bytes) and, when the command wrote to stdout, a line
/// `stdout: ` with its last [`STDOUT_TAIL`] bytes.
fn outcome(
    status: std::process::ExitStatus,
    kept: Vec<u8>,
    kept_out: Vec<u8>,
) -> Result<(), TaskError> {
    if status.success() {
        return Ok(());
    }
    let err = tail_text(&kept, TAIL);
    let out = tail_text(&kept_out, STDOUT_TAIL);
    let code = child::code_of(status);
    let mut text = if err.is_empty() {
        format!("exit {code}")
    } else {
        format!("exit {code}: {err}")
    };
    if !out.is_empty() {
        text.push_str("\nstdout: ");
        text.push_str(&out);
    }
    Err(TaskError::retry(text))
}

/// The last `max` bytes of `kept` as text (cut at a character boundary),
/// trailing whitespace dropped.
fn tail_text(kept: &[u8], max: usize) -> String {
    let text = String::from_utf8_lossy(kept);
    let text = text.trim_end();
    let start = text.len().saturating_sub(max);
    let start = (start..text.len())
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(text.len());
    text[start..].to_string()
}
