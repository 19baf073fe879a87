//! `--note` and `--by` of `baton jobs pause|resume` and `baton queues
//! pause|resume`: what the change records besides the flag.

use baton::store::PauseNote;

/// A pause's or resume's note and author.
#[derive(clap::Args, Debug, Clone)]
pub struct PauseNoteArgs {
    /// Why: kept with the change and shown by `baton jobs`, `baton
    /// queues`, the admin API and the dashboard (at most 1000 bytes; a
    /// later pause or resume replaces it).
    #[arg(long, value_name = "TEXT")]
    pub note: Option<String>,
    /// Who, recorded as "NAME via cli" (default: `$USER@HOSTNAME`, or
    /// `$USERNAME@HOSTNAME`, or `unknown@HOSTNAME`)
    #[arg(long, value_name = "NAME")]
    pub by: Option<String>,
}

impl PauseNoteArgs {
    /// Who: `--by`, else [`default_by`].
    pub fn who(&self) -> String {
        self.by.clone().unwrap_or_else(default_by)
    }

    /// The author as recorded: `NAME via cli`.
    pub fn recorded_by(&self) -> String {
        format!("{} via cli", self.who())
    }
}

/// `$USER@hostname` (or `$USERNAME`, or `unknown`), the default `--by`.
pub fn default_by() -> String {
    let user = ["USER", "USERNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|u| !u.trim().is_empty()))
        .unwrap_or_else(|| "unknown".into());
    format!("{user}@{}", baton::node::host_name())
}

/// `args`' note and author (`by`, as [`PauseNoteArgs::recorded_by`] made
/// it), checked: a bad one is refused naming `--note` or `--by` and the
/// accepted form.
pub fn pause_note<'a>(
    args: &'a PauseNoteArgs,
    by: &'a str,
) -> Result<PauseNote<'a>, baton::InvalidInput> {
    let flag = |mut e: baton::InvalidInput| {
        e.field = format!("--{}", e.field);
        e
    };
    // The name as given (an empty one is refused), then as recorded.
    PauseNote {
        note: args.note.as_deref(),
        by: args.by.as_deref(),
    }
    .validate()
    .map_err(flag)?;
    let n = PauseNote {
        note: args.note.as_deref(),
        by: Some(by),
    };
    n.validate().map_err(flag)?;
    Ok(n)
}
