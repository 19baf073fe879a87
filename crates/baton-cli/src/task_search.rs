//! The search flags `baton tasks list` and `baton tasks delete` share
//! (`--kind`, `--key`, `--text`, `--since`, `--until`), laid onto a
//! [`TaskFilter`].

use baton::store::TaskFilter;
use chrono::{DateTime, Utc};

use crate::values::since_arg;

/// Search terms for tasks.
#[derive(clap::Args, Debug, Default, Clone)]
pub struct SearchArgs {
    /// Only tasks of this kind (a command task's kind is `command`).
    #[arg(long)]
    pub kind: Option<String>,
    /// Only tasks with this key: a unique key (as given at enqueue,
    /// whatever its scope, or a schedule slot's key) or a concurrency key.
    #[arg(long)]
    pub key: Option<String>,
    /// Only tasks whose payload contains this text, taken literally (a
    /// value such as an email address or an order number).
    #[arg(long, value_name = "TEXT")]
    pub text: Option<String>,
    /// Only tasks enqueued at or after this: an RFC 3339 time or a
    /// duration ago (e.g. 90m, 7d).
    #[arg(long, value_parser = since_arg, value_name = "TIME")]
    pub since: Option<DateTime<Utc>>,
    /// Only tasks enqueued before this: an RFC 3339 time or a duration
    /// ago.
    #[arg(long, value_parser = since_arg, value_name = "TIME")]
    pub until: Option<DateTime<Utc>>,
}

impl SearchArgs {
    /// Whether any term was given.
    pub fn any(&self) -> bool {
        self.kind.is_some()
            || self.key.is_some()
            || self.text.is_some()
            || self.since.is_some()
            || self.until.is_some()
    }

    /// Lay the terms onto `f` (the library checks them when it lists;
    /// a backwards range is refused here, naming the flags).
    pub fn apply(self, f: &mut TaskFilter) -> anyhow::Result<()> {
        if let (Some(a), Some(b)) = (self.since, self.until) {
            if a >= b {
                return Err(baton::Error::from(baton::InvalidInput::new(
                    "--since",
                    format!(
                        "{} is not before --until {}",
                        a.to_rfc3339(),
                        b.to_rfc3339()
                    ),
                ))
                .into());
            }
        }
        f.kind = self.kind;
        f.key = self.key;
        f.text = self.text;
        f.created_from = self.since;
        f.created_to = self.until;
        Ok(())
    }
}

/// A filter's terms as an audit record's target: `queue=q kind=k …`, only
/// those set.
pub fn filter_text(f: &TaskFilter) -> String {
    let mut parts = Vec::new();
    let mut add = |k: &str, v: Option<String>| {
        if let Some(v) = v {
            parts.push(format!("{k}={v}"));
        }
    };
    add("queue", f.queue.clone());
    add("state", f.state.map(|s| s.to_string()));
    add("job", f.job.clone());
    add("kind", f.kind.clone());
    add("key", f.key.clone());
    add("text", f.text.clone());
    add("since", f.created_from.map(baton::format_time));
    add("until", f.created_to.map(baton::format_time));
    if parts.is_empty() {
        "all".into()
    } else {
        parts.join(" ")
    }
}
