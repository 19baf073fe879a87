//! `baton audit`: the audit log, newest first — who did what to which
//! target, from where, and how it ended (the admin API's and the
//! dashboard's writes and the CLI's operator commands).

use anyhow::Context;
use baton::store::{AuditPage, AuditRecord};

use crate::output::{self, Align, Table};
use crate::{connect, StoreArg};

/// Arguments of `baton audit`.
#[derive(clap::Args, Debug)]
pub struct AuditArgs {
    #[command(flatten)]
    store: StoreArg,
    /// Only records with ids below this (the previous page's last id).
    #[arg(long, value_name = "ID", value_parser = clap::value_parser!(i64).range(1..))]
    before: Option<i64>,
    /// At most this many records (1 to 10000).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=crate::queue_cmd::MAX_LIMIT as i64))]
    limit: u32,
    /// Print a JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

/// Run `baton audit`.
pub async fn run(a: AuditArgs) -> anyhow::Result<u8> {
    let store = connect(&a.store).await.context("connecting to the store")?;
    let page = AuditPage {
        before_id: a.before,
        limit: a.limit,
    };
    let records = baton::audit::list(&store, &page).await?;
    if a.json {
        output::json(&crate::shapes::audit(&records)?)?;
        return Ok(0);
    }
    let mut t = Table::new(&[
        ("ID", Align::Right),
        ("AT", Align::Left),
        ("ACTOR", Align::Left),
        ("SOURCE", Align::Left),
        ("ACTION", Align::Left),
        ("TARGET", Align::Left),
        ("OUTCOME", Align::Left),
    ]);
    for r in &records {
        let AuditRecord {
            id,
            at,
            actor,
            action,
            target,
            source,
            outcome,
        } = r;
        t.row(vec![
            id.to_string(),
            output::ts(*at),
            actor.clone(),
            source.clone(),
            action.clone(),
            target.clone(),
            outcome.clone(),
        ]);
    }
    t.print()?;
    Ok(0)
}

/// Record an operator command of the CLI in the audit log: `actor` (a
/// pause's `--by`, else `$USER@HOSTNAME`), `action` (`tasks retry`),
/// `target` (`id=42`), source `cli`, `outcome`. A record that cannot be
/// written is logged, never fails the command (its change is made).
pub async fn record_cli(
    store: &baton::Store,
    actor: Option<&str>,
    action: &str,
    target: &str,
    outcome: &str,
) {
    let me = crate::pause_args::default_by();
    let entry = baton::store::AuditAppend {
        actor: actor.unwrap_or(&me),
        action,
        target,
        source: "cli",
        outcome,
    };
    if let Err(e) = baton::audit::record(store, &entry).await {
        tracing::warn!(error = %baton::error::chain(&e), %action, %target, "could not record this command in the audit log");
    }
}
