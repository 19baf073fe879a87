//! Named admin tokens with roles: who may call the admin API, and what
//! each may do.
//!
//! A token has a name (what the audit log and pause records show, as
//! `api:NAME`), a [`Role`] and its secret. They come from the environment
//! (`BATON_ADMIN_TOKEN`: `admin`, role admin; `BATON_ADMIN_READ_TOKEN`:
//! `read`, role read), the config's `[admin]` (`token`, `read_token`), and
//! a tokens file (`BATON_ADMIN_TOKENS_FILE` or `[admin] tokens_file`): one
//! `NAME ROLE SECRET` a line, `#` comments. The file is read again when it
//! changes (checked at most once a second), so a token is added, rotated
//! or revoked without a restart; a file that no longer parses keeps the
//! last good set and logs why. Secrets are compared in constant time, all
//! of them for every request, and never logged.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use axum::http::Method;
use subtle::ConstantTimeEq;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Read only (GET).
    Read,
    /// Read, and steer: pause, resume, trigger, backfill, enqueue, retry,
    /// cancel.
    Operate,
    /// Everything, including what cannot be undone: deleting tasks and
    /// force-releasing locks.
    Admin,
}

impl Role {
    /// The role's name in a tokens file and in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Operate => "operate",
            Role::Admin => "admin",
        }
    }

    /// The least role a request needs: reads need `read`; deleting tasks
    /// and force-releasing a lock need `admin`; any other write `operate`.
    pub fn needed(method: &Method, path: &str) -> Role {
        if matches!(*method, Method::GET | Method::HEAD) {
            Role::Read
        } else if *method == Method::DELETE
            || path == "/api/v1/tasks/delete"
            || (path.starts_with("/api/v1/locks/") && path.ends_with("/release"))
        {
            Role::Admin
        } else {
            Role::Operate
        }
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Role, String> {
        match s {
            "read" => Ok(Role::Read),
            "operate" => Ok(Role::Operate),
            "admin" => Ok(Role::Admin),
            other => Err(format!(
                "{other:?} is not a role; use read, operate or admin"
            )),
        }
    }
}

/// One token: its name, role and secret (its `Debug` hides the secret).
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    /// Shown in records as `api:NAME`.
    pub name: String,
    /// What it may do.
    pub role: Role,
    secret: String,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("name", &self.name)
            .field("role", &self.role)
            .finish_non_exhaustive()
    }
}

impl Credential {
    /// A token named `name` with `role`.
    pub fn new(name: &str, role: Role, secret: &str) -> Credential {
        Credential {
            name: name.to_string(),
            role,
            secret: secret.to_string(),
        }
    }
}

/// Parse a tokens file: `NAME ROLE SECRET` a line (blank lines and `#`
/// comments skipped). A name is 1 to 64 of `A-Za-z0-9._@-`; a secret at
/// least 16 bytes; names are unique. Errors name the line.
pub fn parse_tokens(text: &str) -> Result<Vec<Credential>, String> {
    let mut out: Vec<Credential> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let parts: Vec<&str> = line.split_whitespace().collect();
        let [name, role, secret] = parts[..] else {
            return Err(format!("line {n}: use NAME ROLE SECRET (three words)"));
        };
        let name_ok = (1..=64).contains(&name.len())
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._@-".contains(c));
        if !name_ok {
            return Err(format!(
                "line {n}: the name {name:?} is not 1 to 64 of A-Z a-z 0-9 . _ @ -"
            ));
        }
        let role: Role = role.parse().map_err(|e| format!("line {n}: {e}"))?;
        if secret.len() < 16 {
            return Err(format!(
                "line {n}: the secret of {name:?} is shorter than 16 bytes"
            ));
        }
        if out.iter().any(|c| c.name == name) {
            return Err(format!("line {n}: the name {name:?} is given twice"));
        }
        out.push(Credential::new(name, role, secret));
    }
    Ok(out)
}

