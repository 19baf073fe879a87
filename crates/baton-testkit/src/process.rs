//! A spawned server process that dies with its guard: the test that starts
//! a private server owns it, and a failing test does not leave it running.

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process killed (SIGKILL) and reaped when dropped.
pub struct Guard {
    child: Option<Child>,
    name: String,
}

impl Guard {
    /// Spawn `cmd` (stdout and stderr discarded unless the command set
    /// them); `name` names it in panics.
    pub fn spawn(name: &str, cmd: &mut Command) -> Guard {
        let child = cmd
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("could not start {name}: {e}"));
        Guard {
            child: Some(child),
            name: name.to_string(),
        }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Wait until something accepts TCP connections on `127.0.0.1:port`
    /// (panics after `within`, or when the process exited).
    pub fn wait_port(&mut self, port: u16, within: Duration) {
        let t0 = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    panic!("{} exited before listening on {port}: {status}", self.name);
                }
            }
            assert!(
                t0.elapsed() < within,
                "{} did not listen on {port} within {within:?}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the process has exited (or was killed by [`Guard::kill`]).
    pub fn exited(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => !matches!(c.try_wait(), Ok(None)),
            None => true,
        }
    }

    /// Send `sig` to the process (e.g. `libc::SIGSTOP` to freeze it).
    pub fn signal(&self, sig: i32) {
        if let Some(pid) = self.pid() {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe {
                libc::kill(pid as i32, sig);
            }
        }
    }

    /// Kill (SIGKILL) and reap the process now; idempotent.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.kill();
    }
}
