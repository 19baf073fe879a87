//! The keep-alive: extends a lease before it lapses, confirms a long
//! lease against a force-release, and marks it lost when neither works.

use super::*;

/// Keep the lease alive: extend it every [`LockOptions::renew_period`]
/// and, for a lease longer than [`RELEASE_BOUND`], confirm between
/// extensions (every [`LockOptions::confirm_period`]) that it was not
/// revoked; lost when refused, revoked, or unconfirmed by its deadline.
pub(super) async fn keep_alive(
    store: Store,
    handle: LeaseHandle,
    opts: LockOptions,
    mut deadline: Instant,
) {
    let lost = |why: &str| {
        tracing::warn!(lock = handle.name(), token = %handle.token(), reason = %why, "lease lost");
        handle.shared.lost.cancel();
    };
    let period = opts.renew_period();
    let confirm = opts.confirm_period();
    let mut next = Instant::now() + period;
    let mut next_confirm = confirm.map(|c| Instant::now() + c);
    loop {
        // A manual `Lease::extend` or a confirmation may have moved it.
        deadline = deadline.max(handle.deadline());
        let wake = next_confirm.map_or(next, |c| c.min(next)).min(deadline);
        tokio::time::sleep_until(wake).await;
        deadline = deadline.max(handle.deadline());
        if Instant::now() >= deadline {
            lost("could not extend or confirm it before it lapsed");
            return;
        }
        if let (Some(at), Some(every)) = (next_confirm, confirm) {
            if Instant::now() < next && Instant::now() >= at {
                let sent = Instant::now();
                let read = tokio::time::timeout(
                    deadline.saturating_duration_since(sent),
                    store.backend().lock_get(handle.name()),
                )
                .await;
                match read {
                    Ok(Ok(Some(info))) if info.token == handle.token() && info.held => {
                        handle.confirmed(sent);
                        next_confirm = Some(sent + every);
                    }
                    Ok(Ok(Some(info)))
                        if info.token.0 == handle.token().0.wrapping_add(1)
                            && info.holder.starts_with("revoked:") =>
                    {
                        lost("an operator released (revoked) the lock");
                        return;
                    }
                    Ok(Ok(_)) => {
                        lost("the store no longer shows this lease (lapsed, taken over or lost)");
                        return;
                    }
                    Ok(Err(e)) => {
                        crate::store::warn_unless_read_only!(e, lock = handle.name(), error = %crate::error::chain(&e), "lease confirmation failed; retrying");
                        let left = deadline.saturating_duration_since(Instant::now());
                        next_confirm = Some(
                            Instant::now()
                                + (left / 4)
                                    .clamp(Duration::from_millis(5), Duration::from_secs(1)),
                        );
                    }
                    Err(_) => {
                        lost("the store did not answer before the lease's local bound");
                        return;
                    }
                }
                continue;
            }
        }
        let sent = Instant::now();
        let attempt = tokio::time::timeout(
            deadline.saturating_duration_since(sent),
            store.backend().lock_extend(&crate::store::LockExtend {
                name: handle.name(),
                token: handle.token(),
                at_most: opts.at_most,
            }),
        )
        .await;
        match attempt {
            Ok(Ok(Some(until))) => {
                handle.set_until(until, sent);
                deadline = handle.deadline();
                next = sent + period;
                next_confirm = confirm.map(|c| sent + c);
            }
            Ok(Ok(None)) => {
                lost("the store refused the extension (lapsed, taken over or released by an operator)");
                return;
            }
            Ok(Err(e)) => {
                crate::store::warn_unless_read_only!(e, lock = handle.name(), error = %crate::error::chain(&e), "lease extension failed; retrying");
                // Retry soon, but no later than the deadline allows.
                let left = deadline.saturating_duration_since(Instant::now());
                next = Instant::now()
                    + (left / 4).clamp(Duration::from_millis(5), Duration::from_secs(1));
            }
            Err(_) => {
                lost("the store did not answer before the lease lapsed");
                return;
            }
        }
    }
}
