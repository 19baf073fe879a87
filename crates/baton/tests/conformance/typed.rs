//! Typed tasks ([`TaskArgs`]): inserted with their kind's default options,
//! handed to the handler decoded, and a payload that does not decode fails
//! its task at once, naming the kind and serde's error.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton::queue::{InsertOpts, Queue, TaskArgs, TaskBuilder, TaskError, Worker, WorkerConfig};
use baton::store::{TaskInfo, TaskState};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::TestStore;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Resize {
    image: u64,
    width: u32,
}

impl TaskArgs for Resize {
    const KIND: &'static str = "resize";
    fn insert_opts() -> InsertOpts {
        InsertOpts {
            queue: Some("images".into()),
            max_attempts: Some(4),
            priority: Some(-5),
            ..InsertOpts::default()
        }
    }
}

async fn wait_finished(q: &Queue, id: i64) -> TaskInfo {
    baton_testkit::wait::until(
        Duration::from_secs(10),
        &format!("task {id} finished"),
        || async {
            let t = q.task(id).await.unwrap().expect("task exists");
            t.state.is_terminal().then_some(t)
        },
    )
    .await
}

pub async fn typed_tasks_decode_or_fail_permanently(ts: TestStore) {
    let q = Queue::new(ts.store.clone());
    let args = Resize {
        image: 7,
        width: 640,
    };
    let good = q.insert(&args).await.unwrap();
    assert!(good.inserted);
    let info = q.task(good.id).await.unwrap().unwrap();
    assert_eq!(
        (
            info.kind.as_str(),
            info.queue.as_str(),
            info.max_attempts,
            info.priority
        ),
        ("resize", "images", 4, -5),
        "the kind's insert options apply"
    );
    // Options set on the builder override the kind's defaults.
    let over = q
        .enqueue(
            TaskBuilder::from_args(&args)
                .unwrap()
                .max_attempts(1)
                .unique_key("r-7"),
        )
        .await
        .unwrap();
    assert_eq!(q.task(over.id).await.unwrap().unwrap().max_attempts, 1);
    // Same kind, a payload written by an untyped producer that does not fit.
    let bad = q
        .enqueue(TaskBuilder::new("resize", serde_json::json!({"image": "seven"})).queue("images"))
        .await
        .unwrap();

    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut w = Worker::new(
        ts.store.clone(),
        WorkerConfig::default()
            .queue("images", 2)
            .poll_interval(Duration::from_millis(100)),
    )
    .unwrap();
    let s = seen.clone();
    w.register(move |ctx, r: Resize| {
        let s = s.clone();
        async move {
            s.lock().unwrap().push((ctx.task().id, r));
            Ok::<_, TaskError>(())
        }
    });
    let stop = CancellationToken::new();
    let run = tokio::spawn(w.run(stop.clone()));
    let g = wait_finished(&q, good.id).await;
    let o = wait_finished(&q, over.id).await;
    let b = wait_finished(&q, bad.id).await;
    stop.cancel();
    run.await.unwrap().unwrap();

    assert_eq!(
        (g.state, o.state),
        (TaskState::Succeeded, TaskState::Succeeded)
    );
    let mut seen = seen.lock().unwrap().clone();
    seen.sort_by_key(|(id, _)| *id);
    assert_eq!(seen, vec![(good.id, args.clone()), (over.id, args)]);
    assert_eq!(b.state, TaskState::Failed);
    assert_eq!(
        b.attempt, 1,
        "a payload that does not decode is not retried"
    );
    let msg = b.last_error.unwrap_or_default();
    assert!(
        msg.contains("\"resize\"") && msg.contains("invalid type: string \"seven\""),
        "the error names the kind and serde's error: {msg}"
    );
}
