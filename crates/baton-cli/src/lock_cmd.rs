//! `baton lock NAME -- CMD` and `baton locks`.

use std::time::Duration;

use anyhow::Context;
use baton::lock::{LockOptions, Locker};
use baton::Error;

use crate::child::{self, Signals};
use crate::output::{self, Align, Table};
use crate::values::duration_arg;
use crate::{connect, StoreArg, EXIT_BUSY, EXIT_LEASE_LOST};

/// Arguments of `baton lock`.
#[derive(clap::Args, Debug)]
pub struct LockArgs {
    /// Lock name (1-255 bytes, no control characters).
    pub name: String,
    #[command(flatten)]
    pub store: StoreArg,
    /// The lease lapses this long after its last extension if baton dies.
    #[arg(long, default_value = "15m", value_parser = duration_arg)]
    pub at_most: Duration,
    /// Keep the lock at least this long after it was taken, even if CMD ends sooner.
    #[arg(long, default_value = "0s", value_parser = duration_arg)]
    pub at_least: Duration,
    /// Wait up to this long for the lock instead of giving up at once.
    #[arg(long, value_parser = duration_arg)]
    pub wait: Option<Duration>,
    /// How long CMD gets between SIGTERM and SIGKILL. When the lease cannot
    /// be extended, CMD gets SIGTERM this long before the lease could lapse
    /// and SIGKILL at the lapse. Must be shorter than --at-most, and at
    /// most 20s when --at-most is longer than 30s (such a lease is bounded
    /// by its last confirmation + 30s, the force-release bound) [default:
    /// 10s, or a third of --at-most if that is shorter].
    #[arg(long, value_parser = duration_arg)]
    pub grace: Option<Duration>,
    /// The command to run, after `--`.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

/// The default `--grace`.
const GRACE: Duration = Duration::from_secs(10);

/// `baton lock`.
pub async fn lock(a: LockArgs) -> anyhow::Result<u8> {
    baton::names::validate_name("lock name", &a.name).map_err(Error::from)?;
    if a.at_most.is_zero() {
        return Err(Error::from(baton::InvalidInput::new(
            "--at-most",
            "must be greater than 0 (e.g. 30s, 15m, PT15M)",
        ))
        .into());
    }
    if a.at_most < crate::MIN_LOCK_AT_MOST {
        return Err(Error::from(baton::InvalidInput::new(
            "--at-most",
            format!(
                "{} is too short for a lease; use at least {} (e.g. 30s, 15m): the keep-alive and stopping the command need time",
                baton::format_duration(a.at_most),
                baton::format_duration(crate::MIN_LOCK_AT_MOST)
            ),
        ))
        .into());
    }
    let grace = match a.grace {
        Some(g) if g >= a.at_most => {
            return Err(Error::from(baton::InvalidInput::new(
                "--grace",
                format!(
                    "{} is not shorter than --at-most {}; the command is stopped --grace before the lease can lapse, so give a --grace shorter than --at-most (e.g. --at-most 15m --grace 10s)",
                    baton::format_duration(g),
                    baton::format_duration(a.at_most)
                ),
            ))
            .into());
        }
        // A lease longer than the force-release bound confirms itself and
        // is bounded by its last confirmation + that bound: the command
        // must be able to stop well within it.
        Some(g)
            if a.at_most > baton::lock::RELEASE_BOUND && g > baton::lock::RELEASE_BOUND * 2 / 3 =>
        {
            return Err(Error::from(baton::InvalidInput::new(
                "--grace",
                format!(
                    "{} is longer than {}: a lock longer than {} is stopped {} after a force-release at the latest (and when the store cannot confirm it for that long), so give a --grace of at most {}",
                    baton::format_duration(g),
                    baton::format_duration(baton::lock::RELEASE_BOUND * 2 / 3),
                    baton::format_duration(baton::lock::RELEASE_BOUND),
                    baton::format_duration(baton::lock::RELEASE_BOUND),
                    baton::format_duration(baton::lock::RELEASE_BOUND * 2 / 3),
                ),
            ))
            .into());
        }
        Some(g) => g,
        None => GRACE.min(a.at_most / 3),
    };
    // Extensions come early enough that SIGTERM (`grace` before the stop
    // margin) is never reached while they succeed.
    let margin = grace + baton::lease::stop_margin(a.at_most);
    let opts = LockOptions::new(a.at_most)
        .at_least(a.at_least)
        .renew_margin(if margin < a.at_most { margin } else { grace });
    opts.validate().map_err(|mut e| {
        e.field = format!("--{}", e.field.replace('_', "-"));
        Error::from(e)
    })?;
    // `connect` names the store in its errors.
    let store = connect(&a.store).await?;
    crate::note_store_warnings(&store).await;
    let locker = Locker::new(store);
    let wait = a.wait.unwrap_or(Duration::ZERO);
    // Try at once; when it is held and we may wait, say so before waiting.
    let first = match locker.lock(&a.name, &opts, Duration::ZERO).await {
        Err(Error::Busy {
            holder,
            until,
            token,
            ..
        }) if !wait.is_zero() => {
            crate::note!(
                "baton: lock {:?} is held by {holder} until {} (token {token}); waiting up to {} for it",
                a.name,
                output::ts(until),
                baton::format_duration(wait)
            );
            output::progress(
                format!("baton: waiting for lock {:?}", a.name),
                locker.lock(&a.name, &opts, wait),
            )
            .await
        }
        other => other,
    };
    let lease = match first {
        Ok(lease) => lease,
        Err(Error::Busy {
            name,
            holder,
            until,
            token,
        }) => {
            if token == 0 {
                // No baton grant has token 0: a value baton did not write
                // holds the lock's key (the holder says what it is).
                crate::note!("baton: lock {name:?} is held by {holder}; not running the command");
            } else {
                crate::note!("baton: lock {name:?} is held by {holder} until {} (token {token}); not running the command", output::ts(until));
            }
            return Ok(EXIT_BUSY);
        }
        Err(e) => return Err(anyhow::Error::from(e).context(format!("lock {:?}", a.name))),
    };
    tracing::info!(lock = %a.name, token = %lease.token(), "lock acquired");
    let mut signals = Signals::new()?;
    let env = [
        ("BATON_LOCK_NAME", a.name.clone()),
        ("BATON_FENCING_TOKEN", lease.token().to_string()),
        ("BATON_LOCK_HOLDER", lease.holder().to_string()),
    ];
    // The dead man's switch: the supervisor kills the tree at the lease's
    // stop-by instant by itself unless an extension moved it on, so even a
    // frozen baton never lets the command outlive the lease.
    let mut cmd = match child::spawn(
        &a.command,
        &env,
        child::Capture::Nothing,
        grace,
        Some(lease.watch_stop_by()),
    ) {
        Ok(c) => c,
        Err(e) => {
            let _ = lease.release().await;
            return Err(e);
        }
    };
    cmd.report_stop(crate::child::RanFor {
        task: None,
        token: i64::try_from(lease.token().0).ok(),
    });
    let handle = lease.handle();
    // SIGTERM sent because the lease could not be extended in time.
    let mut at_risk = false;
    // A SIGTERM/SIGINT already forwarded: the next one kills.
    let mut stopping = false;
    let status = loop {
        // Re-read on every turn: each extension moves it forward.
        let deadline = handle.deadline();
        // SIGKILL a little before the deadline (see `stop_by`), SIGTERM
        // `grace` before that.
        let kill_at = handle.stop_by();
        let term_at = kill_at.checked_sub(grace).unwrap_or(kill_at);
        tokio::select! {
            st = cmd.wait() => break st.context("waiting for the command")?,
            sig = signals.recv() => {
                if stopping && sig != libc::SIGHUP {
                    crate::note!("baton: signal {sig} again: killing the command");
                    let _ = cmd.kill().await;
                    release_quietly(lease, &a.name).await;
                    return Ok(128 + sig as u8);
                }
                stopping |= sig != libc::SIGHUP;
                cmd.signal(sig);
            }
            _ = tokio::time::sleep_until(term_at), if !at_risk => {
                if handle.deadline() > deadline {
                    continue; // extended meanwhile
                }
                crate::note!("baton: could not extend the lease on {:?} (token {}); stopping the command {} before it could lapse", a.name, handle.token(), baton::format_duration(grace));
                at_risk = true;
                cmd.signal(libc::SIGTERM);
            }
            _ = tokio::time::sleep_until(kill_at) => {
                if handle.deadline() > deadline {
                    continue;
                }
                crate::note!("baton: the lease on {:?} (token {}) may have lapsed; killing the command", a.name, handle.token());
                let _ = cmd.kill().await;
                return Ok(EXIT_LEASE_LOST);
            }
            _ = handle.lost() => {
                crate::note!("baton: lease on {:?} (token {}) was lost while the command ran; killing it", a.name, handle.token());
                let _ = cmd.kill().await;
                return Ok(EXIT_LEASE_LOST);
            }
        }
    };
    let code = child::code_of(status);
    // Bounded: when the store is dark the lease lapses by itself anyway.
    let bound = handle
        .deadline()
        .saturating_duration_since(tokio::time::Instant::now())
        .max(Duration::from_secs(1));
    let released = match tokio::time::timeout(bound, lease.release()).await {
        Ok(r) => r,
        Err(_) => Err(Error::Store(baton::StoreError::Unavailable(
            "no answer".into(),
        ))),
    };
    match released {
        Ok(()) if at_risk => Ok(EXIT_LEASE_LOST),
        Ok(()) => Ok(code),
        Err(Error::LeaseLost(_)) => {
            crate::note!("baton: lease on {:?} had lapsed before the command finished (exit {code}); another holder may have run meanwhile", a.name);
            Ok(EXIT_LEASE_LOST)
        }
        Err(e) => {
            // The command finished; the lease lapses by itself at at_most.
            crate::note!(
                "baton: could not release lock {:?}: {e}; it lapses by itself at its at_most",
                a.name
            );
            Ok(if at_risk { EXIT_LEASE_LOST } else { code })
        }
    }
}

/// Release after a forced stop; failures only logged.
async fn release_quietly(lease: baton::lock::Lease, name: &str) {
    match tokio::time::timeout(Duration::from_secs(5), lease.release()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => crate::note!("baton: could not release lock {name:?}: {e}"),
        Err(_) => crate::note!("baton: could not release lock {name:?}: the store did not answer"),
    }
}

/// Arguments of `baton locks`.
#[derive(clap::Args, Debug)]
pub struct LocksArgs {
    #[command(flatten)]
    pub store: StoreArg,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `baton locks`.
pub async fn locks(a: LocksArgs) -> anyhow::Result<u8> {
    let store = connect(&a.store).await.context("connecting to the store")?;
    let list = Locker::new(store).list().await?;
    if a.json {
        let rows: Vec<_> = list.iter().map(crate::shapes::lock).collect();
        output::json(&serde_json::Value::Array(rows))?;
        return Ok(0);
    }
    let mut t = Table::new(&[
        ("NAME", Align::Left),
        ("HOLDER", Align::Left),
        ("TOKEN", Align::Right),
        ("LOCKED_AT", Align::Left),
        ("LOCK_UNTIL", Align::Left),
        ("STATE", Align::Left),
    ]);
    for l in list {
        t.row(vec![
            l.name,
            l.holder,
            l.token.0.to_string(),
            output::ts(l.locked_at),
            output::ts(l.lock_until),
            if l.held { "held" } else { "expired" }.into(),
        ]);
    }
    t.print()?;
    Ok(0)
}
