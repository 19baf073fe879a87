//! Deleting tasks (`Queue::delete`, `Queue::delete_finished`,
//! `Backend::task_delete_many`): a task that is not running goes at once,
//! whatever its age; a running one stays; a schedule slot's task leaves
//! its tombstone, as prune does, so deleting a run never lets its slot run
//! again.

use std::time::Duration;

use baton::queue::{DeleteOutcome, Queue, TaskBuilder};
use baton::schedule::spec::Schedule;
use baton::schedule::{trigger, Job};
use baton::store::{Finish, JobRegister, TaskFilter, TaskState};

use crate::TestStore;

pub async fn delete_takes_what_is_not_running(ts: TestStore) {
    let b = ts.store.backend();
    let q = Queue::new(ts.store.clone());
    let task = |key: &str| {
        TaskBuilder::new("k", serde_json::json!({}))
            .queue("del")
            .unique_key(key)
    };
    // Pending: cancelled, then deleted; its unique key is free again.
    let pending = q.enqueue(task("a")).await.unwrap().id;
    assert_eq!(q.delete(pending).await.unwrap(), DeleteOutcome::Deleted);
    assert!(q.task(pending).await.unwrap().is_none());
    assert!(q.enqueue(task("a")).await.unwrap().inserted);
    assert_eq!(q.delete(pending).await.unwrap(), DeleteOutcome::NotFound);

    // Running: left alone, by the operation and by the seam.
    let running = crate::queue::claim(&ts.store, "del", 10, 30_000).await;
    assert_eq!(running.len(), 1);
    let r = running[0].id;
    assert_eq!(q.delete(r).await.unwrap(), DeleteOutcome::Running);
    assert!(b.task_delete_many(&[r]).await.unwrap().is_empty());
    let t = q.task(r).await.unwrap().expect("still there");
    assert_eq!(t.state, TaskState::Running);
    assert!(
        !t.cancel_requested,
        "a refused delete changed nothing: {t:?}"
    );

    // Finished: gone at once, whatever its age (no retention).
    let failed = Finish::Failed {
        error: "boom".into(),
        retry_in: None,
    };
    assert_eq!(
        b.task_finish_many(&[(running[0].claim(), failed)])
            .await
            .unwrap(),
        [true]
    );
    assert!(q.task(r).await.unwrap().unwrap().state.is_terminal());
    assert_eq!(q.delete(r).await.unwrap(), DeleteOutcome::Deleted);
    assert!(q.task(r).await.unwrap().is_none());

    // The seam: only the finished ones among the ids, unknown ids ignored.
    let p = q.enqueue(task("p")).await.unwrap().id;
    let done = q.enqueue(task("d")).await.unwrap().id;
    assert_eq!(
        q.cancel(done).await.unwrap(),
        baton::store::CancelOutcome::Cancelled
    );
    let gone = b.task_delete_many(&[p, done, 42, done]).await.unwrap();
    assert_eq!(gone, [done]);
    assert!(q.task(p).await.unwrap().is_some());
    assert!(b.task_delete_many(&[]).await.unwrap().is_empty());

    // In bulk, by filter: the finished tasks of the queue, not the pending.
    let mut cancelled = Vec::new();
    for i in 0..5 {
        let id = q.enqueue(task(&format!("bulk{i}"))).await.unwrap().id;
        q.cancel(id).await.unwrap();
        cancelled.push(id);
    }
    let filter = TaskFilter {
        queue: Some("del".into()),
        ..TaskFilter::default()
    };
    let mut gone = q.delete_finished(&filter).await.unwrap();
    gone.sort();
    assert_eq!(gone, cancelled);
    let left: Vec<i64> = q
        .tasks_all(&filter)
        .await
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    assert!(
        left.contains(&p) && !left.iter().any(|id| cancelled.contains(id)),
        "{left:?}"
    );
    // The queue's counts followed (Redis keeps them apart from the tasks).
    let stats = q.stats().await.unwrap();
    let s = stats.iter().find(|s| s.queue == "del").expect("the queue");
    assert_eq!(s.cancelled, 0, "{s:?}");
    assert_eq!(s.failed, 0, "{s:?}");
}

/// A slot's run deleted leaves its tombstone: the slot is not run again,
/// by a trigger or by the scheduler.
pub async fn a_deleted_slot_is_never_run_again(ts: TestStore) {
    let b = ts.store.backend();
    let q = Queue::new(ts.store.clone());
    let job = Job::new("deleted", Schedule::every(Duration::from_secs(1)).unwrap()).queue("dq");
    let c0 = b
        .job_register(&JobRegister::new("deleted").queue("dq"))
        .await
        .unwrap()
        .last_slot
        .unwrap();
    let s1 = job.schedule.next_after(c0).unwrap();
    let first = trigger(&ts.store, &job, s1).await.unwrap();
    assert!(first.inserted);
    // Deleted while pending (cancelled first).
    assert_eq!(q.delete(first.id).await.unwrap(), DeleteOutcome::Deleted);
    let again = trigger(&ts.open().await, &job, s1).await.unwrap();
    assert!(!again.inserted, "the deleted slot ran again: {again:?}");
    assert_eq!(again.id, first.id);
    let tomb = b
        .slot_get(&job.slot_key(s1))
        .await
        .unwrap()
        .expect("a tombstone");
    assert_eq!(tomb.task_id, first.id);
    assert_eq!(tomb.state, TaskState::Cancelled);
}