/// A tokens file, read again when it changes.
#[derive(Debug)]
struct TokenFile {
    path: PathBuf,
    /// The fixed tokens' names, which the file may not use (the audit log
    /// must tell the tokens apart).
    taken: Vec<String>,
    state: Mutex<FileState>,
}

#[derive(Debug)]
struct FileState {
    checked: Instant,
    modified: Option<SystemTime>,
    tokens: Vec<Credential>,
}

/// How often a request may look at the tokens file for a change.
const RECHECK: Duration = Duration::from_secs(1);

impl TokenFile {
    fn read(
        path: &Path,
        taken: &[String],
    ) -> Result<(Option<SystemTime>, Vec<Credential>), String> {
        let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let tokens = parse_tokens(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        if let Some(c) = tokens.iter().find(|c| taken.contains(&c.name)) {
            return Err(format!(
                "{}: the name {:?} is the environment's or the config's token (BATON_ADMIN_TOKEN is \"admin\", BATON_ADMIN_READ_TOKEN \"read\"); give it another",
                path.display(),
                c.name
            ));
        }
        Ok((modified, tokens))
    }

    /// The tokens, read again when the file changed since the last look.
    fn current(&self) -> Vec<Credential> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.checked.elapsed() >= RECHECK {
            st.checked = Instant::now();
            let modified = std::fs::metadata(&self.path)
                .and_then(|m| m.modified())
                .ok();
            if modified != st.modified {
                match TokenFile::read(&self.path, &self.taken) {
                    Ok((m, tokens)) => {
                        tracing::info!(file = %self.path.display(), tokens = tokens.len(), "admin tokens read again");
                        st.modified = m;
                        st.tokens = tokens;
                    }
                    Err(e) => {
                        // Keep serving with the last good set.
                        st.modified = modified;
                        tracing::warn!(error = %e, "the admin tokens file no longer parses; keeping the tokens read before");
                    }
                }
            }
        }
        st.tokens.clone()
    }
}

/// Every admin token: fixed ones (environment, config) and a file's.
#[derive(Debug, Default)]
pub struct TokenSet {
    fixed: Vec<Credential>,
    file: Option<TokenFile>,
}

impl TokenSet {
    /// The fixed tokens and, with `file`, a tokens file (read now: an
    /// unreadable or bad file is an error naming it and the line).
    pub fn new(fixed: Vec<Credential>, file: Option<&Path>) -> Result<TokenSet, String> {
        let file = match file {
            Some(path) => {
                let taken: Vec<String> = fixed.iter().map(|c| c.name.clone()).collect();
                let (modified, tokens) = TokenFile::read(path, &taken)?;
                Some(TokenFile {
                    path: path.to_path_buf(),
                    taken,
                    state: Mutex::new(FileState {
                        checked: Instant::now(),
                        modified,
                        tokens,
                    }),
                })
            }
            None => None,
        };
        Ok(TokenSet { fixed, file })
    }

    /// Make the next check look at the file (tests, instead of waiting).
    #[cfg(test)]
    fn look_again(&self) {
        if let Some(f) = &self.file {
            let mut st = f.state.lock().unwrap();
            st.checked = Instant::now().checked_sub(RECHECK).unwrap();
        }
    }

    /// No token at all: the server is open, so it binds loopback only.
    pub fn is_empty(&self) -> bool {
        self.fixed.is_empty() && self.file.is_none()
    }

