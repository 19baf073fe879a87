//! L1 mutual exclusion, L2 fencing, L3 at_most / at_least, and the lock API.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton::lock::{LockOptions, Locker};
use baton::{Error, FencingToken};

use baton_testkit::clock;

use crate::TestStore;

fn opts(at_most_ms: u64) -> LockOptions {
    LockOptions::new(Duration::from_millis(at_most_ms))
}

pub async fn grant_busy_release(ts: TestStore) {
    let a = Locker::new(ts.store.clone());
    let b = Locker::new(ts.open().await);
    let lease = a
        .try_lock("job", &opts(10_000))
        .await
        .unwrap()
        .expect("free lock is granted");
    assert_eq!(lease.name(), "job");
    assert!(lease.holder().starts_with(&baton::node::node_id()));
    assert!(lease.expires_at() > lease.locked_at());
    assert!(
        b.try_lock("job", &opts(10_000)).await.unwrap().is_none(),
        "busy lock is skipped"
    );
    match b.lock("job", &opts(10_000), Duration::ZERO).await {
        Err(Error::Busy { holder, token, .. }) => {
            assert_eq!(holder, lease.holder());
            assert_eq!(token, lease.token().0);
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    lease.release().await.unwrap();
    let again = b
        .try_lock("job", &opts(10_000))
        .await
        .unwrap()
        .expect("released lock is free");
    assert_ne!(again.holder(), "", "holder recorded");
    again.release().await.unwrap();
}

pub async fn tokens_strictly_increase(ts: TestStore) {
    let lockers = [Locker::new(ts.store.clone()), Locker::new(ts.open().await)];
    let mut last = FencingToken(0);
    for i in 0..40 {
        let lease = lockers[i % 2]
            .try_lock("fence", &opts(10_000))
            .await
            .unwrap()
            .expect("free");
        assert!(
            lease.token() > last,
            "token {} after {}",
            lease.token(),
            last
        );
        last = lease.token();
        lease.release().await.unwrap();
    }
    // A different name has its own sequence but also never repeats itself.
    let other = lockers[0]
        .try_lock("fence-2", &opts(10_000))
        .await
        .unwrap()
        .unwrap();
    other.release().await.unwrap();
    let again = lockers[1]
        .try_lock("fence", &opts(10_000))
        .await
        .unwrap()
        .unwrap();
    assert!(again.token() > last);
}

/// One grant as seen by its holder: (token, start, end) on one monotonic clock.
type Ledger = Arc<Mutex<Vec<(FencingToken, Instant, Instant)>>>;

/// Sort by start; every grant must end before the next starts, and tokens
/// must rise in that order.
pub fn assert_no_overlap(ledger: &[(FencingToken, Instant, Instant)]) {
    let mut v = ledger.to_vec();
    v.sort_by_key(|e| e.1);
    for w in v.windows(2) {
        assert!(
            w[0].2 <= w[1].1,
            "two holders at once: {:?} overlaps {:?}",
            w[0].0,
            w[1].0
        );
        assert!(
            w[0].0 < w[1].0,
            "token did not rise: {:?} then {:?}",
            w[0].0,
            w[1].0
        );
    }
}

pub async fn mutual_exclusion_16_contenders(ts: TestStore) {
    const CONTENDERS: usize = 16;
    const ROUNDS: usize = 200;
    let ledger: Ledger = Arc::default();
    let mut handles = Vec::new();
    let mut stores = vec![ts.store.clone()];
    for _ in 0..3 {
        stores.push(ts.open().await);
    }
    for c in 0..CONTENDERS {
        let locker = Locker::new(stores[c % stores.len()].clone());
        let ledger = ledger.clone();
        handles.push(tokio::spawn(async move {
            let mut won = 0;
            while won < ROUNDS {
                match locker.try_lock("contended", &opts(30_000)).await {
                    Ok(Some(lease)) => {
                        let start = Instant::now();
                        tokio::task::yield_now().await;
                        let end = Instant::now();
                        ledger.lock().unwrap().push((lease.token(), start, end));
                        lease.release().await.unwrap();
                        won += 1;
                    }
                    Ok(None) => {
                        tokio::time::sleep(Duration::from_micros(200 + fastrand_like(c) % 800))
                            .await
                    }
                    Err(e) if matches!(&e, Error::Store(s) if s.is_retryable()) => {
                        tokio::time::sleep(Duration::from_millis(5)).await
                    }
                    Err(e) => panic!("contender {c}: {e}"),
                }
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let ledger = ledger.lock().unwrap();
    assert_eq!(ledger.len(), CONTENDERS * ROUNDS);
    assert_no_overlap(&ledger);
}

fn fastrand_like(seed: usize) -> u64 {
    (seed as u64).wrapping_mul(2654435761) ^ (Instant::now().elapsed().subsec_nanos() as u64)
}

pub async fn lapsed_holder_cannot_extend_or_release(ts: TestStore) {
    let a = Locker::new(ts.store.clone());
    let b = Locker::new(ts.open().await);
    // From before the request: the lease's local bound counts from its
    // send (a slow answer on a loaded machine must not read as early).
    let t0 = Instant::now();
    let old = a
        .try_lock("lapse", &opts(300).keep_alive(false))
        .await
        .unwrap()
        .unwrap();
    assert!(!old.is_lost(), "a fresh lease is not lost");
    // Nothing runs beside a lease without keep-alive: `lost()` itself
    // resolves when at_most has passed.
    tokio::time::timeout(Duration::from_secs(3), old.lost())
        .await
        .expect("lost() resolves once at_most has passed");
    assert!(
        t0.elapsed() >= Duration::from_millis(250),
        "lost() resolved early: {:?}",
        t0.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        old.is_lost(),
        "a lease without keep-alive is lost after at_most"
    );
    let new = b
        .try_lock("lapse", &opts(10_000))
        .await
        .unwrap()
        .expect("lapsed lease is free");
    assert!(new.token() > old.token());
    // The old holder can neither extend nor release the new lease.
    assert!(matches!(old.extend().await, Err(Error::LeaseLost(_))));
    let backend = ts.store.backend();
    assert_eq!(
        backend
            .lock_extend(&baton::store::LockExtend {
                name: "lapse",
                token: old.token(),
                at_most: Duration::from_secs(60)
            })
            .await
            .unwrap(),
        None
    );
    assert!(!backend
        .lock_release(&baton::store::LockRelease {
            name: "lapse",
            token: old.token(),
            at_least: Duration::ZERO,
            record: false,
        })
        .await
        .unwrap());
    assert!(matches!(old.release().await, Err(Error::LeaseLost(_))));
    let info = backend.lock_get("lapse").await.unwrap().unwrap();
    assert_eq!(info.token, new.token(), "the new lease is untouched");
    assert_eq!(info.holder, new.holder());
    assert!(info.held);
    assert!(
        b.try_lock("lapse", &opts(10_000)).await.unwrap().is_none(),
        "still held by the new holder"
    );
    new.release().await.unwrap();
}

pub async fn at_least_is_honoured(ts: TestStore) {
    // On the store's clock (the test clock moves it; nothing sleeps): a
    // release before at_least has passed holds the lock until
    // `locked_at + at_least`, and not a moment longer.
    let a = Locker::new(ts.store.clone());
    let b = Locker::new(ts.open().await);
    let o = opts(600_000).at_least(Duration::from_secs(60));
    let lease = a.try_lock("least", &o).await.unwrap().unwrap();
    let locked_at = lease.locked_at();
    lease.release().await.unwrap();
    let info = ts.store.backend().lock_get("least").await.unwrap().unwrap();
    assert_eq!(
        info.lock_until - locked_at,
        chrono::Duration::seconds(60),
        "held until granted_at + at_least"
    );
    assert!(
        b.try_lock("least", &opts(10_000)).await.unwrap().is_none(),
        "at_least keeps a second caller off"
    );
    let lease = held_for_60_s(&ts, &b, "least").await;
    // A release after at_least has passed frees the lock at once.
    lease.release().await.unwrap();
    let o2 = opts(600_000).at_least(Duration::from_secs(1));
    let l2 = a.try_lock("least2", &o2).await.unwrap().unwrap();
    clock::advance(&ts, Duration::from_secs(2)).await;
    l2.release().await.unwrap();
    assert!(b.try_lock("least2", &opts(10_000)).await.unwrap().is_some());
}

pub async fn at_most_lapses_a_dropped_lease(ts: TestStore) {
    // A holder that crashed (no release, its keep-alive gone) keeps the
    // lock until at_most has passed on the store's clock, then it is free.
    let a = Locker::new(ts.store.clone());
    let b = Locker::new(ts.open().await);
    let lease = a.try_lock("dropped", &opts(60_000)).await.unwrap().unwrap();
    drop(lease); // crashed holder: no release, and the keep-alive stops
    assert!(b
        .try_lock("dropped", &opts(10_000))
        .await
        .unwrap()
        .is_none());
    let got = held_for_60_s(&ts, &b, "dropped").await;
    got.release().await.unwrap();
}

/// Lock `name`, held for 60 s from now by another holder, is still held
/// 58 s on by the store's clock (the test clock) and free 61 s on: the
/// lease `b` then takes.
async fn held_for_60_s(ts: &TestStore, b: &Locker, name: &str) -> baton::lock::Lease {
    clock::advance(ts, Duration::from_secs(58)).await;
    assert!(
        b.try_lock(name, &opts(10_000)).await.unwrap().is_none(),
        "{name}: still held 58 s into a bound of 60 s"
    );
    clock::advance(ts, Duration::from_secs(3)).await;
    b.try_lock(name, &opts(10_000))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{name}: free once the 60 s have passed"))
}

pub async fn keep_alive_extends_and_signals_loss(ts: TestStore) {
    let a = Locker::new(ts.store.clone());
    let b = Locker::new(ts.open().await);
    let lease = a.try_lock("alive", &opts(300)).await.unwrap().unwrap();
    let first_until = lease.expires_at();
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert!(!lease.is_lost());
    assert!(
        lease.expires_at() > first_until,
        "keep-alive moved the expiry"
    );
    assert!(
        b.try_lock("alive", &opts(10_000)).await.unwrap().is_none(),
        "kept alive past at_most"
    );

    // The lease is taken away (an operator releases it; another takes it):
    // the keep-alive's next extension is refused and the work is cancelled.
    let handle = lease.handle();
    let work = tokio::spawn(async move {
        lease
            .run(|_l| async {
                tokio::time::sleep(Duration::from_secs(60)).await;
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(ts
        .store
        .backend()
        .lock_release(&baton::store::LockRelease {
            name: "alive",
            token: handle.token(),
            at_least: Duration::ZERO,
            record: false,
        })
        .await
        .unwrap());
    let thief = b
        .try_lock("alive", &opts(10_000))
        .await
        .unwrap()
        .expect("free after forced release");
    let t0 = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(3), work)
        .await
        .expect("work cancelled in time")
        .unwrap();
    assert!(matches!(out, Err(Error::LeaseLost(_))), "{out:?}");
    assert!(handle.is_lost());
    assert!(t0.elapsed() < Duration::from_millis(1_000));
    let info = ts.store.backend().lock_get("alive").await.unwrap().unwrap();
    assert_eq!(
        info.token,
        thief.token(),
        "the loser did not disturb the new holder"
    );
    thief.release().await.unwrap();
}

pub async fn wait_gets_the_lock_when_released(ts: TestStore) {
    let a = Locker::new(ts.store.clone());
    let b = Locker::new(ts.open().await);
    let lease = a.try_lock("wait", &opts(10_000)).await.unwrap().unwrap();
    match b
        .lock("wait", &opts(10_000), Duration::from_millis(200))
        .await
    {
        Err(Error::Busy { holder, until, .. }) => {
            assert_eq!(holder, lease.holder());
            assert_eq!(until, lease.expires_at());
        }
        other => panic!("expected Busy after the wait, got {other:?}"),
    }
    let waiter = tokio::spawn(async move {
        let t0 = Instant::now();
        let l = b.lock("wait", &opts(10_000), Duration::from_secs(5)).await;
        (l, t0.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    lease.release().await.unwrap();
    let (l, waited) = waiter.await.unwrap();
    let l = l.expect("waiter gets the lock");
    assert!(waited < Duration::from_millis(1_500), "waited {waited:?}");
    l.release().await.unwrap();
}

pub async fn client_clock_skew_changes_nothing(ts: TestStore) {
    // Expiry is decided by the store's clock alone. The test clock puts
    // the store an hour ahead of this client's clock, then an hour behind
    // it: a client that wrote or compared its own time would grant a lease
    // that is already over (ahead) or one that lasts an hour (behind).
    let a = Locker::new(ts.store.clone());
    let b = Locker::new(ts.open().await);
    let hour = 3_600_000_000;
    // The local deadline of a lease taken with no skew, for comparison.
    let lease = a
        .try_lock("skew-none", &opts(60_000))
        .await
        .unwrap()
        .unwrap();
    let base_left = lease
        .deadline()
        .saturating_duration_since(tokio::time::Instant::now());
    lease.release().await.unwrap();
    for (name, offset) in [("skew-ahead", hour), ("skew-behind", -hour)] {
        clock::set_offset(&ts, offset).await;
        let lease = a.try_lock(name, &opts(60_000)).await.unwrap().unwrap();
        assert_eq!(
            lease.expires_at() - lease.locked_at(),
            chrono::Duration::seconds(60),
            "the lease is at_most long, on the store's clock"
        );
        let store_now = ts.store.now().await.unwrap();
        let drift = (store_now - lease.locked_at()).num_milliseconds().abs();
        assert!(
            drift < 5_000,
            "{name}: grant time is store time ({drift} ms away)"
        );
        let skew = (chrono::Utc::now() - lease.locked_at()).num_minutes().abs();
        assert!(
            skew >= 59,
            "{name}: the store's clock is {skew} min from this one"
        );
        // The local deadline is as far as without skew.
        let left = lease
            .deadline()
            .saturating_duration_since(tokio::time::Instant::now());
        let diff = left.abs_diff(base_left);
        assert!(
            diff < Duration::from_secs(2),
            "{name}: local deadline {left:?} away, {base_left:?} without skew"
        );
        drop(lease);
        assert!(
            b.try_lock(name, &opts(10_000)).await.unwrap().is_none(),
            "{name}: a fresh lease holds"
        );
        clock::advance(&ts, Duration::from_secs(61)).await;
        let next = b.try_lock(name, &opts(10_000)).await.unwrap();
        assert!(
            next.is_some(),
            "{name}: free after at_most on the store's clock"
        );
    }
    clock::set_offset(&ts, 0).await;
}

pub async fn list_and_get(ts: TestStore) {
    let a = Locker::new(ts.store.clone());
    let x = a.try_lock("list-a", &opts(10_000)).await.unwrap().unwrap();
    let y = a.try_lock("list-b", &opts(10_000)).await.unwrap().unwrap();
    y.release().await.unwrap();
    let all = ts.store.backend().lock_list().await.unwrap();
    let names: Vec<_> = all.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["list-a", "list-b"]);
    assert!(all[0].held && !all[1].held);
    assert_eq!(all[0].token, x.token());
    assert_eq!(all[0].holder, x.holder());
    assert!(ts.store.backend().lock_get("nope").await.unwrap().is_none());
    x.release().await.unwrap();
}

pub async fn bad_input_is_refused(ts: TestStore) {
    let a = Locker::new(ts.store.clone());
    let long = "x".repeat(256);
    for (name, what) in [
        ("", "empty"),
        (long.as_str(), "256 bytes"),
        ("a\nb", "control"),
        ("a\0b", "control"),
    ] {
        match a.try_lock(name, &opts(1_000)).await {
            Err(Error::Invalid(e)) => assert_eq!(e.field, "lock name", "{what}"),
            other => panic!("{what}: expected an input error, got {other:?}"),
        }
    }
    assert!(
        a.try_lock(&"y".repeat(255), &opts(1_000))
            .await
            .unwrap()
            .is_some(),
        "255 bytes is fine"
    );
    // Options are checked where they are used, naming the field, before
    // any store call.
    for (bad, field) in [
        (LockOptions::new(Duration::ZERO), "at_most"),
        (opts(1_000).at_least(Duration::from_secs(2)), "at_least"),
        (opts(1_000).renew_margin(Duration::from_secs(1)), "margin"),
    ] {
        match a.try_lock("bad-opts", &bad).await {
            Err(Error::Invalid(e)) => assert_eq!(e.field, field, "{e}"),
            other => panic!("{field}: {other:?}"),
        }
        assert_eq!(bad.validate().unwrap_err().field, field);
    }
    assert_eq!(
        ts.store.backend().lock_list().await.unwrap().len(),
        1,
        "nothing half-written"
    );
}

/// Lock tokens are floored at the store's clock in µs: after the lock's
/// record was lost (deleted here, as restoring a backup taken before the
/// lock existed would), the next grant's token is still above every
/// earlier one. On Redis the record has no TTL, so it is never lost by
/// expiry (a clock step back could then lower the floor).
pub async fn tokens_rise_after_the_record_is_lost(ts: TestStore) {
    let locker = Locker::new(ts.store.clone());
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let floor = ts.store.now().await.unwrap().timestamp_micros();
        let lease = locker
            .try_lock("restored", &opts(10_000))
            .await
            .unwrap()
            .expect("free");
        assert!(
            i64::try_from(lease.token().0).unwrap() >= floor,
            "token {} below the store clock {floor} µs",
            lease.token()
        );
        tokens.push(lease.token());
        lease.release().await.unwrap();
    }
    if let crate::harness::Kind::Redis = ts.kind {
        let mut c = crate::upgrade::redis_conn(&ts).await;
        let ttl: i64 = redis::cmd("PTTL")
            .arg(format!("{}{{baton:lock:restored}}", ts.prefix))
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(ttl, -1, "the record holding the token never expires");
    }
    crate::upgrade::delete_lock_record(&ts, "restored").await;
    assert!(ts
        .store
        .backend()
        .lock_get("restored")
        .await
        .unwrap()
        .is_none());
    let lease = locker
        .try_lock("restored", &opts(10_000))
        .await
        .unwrap()
        .expect("free");
    tokens.push(lease.token());
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens must rise even after the record was lost: {tokens:?}"
    );
    lease.release().await.unwrap();
}

/// Lock names are exact bytes, whatever they hold: quotes and backslashes
/// (which must not end or escape anything in the store's query), case,
/// trailing spaces and differently composed Unicode are all different names.
pub async fn names_are_exact(ts: TestStore) {
    let a = Locker::new(ts.store.clone());
    let names = [
        "q'uote",
        "q\\'uote",
        "back\\slash",
        "Case",
        "case",
        "case ",
        "caf\u{e9}",
        "cafe\u{301}",
        "x') OR 1=1; --",
    ];
    let mut leases = Vec::new();
    for name in names {
        let lease = a
            .try_lock(name, &opts(10_000))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{name:?} is its own lock, free"));
        assert_eq!(lease.name(), name);
        leases.push(lease);
    }
    let mut listed: Vec<_> = ts
        .store
        .backend()
        .lock_list()
        .await
        .unwrap()
        .into_iter()
        .map(|i| (i.name, i.held))
        .collect();
    listed.sort();
    let mut want: Vec<_> = names.iter().map(|n| (n.to_string(), true)).collect();
    want.sort();
    assert_eq!(listed, want);
    for lease in leases {
        let name = lease.name().to_string();
        let token = lease.token();
        lease.release().await.unwrap();
        let again = a.try_lock(&name, &opts(10_000)).await.unwrap().unwrap();
        assert!(again.token() > token, "{name:?}: token rose");
        again.release().await.unwrap();
    }
}

/// An operator's force-release (`lock_revoke`): the lease is revoked, not
/// freed at once. Its token is bumped (granted to no one), so the holder
/// can neither extend nor release it and a second revoke is refused; the
/// record names it `revoked:`; it ends at `min(lock_until, now + within)`
/// and only then is granted again, with a higher token. A wrong token
/// changes nothing.
pub async fn revoke_refuses_the_holder_and_frees_within_the_bound(ts: TestStore) {
    let backend = ts.store.backend();
    let b = Locker::new(ts.open().await);
    let grant = |name: &'static str, ms: u64| async move {
        match backend
            .lock_acquire(&baton::store::LockAcquire {
                name,
                holder: "h:1:a",
                at_most: Duration::from_millis(ms),
            })
            .await
            .unwrap()
        {
            baton::store::Acquire::Granted { token, .. } => token,
            other => panic!("expected a grant, got {other:?}"),
        }
    };
    let revoke = |name: &'static str, token: FencingToken, ms: u64| async move {
        backend
            .lock_revoke(&baton::store::LockRevoke {
                name,
                token,
                within: Duration::from_millis(ms),
            })
            .await
            .unwrap()
    };
    let token = grant("revoked", 60_000).await;
    assert_eq!(
        revoke("revoked", FencingToken(token.0 + 7), 1000).await,
        None,
        "a wrong token revokes nothing"
    );
    assert_eq!(revoke("never-locked", token, 1000).await, None);
    let now = ts.store.now().await.unwrap();
    let until = revoke("revoked", token, 1000)
        .await
        .expect("the current token is revoked");
    let left = until - now;
    assert!(
        left > chrono::Duration::zero() && left <= chrono::Duration::milliseconds(1500),
        "the revoked lease ends within the bound, not at its 60 s lock_until: {left}"
    );
    let info = backend.lock_get("revoked").await.unwrap().unwrap();
    assert_eq!(info.token, FencingToken(token.0 + 1), "the token is bumped");
    assert_eq!(info.holder, "revoked:h:1:a");
    assert_eq!(info.lock_until, until);
    assert!(info.held, "still held until the bound: no one else yet");
    assert_eq!(
        backend
            .lock_extend(&baton::store::LockExtend {
                name: "revoked",
                token,
                at_most: Duration::from_secs(60)
            })
            .await
            .unwrap(),
        None,
        "the revoked holder cannot extend"
    );
    assert!(
        !backend
            .lock_release(&baton::store::LockRelease {
                name: "revoked",
                token,
                at_least: Duration::ZERO,
                record: false,
            })
            .await
            .unwrap(),
        "the revoked holder cannot release"
    );
    assert_eq!(revoke("revoked", token, 1000).await, None, "revoked once");
    assert!(
        b.try_lock("revoked", &opts(10_000))
            .await
            .unwrap()
            .is_none(),
        "not granted again before the revoked lease ends"
    );
    clock::advance(
        &ts,
        (until - now).to_std().unwrap() + Duration::from_millis(150),
    )
    .await;
    let next = b
        .try_lock("revoked", &opts(10_000))
        .await
        .unwrap()
        .expect("free once the revoked lease ended");
    assert!(
        next.token().0 > token.0 + 1,
        "the next token is still higher"
    );
    next.release().await.unwrap();

    // A lease shorter than the bound keeps its own end.
    let token = grant("short", 800).await;
    let lock_until = backend.lock_get("short").await.unwrap().unwrap().lock_until;
    assert_eq!(revoke("short", token, 30_000).await, Some(lock_until));
}

/// A kept-alive lease longer than `RELEASE_BOUND` learns of a
/// force-release within its confirm period (5 s), not at its next
/// extension (a third of at_most), and its local deadline never passes
/// the last confirmation + the bound. A lease whose extensions come every
/// 5 s or more often needs no confirmations.
pub async fn holder_learns_of_a_revocation_within_the_confirm_period(ts: TestStore) {
    let a = Locker::new(ts.store.clone());
    let o = opts(120_000);
    let every = o
        .confirm_period()
        .expect("a lease longer than the bound confirms");
    assert!(every <= Duration::from_secs(5), "{every:?}");
    assert!(
        opts(15_000).confirm_period().is_none(),
        "extended every 5 s"
    );
    assert!(
        opts(20_000).confirm_period().is_some(),
        "extended every 6.7 s"
    );
    let lease = a.try_lock("watched", &o).await.unwrap().expect("free");
    let t0 = Instant::now();
    assert!(
        lease.deadline() <= tokio::time::Instant::now() + baton::lock::RELEASE_BOUND,
        "bounded by the release bound, not by at_most"
    );
    let until = ts
        .store
        .backend()
        .lock_revoke(&baton::store::LockRevoke {
            name: "watched",
            token: lease.token(),
            within: baton::lock::RELEASE_BOUND,
        })
        .await
        .unwrap()
        .expect("revoked");
    tokio::time::timeout(every + Duration::from_secs(2), lease.lost())
        .await
        .expect("the holder sees the revocation within its confirm period");
    assert!(t0.elapsed() <= every + Duration::from_secs(2));
    assert!(lease.is_lost());
    let now = ts.store.now().await.unwrap();
    assert!(until > now, "and before the revoked lease ends");
    assert!(matches!(lease.release().await, Err(Error::LeaseLost(_))));
}
