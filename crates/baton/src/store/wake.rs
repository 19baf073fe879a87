//! The in-process wake-up registry of the backends without a server-side
//! notification channel (SQLite, MySQL/MariaDB): every handle in this
//! process on the same store (a file or a server and database, and a
//! prefix) shares one broadcast channel, so an insert through one handle
//! wakes the workers of every other handle at once. Other processes learn
//! of new work by polling.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use tokio::sync::broadcast;

use super::Wake;

/// Wake-ups buffered per channel; a slow receiver that falls further
/// behind misses some (they are hints: workers poll as well).
const CAPACITY: usize = 1024;

/// The channel of the store named by `key` (its file or server and
/// database, with the prefix), created on first use.
pub(crate) fn channel(key: String) -> broadcast::Sender<Wake> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, broadcast::Sender<Wake>>>> = OnceLock::new();
    let map = REGISTRY.get_or_init(|| Mutex::new(HashMap::new()));
    // A poisoned lock only means another thread panicked holding it; the
    // map itself is still usable.
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    map.entry(key)
        .or_insert_with(|| broadcast::channel(CAPACITY).0)
        .clone()
}
