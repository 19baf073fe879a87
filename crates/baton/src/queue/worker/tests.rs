use super::*;

#[test]
fn pace_sizes_the_buffer_to_the_horizon_and_forgets_idle_spells() {
    let t0 = Instant::now();
    let mut p = Pace::new(t0);
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
    let mut slow = Pace::new(t0);
    slow.started(24);
    assert_eq!(slow.buffer(t0 + Duration::from_secs(1), 512), 2);
    // An idle spell replaces the estimate: nothing buffered after it.
    assert_eq!(p.buffer(t0 + Duration::from_secs(5), 512), 0);
}
