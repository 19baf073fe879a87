//! `baton jobs`: list the jobs (policy, misfire, next fire times, pause
//! note), show one, pause or resume one with a note, print its next fire
//! times, backfill a range of its slots.

use anyhow::Context;
use baton::schedule;
use baton::Error;

use crate::output::{self, Align, Table};
use crate::pause_args::{pause_note, PauseNoteArgs};
use crate::stored_jobs::Define;

/// Arguments of `baton jobs`.
#[derive(clap::Args, Debug)]
pub struct JobsArgs {
    #[command(subcommand)]
    pub cmd: Option<JobsCmd>,
    #[command(flatten)]
    pub store: crate::StoreArg,
    /// Print JSON.
    #[arg(long, global = true)]
    pub json: bool,
}

/// `baton jobs pause|resume|show|next|backfill|create|update|delete`.
#[derive(clap::Subcommand, Debug)]
pub enum JobsCmd {
    /// Define a job in the store: every `baton serve`/`work` on the store
    /// runs it within seconds (a config job of the same name gives way).
    /// The fields are a `[[job]]` table's, as flags or `--file`; the
    /// command after `--`.
    Create {
        /// The job's name.
        job: String,
        #[command(flatten)]
        def: crate::stored_jobs::DefineArgs,
    },
    /// Replace a job's definition in the store (the whole of it), from its
    /// next slot on. Refused unless --version is the version in the store,
    /// so two operators cannot overwrite each other's change unseen.
    Update {
        /// The job's name.
        job: String,
        /// The version replaced (`baton jobs show JOB`).
        #[arg(long)]
        version: i64,
        #[command(flatten)]
        def: crate::stored_jobs::DefineArgs,
    },
    /// Delete a job's definition from the store: it stops everywhere
    /// within seconds (a run in progress finishes).
    Delete {
        /// The job's name.
        job: String,
        /// Only if this is the version in the store.
        #[arg(long)]
        version: Option<i64>,
    },
    /// Stop enqueueing a job's slots, cluster-wide.
    Pause {
        /// The job's name (as in the config file and `baton jobs`).
        job: String,
        #[command(flatten)]
        why: PauseNoteArgs,
    },
    /// Resume a paused job (missed slots follow its misfire policy).
    Resume {
        /// The job's name.
        job: String,
        #[command(flatten)]
        why: PauseNoteArgs,
    },
    /// Print one job: queue, schedule, overlap and misfire policies, its
    /// pause flag with the last pause or resume (note, by, at), last slot,
    /// next fire times in its zone (with --config) and last run.
    Show {
        /// The job's name.
        job: String,
    },
    /// Print a job's next fire times (from `--config`) in its own time
    /// zone, with the offset and zone abbreviation, so a daylight saving
    /// change shows; computed from the store's clock.
    Next {
        /// The job's name (in the config file).
        job: String,
        /// How many fire times.
        #[arg(short = 'n', long = "count", default_value_t = 5,
              value_parser = clap::value_parser!(u32).range(1..=1000))]
        count: u32,
    },
    /// Run each of a job's past slots from --from to --to once (the job's
    /// schedule from --config): slots with no run are enqueued, due now;
    /// slots that already ran, are pending or running, or were cancelled
    /// are left alone and reported; skipped slots are reported (or run
    /// once with --run-skipped). Repeating a backfill enqueues nothing new.
    Backfill {
        /// The job's name (in the config file).
        job: String,
        /// The range's first instant (RFC 3339, inclusive).
        #[arg(long, value_parser = crate::values::rfc3339_arg)]
        from: chrono::DateTime<chrono::Utc>,
        /// The range's last instant (RFC 3339, inclusive); not after now.
        #[arg(long, value_parser = crate::values::rfc3339_arg)]
        to: chrono::DateTime<chrono::Utc>,
        /// The most slots the range may hold; a range with more is refused
        /// whole (nothing enqueued).
        #[arg(long, default_value_t = baton::schedule::BACKFILL_DEFAULT_MAX)]
        max: usize,
        /// Print what would be done; enqueue nothing.
        #[arg(long)]
        dry_run: bool,
        /// Also run the slots the scheduler skipped, once each.
        #[arg(long)]
        run_skipped: bool,
    },
}

