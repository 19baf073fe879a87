//! Issue 26 item 4: job definitions kept in the store. Every write is a
//! compare-and-set on the name's version (a create only where the name has
//! no live definition), a delete leaves a tombstone so a version never
//! repeats, racing writers get one winner, and the change counter rises
//! with every write and only then (DESIGN.md D1).

use std::sync::Arc;
use std::time::Duration;

use baton::schedule::{Job, Schedule, Scheduler};
use baton::store::{JobDef, JobDefDelete, JobDefPut, JobDefWrite, TaskFilter};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::TestStore;

fn put<'a>(name: &'a str, spec: &'a serde_json::Value, expected: Option<i64>) -> JobDefPut<'a> {
    JobDefPut {
        name,
        spec,
        expected,
        by: "ana",
    }
}

async fn one(ts: &TestStore, name: &str) -> JobDef {
    ts.store
        .backend()
        .jobdef_list()
        .await
        .unwrap()
        .into_iter()
        .find(|d| d.name == name)
        .unwrap_or_else(|| panic!("{name} listed"))
}

pub async fn definitions_are_versioned_compare_and_set(ts: TestStore) {
    let b = ts.store.backend();
    let written = |version| JobDefWrite::Written { version };
    let conflict = |current| JobDefWrite::Conflict { current };
    let (s1, s2, s3) = (
        json!({"every": "1m", "command": ["true"]}),
        json!({"every": "2m", "command": ["true"], "queue": "q"}),
        json!({"cron": "0 * * * *", "command": ["echo", "é"]}),
    );
    let r0 = b.jobdef_revision().await.unwrap();

    assert_eq!(
        b.jobdef_put(&put("a", &s1, None)).await.unwrap(),
        written(1)
    );
    let r1 = b.jobdef_revision().await.unwrap();
    assert!(r1 > r0, "a create raises the revision ({r0} -> {r1})");
    let first = one(&ts, "a").await;
    assert_eq!(
        (
            first.version,
            &first.spec,
            first.deleted,
            first.updated_by.as_str()
        ),
        (1, &s1, false, "ana")
    );
    assert_eq!(first.created_at, first.updated_at);
    let now = b.now().await.unwrap();
    assert!(
        (now - first.updated_at).num_seconds().abs() < 5,
        "store time"
    );

    // A second create, a stale or a future version: refused, unchanged.
    assert_eq!(
        b.jobdef_put(&put("a", &s2, None)).await.unwrap(),
        conflict(Some(1))
    );
    assert_eq!(
        b.jobdef_put(&put("a", &s2, Some(2))).await.unwrap(),
        conflict(Some(1))
    );
    assert_eq!(
        b.jobdef_put(&put("a", &s2, Some(0))).await.unwrap(),
        conflict(Some(1))
    );
    assert_eq!(
        b.jobdef_revision().await.unwrap(),
        r1,
        "refusals change nothing"
    );
    assert_eq!(one(&ts, "a").await, first);

    assert_eq!(
        b.jobdef_put(&put("a", &s2, Some(1))).await.unwrap(),
        written(2)
    );
    assert_eq!(
        b.jobdef_put(&put("a", &s3, Some(1))).await.unwrap(),
        conflict(Some(2))
    );
    let second = one(&ts, "a").await;
    assert_eq!((second.version, &second.spec), (2, &s2));
    assert_eq!(
        second.created_at, first.created_at,
        "an update keeps created_at"
    );
    assert!(second.updated_at >= first.updated_at);
    let r2 = b.jobdef_revision().await.unwrap();
    assert!(r2 > r1);

    // Unknown names.
    assert_eq!(
        b.jobdef_put(&put("b", &s1, Some(1))).await.unwrap(),
        conflict(None)
    );
    let del = |name, expected| JobDefDelete {
        name,
        expected,
        by: "bo",
    };
    assert_eq!(
        b.jobdef_delete(&del("b", None)).await.unwrap(),
        conflict(None)
    );

    // Delete: a compare-and-set when a version is given; a tombstone.
    assert_eq!(
        b.jobdef_delete(&del("a", Some(1))).await.unwrap(),
        conflict(Some(2))
    );
    assert_eq!(b.jobdef_delete(&del("a", None)).await.unwrap(), written(3));
    let gone = one(&ts, "a").await;
    assert!(gone.deleted, "a tombstone is kept");
    assert_eq!((gone.version, gone.updated_by.as_str()), (3, "bo"));
    let r3 = b.jobdef_revision().await.unwrap();
    assert!(r3 > r2, "a delete raises the revision");
    assert_eq!(
        b.jobdef_delete(&del("a", None)).await.unwrap(),
        conflict(None)
    );
    assert_eq!(
        b.jobdef_put(&put("a", &s1, Some(3))).await.unwrap(),
        conflict(None),
        "a tombstone is not live"
    );

    // Created again: the version goes on from the tombstone's, so an
    // update or delete written against the old life cannot land.
    assert_eq!(
        b.jobdef_put(&put("a", &s3, None)).await.unwrap(),
        written(4)
    );
    let again = one(&ts, "a").await;
    assert_eq!((again.version, &again.spec, again.deleted), (4, &s3, false));
    assert!(again.created_at >= gone.updated_at, "created again now");
    assert_eq!(
        b.jobdef_put(&put("a", &s1, Some(2))).await.unwrap(),
        conflict(Some(4))
    );
    assert!(b.jobdef_revision().await.unwrap() > r3);

    // Racing writers: one create wins, one update of a version wins.
    let spec = Arc::new(s1.clone());
    let race = |expected: Option<i64>, name: &'static str| {
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..16 {
            let (store, spec) = (ts.store.clone(), spec.clone());
            set.spawn(async move {
                store
                    .backend()
                    .jobdef_put(&JobDefPut {
                        name,
                        spec: &spec,
                        expected,
                        by: "racer",
                    })
                    .await
                    .unwrap()
            });
        }
        set
    };
    for (expected, name, version) in [(None, "c", 1), (Some(4), "a", 5)] {
        let outs = race(expected, name).join_all().await;
        let wins: Vec<_> = outs
            .iter()
            .filter(|o| matches!(o, JobDefWrite::Written { .. }))
            .collect();
        assert_eq!(wins, [&written(version)], "{name}: {outs:?}");
        assert!(outs
            .iter()
            .all(|o| *o == written(version) || *o == conflict(Some(version))));
    }
    let names: Vec<_> = b
        .jobdef_list()
        .await
        .unwrap()
        .into_iter()
        .map(|d| (d.name, d.version, d.deleted))
        .collect();
    assert_eq!(names, [("a".into(), 5, false), ("c".into(), 1, false)]);
}

