//! Jobs defined at run time (issue 26 item 4): the definition kept in the
//! store is a `[[job]]` table as JSON, parsed by the config file's own
//! code ([`crate::config::job_from_doc`]); here is how `baton serve` and
//! `baton work` turn one into the job they run, how a config job and the
//! store's definition of it compare, and `baton jobs create|update|delete`.

use std::path::PathBuf;

use baton::schedule::{self, Job};
use baton::store::{JobDef, JobDefWrite};
use baton::{Error, InvalidInput};
use serde_json::{json, Map, Value};

use crate::config::{job_from_doc, Action, JobConfig, Mode};

/// The job a stored definition runs: a durable job whose command runs as
/// a command task (kind `command`, `BATON_JOB` and `BATON_SLOT` set), so
/// any `baton serve` or `baton work` on the job's queue runs it. Refused
/// (naming the field): lock mode, and `http` actions (not yet).
pub fn job_of(c: &JobConfig) -> Result<Job, InvalidInput> {
    if let Mode::Lock { .. } = c.mode {
        return Err(InvalidInput::new(
            "mode",
            "a job kept in the store runs in durable mode only; leave mode out",
        ));
    }
    let Action::Command(argv) = &c.action else {
        return Err(InvalidInput::new(
            "http",
            "is not yet supported for a job kept in the store; give command = [\"program\", …]",
        ));
    };
    Ok(c.job()
        .kind(crate::command_task::KIND)
        .payload(crate::command_task::payload(argv)))
}

/// A definition as its validated config, or the bad input naming the field.
pub fn config_of(name: &str, spec: &Value) -> Result<JobConfig, InvalidInput> {
    let c = job_from_doc(name, spec)?;
    let _runs = job_of(&c)?;
    Ok(c)
}

/// The scheduler's decoder for `baton serve`/`work`: the definition's job;
/// a config job of the same name that says something else is logged as a
/// warning (once per version: the scheduler decodes each version once),
/// and does not run (the store's definition does).
pub fn decoder(
    config: Vec<JobConfig>,
) -> impl Fn(&JobDef) -> Result<Job, InvalidInput> + Send + Sync + 'static {
    move |def: &JobDef| {
        let c = config_of(&def.name, &def.spec)?;
        if let Some(mine) = config.iter().find(|j| j.name == def.name) {
            if mine.doc != def.spec {
                tracing::warn!(job = %def.name, store_version = def.version, config = %mine.doc, store = %def.spec,
                    "the config file defines this job differently from the store; the store's definition (version {}) runs, the config's does not", def.version);
            }
        }
        job_of(&c)
    }
}

/// Where a job's definition comes from, for `baton jobs` and the API:
/// `store vN`, `store vN (config differs)`, `config`, `config (another
/// instance's differs)` (the fingerprint `registered` in the job's record
/// is not this config's), or `-`.
pub fn source_text(
    name: &str,
    defs: &[JobDef],
    config: &[JobConfig],
    registered: Option<&str>,
) -> String {
    let mine = config.iter().find(|j| j.name == name);
    match (defs.iter().find(|d| d.name == name), mine) {
        (Some(d), Some(m)) if m.doc != d.spec => format!("store v{} (config differs)", d.version),
        (Some(d), _) => format!("store v{}", d.version),
        (None, Some(m)) if registered.is_some_and(|r| r != m.job().fingerprint()) => {
            "config (another instance's differs)".into()
        }
        (None, Some(_)) => "config".into(),
        (None, None) => "-".into(),
    }
}

