//! `[[queue]]` tables: names, concurrency, lease and the cluster-wide caps.

use std::collections::HashSet;
use std::time::Duration;

use serde::Deserialize;

use super::{
    check_name, owner_of, positive_duration, ranged, ConfigError, DEFAULT_LEASE, MAX_CONCURRENCY,
};

/// One `[[queue]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueConfig {
    /// Queue name.
    pub name: String,
    /// Tasks this instance runs at once from this queue (≥ 1).
    pub concurrency: u32,
    /// Lease per claim, renewed by heartbeats.
    pub lease: Duration,
    /// At most this many of the queue's tasks run at once across every
    /// instance (`None`: no cluster-wide cap).
    pub max_running: Option<u32>,
    /// At most this many of the queue's tasks with the same concurrency
    /// key run at once across every instance (`None`: no per-key cap).
    pub per_key_max_running: Option<u32>,
    /// At most this many starts per period across every instance: the
    /// queue's own limit (`None` name) or a named one shared by the queues
    /// that name it (`rate = "100/1m"` or `rate = "partner-api=10/1s"`).
    pub rate: Option<(Option<String>, baton::queue::RateLimit)>,
    /// At most this many starts per period of each concurrency key across
    /// every instance (`per_key_rate = "10/1m"`).
    pub per_key_rate: Option<baton::queue::RateLimit>,
    /// Claims interleave the concurrency keys (`fair = true`), so one
    /// key's backlog does not hold back another's tasks.
    pub fair: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawQueue {
    name: String,
    concurrency: Option<i64>,
    lease: Option<String>,
    max_running: Option<i64>,
    per_key_max_running: Option<i64>,
    rate: Option<String>,
    per_key_rate: Option<String>,
    /// Any TOML value, so that a wrong type is refused naming the field.
    fair: Option<toml::Value>,
}

/// Validate the `[[queue]]` tables, in file order.
pub(super) fn validate_queues(raw: Vec<RawQueue>) -> Result<Vec<QueueConfig>, ConfigError> {
    let mut queues = Vec::with_capacity(raw.len() + 1);
    let mut seen = HashSet::new();
    for (i, q) in raw.into_iter().enumerate() {
        let owner = owner_of("queue", i, &q.name);
        check_name(&owner, &q.name)?;
        if !seen.insert(q.name.clone()) {
            return Err(ConfigError::invalid(
                &owner,
                Some("name"),
                "is declared twice; queue names must be unique",
            ));
        }
        let concurrency = ranged(
            &owner,
            "concurrency",
            q.concurrency.unwrap_or(1),
            1,
            MAX_CONCURRENCY,
        )? as u32;
        let lease = match &q.lease {
            Some(s) => {
                let d = positive_duration("lease", s)
                    .map_err(|e| ConfigError::from_input(&owner, e))?;
                if d < baton::queue::MIN_LEASE {
                    return Err(ConfigError::invalid(
                        &owner,
                        Some("lease"),
                        format!(
                            "{s:?} is too short; use at least {} (e.g. \"30s\"): heartbeats renew it every third",
                            baton::format_duration(baton::queue::MIN_LEASE)
                        ),
                    ));
                }
                d
            }
            None => DEFAULT_LEASE,
        };
        let max_running = q
            .max_running
            .map(|m| ranged(&owner, "max_running", m, 1, MAX_CONCURRENCY).map(|m| m as u32))
            .transpose()?;
        let per_key_max_running = q
            .per_key_max_running
            .map(|m| ranged(&owner, "per_key_max_running", m, 1, MAX_CONCURRENCY).map(|m| m as u32))
            .transpose()?;
        let rate = q
            .rate
            .as_deref()
            .map(|r| {
                baton::queue::RateLimit::parse_named("rate", r)
                    .map_err(|e| ConfigError::from_input(&owner, e))
            })
            .transpose()?;
        let per_key_rate = q
            .per_key_rate
            .as_deref()
            .map(|r| {
                baton::queue::RateLimit::parse("per_key_rate", r)
                    .map_err(|e| ConfigError::from_input(&owner, e))
            })
            .transpose()?;
        let fair = match q.fair {
            None => false,
            Some(toml::Value::Boolean(b)) => b,
            Some(v) => {
                return Err(ConfigError::invalid(
                    &owner,
                    Some("fair"),
                    format!("{v} is not a boolean; use fair = true or fair = false"),
                ))
            }
        };
        if fair && per_key_rate.is_some() {
            return Err(ConfigError::invalid(
                &owner,
                Some("per_key_rate"),
                "cannot be combined with fair = true yet; drop one of the two",
            ));
        }
        queues.push(QueueConfig {
            name: q.name,
            concurrency,
            lease,
            max_running,
            per_key_max_running,
            rate,
            per_key_rate,
            fair,
        });
    }

    Ok(queues)
}
