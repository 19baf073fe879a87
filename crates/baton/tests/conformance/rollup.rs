//! The throughput rollup: concurrent additive flushes sum exactly (maxima
//! kept), reads select one resolution from a bucket on and one queue,
//! kind or job, a job's rows stay apart from its kind's other rows, and
//! the prune keeps each resolution's window only.

use baton::store::stats::bucket_of;
use baton::store::{StatsCounts, StatsQuery, StatsRow};
use chrono::{DateTime, Utc};

use crate::TestStore;
use baton_testkit::clock;

fn row(res: u32, at_ms: i64, queue: &str, kind: &str, counts: StatsCounts) -> StatsRow {
    StatsRow {
        res_secs: res,
        bucket: DateTime::<Utc>::from_timestamp_millis(bucket_of(at_ms, res)).unwrap(),
        queue: queue.into(),
        kind: kind.into(),
        job: None,
        counts,
    }
}

/// [`row`] counted for schedule job `job`.
fn job_row(res: u32, at_ms: i64, queue: &str, kind: &str, job: &str, c: StatsCounts) -> StatsRow {
    StatsRow {
        job: Some(job.into()),
        ..row(res, at_ms, queue, kind, c)
    }
}

/// The counts flusher `f` sends in its call `i`: every field differs by
/// flusher and call, so a lost or doubled add shows in the sums.
fn counts(f: i64, i: i64) -> StatsCounts {
    StatsCounts {
        succeeded: f + i,
        failed: 1 + (f * i) % 3,
        dead: i % 2,
        cancelled: f % 2,
        wait_n: 2,
        wait_ms: 10 * f + i,
        wait_max_ms: 100 * f + i,
        run_n: 1,
        run_ms: f * 7 + i,
        run_max_ms: 1000 - f * 10 - i,
    }
}

