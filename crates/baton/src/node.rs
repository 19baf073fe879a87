//! Who this process is to the store: its node id (`host:pid`), which
//! starts every lock holder, worker id and PostgreSQL `application_name`
//! it writes, and the short random ids that tell its acquisitions and
//! workers apart.

/// `host:pid`, the stable part of every holder id from this process.
///
/// ```
/// let id = baton::node::node_id();
/// assert!(id.ends_with(&format!(":{}", std::process::id())));
/// ```
pub fn node_id() -> String {
    format!("{}:{}", host_name(), std::process::id())
}

/// This host's name, as [`node_id`] starts with it.
pub fn host_name() -> String {
    gethostname::gethostname().to_string_lossy().into_owned()
}

/// A short random id (12 hex digits), unique per acquisition beside the
/// `host:pid` it follows.
pub(crate) fn short_id() -> String {
    format!("{:012x}", fastrand::u64(..) >> 16)
}
