//! The dead man's switch: a `baton lock` / `baton work` / `baton serve`
//! process frozen (SIGSTOP of that process alone, not its command) while
//! its command runs. Nothing in the frozen process can stop the command at
//! the lease's end, so its supervisor must: the whole tree (a
//! SIGTERM-ignoring grandchild included) is gone before the lease ends by
//! the store's clock, and the instance that takes the lapsed lease over
//! never runs beside it. On every store that answers.

use crate::common;

use common::holder::{self, holder_stops_in_time, lock_holder, task_holder, Fault};
use common::{exit_within, have_bash, signal, sigterm_within, Env};

per_backend! {
    frozen_lock_holder_is_killed_before_its_lease_ends,
    frozen_worker_is_killed_before_its_lease_ends,
    frozen_lock_mode_job_is_killed_before_its_lease_ends,
}

// Each test: the scenario of [`holder_stops_in_time`] with the first
// holder's baton process SIGSTOPped alone ([`Fault::Freeze`]).

async fn frozen_lock_holder_is_killed_before_its_lease_ends(e: Env) {
    if !have_bash() {
        return;
    }
    let name = "freeze-lock";
    let (mut first, mut second) = holder_stops_in_time(
        &e,
        Fault::Freeze,
        holder::lock(&e, name),
        lock_holder(&e, name),
    )
    .await;
    // Thawed, the first holder finds its command killed and its lease
    // gone: it exits non-zero.
    signal(&first, libc::SIGCONT);
    let code = exit_within(&mut first, 15, "the thawed baton lock");
    assert_ne!(code, Some(0), "a holder whose lease lapsed does not exit 0");
    sigterm_within(&mut second, 15, "the second baton lock after SIGTERM");
}

async fn frozen_worker_is_killed_before_its_lease_ends(e: Env) {
    if !have_bash() {
        return;
    }
    let id = holder::enqueue_tree(&e);
    let (mut first, mut second) =
        holder_stops_in_time(&e, Fault::Freeze, holder::work(&e), task_holder(&e, id)).await;
    signal(&first, libc::SIGCONT);
    sigterm_within(&mut first, 15, "the thawed baton work after SIGTERM");
    sigterm_within(&mut second, 15, "the second baton work after SIGTERM");
}

async fn frozen_lock_mode_job_is_killed_before_its_lease_ends(e: Env) {
    if !have_bash() {
        return;
    }
    let name = "freeze-job";
    let (mut first, mut second) = holder_stops_in_time(
        &e,
        Fault::Freeze,
        holder::serve(&e, name, "1s"),
        lock_holder(&e, name),
    )
    .await;
    signal(&first, libc::SIGCONT);
    sigterm_within(&mut first, 15, "the thawed baton serve after SIGTERM");
    sigterm_within(&mut second, 15, "the second baton serve after SIGTERM");
}
