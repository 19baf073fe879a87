//! Issue 26 item 5: a job records its overlap policy when registered, and
//! a pause or resume of a job or queue keeps its note, author and the
//! store's time (the last change), read back by `job_get`, `job_list` and
//! `queue_stats`.

use baton::queue::Queue;
use baton::schedule;
use baton::store::{JobRegister, JobState, Overlap, PauseChange, PauseNote};
use chrono::{DateTime, Utc};

use crate::TestStore;

/// `change` was made at about the store's `now` (within 5 s before it).
fn recent(change: &PauseChange, now: DateTime<Utc>) {
    let age = now - change.at;
    assert!(
        age >= chrono::Duration::zero() && age < chrono::Duration::seconds(5),
        "changed at {} (store now {now})",
        change.at
    );
}

async fn both(ts: &TestStore, job: &str) -> JobState {
    let b = ts.store.backend();
    let one = b.job_get(job).await.unwrap().expect("job known");
    let listed = b
        .job_list()
        .await
        .unwrap()
        .into_iter()
        .find(|j| j.name == job)
        .expect("job listed");
    assert_eq!(one, listed, "job_get and job_list agree");
    one
}

pub async fn job_records_its_policy_and_pause_notes(ts: TestStore) {
    let b = ts.store.backend();
    let reg = JobRegister::new("noted")
        .queue("q1")
        .overlap(Overlap::BufferAll);
    let st = b.job_register(&reg).await.unwrap();
    assert_eq!(st.overlap, Some(Overlap::BufferAll));
    assert_eq!(st.pause_change, None, "never paused");
    // Registering again without a policy keeps it; with one changes it.
    b.job_register(&JobRegister::new("noted")).await.unwrap();
    assert_eq!(both(&ts, "noted").await.overlap, Some(Overlap::BufferAll));
    b.job_register(&JobRegister::new("noted").overlap(Overlap::Skip))
        .await
        .unwrap();
    assert_eq!(both(&ts, "noted").await.overlap, Some(Overlap::Skip));
    // A job registered with no policy has none recorded.
    b.job_register(&JobRegister::new("plain")).await.unwrap();
    assert_eq!(both(&ts, "plain").await.overlap, None);

    // Pause with a note and author: kept, with the store's time.
    let note = "deploy in progress — ünïcode ok\nsecond line";
    let why = PauseNote::default().note(note).by("alice@ops-1 via cli");
    assert!(schedule::set_paused_with(&ts.store, "noted", true, why)
        .await
        .unwrap());
    let now = ts.store.now().await.unwrap();
    let st = both(&ts, "noted").await;
    assert!(st.paused);
    let c = st.pause_change.expect("the pause is recorded");
    assert_eq!(c.note.as_deref(), Some(note));
    assert_eq!(c.by.as_deref(), Some("alice@ops-1 via cli"));
    recent(&c, now);
    // The other job is untouched.
    assert_eq!(both(&ts, "plain").await.pause_change, None);

    // A resume with only an author replaces the record: no note now.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let why = PauseNote::default().by("api:operate via api");
    assert!(schedule::set_paused_with(&ts.store, "noted", false, why)
        .await
        .unwrap());
    let st = both(&ts, "noted").await;
    assert!(!st.paused);
    let c2 = st.pause_change.expect("the resume is recorded");
    assert_eq!(c2.note, None, "the pause's note is not carried over");
    assert_eq!(c2.by.as_deref(), Some("api:operate via api"));
    assert!(c2.at > c.at, "the resume is later than the pause");
    // The old call records a change without note or author.
    assert!(schedule::set_paused(&ts.store, "noted", true)
        .await
        .unwrap());
    let c3 = both(&ts, "noted").await.pause_change.unwrap();
    assert_eq!((c3.note, c3.by), (None, None));

    // Unknown job: false, nothing created.
    let why = PauseNote::default().note("x");
    assert!(!schedule::set_paused_with(&ts.store, "nope", true, why)
        .await
        .unwrap());
    assert_eq!(b.job_get("nope").await.unwrap(), None);
    // A note over the bound is refused before the store, naming the field.
    let long = "n".repeat(baton::store::MAX_PAUSE_NOTE_LEN + 1);
    let e = schedule::set_paused_with(&ts.store, "noted", false, PauseNote::default().note(&long))
        .await
        .unwrap_err();
    assert!(e.to_string().starts_with("note:"), "{e}");
    assert!(both(&ts, "noted").await.paused, "nothing changed");
}

pub async fn queue_pause_notes_are_kept_and_shown(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let stats = |name: &'static str| {
        let q = q.clone();
        async move {
            q.stats()
                .await
                .unwrap()
                .into_iter()
                .find(|s| s.queue == name)
        }
    };
    // A paused queue without tasks is listed, with its note.
    let why = PauseNote::default()
        .note("vendor outage")
        .by("bob@host via cli");
    q.pause_with("empty", why).await.unwrap();
    let now = ts.store.now().await.unwrap();
    let s = stats("empty").await.expect("a paused queue is listed");
    assert!(s.paused);
    let c = s.pause_change.expect("recorded");
    assert_eq!(c.note.as_deref(), Some("vendor outage"));
    assert_eq!(c.by.as_deref(), Some("bob@host via cli"));
    recent(&c, now);
    // Resumed, it has no tasks: no longer listed.
    q.resume("empty").await.unwrap();
    assert_eq!(stats("empty").await, None);

    // A queue with tasks shows its last change, paused or resumed.
    q.enqueue(baton::queue::TaskBuilder::new("k", serde_json::json!({})).queue("busy"))
        .await
        .unwrap();
    assert_eq!(stats("busy").await.unwrap().pause_change, None);
    q.pause_with("busy", PauseNote::default().note("hold"))
        .await
        .unwrap();
    let s = stats("busy").await.unwrap();
    assert!(s.paused);
    assert_eq!(
        s.pause_change.as_ref().unwrap().note.as_deref(),
        Some("hold")
    );
    assert_eq!(s.pause_change.as_ref().unwrap().by, None);
    q.resume_with("busy", PauseNote::default().note("fixed").by("carol"))
        .await
        .unwrap();
    let s = stats("busy").await.unwrap();
    assert!(!s.paused);
    let c = s.pause_change.unwrap();
    assert_eq!(
        (c.note.as_deref(), c.by.as_deref()),
        (Some("fixed"), Some("carol"))
    );
    // Bad input is refused naming the field; nothing changes.
    let e = q
        .pause_with("busy", PauseNote::default().by("a\u{1b}[31m"))
        .await
        .unwrap_err();
    assert!(e.to_string().starts_with("by:"), "{e}");
    assert!(!stats("busy").await.unwrap().paused);
}