/// `baton jobs`.
pub async fn jobs(a: JobsArgs) -> anyhow::Result<u8> {
    let cfg = a.store.config()?;
    if let Some(JobsCmd::Pause { job, why } | JobsCmd::Resume { job, why }) = &a.cmd {
        baton::names::validate_name("JOB", job).map_err(Error::from)?;
        pause_note(why, &why.recorded_by()).map_err(Error::from)?;
    }
    if let Some(JobsCmd::Show { job }) = &a.cmd {
        baton::names::validate_name("JOB", job).map_err(Error::from)?;
    }
    if let Some(JobsCmd::Next { job, .. } | JobsCmd::Backfill { job, .. }) = &a.cmd {
        baton::names::validate_name("JOB", job).map_err(Error::from)?;
    }
    let write = match &a.cmd {
        Some(JobsCmd::Create { job, def }) => Some((
            job,
            Define::Put {
                args: def,
                version: None,
            },
        )),
        Some(JobsCmd::Update { job, version, def }) => Some((
            job,
            Define::Put {
                args: def,
                version: Some(*version),
            },
        )),
        Some(JobsCmd::Delete { job, version }) => Some((job, Define::Delete { version: *version })),
        _ => None,
    };
    if let Some((job, _)) = &write {
        baton::names::validate_name("JOB", job).map_err(Error::from)?;
    }
    let store = crate::connect_resolved(&a.store.resolve(cfg.as_ref()), true)
        .await
        .context("connecting to the store")?;
    if let Some((job, w)) = write {
        return crate::stored_jobs::define(&store, job, w, a.json).await;
    }
    if let Some(JobsCmd::Next { job, count }) = &a.cmd {
        let j = &job_named(&store, cfg.as_ref(), job, "next").await?;
        let now = store.now().await.map_err(Error::from)?;
        let lib = j.job();
        let fires = lib.next_fires(now, *count as usize);
        // With jitter, when each slot's run is due (the slot plus its offset).
        let runs =
            |at| output::ts(at + chrono::Duration::from_std(lib.jitter_at(at)).unwrap_or_default());
        if a.json {
            output::json(&serde_json::json!({
                "job": job,
                "schedule": j.schedule.to_string(),
                "next": fires.iter().map(|f| serde_json::json!({
                    "at": output::ts(f.at), "local": f.local, "zone": f.zone, "dst": f.dst,
                    "runs_at": runs(f.at),
                })).collect::<Vec<_>>(),
            }))?;
            return Ok(0);
        }
        crate::outln!("{job}: {}", j.schedule);
        let jittered = !lib.jitter.is_zero();
        let mut cols = vec![
            ("FIRE (JOB'S ZONE)", Align::Left),
            ("ZONE", Align::Left),
            ("UTC", Align::Left),
        ];
        if jittered {
            cols.push(("RUNS AT (UTC, WITH JITTER)", Align::Left));
        }
        let mut table = Table::new(&cols);
        for f in fires {
            let zone = if f.dst {
                format!("{} (DST)", f.zone)
            } else {
                f.zone
            };
            let mut row = vec![f.local, zone, output::ts(f.at)];
            if jittered {
                row.push(runs(f.at));
            }
            table.row(row);
        }
        table.print()?;
        return Ok(0);
    }
    if let Some(JobsCmd::Backfill {
        job,
        from,
        to,
        max,
        dry_run,
        run_skipped,
    }) = &a.cmd
    {
        let j = &job_named(&store, cfg.as_ref(), job, "backfill").await?;
        let b = schedule::Backfill::new(*from, *to)
            .max(*max)
            .dry_run(*dry_run)
            .run_skipped(*run_skipped);
        let done = schedule::backfill(&store, &j.job(), &b)
            .await
            .map_err(backfill_flags)?;
        if !*dry_run {
            let target = format!(
                "name={job} from={} to={}",
                baton::format_time(*from),
                baton::format_time(*to)
            );
            let outcome = format!(
                "{} enqueued",
                done.iter().filter(|s| s.runs_now(&b)).count()
            );
            crate::audit_cmd::record_cli(&store, None, "jobs backfill", &target, &outcome).await;
        }
        print_backfill(job, &b, &done, a.json)?;
        return Ok(0);
    }
    let toggle = match &a.cmd {
        Some(JobsCmd::Pause { job, why }) => Some((job, why, true)),
        Some(JobsCmd::Resume { job, why }) => Some((job, why, false)),
        _ => None,
    };
    if let Some((job, why, paused)) = toggle {
        let by = why.recorded_by();
        let note = pause_note(why, &by).map_err(Error::from)?;
        if schedule::set_paused_with(&store, job, paused, note).await? {
            let who = why.who();
            let action = if paused { "jobs pause" } else { "jobs resume" };
            let target = format!("name={job}");
            crate::audit_cmd::record_cli(&store, Some(&who), action, &target, "done").await;
            crate::outln!(
                "job {job} {} (by {by})",
                if paused { "paused" } else { "resumed" }
            );
            return Ok(0);
        }
        crate::note!(
            "baton: no job {job:?} in this store (it appears once a scheduler has run it)"
        );
        return Ok(crate::EXIT_NOT_FOUND);
    }
    let now = store.now().await.map_err(Error::from)?;
    let own_jobs = cfg.as_ref().map_or(&[][..], |c| &c.jobs[..]);
    // The store's definitions stand in for config jobs of the same name.
    let defs = schedule::definitions::list(&store).await?;
    let effective = crate::stored_jobs::effective_jobs(&defs, own_jobs);
    let cfg_jobs = &effective[..];
    let source = |s: &schedule::JobStatus| {
        let registered = s.state.fingerprint.as_deref();
        crate::stored_jobs::source_text(&s.state.name, &defs, own_jobs, registered)
    };
    let mut statuses =
        crate::shapes::with_config_jobs(schedule::job_statuses(&store).await?, cfg_jobs);
    let cfg_of = |name: &str| cfg_jobs.iter().find(|j| j.name == name);
    if let Some(JobsCmd::Show { job }) = &a.cmd {
        statuses.retain(|s| &s.state.name == job);
        let Some(s) = statuses.first() else {
            crate::note!("baton: no job {job:?} in this store or the config file");
            return Ok(crate::EXIT_NOT_FOUND);
        };
        let j = cfg_of(job);
        if a.json {
            output::json(&crate::stored_jobs::with_source(
                crate::shapes::job(s, j, now),
                &defs,
                &source(s),
            ))?;
        } else {
            print_show(s, j, now, cfg.is_some())?;
            crate::outln!("{:<11}{}", "source:", source(s));
        }
        return Ok(0);
    }
    if a.json {
        let rows: Vec<_> = statuses
            .iter()
            .map(|s| {
                let row = crate::shapes::job(s, cfg_of(&s.state.name), now);
                crate::stored_jobs::with_source(row, &defs, &source(s))
            })
            .collect();
        output::json(&serde_json::Value::Array(rows))?;
        return Ok(0);
    }
    let mut table = Table::new(&[
        ("JOB", Align::Left),
        ("SOURCE", Align::Left),
        ("PAUSED", Align::Left),
        ("OVERLAP", Align::Left),
        ("MISFIRE", Align::Left),
        ("LAST SLOT", Align::Left),
        ("NEXT FIRE", Align::Left),
        ("LAST RUN", Align::Left),
        ("PAUSE NOTE", Align::Left),
    ]);
    for s in statuses {
        let j = cfg_of(&s.state.name);
        // Next fire in the job's own zone (with its offset) for cron jobs.
        let next = j
            .and_then(|j| crate::shapes::next_fire(j, now))
            .unwrap_or_else(|| no_config(cfg.is_some()));
        let overlap = j
            .map(|j| j.overlap)
            .or(s.state.overlap)
            .map_or_else(|| "-".to_string(), |o| o.to_string());
        table.row(vec![
            s.state.name.clone(),
            source(&s),
            s.state.paused.to_string(),
            overlap,
            j.map_or_else(|| "-".to_string(), |j| j.misfire.to_string()),
            output::ts_or_dash(s.state.last_slot),
            next,
            last_run_text(s.last_run.as_ref()),
            crate::shapes::pause_text(s.state.pause_change.as_ref()),
        ]);
    }
    table.print()?;
    Ok(0)
}

