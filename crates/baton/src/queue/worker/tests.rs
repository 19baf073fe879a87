use super::*;

#[test]
fn pace_sizes_the_buffer_to_the_horizon_and_forgets_idle_spells() {
    let t0 = Instant::now();
    let mut p = Pace::new(t0, crate::queue::PREFETCH_HORIZON);
    assert_eq!(p.buffer(t0, 512), 0, "no pace known yet: free slots only");
    // 200 starts in 50 ms: 4000/s, averaged with the unknown 0 → 2000/s
    // → 200 tasks in 100 ms.
    p.started(200);
    assert_eq!(p.buffer(t0 + Duration::from_millis(50), 512), 200);
    // The same pace again: the average converges to 4000/s → 300, then 350.
    p.started(200);
    assert_eq!(p.buffer(t0 + Duration::from_millis(100), 512), 300);
    p.started(200);
    assert_eq!(p.buffer(t0 + Duration::from_millis(150), 512), 350);
    // Bounded by `max`.
    assert_eq!(p.buffer(t0 + Duration::from_millis(160), 100), 100);
    // Long handlers: 24 starts a second buffer next to nothing.
    let mut slow = Pace::new(t0, crate::queue::PREFETCH_HORIZON);
    slow.started(24);
    assert_eq!(slow.buffer(t0 + Duration::from_secs(1), 512), 2);
    // An idle spell replaces the estimate: nothing buffered after it.
    assert_eq!(p.buffer(t0 + Duration::from_secs(5), 512), 0);
}

#[test]
fn pace_holds_its_horizon_of_work() {
    // PostgreSQL's and MySQL's longer horizon: the same pace, three times
    // the buffer (and so claims about three times as large, a third as
    // many).
    let t0 = Instant::now();
    let mut short = Pace::new(t0, crate::queue::PREFETCH_HORIZON);
    let mut long = Pace::new(t0, crate::queue::SERVER_SQL_PREFETCH_HORIZON);
    for p in [&mut short, &mut long] {
        p.started(100);
        p.buffer(t0 + Duration::from_millis(50), 10_000);
        p.started(100);
    }
    // 2000/s averaged with the unknown 0, then 2000/s again: 1500/s.
    let at = t0 + Duration::from_millis(100);
    assert_eq!(short.buffer(at, 10_000), 150);
    assert_eq!(long.buffer(at, 10_000), 450);
    assert_eq!(long.buffer(at, 400), 400, "still bounded by `max`");
}

fn completion(
    id: i64,
) -> (
    Completion,
    tokio::sync::oneshot::Receiver<Result<bool, StoreError>>,
) {
    let (reply, rx) = tokio::sync::oneshot::channel();
    let claim = Claim {
        id,
        attempt: 1,
        token: crate::store::FencingToken(7),
    };
    (
        Completion {
            claim,
            finish: Finish::Succeeded,
            reply: Reply::Waiter(reply),
        },
        rx,
    )
}

#[test]
fn a_claim_carries_each_task_once_and_holding_follows_the_hot_queues() {
    let ride = Ride::new(true, 536);
    assert_eq!(ride.hold_max, 268);
    assert!(!ride.holding(), "no queue with a backlog: nothing held");
    let mut a = Hot::new(&ride);
    let mut b = Hot::new(&ride);
    a.set(true);
    b.set(true);
    a.set(true);
    b.set(false);
    assert!(ride.holding(), "one hot queue is enough");
    // Results for tasks 1, 2, 1 (a lost claim's and its next claim's), 3:
    // a claim takes 1 and 2 only; the second result for 1 and the one
    // after it stay held for the next.
    let mut rxs = Vec::new();
    let held = ride.hold([1, 2, 1, 3].map(|id| {
        let (c, rx) = completion(id);
        rxs.push(rx);
        c
    }));
    assert_eq!(held, 4);
    let ids = |v: &[Completion]| v.iter().map(|c| c.claim.id).collect::<Vec<_>>();
    let first = ride.take_for_claim();
    assert_eq!(ids(&first), [1, 2]);
    assert_eq!(ride.held(), 2);
    ride::answer(first, Ok(&[true, false]));
    assert!(matches!(rxs[0].try_recv(), Ok(Ok(true))));
    assert!(matches!(rxs[1].try_recv(), Ok(Ok(false))));
    let second = ride.take_for_claim();
    assert_eq!(ids(&second), [1, 3]);
    // A wrong number of answers fails every waiter, none is left hanging.
    ride::answer(second, Ok(&[true]));
    assert!(matches!(rxs[2].try_recv(), Ok(Err(StoreError::Corrupt(_)))));
    assert!(matches!(rxs[3].try_recv(), Ok(Err(StoreError::Corrupt(_)))));
    drop(a);
    assert!(
        !ride.holding(),
        "the last hot queue gone: results go at once"
    );
    assert!(!Ride::new(false, 536).holding());
}

#[tokio::test]
async fn stop_by_follows_the_lease_bound_whenever_watched() {
    let task = crate::testing::task_of(crate::queue::TaskBuilder::new(
        "watched",
        serde_json::json!({}),
    ))
    .unwrap();
    let ctx = TaskContext::for_test(task);
    let margin = ctx.margin;
    let first = Instant::now() + Duration::from_secs(60);
    // Moved before anyone watches: the watch made later starts there.
    ctx.state.set_lease_bound(first);
    assert_eq!(ctx.stop_by(), first - margin);
    let mut watch = ctx.watch_stop_by();
    assert_eq!(watch.get(), first - margin);
    // Moved while watched: the watch hears it, and a second watch shares it.
    let mut second = ctx.watch_stop_by();
    let later = first + Duration::from_secs(30);
    ctx.state.set_lease_bound(later);
    let heard = |w: &mut crate::lock::StopBy| {
        let mut w = w.clone();
        async move { tokio::time::timeout(Duration::from_secs(5), w.changed()).await }
    };
    assert_eq!(heard(&mut watch).await, Ok(Some(later - margin)));
    assert_eq!(heard(&mut second).await, Ok(Some(later - margin)));
    assert_eq!(ctx.stop_by(), later - margin);
    // The attempt gone (every context dropped): nothing moves it any more.
    drop(ctx);
    watch.get();
    assert_eq!(heard(&mut watch).await, Ok(None));
}