/// The test's document: `{"every_ms": N, "v": V}`, run as kind `dyn` with
/// payload `{"v": V}`.
fn decode_test_def(def: &JobDef) -> Result<Job, baton::InvalidInput> {
    let ms = def.spec["every_ms"]
        .as_u64()
        .ok_or_else(|| baton::InvalidInput::new("every_ms", "give milliseconds"))?;
    Ok(Job::new(
        def.name.clone(),
        Schedule::every(Duration::from_millis(ms))?,
    )
    .kind("dyn")
    .payload(json!({"v": def.spec["v"]})))
}

/// Three schedulers run a job defined in the store once per slot; a
/// change applies from the next slot (the cursor kept: no slot twice,
/// none skipped between the old schedule's last and the new one's
/// first); a delete stops it everywhere, and a scheduler's own job of
/// the same name, kept off while the store defined it, comes back.
pub async fn stored_jobs_follow_changes_once_per_slot(ts: TestStore) {
    let b = ts.store.backend();
    let job = "dyn-job";
    let v1 = json!({"every_ms": 500, "v": 1});
    assert_eq!(
        b.jobdef_put(&put(job, &v1, None)).await.unwrap(),
        JobDefWrite::Written { version: 1 }
    );
    let stop = CancellationToken::new();
    let mut runs = tokio::task::JoinSet::new();
    for i in 0..3 {
        let mut s = Scheduler::new(ts.store.clone());
        if i == 0 {
            let own = Job::new(job, Schedule::every(Duration::from_millis(500)).unwrap())
                .kind("dyn")
                .payload(json!({"v": "own"}));
            s.add(own).unwrap();
        }
        s.definitions(decode_test_def)
            .definitions_every(Duration::from_millis(200));
        runs.spawn(s.run(stop.clone()));
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let v2 = json!({"every_ms": 1000, "v": 2});
    assert_eq!(
        b.jobdef_put(&put(job, &v2, Some(1))).await.unwrap(),
        JobDefWrite::Written { version: 2 }
    );
    let changed_at = one(&ts, job).await.updated_at;
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!(
        b.jobdef_delete(&JobDefDelete {
            name: job,
            expected: Some(2),
            by: "ana"
        })
        .await
        .unwrap(),
        JobDefWrite::Written { version: 3 }
    );
    let deleted_at = one(&ts, job).await.updated_at;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    stop.cancel();
    while let Some(r) = runs.join_next().await {
        r.unwrap().unwrap();
    }

    let filter = TaskFilter {
        job: Some(job.into()),
        limit: 1000,
        ..TaskFilter::default()
    };
    let mut ledger: Vec<(chrono::DateTime<chrono::Utc>, serde_json::Value)> = b
        .task_list(&filter)
        .await
        .unwrap()
        .into_iter()
        .map(|t| (t.slot.expect("a slot's task"), t.payload["v"].clone()))
        .collect();
    ledger.sort_by_key(|(slot, _)| *slot);
    let shown = format!("{ledger:?}");
    let slots: Vec<_> = ledger.iter().map(|(s, _)| *s).collect();
    let mut unique = slots.clone();
    unique.dedup();
    assert_eq!(unique, slots, "each slot once: {shown}");
    let of = |v: serde_json::Value| -> Vec<chrono::DateTime<chrono::Utc>> {
        ledger
            .iter()
            .filter(|(_, p)| *p == v)
            .map(|(s, _)| *s)
            .collect()
    };
    let (one_s, two_s, own_s) = (of(json!(1)), of(json!(2)), of(json!("own")));
    assert!(
        one_s.len() >= 3 && two_s.len() >= 2 && !own_s.is_empty(),
        "{shown}"
    );
    // Each definition's slots are its schedule's, from when it was
    // written to when the next write reached the schedulers (each reads
    // the definitions every 200 ms plus up to 400 ms of jitter, so the old
    // one may take a slot due within that lag); none of the own job's
    // while the store defined the job.
    let lag = chrono::Duration::seconds(1);
    assert!(
        one_s
            .iter()
            .all(|s| s.timestamp_subsec_millis() % 500 == 0 && *s <= changed_at + lag),
        "{shown}"
    );
    assert!(
        two_s.iter().all(|s| s.timestamp_subsec_millis() == 0),
        "{shown}"
    );
    assert!(
        two_s
            .iter()
            .all(|s| *s >= changed_at && *s <= deleted_at + lag),
        "{shown}"
    );
    assert!(own_s.iter().all(|s| *s > deleted_at), "{shown}");
    // None skipped: no gap wider than the longer period, across the change.
    let defined: Vec<_> = slots.iter().filter(|s| **s <= deleted_at).collect();
    for w in defined.windows(2) {
        assert!(
            *w[1] - *w[0] <= chrono::Duration::milliseconds(1000),
            "gap {w:?}: {shown}"
        );
    }
}

/// A job's record keeps the definition fingerprint its schedulers
/// register (`None` leaves it), read back by `job_get` and `job_list`, so
/// an instance can see another one defines the job otherwise (D2).
pub async fn registration_keeps_the_definition_fingerprint(ts: TestStore) {
    use baton::store::JobRegister;
    let b = ts.store.backend();
    let read = |st: baton::store::JobState| st.fingerprint;
    let one = || async { read(b.job_get("fp").await.unwrap().unwrap()) };
    let listed = || async {
        b.job_list()
            .await
            .unwrap()
            .into_iter()
            .find(|j| j.name == "fp")
            .and_then(|j| j.fingerprint)
    };
    let reg = JobRegister::new("fp").queue("q");
    assert_eq!(read(b.job_register(&reg).await.unwrap()), None);
    let st = b.job_register(&reg.fingerprint("aaaa")).await.unwrap();
    assert_eq!(read(st), Some("aaaa".into()));
    assert_eq!(
        b.job_register(&reg).await.unwrap().fingerprint,
        Some("aaaa".into()),
        "None keeps it"
    );
    b.job_register(&reg.fingerprint("bbbb")).await.unwrap();
    assert_eq!(
        (one().await, listed().await),
        (Some("bbbb".into()), Some("bbbb".into()))
    );

    // Jobs that schedule alike have one fingerprint; any field changes it.
    let job = |every| Job::new("fp", Schedule::every(Duration::from_secs(every)).unwrap());
    assert_eq!(job(60).fingerprint(), job(60).fingerprint());
    assert_ne!(job(60).fingerprint(), job(30).fingerprint());
    assert_ne!(
        job(60).fingerprint(),
        job(60).payload(json!({"a": 1})).fingerprint()
    );
    assert_eq!(
        job(60).payload(json!({"a": 1, "b": 2})).fingerprint(),
        job(60).payload(json!({"b": 2, "a": 1})).fingerprint()
    );
}

/// A definitions write is announced on the store's wake-up channel: a
/// scheduler whose timer would read the change counter only once a minute
/// starts a job created after its first read within moments (through
/// PostgreSQL's NOTIFY and Redis pub/sub from any process; on SQLite and
/// MySQL from this process's handles, others wait for the timer).
pub async fn a_definitions_write_is_heard_at_once(ts: TestStore) {
    let b = ts.store.backend();
    let job = "heard-job";
    let stop = CancellationToken::new();
    let mut s = Scheduler::new(ts.store.clone());
    s.definitions(decode_test_def)
        .definitions_every(Duration::from_secs(60));
    let run = tokio::spawn(s.run(stop.clone()));
    // Past its first read (the counter, no definitions yet).
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let spec = json!({"every_ms": 200, "v": 1});
    // Through a handle of its own, as another process would write it.
    let other = ts.open().await;
    assert_eq!(
        other
            .backend()
            .jobdef_put(&put(job, &spec, None))
            .await
            .unwrap(),
        JobDefWrite::Written { version: 1 }
    );
    let filter = TaskFilter {
        job: Some(job.into()),
        limit: 10,
        ..TaskFilter::default()
    };
    let t0 = std::time::Instant::now();
    let mut ran = false;
    while t0.elapsed() < Duration::from_secs(4) {
        if !b.task_list(&filter).await.unwrap().is_empty() {
            ran = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    run.await.unwrap().unwrap();
    assert!(
        ran,
        "a job defined after the scheduler's first read had no slot after {:?} (its timer: 60 s); the write was not heard",
        t0.elapsed()
    );
}

/// Issue 26 follow-up: tombstones older than the retention are pruned
/// (the upkeep's prune tick calls this), younger ones and live
/// definitions stay; the revision never falls back (a reload that read it
/// before the prune still sees every later write, D1), and a pruned name
/// can be created again, from version 1.
pub async fn old_tombstones_are_pruned_keeping_the_revision(ts: TestStore) {
    let b = ts.store.backend();
    let spec = json!({"every": "1m", "command": ["true"]});
    let delete = |name| JobDefDelete {
        name,
        expected: None,
        by: "ana",
    };
    for name in ["old", "old2", "live"] {
        b.jobdef_put(&put(name, &spec, None)).await.unwrap();
    }
    b.jobdef_put(&put("old", &spec, Some(1))).await.unwrap();
    b.jobdef_delete(&delete("old")).await.unwrap();
    b.jobdef_delete(&delete("old2")).await.unwrap();
    // Two hours on by the store's clock, one more tombstone: younger.
    baton_testkit::clock::advance(&ts, Duration::from_secs(7200)).await;
    b.jobdef_put(&put("young", &spec, None)).await.unwrap();
    b.jobdef_delete(&delete("young")).await.unwrap();
    let before = b.jobdef_revision().await.unwrap();
    let keep = Duration::from_secs(3600);
    assert_eq!(b.jobdef_prune_many(keep).await.unwrap(), 2);
    let names = |defs: Vec<JobDef>| {
        defs.into_iter()
            .map(|d| (d.name, d.deleted))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(b.jobdef_list().await.unwrap()),
        [("live".to_string(), false), ("young".to_string(), true)],
        "the old tombstones gone, the rest kept"
    );
    let after = b.jobdef_revision().await.unwrap();
    assert!(
        after >= before,
        "the revision fell back: {before} -> {after}"
    );
    assert_eq!(
        b.jobdef_prune_many(keep).await.unwrap(),
        0,
        "nothing left to prune"
    );
    assert_eq!(b.jobdef_revision().await.unwrap(), after);
    // A write after the prune raises the revision above every value it
    // had, so no reader's cached revision can come back.
    assert_eq!(
        b.jobdef_put(&put("old", &spec, None)).await.unwrap(),
        JobDefWrite::Written { version: 1 },
        "a pruned name starts again"
    );
    let again = b.jobdef_revision().await.unwrap();
    assert!(again > after && again > before, "{before} {after} {again}");
    // Racing prunes delete each tombstone once.
    b.jobdef_delete(&delete("old")).await.unwrap();
    b.jobdef_delete(&delete("live")).await.unwrap();
    baton_testkit::clock::advance(&ts, Duration::from_secs(7200)).await;
    let r = b.jobdef_revision().await.unwrap();
    let racers: Vec<_> = (0..4)
        .map(|_| {
            let s = ts.store.clone();
            tokio::spawn(async move { s.backend().jobdef_prune_many(keep).await.unwrap() })
        })
        .collect();
    let mut total = 0;
    for j in racers {
        total += j.await.unwrap();
    }
    assert_eq!(total, 3, "old, live and young, each pruned once");
    assert!(b.jobdef_list().await.unwrap().is_empty());
    assert!(b.jobdef_revision().await.unwrap() >= r);
}

/// D2: a scheduler's loop that has not yet reloaded a definitions change
/// cannot take the slots the newer definition governs (those at and after
/// its `updated_at`): the advance says which definition it runs
/// (`JobAdvance::source`) and the store refuses it
/// ([`Advanced::Superseded`]), cursor unmoved; slots before the change
/// stay the older definition's; a delete hands the later slots back to the
/// instances' own job; an advance without a source is not checked.
pub async fn a_stale_definition_cannot_take_a_newer_ones_slot(ts: TestStore) {
    use baton::store::{Advanced, DefinitionSource, JobAdvance, JobRegister};
    use chrono::{DateTime, Utc};
    let b = ts.store.backend();
    let name = "gov";
    let job = Job::new(name, Schedule::every(Duration::from_secs(1)).unwrap());
    b.job_register(&JobRegister::new(name)).await.unwrap();
    let ms = chrono::Duration::milliseconds;
    let cursor = || async { b.job_get(name).await.unwrap().unwrap().last_slot };
    let take = |slot: DateTime<Utc>, source: Option<DefinitionSource>| {
        let job = job.clone();
        async move {
            let task = job.task(slot, false).unwrap();
            let expected = b.job_get(name).await.unwrap().unwrap().last_slot;
            b.job_advance(&JobAdvance {
                source,
                ..JobAdvance::new(name, expected, slot, Some(&task))
            })
            .await
            .unwrap()
        }
    };
    let taken = |a: &Advanced| matches!(a, Advanced::Enqueued(e) if e.inserted);
    let own = Some(DefinitionSource::Own);
    let stored = |v| Some(DefinitionSource::Stored(v));
    let t0 = b.now().await.unwrap();

    // No definition in the store: the own job takes its slots.
    assert!(taken(&take(t0 - ms(5_000), own).await));
    let spec = json!({"every_ms": 1000, "v": 1});
    b.jobdef_put(&put(name, &spec, None)).await.unwrap();
    let u1 = one(&ts, name).await.updated_at;
    // The own job is refused the slots the definition governs (at and
    // after its write), not those before it.
    let before = cursor().await;
    assert_eq!(take(u1, own).await, Advanced::Superseded);
    assert_eq!(take(u1 + ms(3_000), own).await, Advanced::Superseded);
    assert_eq!(cursor().await, before, "a refused advance moves nothing");
    assert!(taken(&take(u1 - ms(1), own).await));
    // Version 1 takes them; an unchecked advance is not judged.
    assert!(taken(&take(u1, stored(1)).await));
    assert!(taken(&take(u1 + ms(1), None).await));

    tokio::time::sleep(Duration::from_millis(50)).await;
    let spec2 = json!({"every_ms": 2000, "v": 2});
    b.jobdef_put(&put(name, &spec2, Some(1))).await.unwrap();
    let u2 = one(&ts, name).await.updated_at;
    assert!(u2 > u1 + ms(2), "{u1} {u2}");
    assert_eq!(take(u2 + ms(2_000), stored(1)).await, Advanced::Superseded);
    assert_eq!(take(u2, own).await, Advanced::Superseded);
    assert!(
        taken(&take(u2 - ms(1), stored(1)).await),
        "a slot before the change stays version 1's"
    );
    assert!(taken(&take(u2, stored(2)).await));

    tokio::time::sleep(Duration::from_millis(50)).await;
    b.jobdef_delete(&JobDefDelete {
        name,
        expected: Some(2),
        by: "ana",
    })
    .await
    .unwrap();
    let u3 = one(&ts, name).await.updated_at;
    assert_eq!(take(u3, stored(2)).await, Advanced::Superseded);
    assert!(
        taken(&take(u3, own).await),
        "the delete hands the slots back"
    );
    // A stored loop of a version the store never had.
    assert_eq!(
        take(u3 + ms(1_000), Some(DefinitionSource::Stored(9))).await,
        Advanced::Superseded
    );
}
