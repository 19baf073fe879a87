//! What the commands print: lines on stdout that end the command quietly
//! when the reader went away (`baton tasks list | head -1`), notes on
//! stderr that never fail (a daemon whose stderr was closed keeps running),
//! aligned tables, and timestamps in one form.

use std::fmt;
use std::io::Write;

use chrono::{DateTime, SecondsFormat, Utc};

/// Stdout was closed by its reader (EPIPE). `main` ends the command with
/// exit 0 and no message: the reader took what it wanted.
#[derive(Debug)]
pub struct Closed;

impl fmt::Display for Closed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("stdout was closed")
    }
}

impl std::error::Error for Closed {}

/// Write one line to stdout. A closed pipe becomes [`Closed`]; any other
/// write error is returned as is.
pub fn line(args: fmt::Arguments<'_>) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_fmt(args).and_then(|()| out.write_all(b"\n")) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(Closed.into()),
        Err(e) => Err(anyhow::Error::from(e).context("writing to stdout")),
    }
}

/// Whether notes are written as JSON log lines (`--log-format json`).
static JSON_NOTES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Write notes as JSON log lines from now on (`--log-format json`).
pub fn log_json(on: bool) {
    JSON_NOTES.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Whether logs are JSON lines (`--log-format json`).
pub fn json_logs() -> bool {
    JSON_NOTES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Write one line to stderr, ignoring failure (unlike `eprintln!`, which
/// panics when stderr is closed). Under `--log-format json` the line is a
/// JSON object like the logs' (`timestamp`, `level`, `message`, `target`).
pub fn note(args: fmt::Arguments<'_>) {
    let mut err = std::io::stderr().lock();
    if JSON_NOTES.load(std::sync::atomic::Ordering::Relaxed) {
        let line = serde_json::json!({
            "timestamp": Utc::now().to_rfc3339_opts(SecondsFormat::Micros, true),
            "level": "INFO",
            "message": args.to_string(),
            "target": "baton",
        });
        let _ = writeln!(err, "{line}");
        return;
    }
    let _ = err.write_fmt(args).and_then(|()| err.write_all(b"\n"));
}

/// `println!` that returns [`Closed`] (via `?`) when stdout's reader left.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::output::line(format_args!($($arg)*))?
    };
}

/// `eprintln!` that never panics.
#[macro_export]
macro_rules! note {
    ($($arg:tt)*) => {
        $crate::output::note(format_args!($($arg)*))
    };
}

/// A timestamp as every command prints it: RFC 3339, UTC, milliseconds
/// (`2026-01-31T06:00:00.000Z`), whatever precision the store keeps.
pub fn ts(t: DateTime<Utc>) -> String {
    baton::format_time(t)
}

/// [`ts`], or `-` for none.
pub fn ts_or_dash(t: Option<DateTime<Utc>>) -> String {
    t.map(ts).unwrap_or_else(|| "-".into())
}

/// Rewrite the RFC 3339 strings under `keys` of a JSON object (or of each
/// object in an array) to [`ts`]'s form, so JSON output has one precision
/// on every store.
pub fn normalize_times(v: &mut serde_json::Value, keys: &[&str]) {
    match v {
        serde_json::Value::Array(items) => {
            for item in items {
                normalize_times(item, keys);
            }
        }
        serde_json::Value::Object(map) => {
            for key in keys {
                if let Some(serde_json::Value::String(s)) = map.get_mut(*key) {
                    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
                        *s = ts(t.with_timezone(&Utc));
                    }
                }
            }
        }
        _ => {}
    }
}

/// Print `v` as pretty JSON.
pub fn json(v: &serde_json::Value) -> anyhow::Result<()> {
    line(format_args!("{}", serde_json::to_string_pretty(v)?))
}

/// Which way a column's cells are padded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Text: padded on the right.
    Left,
    /// Numbers: padded on the left.
    Right,
}

