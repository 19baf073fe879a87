//! T8, the checker's rate per concurrency key (`--per-key-rate N/PERIOD`,
//! DESIGN.md T6): no concurrency key of the workload's queue has more than
//! N `started_at` in any window `[t, t + P)` of the store's clock. As for
//! T6, the store keeps each task's latest start, so the check sees a
//! subset of the starts, and N + 1 of one key within P is a violation
//! whatever the rest were.

use std::collections::BTreeMap;

use baton::queue::RateLimit;
use baton::store::TaskInfo;

use super::check::{at, crowded, Report};

/// Check T8 on `tasks` of `queue` under `rate` per key into `r`.
pub(super) fn per_key_rate(r: &mut Report, tasks: &[TaskInfo], queue: &str, rate: RateLimit) {
    let mut by_key: BTreeMap<&str, Vec<(i64, i64)>> = BTreeMap::new();
    for t in tasks.iter().filter(|t| t.queue == queue) {
        if let (Some(k), Some(s)) = (t.concurrency_key.as_deref(), t.started_at) {
            by_key
                .entry(k)
                .or_default()
                .push((s.timestamp_micros(), t.id));
        }
    }
    let starts: usize = by_key.values().map(Vec::len).sum();
    r.op("T8: keyed starts (latest per task)", starts as u64);
    let mut most = 0;
    for (key, starts) in by_key {
        let (m, over) = crowded(starts, rate);
        most = most.max(m);
        for (t, ids) in over {
            r.violation(
                "T8",
                format!(
                    "queue {queue:?}, key {key:?}: {} starts in [{}, +{}), limit {rate} per key: \
                     tasks {ids:?}",
                    ids.len(),
                    at(t),
                    baton::format_duration(rate.per())
                ),
            );
        }
    }
    r.op("T8: most starts of one key in one period", most as u64);
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::check::limits::task;
    use super::super::check::{check, Limits};
    use super::*;

    fn limits(n: u32) -> Limits {
        Limits {
            queue: "chaos".into(),
            per_key_max_running: None,
            rate: None,
            per_key_rate: Some(RateLimit::new(n, Duration::from_secs(1)).unwrap()),
            ..Limits::default()
        }
    }

    fn t8(tasks: &[TaskInfo], l: &Limits) -> Option<u64> {
        check(&[], tasks, l).violations.get("T8").map(|v| v.0)
    }

    #[test]
    fn n_plus_one_starts_of_one_key_within_a_period_are_a_t8_violation() {
        // Key a starts at 0, 400 and 999 ms; key b twice in between;
        // keyless tasks count for no key.
        let tasks = [
            task(1, Some("a"), 0),
            task(2, Some("a"), 400),
            task(3, Some("a"), 999),
            task(4, Some("b"), 100),
            task(5, Some("b"), 200),
            task(6, None, 300),
            task(7, None, 310),
            task(8, None, 320),
        ];
        assert_eq!(t8(&tasks, &limits(3)), None);
        // A planted overshoot: at 2 per second, key a's three starts.
        assert_eq!(t8(&tasks, &limits(2)), Some(1));
        let r = check(&[], &tasks, &limits(2));
        let example = &r.violations["T8"].1[0];
        assert!(
            example.contains("key \"a\"") && example.contains("tasks [1, 2, 3]"),
            "{example}"
        );
        // At 1 per second both keys overshoot.
        assert_eq!(t8(&tasks, &limits(1)), Some(3));
        // 1 000 ms apart is the next window: [0, 1 s) is half-open.
        let tasks = [task(1, Some("a"), 0), task(2, Some("a"), 1_000)];
        assert_eq!(t8(&tasks, &limits(1)), None);
        // Another queue's starts do not count.
        let mut other = task(3, Some("a"), 500);
        other.queue = "other".into();
        assert_eq!(t8(&[task(1, Some("a"), 0), other], &limits(1)), None);
        // Without the option the row is not exercised.
        let r = check(&[], &tasks, &Limits::default());
        assert!(
            r.table().contains("not exercised (no --per-key-rate)"),
            "{}",
            r.table()
        );
    }
}