    /// The token `given` is, if any. Every secret is compared, in
    /// constant time, so the time taken does not tell which matched.
    pub fn check(&self, given: &str) -> Option<Credential> {
        let from_file = self
            .file
            .as_ref()
            .map(TokenFile::current)
            .unwrap_or_default();
        let mut found = None;
        for c in self.fixed.iter().chain(&from_file) {
            // Lengths are not secret; the bytes are compared in constant time.
            let same = c.secret.len() == given.len()
                && bool::from(c.secret.as_bytes().ct_eq(given.as_bytes()));
            if same && found.is_none() {
                found = Some(c.clone());
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_grant_what_they_should() {
        let needs = |m: Method, p: &str| Role::needed(&m, p);
        assert_eq!(needs(Method::GET, "/api/v1/tasks"), Role::Read);
        assert_eq!(needs(Method::POST, "/api/v1/queues/q/pause"), Role::Operate);
        assert_eq!(needs(Method::POST, "/api/v1/tasks/7/retry"), Role::Operate);
        assert_eq!(needs(Method::DELETE, "/api/v1/tasks/7"), Role::Admin);
        assert_eq!(needs(Method::POST, "/api/v1/tasks/delete"), Role::Admin);
        assert_eq!(
            needs(Method::POST, "/api/v1/locks/nightly/release"),
            Role::Admin
        );
        assert!(Role::Admin > Role::Operate && Role::Operate > Role::Read);
    }

    #[test]
    fn a_tokens_file_parses_or_names_the_line() {
        let ok = parse_tokens(
            "# ops\nalice operate 0123456789abcdef\n\nci-bot read fedcba9876543210xx\n",
        )
        .unwrap();
        assert_eq!(ok.len(), 2);
        assert_eq!((ok[0].name.as_str(), ok[0].role), ("alice", Role::Operate));
        assert!(!format!("{ok:?}").contains("0123456789abcdef"));
        for (bad, want) in [
            ("alice operate", "line 1: use NAME ROLE SECRET"),
            (
                "alice root 0123456789abcdef",
                "line 1: \"root\" is not a role",
            ),
            ("alice admin short", "shorter than 16 bytes"),
            ("a/b admin 0123456789abcdef", "is not 1 to 64"),
            (
                "a read 0123456789abcdef\na admin 0123456789abcdeg",
                "line 2: the name \"a\" is given twice",
            ),
        ] {
            let e = parse_tokens(bad).unwrap_err();
            assert!(e.contains(want), "{bad:?}: {e}");
        }
    }

    #[test]
    fn check_finds_the_token_and_follows_the_file() {
        let dir = std::env::temp_dir().join(format!("baton-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokens");
        std::fs::write(&path, "alice operate alice-secret-0001\n").unwrap();
        let set = TokenSet::new(
            vec![Credential::new("admin", Role::Admin, "the-admin-secret")],
            Some(&path),
        )
        .unwrap();
        assert_eq!(set.check("the-admin-secret").unwrap().name, "admin");
        // A file token may not take a fixed token's name.
        let twin = dir.join("twin");
        std::fs::write(&twin, "admin operate another-secret-0001\n").unwrap();
        let fixed = vec![Credential::new("admin", Role::Admin, "the-admin-secret")];
        let e = TokenSet::new(fixed, Some(&twin)).unwrap_err();
        assert!(e.contains("\"admin\" is the environment's"), "{e}");
        assert_eq!(set.check("alice-secret-0001").unwrap().role, Role::Operate);
        assert!(set.check("alice-secret-0002").is_none());
        assert!(set.check("").is_none());
        // Rotated in the file: the old secret stops working, the new one
        // works, without a restart.
        set.look_again();
        std::fs::write(&path, "alice operate alice-secret-0002\n").unwrap();
        let bump = SystemTime::now() + Duration::from_secs(2);
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_modified(bump).unwrap();
        assert!(set.check("alice-secret-0001").is_none());
        assert_eq!(set.check("alice-secret-0002").unwrap().name, "alice");
        // Not looked at again within a second: the file is not read per
        // request.
        std::fs::write(&path, "bob operate bob-secret-000000001\n").unwrap();
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_modified(bump + Duration::from_secs(1)).unwrap();
        assert!(set.check("bob-secret-000000001").is_none());
        // A broken file keeps the last good set.
        std::fs::write(&path, "alice nonsense\n").unwrap();
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_modified(bump + Duration::from_secs(2)).unwrap();
        set.look_again();
        assert_eq!(set.check("alice-secret-0002").unwrap().name, "alice");
        std::fs::remove_dir_all(&dir).ok();
    }
}