/// What a column that needs the job's config says without it.
fn no_config(have_config: bool) -> String {
    if have_config { "-" } else { "(give --config)" }.into()
}

/// A job's last run in one line: `task ID SLOT STATE (attempt N): error`.
fn last_run_text(t: Option<&baton::store::TaskInfo>) -> String {
    let Some(t) = t else { return "-".into() };
    let why = match (&t.state, &t.last_error) {
        (baton::store::TaskState::Failed | baton::store::TaskState::Cancelled, Some(e)) => {
            format!(": {e}")
        }
        _ => String::new(),
    };
    format!(
        "task {} {} {} (attempt {}){why}",
        t.id,
        output::ts_or_dash(t.slot),
        t.state,
        t.attempt
    )
}

/// `baton jobs show JOB`: one field a line.
fn print_show(
    s: &schedule::JobStatus,
    j: Option<&crate::config::JobConfig>,
    now: chrono::DateTime<chrono::Utc>,
    have_config: bool,
) -> anyhow::Result<()> {
    let st = &s.state;
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let overlap = j.map(|j| j.overlap).or(st.overlap).map(|o| o.to_string());
    let mut lines = vec![
        ("job", st.name.clone()),
        (
            "queue",
            or_dash(j.map(|j| j.queue.clone()).or(st.queue.clone())),
        ),
        (
            "schedule",
            j.map_or_else(|| no_config(have_config), |j| j.schedule.to_string()),
        ),
        ("overlap", or_dash(overlap)),
        (
            "misfire",
            j.map_or_else(|| no_config(have_config), |j| j.misfire.to_string()),
        ),
        ("paused", st.paused.to_string()),
        (
            if st.paused { "paused" } else { "resumed" },
            crate::shapes::pause_text(st.pause_change.as_ref()),
        ),
        ("last slot", output::ts_or_dash(st.last_slot)),
    ];
    match j {
        Some(j) => {
            for f in j.job().next_fires(now, crate::shapes::NEXT_FIRES) {
                let dst = if f.dst { " (DST)" } else { "" };
                lines.push(("next fire", format!("{} {}{dst}", f.local, f.zone)));
            }
        }
        None => lines.push(("next fire", no_config(have_config))),
    }
    lines.push(("last run", last_run_text(s.last_run.as_ref())));
    for (k, v) in lines {
        crate::outln!("{:<11}{v}", format!("{k}:"));
    }
    Ok(())
}