/// A table whose columns are as wide as their widest cell (header
/// included); the last column is not padded.
pub struct Table {
    headers: Vec<(&'static str, Align)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers.
    pub fn new(headers: &[(&'static str, Align)]) -> Table {
        Table {
            headers: headers.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Add a row (one cell per column).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as lines, header first.
    pub fn lines(&self) -> Vec<String> {
        let n = self.headers.len();
        let mut width: Vec<usize> = self.headers.iter().map(|(h, _)| h.len()).collect();
        for r in &self.rows {
            for (w, c) in width.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let render = |cells: Vec<&str>| {
            let mut s = String::new();
            for (i, c) in cells.iter().enumerate() {
                let pad = width[i].saturating_sub(c.chars().count());
                if i > 0 {
                    s.push_str("  ");
                }
                match self.headers[i].1 {
                    Align::Right => {
                        s.extend(std::iter::repeat_n(' ', pad));
                        s.push_str(c);
                    }
                    Align::Left => {
                        s.push_str(c);
                        if i + 1 < n {
                            s.extend(std::iter::repeat_n(' ', pad));
                        }
                    }
                }
            }
            s
        };
        let mut out = vec![render(self.headers.iter().map(|(h, _)| *h).collect())];
        for r in &self.rows {
            out.push(render(r.iter().map(String::as_str).collect()));
        }
        out
    }

    /// Print the table.
    pub fn print(&self) -> anyhow::Result<()> {
        for l in self.lines() {
            line(format_args!("{l}"))?;
        }
        Ok(())
    }
}

/// Print `label: value` pairs with the values aligned.
pub fn fields(pairs: &[(&str, String)]) -> anyhow::Result<()> {
    let w = pairs.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in pairs {
        line(format_args!("  {:<w$}  {v}", format!("{k}:"), w = w + 1))?;
    }
    Ok(())
}

/// Await `work`, showing a running line on stderr while it lasts —
/// `WHAT … 3s`, redrawn every quarter second and erased when the work
/// ends — only when stderr is a terminal; otherwise (a pipe, a file, a
/// daemon's log) nothing is written. For the one long store call of
/// `migrate`, `tasks prune` and `lock --wait`, which report no progress of
/// their own: the line shows that the command is working and for how long.
pub async fn progress<T>(what: impl fmt::Display, work: impl std::future::Future<Output = T>) -> T {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return work.await;
    }
    let t0 = std::time::Instant::now();
    let draw = || {
        let mut err = std::io::stderr().lock();
        // \r and "erase line": the line is redrawn in place.
        let _ = write!(err, "\r\x1b[K{what} … {}s", t0.elapsed().as_secs());
        let _ = err.flush();
    };
    // Drawn at once, however quick the work, then every quarter second.
    draw();
    let every = std::time::Duration::from_millis(250);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tokio::pin!(work);
    let out = loop {
        tokio::select! {
            out = &mut work => break out,
            _ = tick.tick() => draw(),
        }
    };
    let mut err = std::io::stderr().lock();
    let _ = write!(err, "\r\x1b[K");
    let _ = err.flush();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_on_the_widest_cell() {
        let mut t = Table::new(&[
            ("ID", Align::Right),
            ("NAME", Align::Left),
            ("X", Align::Left),
        ]);
        t.row(vec!["7".into(), "a-long-name".into(), "last".into()]);
        t.row(vec!["1234".into(), "b".into(), "z".into()]);
        let l = t.lines();
        assert_eq!(l[0], "  ID  NAME         X");
        assert_eq!(l[1], "   7  a-long-name  last");
        assert_eq!(l[2], "1234  b            z");
    }

    #[test]
    fn timestamps_have_milliseconds() {
        let t = DateTime::parse_from_rfc3339("2026-01-31T06:00:00.123456Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(ts(t), "2026-01-31T06:00:00.123Z");
        let mut v = serde_json::json!([{"run_at": "2026-01-31T06:00:00Z", "payload": "2026-01-31T06:00:00Z"}]);
        normalize_times(&mut v, &["run_at"]);
        assert_eq!(v[0]["run_at"], "2026-01-31T06:00:00.000Z");
        assert_eq!(v[0]["payload"], "2026-01-31T06:00:00Z");
    }
}
