//! Lock history: each release recorded (`LockRelease::record`, the
//! store's `lock_history` option) says who held which lock with which
//! token, from when until when; a refused release, or one not recorded,
//! records nothing; the
//! list is newest first, by lock or all; the prune keeps a day and at most
//! `LOCK_HISTORY_PER_LOCK` a lock.

use std::time::Duration;

use baton::store::{
    Acquire, FencingToken, LockAcquire, LockHistoryQuery, LockRelease, LOCK_HISTORY_PER_LOCK,
};

use crate::TestStore;

/// Grant `name` to `holder` and release it, recorded; the grant's token
/// and time.
async fn cycle(
    ts: &TestStore,
    name: &str,
    holder: &str,
) -> (FencingToken, chrono::DateTime<chrono::Utc>) {
    cycle_with(ts, name, holder, true).await
}

/// [`cycle`], the release recorded or not (`LockRelease::record`).
async fn cycle_with(
    ts: &TestStore,
    name: &str,
    holder: &str,
    record: bool,
) -> (FencingToken, chrono::DateTime<chrono::Utc>) {
    let b = ts.store.backend();
    let Acquire::Granted {
        token, locked_at, ..
    } = b
        .lock_acquire(&LockAcquire {
            name,
            holder,
            at_most: Duration::from_secs(60),
        })
        .await
        .unwrap()
    else {
        panic!("{name} is free")
    };
    let release = LockRelease {
        name,
        token,
        at_least: Duration::ZERO,
        record,
    };
    assert!(b.lock_release(&release).await.unwrap());
    // Released once: a second release (a stale holder) is refused and
    // records nothing.
    assert!(!b.lock_release(&release).await.unwrap());
    (token, locked_at)
}

fn query(name: Option<&str>, limit: u32) -> LockHistoryQuery {
    LockHistoryQuery {
        name: name.map(String::from),
        limit,
    }
}

pub async fn releases_are_kept_listed_and_pruned(ts: TestStore) {
    let b = ts.store.backend();
    let (t1, at1) = cycle(&ts, "hist-a", "alice@host-1").await;
    let (t2, _) = cycle(&ts, "hist-b", "bob@host-2").await;
    let (t3, _) = cycle(&ts, "hist-a", "carol@host-3").await;
    let all = b.lock_history_list(&query(None, 0)).await.unwrap();
    let seen: Vec<(&str, &str, FencingToken)> = all
        .iter()
        .map(|r| (r.name.as_str(), r.holder.as_str(), r.token))
        .collect();
    assert_eq!(
        seen,
        [
            ("hist-a", "carol@host-3", t3),
            ("hist-b", "bob@host-2", t2),
            ("hist-a", "alice@host-1", t1),
        ],
        "newest first, one record a release"
    );
    let first = &all[2];
    assert_eq!(first.acquired_at, at1);
    assert!(first.released_at >= first.acquired_at, "{first:?}");
    let a = b
        .lock_history_list(&query(Some("hist-a"), 0))
        .await
        .unwrap();
    assert_eq!(a.iter().map(|r| r.token).collect::<Vec<_>>(), [t3, t1]);
    assert_eq!(b.lock_history_list(&query(None, 1)).await.unwrap().len(), 1);
    assert!(b
        .lock_history_list(&query(Some("nope"), 0))
        .await
        .unwrap()
        .is_empty());

    // A release not recorded (the store's lock history off) releases and
    // leaves no record.
    cycle_with(&ts, "hist-quiet", "eve@host-5", false).await;
    assert!(b
        .lock_history_list(&query(Some("hist-quiet"), 0))
        .await
        .unwrap()
        .is_empty());

    // Quotes, a backslash and non-ASCII text in the name and holder come
    // back as they were (MySQL sends the name as a hex literal; Redis
    // keeps the holder last in a plain record).
    let (odd, odd_holder) = ("hist-'q\\é\"", "o'neil \\ é; x");
    let (t_odd, _) = cycle(&ts, odd, odd_holder).await;
    let got = b.lock_history_list(&query(Some(odd), 0)).await.unwrap();
    assert_eq!(
        got.iter()
            .map(|r| (r.name.as_str(), r.holder.as_str(), r.token))
            .collect::<Vec<_>>(),
        [(odd, odd_holder, t_odd)]
    );

    // A busy lock lists more releases than it keeps: the newest
    // LOCK_HISTORY_PER_LOCK stay.
    let mut last = FencingToken(0);
    for i in 0..LOCK_HISTORY_PER_LOCK + 5 {
        last = cycle(&ts, "hist-busy", &format!("w{i}")).await.0;
    }
    b.lock_history_prune_many().await.unwrap();
    let busy = b
        .lock_history_list(&query(Some("hist-busy"), 1000))
        .await
        .unwrap();
    assert_eq!(busy.len(), LOCK_HISTORY_PER_LOCK);
    assert_eq!(busy[0].token, last);
    assert_eq!(busy[0].holder, format!("w{}", LOCK_HISTORY_PER_LOCK + 4));

    // A day later by the store's clock, one more release: the prune keeps
    // only it.
    baton_testkit::clock::advance(&ts, Duration::from_secs(25 * 3600)).await;
    let (t4, _) = cycle(&ts, "hist-b", "dave@host-4").await;
    let gone = b.lock_history_prune_many().await.unwrap();
    assert_eq!(gone, 4 + LOCK_HISTORY_PER_LOCK as u64);
    let left = b.lock_history_list(&query(None, 0)).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(
        (left[0].holder.as_str(), left[0].token),
        ("dave@host-4", t4)
    );
}