/// The library's field names as this command's flags (`to` → `--to`).
fn backfill_flags(e: baton::Error) -> anyhow::Error {
    match e {
        baton::Error::Invalid(mut i) if ["from", "to", "max"].contains(&i.field.as_str()) => {
            i.field = format!("--{}", i.field);
            i.problem = i.problem.replace("raise max", "raise --max");
            Error::from(i).into()
        }
        e => e.into(),
    }
}

/// `baton jobs backfill`'s answer: a row a slot and a summary line (or
/// JSON: the slots and the counts).
fn print_backfill(
    job: &str,
    b: &schedule::Backfill,
    done: &[schedule::BackfilledSlot],
    json: bool,
) -> anyhow::Result<()> {
    let runs = done.iter().filter(|s| s.runs_now(b)).count();
    let left = done.len() - runs;
    if json {
        output::json(&crate::shapes::backfilled(job, b, done))?;
        return Ok(());
    }
    let mut table = Table::new(&[
        ("SLOT", Align::Left),
        ("TASK", Align::Right),
        ("BACKFILL", Align::Left),
        ("STATE", Align::Left),
        ("NOTE", Align::Left),
    ]);
    for s in done {
        let verb = match (s.runs_now(b), b.dry_run) {
            (true, true) => "would run",
            (true, false) => "enqueued",
            (false, _) => "left alone",
        };
        let (id, state, note) = match &s.run {
            None => (String::new(), String::new(), String::new()),
            Some(r) => (
                r.id.to_string(),
                r.outcome.as_str().to_string(),
                match (r.pruned, &r.reason) {
                    (true, Some(why)) => format!("pruned; {why}"),
                    (true, None) => "pruned".into(),
                    (false, Some(why)) if !r.inserted => why.clone(),
                    _ => String::new(),
                },
            ),
        };
        table.row(vec![output::ts(s.slot), id, verb.into(), state, note]);
    }
    table.print()?;
    crate::note!(
        "baton: backfill of {job} from {} to {}: {} slots, {runs} {}, {left} left alone{}",
        output::ts(b.from),
        output::ts(b.to),
        done.len(),
        if b.dry_run {
            "would be enqueued"
        } else {
            "enqueued"
        },
        if b.dry_run {
            " (dry run: nothing enqueued)"
        } else {
            ""
        }
    );
    Ok(())
}

/// The job `name` as `baton serve` runs it: the store's definition, else
/// the config file's job; exit 2 naming `JOB` when neither has it.
async fn job_named(
    store: &baton::Store,
    cfg: Option<&crate::config::Config>,
    name: &str,
    what: &str,
) -> anyhow::Result<crate::config::JobConfig> {
    let defs = schedule::definitions::list(store).await?;
    let config = cfg.map(|c| c.jobs.as_slice()).unwrap_or_default();
    crate::stored_jobs::effective_jobs(&defs, config)
        .into_iter()
        .find(|j| j.name == name)
        .ok_or_else(|| {
            Error::from(baton::InvalidInput::new(
                "JOB",
                format!(
                    "{name:?} is not a job of the config file{} nor defined in the store; \
                     `baton jobs {what}` reads the job's schedule from --config FILE (or env \
                     BATON_CONFIG) or the store's definitions (`baton jobs create`)",
                    if cfg.is_some() { "" } else { " (none given)" }
                ),
            ))
            .into()
        })
}
