//! The store's clock as seen from this process: calibrated with the store's
//! `now()`, advanced on the local monotonic clock (DESIGN.md C1). The
//! scheduler uses it to fire slots; workers use it to turn a wake-up's due
//! time (store time) into a local instant for their timers.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

use crate::error::Error;
use crate::store::Store;

/// An estimate of the store's clock: calibrated with the store's `now()`,
/// advanced on this machine's monotonic clock. The local wall clock is
/// never used for time, so a skewed node fires at the same instants as the
/// rest. (It is compared with the monotonic clock only to notice a
/// suspended machine, whose monotonic clock stood still: then the estimate
/// is recalibrated at once.)
#[derive(Debug, Clone)]
pub struct StoreClock {
    store: Store,
    /// Store time read, the local instant it is taken to correspond to (the
    /// middle of the round trip), and half that round trip (the most the
    /// estimate can be off by, apart from drift).
    base: Arc<std::sync::Mutex<(DateTime<Utc>, Instant, Duration)>>,
    wall: Arc<std::sync::Mutex<(std::time::SystemTime, Instant)>>,
    /// The test clock's jump count this estimate was read after (feature
    /// `test-clock`, see [`test_jumps`]).
    #[cfg(feature = "test-clock")]
    jumps_seen: Arc<std::sync::atomic::AtomicU64>,
}

/// The test clock's jumps in this process (feature `test-clock`, tests
/// only): a test that shifts the store's clock calls [`test_jumps::jumped`] (the test
/// kit's `clock::advance` does), and every [`StoreClock`] of the process
/// recalibrates at its next look (a scheduler's sleep ends at once).
/// Other processes follow at their next recalibration.
#[cfg(feature = "test-clock")]
pub mod test_jumps {
    use std::sync::OnceLock;
    use tokio::sync::watch;

    fn channel() -> &'static watch::Sender<u64> {
        static JUMPS: OnceLock<watch::Sender<u64>> = OnceLock::new();
        JUMPS.get_or_init(|| watch::channel(0).0)
    }

    /// Tell this process's store clocks that the store's clock jumped.
    pub fn jumped() {
        channel().send_modify(|n| *n += 1);
    }

    /// How many jumps this process was told of.
    pub(crate) fn count() -> u64 {
        *channel().borrow()
    }

    /// A receiver that sees the next jump.
    pub(crate) fn subscribe() -> watch::Receiver<u64> {
        channel().subscribe()
    }
}

/// One reading of the store's clock: (store now, local mid-point, half RTT).
async fn sample(store: &Store) -> Result<(DateTime<Utc>, Instant, Duration), Error> {
    let t0 = Instant::now();
    let now = store.now().await?;
    let half = t0.elapsed() / 2;
    Ok((now, t0 + half, half))
}

impl StoreClock {
    /// Calibrate against the store.
    pub async fn new(store: Store) -> Result<StoreClock, Error> {
        #[cfg(feature = "test-clock")]
        let jumps = test_jumps::count();
        let base = sample(&store).await?;
        Ok(StoreClock {
            store,
            base: Arc::new(std::sync::Mutex::new(base)),
            wall: Arc::new(std::sync::Mutex::new((
                std::time::SystemTime::now(),
                Instant::now(),
            ))),
            #[cfg(feature = "test-clock")]
            jumps_seen: Arc::new(std::sync::atomic::AtomicU64::new(jumps)),
        })
    }

    /// Whether the test clock jumped since this estimate was read (always
    /// false without the feature `test-clock`).
    fn jumped(&self) -> bool {
        #[cfg(feature = "test-clock")]
        {
            test_jumps::count() != self.jumps_seen.load(std::sync::atomic::Ordering::Relaxed)
        }
        #[cfg(not(feature = "test-clock"))]
        false
    }

    /// Recalibrate if the machine was suspended long enough that the
    /// monotonic clock (which stands still during suspend) fell behind the
    /// wall clock.
    pub async fn recalibrate_if_suspended(&self) {
        if self.jumped() {
            tracing::debug!("the test clock jumped; recalibrating the store clock");
            self.recalibrate().await;
            return;
        }
        let (sys, mono) = match self.wall.lock() {
            Ok(g) => *g,
            Err(p) => *p.into_inner(),
        };
        let wall_elapsed = std::time::SystemTime::now()
            .duration_since(sys)
            .unwrap_or_default();
        if wall_elapsed.saturating_sub(mono.elapsed()) > Duration::from_secs(1) {
            tracing::info!("the machine was suspended; recalibrating the store clock");
            self.recalibrate().await;
        }
    }

    fn base(&self) -> (DateTime<Utc>, Instant, Duration) {
        match self.base.lock() {
            Ok(g) => *g,
            Err(p) => *p.into_inner(),
        }
    }

    /// The estimated store time now.
    pub fn now(&self) -> DateTime<Utc> {
        let (t, at, _) = self.base();
        t + chrono::Duration::from_std(at.elapsed()).unwrap_or_default()
    }

    /// The local instant by which the store's clock has surely reached `t`
    /// (the estimate plus its uncertainty, half the calibration's round
    /// trip). An instant in the past for a `t` already reached.
    pub fn instant_at(&self, t: DateTime<Utc>) -> Instant {
        let (base, at, half) = self.base();
        match (t - base).to_std() {
            Ok(ahead) => at + ahead + half,
            Err(_) => {
                let behind = (base - t).to_std().unwrap_or_default();
                at.checked_sub(behind).unwrap_or(at) + half
            }
        }
    }

    /// Re-read the store's clock (errors keep the old estimate).
    pub async fn recalibrate(&self) {
        self.recalibrate_best_of(1).await;
    }

    /// Read the store's clock `n` times and keep the reading with the
    /// shortest round trip (the most precise). Errors keep the old estimate.
    pub async fn recalibrate_best_of(&self, n: usize) {
        #[cfg(feature = "test-clock")]
        let jumps = test_jumps::count();
        let mut best: Option<(DateTime<Utc>, Instant, Duration)> = None;
        for _ in 0..n.max(1) {
            if let Ok(s) = sample(&self.store).await {
                if best.is_none_or(|b| s.2 < b.2) {
                    best = Some(s);
                }
            }
        }
        let Some(best) = best else { return };
        #[cfg(feature = "test-clock")]
        self.jumps_seen
            .store(jumps, std::sync::atomic::Ordering::Relaxed);
        match self.base.lock() {
            Ok(mut g) => *g = best,
            Err(p) => *p.into_inner() = best,
        }
        let w = (std::time::SystemTime::now(), Instant::now());
        match self.wall.lock() {
            Ok(mut g) => *g = w,
            Err(p) => *p.into_inner() = w,
        }
    }

    /// Sleep until the store's clock reaches `t` (or `max`, whichever first).
    pub async fn sleep_until(&self, t: DateTime<Utc>, max: Duration) {
        let wait = (t - self.now()).to_std().unwrap_or(Duration::ZERO);
        let sleep = tokio::time::sleep(wait.min(max).max(Duration::from_millis(2)));
        #[cfg(feature = "test-clock")]
        {
            // A jump of the test clock ends the sleep: the caller
            // recalibrates and looks again.
            let mut jumps = test_jumps::subscribe();
            if self.jumped() {
                return;
            }
            tokio::select! {
                _ = sleep => {}
                _ = jumps.changed() => {}
            }
        }
        #[cfg(not(feature = "test-clock"))]
        sleep.await;
    }
}
