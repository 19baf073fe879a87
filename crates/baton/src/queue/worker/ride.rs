//! Results that ride with the next claim: while a queue has a backlog (its
//! last claim came back full) a claim is never far off, so on a store whose
//! [`task_finish_and_claim`](crate::store::Backend::task_finish_and_claim)
//! is one round trip ([`claims_carry_finishes`](crate::store::Backend::claims_carry_finishes))
//! the completer holds the finished attempts for that claim instead of
//! writing them alone: one statement and one commit for both. Results are
//! held at most [`RIDE_MAX`], at most [`Ride::hold_max`] of them (half the
//! places a queue has for unacknowledged results, so holding never keeps a
//! slot taken), and not at all when no queue has a backlog, so an idle or
//! lightly loaded worker writes each result at once.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

/// The longest a result waits for a claim to carry it before the
/// completer writes it alone.
pub(super) const RIDE_MAX: Duration = Duration::from_millis(20);

/// The most results one claim carries.
pub(super) const RIDE_BATCH: usize = 2048;

/// The results held for the next claim, and who will claim soon.
pub(super) struct Ride {
    /// Whether the store finishes with a claim in one round trip.
    pub(super) enabled: bool,
    /// The most results held at once: half the places for unacknowledged
    /// results of the queue with the fewest (its concurrency plus its
    /// prefetch bound; see `Slot`). A queue whose places were all taken by
    /// held results would keep its slots until they are written, and claim
    /// nothing meanwhile: a stall of [`RIDE_MAX`].
    pub(super) hold_max: usize,
    /// The results held, oldest first.
    held: Mutex<Vec<Completion>>,
    /// Claim loops whose queue has a backlog and whose claims may carry
    /// results.
    hot: AtomicUsize,
    /// Told when held results are taken or `hot` changes.
    pub(super) changed: Notify,
}

impl Ride {
    /// A ride for a store that carries finishes with claims or not, for
    /// queues with at least `places` places for unacknowledged results.
    pub(super) fn new(enabled: bool, places: usize) -> Ride {
        Ride {
            enabled,
            hold_max: (places / 2).clamp(1, RIDE_BATCH),
            held: Mutex::new(Vec::new()),
            hot: AtomicUsize::new(0),
            changed: Notify::new(),
        }
    }

    /// Whether results should wait for a claim now.
    pub(super) fn holding(&self) -> bool {
        self.enabled && self.hot.load(Ordering::Acquire) > 0
    }

    /// Hold `items` for the next claim; how many are held now.
    pub(super) fn hold(&self, items: impl IntoIterator<Item = Completion>) -> usize {
        let mut held = lock(&self.held);
        held.extend(items);
        held.len()
    }

    /// How many results are held.
    pub(super) fn held(&self) -> usize {
        lock(&self.held).len()
    }

    /// Every result held (the completer writes them).
    pub(super) fn take_all(&self) -> Vec<Completion> {
        std::mem::take(&mut *lock(&self.held))
    }

    /// The results a claim carries: the oldest held, up to
    /// [`RIDE_BATCH`], each task at most once (a later result for a task
    /// already carried stays held).
    pub(super) fn take_for_claim(&self) -> Vec<Completion> {
        let mut held = lock(&self.held);
        if held.is_empty() {
            return Vec::new();
        }
        let mut seen = crate::fast_hash::set_with_capacity(held.len().min(RIDE_BATCH));
        let n = held
            .iter()
            .take(RIDE_BATCH)
            .take_while(|c| seen.insert(c.claim.id))
            .count();
        let rest = held.split_off(n);
        let taken = std::mem::replace(&mut *held, rest);
        drop(held);
        self.changed.notify_one();
        taken
    }
}

/// A claim loop's mark on [`Ride::hot`]: set while its queue has a backlog
/// and its claims may carry results; cleared when dropped.
pub(super) struct Hot<'a> {
    ride: &'a Ride,
    on: bool,
}

impl<'a> Hot<'a> {
    pub(super) fn new(ride: &'a Ride) -> Hot<'a> {
        Hot { ride, on: false }
    }

    /// Mark or unmark; the completer hears of a change.
    pub(super) fn set(&mut self, on: bool) {
        if on == self.on {
            return;
        }
        self.on = on;
        if on {
            self.ride.hot.fetch_add(1, Ordering::AcqRel);
        } else {
            self.ride.hot.fetch_sub(1, Ordering::AcqRel);
        }
        self.ride.changed.notify_one();
    }
}

impl Drop for Hot<'_> {
    fn drop(&mut self) {
        self.set(false);
    }
}

/// Answer each carried result from the combined call's answer (or its
/// error, as the completer answers a failed batch).
pub(super) fn answer(carried: Vec<Completion>, r: Result<&[bool], &crate::StoreError>) {
    match r {
        Ok(answers) if answers.len() == carried.len() => {
            for (c, ok) in carried.into_iter().zip(answers) {
                c.reply.answer(Ok(*ok));
            }
        }
        Ok(_) => fail_all(
            carried,
            &crate::StoreError::Corrupt(
                "finish_and_claim answered the wrong number of items".into(),
            ),
        ),
        Err(e) => fail_all(carried, e),
    }
}

/// Answer every result of a batch with the batch's error: retryable ones
/// as [`Unavailable`](crate::StoreError::Unavailable) (the waiter retries
/// within its lease), others as [`Backend`](crate::StoreError::Backend).
pub(super) fn fail_all(batch: Vec<Completion>, e: &crate::StoreError) {
    let msg = e.to_string();
    let retryable = e.is_retryable();
    for c in batch {
        let err = if retryable {
            crate::StoreError::Unavailable(msg.clone())
        } else if matches!(e, crate::StoreError::Corrupt(_)) {
            crate::StoreError::Corrupt(msg.clone())
        } else {
            crate::StoreError::Backend(msg.clone())
        };
        c.reply.answer(Err(err));
    }
}