/// A job's JSON with where its definition comes from: `source` (`store`,
/// `config` or null), the store's `version`, and `config_differs` when the
/// config file defines it otherwise.
pub fn with_source(
    mut row: serde_json::Value,
    defs: &[baton::store::JobDef],
    source: &str,
) -> serde_json::Value {
    if let Some(o) = row.as_object_mut() {
        let name = o.get("name").and_then(|n| n.as_str()).unwrap_or_default();
        let def = defs.iter().find(|d| d.name == name);
        let kind = source.split(' ').next().filter(|k| *k != "-");
        o.insert("source".into(), serde_json::json!(kind));
        o.insert("version".into(), serde_json::json!(def.map(|d| d.version)));
        o.insert(
            "config_differs".into(),
            serde_json::json!(source.ends_with("differs)")),
        );
    }
    row
}

/// The jobs to describe: the store's definitions (valid ones) in place of
/// config jobs of the same name, then the other config jobs.
pub fn effective_jobs(defs: &[JobDef], config: &[JobConfig]) -> Vec<JobConfig> {
    let mut out: Vec<JobConfig> = defs
        .iter()
        .filter_map(|d| config_of(&d.name, &d.spec).ok())
        .collect();
    out.extend(
        config
            .iter()
            .filter(|c| !defs.iter().any(|d| d.name == c.name))
            .cloned(),
    );
    out
}

/// The flags of `baton jobs create` and `update`: a `[[job]]` table's
/// fields, or a file holding one.
#[derive(clap::Args, Debug, Default)]
pub struct DefineArgs {
    /// A TOML file with one `[[job]]` table (its `name` may be left out),
    /// instead of the flags.
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// A cron expression (5 fields, or 6 with seconds first).
    #[arg(long)]
    pub cron: Option<String>,
    /// The cron expression's time zone (IANA, e.g. Asia/Seoul).
    #[arg(long)]
    pub tz: Option<String>,
    /// An interval instead of cron, e.g. 30s, 5m.
    #[arg(long)]
    pub every: Option<String>,
    /// The queue of its runs (a worker must run it).
    #[arg(long)]
    pub queue: Option<String>,
    /// What a slot does while the previous run is unfinished.
    #[arg(long)]
    pub overlap: Option<String>,
    /// What to do with missed slots: latest, all or none.
    #[arg(long)]
    pub misfire: Option<String>,
    /// Attempts per slot.
    #[arg(long)]
    pub max_attempts: Option<i64>,
    /// Time limit per attempt, e.g. 10m.
    #[arg(long)]
    pub timeout: Option<String>,
    /// Each run up to this much after its slot, e.g. 30s.
    #[arg(long)]
    pub jitter: Option<String>,
    /// Task priority, -100..=100.
    #[arg(long, allow_negative_numbers = true)]
    pub priority: Option<i64>,
    /// The command to run and its arguments (after `--`).
    #[arg(last = true)]
    pub command: Vec<String>,
}

impl DefineArgs {
    /// The definition document the flags or the file give, not yet
    /// validated.
    pub fn doc(&self, name: &str) -> Result<Value, InvalidInput> {
        let flags = [
            ("cron", &self.cron),
            ("tz", &self.tz),
            ("every", &self.every),
            ("queue", &self.queue),
            ("overlap", &self.overlap),
            ("misfire", &self.misfire),
            ("timeout", &self.timeout),
            ("jitter", &self.jitter),
        ];
        let mut doc = Map::new();
        for (k, v) in flags {
            if let Some(v) = v {
                doc.insert(k.into(), json!(v));
            }
        }
        for (k, v) in [
            ("max_attempts", self.max_attempts),
            ("priority", self.priority),
        ] {
            if let Some(v) = v {
                doc.insert(k.into(), json!(v));
            }
        }
        if !self.command.is_empty() {
            doc.insert("command".into(), json!(self.command));
        }
        let Some(path) = &self.file else {
            return Ok(Value::Object(doc));
        };
        if !doc.is_empty() {
            return Err(InvalidInput::new(
                "--file",
                "give the job's fields in the file or as flags, not both",
            ));
        }
        file_doc(path, name)
    }
}