pub async fn rollup_flushes_add_up_read_by_range_and_prune(ts: TestStore) {
    let b = ts.store.backend();
    // The store's clock moved to 1 s into a minute: the test's minute
    // buckets (the 2 h edge below) stay the current ones until its end
    // (a minute turning between `now` and the prune moved the edge out).
    let next_minute = (b.now().await.unwrap().timestamp_millis() / 60_000 + 1) * 60_000;
    clock::advance_to(
        &ts,
        DateTime::from_timestamp_millis(next_minute + 1_000).unwrap(),
    )
    .await;
    let now = b.now().await.unwrap().timestamp_millis();
    // 8 flushers at once, 12 calls each, every call one row of each of
    // two series in the same bucket at every resolution, plus a row twice
    // (which the call adds up too).
    let (flushers, calls) = (8i64, 12i64);
    let mut joins = Vec::new();
    for f in 0..flushers {
        let store = ts.store.clone();
        joins.push(tokio::spawn(async move {
            for i in 0..calls {
                let c = counts(f, i);
                let mut rows = Vec::new();
                for res in [60, 900, 3600] {
                    rows.push(row(res, now, "q1", "mail", c));
                    rows.push(row(res, now, "q2", "sms", c));
                }
                rows.push(row(60, now, "q1", "mail", c));
                store.backend().stats_add(&rows).await.unwrap();
            }
        }));
    }
    for j in joins {
        j.await.unwrap();
    }
    let mut once = StatsCounts::default();
    for f in 0..flushers {
        for i in 0..calls {
            once.add(&counts(f, i));
        }
    }
    let mut twice = once;
    twice.add(&once);
    let read_job =
        |res: u32, since_ms: i64, queue: Option<&str>, kind: Option<&str>, job: Option<&str>| {
            let q = StatsQuery {
                res_secs: res,
                since: DateTime::<Utc>::from_timestamp_millis(since_ms).unwrap(),
                queue: queue.map(String::from),
                kind: kind.map(String::from),
                job: job.map(String::from),
            };
            async move { b.stats_read(&q).await.unwrap() }
        };
    let read = |res, since_ms, queue, kind| read_job(res, since_ms, queue, kind, None);
    let minute = read(60, now - 60_000, None, None).await;
    assert_eq!(minute.len(), 2, "{minute:?}");
    assert_eq!(
        (minute[0].queue.as_str(), minute[0].kind.as_str()),
        ("q1", "mail")
    );
    assert_eq!(minute[0].counts, twice, "q1 at 1 min: every add, twice");
    assert_eq!(minute[1].counts, once, "q2 at 1 min");
    assert_eq!(minute[0].bucket.timestamp_millis(), bucket_of(now, 60));
    for res in [900, 3600] {
        let rows = read(res, now - 3_600_000, Some("q2"), None).await;
        assert_eq!(rows.len(), 1, "{res}: {rows:?}");
        assert_eq!((rows[0].res_secs, &rows[0].counts), (res, &once));
    }
    assert_eq!(
        read(60, now - 60_000, None, Some("sms")).await[0].queue,
        "q2"
    );
    assert!(read(60, now - 60_000, Some("q1"), Some("sms"))
        .await
        .is_empty());
    // Jobs: rows of one queue and kind (a store-defined job's tasks are
    // kind `command`) stay apart per job, and each reads back alone.
    let (two, five) = (
        StatsCounts {
            succeeded: 2,
            ..Default::default()
        },
        StatsCounts {
            failed: 5,
            ..Default::default()
        },
    );
    b.stats_add(&[
        row(60, now, "jq", "command", one_of(7)),
        job_row(60, now, "jq", "command", "nightly", two),
        job_row(60, now, "jq", "command", "hourly", five),
        job_row(60, now, "jq", "command", "nightly", two),
    ])
    .await
    .unwrap();
    let jq = read(60, now - 60_000, Some("jq"), Some("command")).await;
    let jobs: Vec<(Option<&str>, &StatsCounts)> =
        jq.iter().map(|r| (r.job.as_deref(), &r.counts)).collect();
    let four = StatsCounts {
        succeeded: 4,
        ..Default::default()
    };
    assert_eq!(
        jobs,
        [
            (None, &one_of(7)),
            (Some("hourly"), &five),
            (Some("nightly"), &four)
        ],
        "one row a job, added up; the kind's rows of no job apart"
    );
    let nightly = read_job(60, now - 60_000, None, None, Some("nightly")).await;
    assert_eq!(nightly.len(), 1, "{nightly:?}");
    assert_eq!(
        (nightly[0].job.as_deref(), &nightly[0].counts),
        (Some("nightly"), &four)
    );
    assert!(
        read_job(60, now - 60_000, Some("q1"), None, Some("nightly"))
            .await
            .is_empty()
    );
    // A bucket before `since` is not read.
    assert!(read(60, bucket_of(now, 60) + 60_000, None, None)
        .await
        .is_empty());

    // Old buckets: 1-minute ones kept 2 h, 15-minute 2 days, 1-hour 8 days.
    let one = StatsCounts {
        succeeded: 1,
        ..Default::default()
    };
    let h = 3_600_000;
    b.stats_add(&[
        row(60, now - 3 * h, "old", "k", one),
        row(60, now - h, "old", "k", one),
        // The 1-minute bucket that starts 2 h before the current one ends
        // within the last 2 h: kept.
        row(60, bucket_of(now, 60) - 2 * h, "edge", "k", one),
        row(900, now - 3 * 24 * h, "old", "k", one),
        row(900, now - 24 * h, "old", "k", one),
        row(3600, now - 9 * 24 * h, "old", "k", one),
        row(3600, now - 7 * 24 * h, "old", "k", one),
    ])
    .await
    .unwrap();
    let gone = b.stats_prune_many().await.unwrap();
    assert_eq!(gone, 3, "one bucket of each resolution was past its window");
    let left = |res| read(res, now - 10 * 24 * h, Some("old"), None);
    for (res, kept_ms) in [(60, now - h), (900, now - 24 * h), (3600, now - 7 * 24 * h)] {
        let rows = left(res).await;
        assert_eq!(rows.len(), 1, "{res}: {rows:?}");
        assert_eq!(rows[0].bucket.timestamp_millis(), bucket_of(kept_ms, res));
    }
    assert_eq!(
        read(60, now - 3 * h, Some("edge"), None).await.len(),
        1,
        "a bucket is kept until its end leaves the window"
    );
    assert_eq!(b.stats_prune_many().await.unwrap(), 0);
    // The recent series were left alone.
    assert_eq!(read(60, now - 60_000, None, None).await.len(), 5);
}

/// Counts of `n` succeeded attempts.
fn one_of(n: i64) -> StatsCounts {
    StatsCounts {
        succeeded: n,
        ..Default::default()
    }
}
