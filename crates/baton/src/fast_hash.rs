//! Hash sets and maps for the per-task path (the running attempts, the
//! answers of a batch of results, the throughput rollup, the handlers by
//! kind): foldhash, seeded per process, instead of the standard library's
//! SipHash, which took ~2k of a task's ~38k instructions on PostgreSQL
//! (docs/BENCHMARKS.md, session 31).
//!
//! Their keys are the store's own ids and tokens, or queue, kind and job
//! names; the per-process seed keeps collisions from being chosen in
//! advance.

use std::collections::{HashMap, HashSet};

/// The hasher of [`FastMap`] and [`FastSet`].
pub(crate) type FastState = foldhash::fast::RandomState;

/// A [`HashMap`] with [`FastState`].
pub(crate) type FastMap<K, V> = HashMap<K, V, FastState>;

/// A [`HashSet`] with [`FastState`].
pub(crate) type FastSet<T> = HashSet<T, FastState>;

/// An empty [`FastSet`] with room for `n` items.
pub(crate) fn set_with_capacity<T>(n: usize) -> FastSet<T> {
    FastSet::with_capacity_and_hasher(n, FastState::default())
}