/// The one `[[job]]` table of a TOML file, without its name (which must be
/// `name` when given), as JSON.
fn file_doc(path: &std::path::Path, name: &str) -> Result<Value, InvalidInput> {
    let shown = path.display();
    let text = std::fs::read_to_string(path)
        .map_err(|e| InvalidInput::new("--file", format!("{shown}: {e}")))?;
    let parsed: toml::Table = toml::from_str(&text)
        .map_err(|e| InvalidInput::new("--file", format!("{shown}: {}", e.message())))?;
    let tables = match parsed.get("job") {
        Some(toml::Value::Array(a)) if parsed.len() == 1 && a.len() == 1 => a,
        _ => {
            return Err(InvalidInput::new(
                "--file",
                format!("{shown}: give exactly one [[job]] table and nothing else"),
            ))
        }
    };
    let mut doc = serde_json::to_value(&tables[0])
        .map_err(|e| InvalidInput::new("--file", format!("{shown}: {e}")))?;
    if let Some(o) = doc.as_object_mut() {
        match o.remove("name") {
            Some(Value::String(n)) if n == name => {}
            None => {}
            Some(other) => {
                return Err(InvalidInput::new(
                    "name",
                    format!("{shown} names the job {other}, not {name:?}; leave name out or make them agree"),
                ))
            }
        }
    }
    Ok(doc)
}

/// What a write did, for the operator and the exit code.
pub fn report(name: &str, verb: &str, w: JobDefWrite, json_out: bool) -> anyhow::Result<u8> {
    match w {
        JobDefWrite::Written { version } => {
            if json_out {
                crate::output::json(&json!({"name": name, "version": version, "result": verb}))?;
            } else {
                crate::outln!("job {name} {verb} (version {version})");
            }
            Ok(0)
        }
        JobDefWrite::Conflict { current } => {
            match current {
                Some(v) => crate::note!(
                    "baton: job {name:?} is at version {v} in the store; nothing {verb} (read it again with `baton jobs show {name}`, then give --version {v})"
                ),
                None => crate::note!("baton: no job {name:?} is defined in the store; nothing {verb}"),
            }
            Ok(match current {
                Some(_) => crate::EXIT_CONFLICT,
                None if verb == "created" => crate::EXIT_CONFLICT,
                None => crate::EXIT_NOT_FOUND,
            })
        }
    }
}

/// `baton jobs create|update|delete`: validate, write, audit, report.
pub async fn define(
    store: &baton::Store,
    name: &str,
    write: Define<'_>,
    json_out: bool,
) -> anyhow::Result<u8> {
    let by = format!("{} via cli", crate::pause_args::default_by());
    let (verb, action, w) = match write {
        Define::Put { args, version } => {
            let doc = args.doc(name).map_err(Error::from)?;
            config_of(name, &doc).map_err(Error::from)?;
            let w = schedule::definitions::put(store, name, &doc, version, &by).await?;
            let verb = if version.is_some() {
                "updated"
            } else {
                "created"
            };
            (verb, format!("jobs {}", &verb[..verb.len() - 1]), w)
        }
        Define::Delete { version } => {
            let w = schedule::definitions::delete(store, name, version, &by).await?;
            ("deleted", "jobs delete".to_string(), w)
        }
    };
    let outcome = match w {
        JobDefWrite::Written { version } => format!("version {version}"),
        JobDefWrite::Conflict { current: Some(v) } => format!("conflict: at version {v}"),
        JobDefWrite::Conflict { current: None } => "conflict: not defined".into(),
    };
    crate::audit_cmd::record_cli(store, None, &action, &format!("name={name}"), &outcome).await;
    report(name, verb, w, json_out)
}

/// One definition write of the CLI.
pub enum Define<'a> {
    /// Create (`version: None`) or update version `version`.
    Put {
        /// The fields.
        args: &'a DefineArgs,
        /// The version replaced.
        version: Option<i64>,
    },
    /// Delete (only version `version` when given).
    Delete {
        /// The version deleted.
        version: Option<i64>,
    },
}
