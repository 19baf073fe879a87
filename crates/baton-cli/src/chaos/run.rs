//! What a chaos run's tasks share: the seeded generator, the run
//! directory and history, and starting `baton` instances under it
//! (`baton chaos __instance`, so each installs the verifier's stop hook).

use super::*;

/// A small seeded generator (splitmix64): the same seed gives the same
/// fault schedule and workload.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// A number in `lo..hi`.
    pub(super) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo).max(1)
    }
}

/// An instance: its label, `baton` arguments and extra environment.
pub(super) type Instance = (String, Vec<String>, Vec<(&'static str, String)>);

/// Everything the run's tasks share.
pub(super) struct Run {
    pub(super) exe: PathBuf,
    pub(super) dir: PathBuf,
    pub(super) url: String,
    pub(super) prefix: String,
    pub(super) unsafe_: bool,
    /// Live processes the nemesis may hit: label → pid.
    pub(super) live: Mutex<HashMap<String, u32>>,
    pub(super) history: Mutex<History>,
}

impl Run {
    pub(super) fn record(&self, r: Record) {
        let mut h = self.history.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = h.append(&r) {
            tracing::warn!("chaos: {e:#}");
        }
    }

    /// The shell wrapper that records an effect (twice at once, unfenced,
    /// with `--unsafe`).
    pub(super) fn wrapper(&self, kind: &str, name: &str, hold_ms: u64) -> String {
        let one = format!(
            "env -u LD_PRELOAD -u FAKETIME '{}' chaos __effect --dir '{}' --kind {kind} --name '{name}' --hold-ms {hold_ms}",
            self.exe.display(),
            self.dir.display()
        );
        if self.unsafe_ {
            format!("{one} --unfenced & {one} --unfenced; wait")
        } else {
            format!("exec {one}")
        }
    }

    /// Spawn `baton ARGS` (or `argv` itself when `raw`) as instance `label`.
    pub(super) fn spawn(
        &self,
        label: &str,
        argv: &[String],
        raw: bool,
        env: &[(&str, String)],
    ) -> anyhow::Result<tokio::process::Child> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("logs").join(format!("{label}.log")))?;
        let mut c = if raw {
            let mut c = tokio::process::Command::new(&argv[0]);
            c.args(&argv[1..]);
            c
        } else {
            let mut c = tokio::process::Command::new(&self.exe);
            c.args(["chaos", INSTANCE, "--"]).args(argv);
            c
        };
        c.env("BATON_STORE", &self.url)
            .env("BATON_PREFIX", &self.prefix)
            .env("BATON_LOG", "info")
            .env(PROC_ENV, label)
            .env(KILLED_ENV, self.dir.join(history::HISTORY))
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .kill_on_drop(true);
        let child = c.spawn().with_context(|| format!("starting {label}"))?;
        if let Some(pid) = child.id() {
            self.lock_live().insert(label.to_string(), pid);
        }
        Ok(child)
    }

    pub(super) fn lock_live(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }
}
