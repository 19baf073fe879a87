//! What a job runs: `command = [...]` or `http = { ... }`.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::ConfigError;

/// What a job runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// A program and its arguments (no shell unless you name one).
    Command(Vec<String>),
    /// An HTTP request; a 2xx answer is success.
    Http {
        /// Upper-case method, default `POST`.
        method: String,
        /// `http://` or `https://` URL.
        url: String,
        /// Request headers.
        headers: BTreeMap<String, String>,
        /// Request body.
        body: Option<String>,
    },
}

#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHttp {
    #[serde(skip_serializing_if = "Option::is_none")]
    method: Option<String>,
    url: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    headers: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    body: Option<String>,
}

/// Exactly one of `command` and `http`, validated.
pub(super) fn validate_action(
    owner: &str,
    command: Option<Vec<String>>,
    http: Option<RawHttp>,
) -> Result<Action, ConfigError> {
    Ok(match (command, http) {
        (Some(command), None) => {
            if let Err(problem) = crate::command_task::check_argv(&command) {
                return Err(ConfigError::invalid(owner, Some("command"), problem));
            }
            // The task's payload holds the command (durable mode).
            let size: usize = command.iter().map(|a| a.len() + 3).sum();
            if size > baton::queue::MAX_PAYLOAD_BYTES {
                return Err(ConfigError::invalid(
                    owner,
                    Some("command"),
                    format!(
                        "is {size} bytes long; at most {} (8 MiB) are accepted (put a long script in a file and run that)",
                        baton::queue::MAX_PAYLOAD_BYTES
                    ),
                ));
            }
            Action::Command(command)
        }
        (None, Some(http)) => validate_http(owner, http)?,
        _ => {
            return Err(ConfigError::invalid(
                owner,
                None,
                "give exactly one of command or http",
            ))
        }
    })
}

fn validate_http(owner: &str, http: RawHttp) -> Result<Action, ConfigError> {
    let method = http
        .method
        .as_deref()
        .unwrap_or("POST")
        .to_ascii_uppercase();
    if method.is_empty() || !method.chars().all(|c| c.is_ascii_alphabetic()) {
        return Err(ConfigError::invalid(
            owner,
            Some("http.method"),
            format!("{method:?} is not an HTTP method; use GET, POST, PUT, PATCH or DELETE"),
        ));
    }
    let url = http.url.trim().to_string();
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    if rest.is_none_or(|r| r.is_empty()) || url.chars().any(|c| c.is_control() || c == ' ') {
        return Err(ConfigError::invalid(
            owner,
            Some("http.url"),
            format!("{:?} is not an http:// or https:// URL", http.url),
        ));
    }
    for (k, v) in &http.headers {
        let bad_name = k.is_empty()
            || !k
                .chars()
                .all(|c| c.is_ascii_graphic() && !"()<>@,;:\\\"/[]?={}".contains(c));
        if bad_name {
            return Err(ConfigError::invalid(
                owner,
                Some("http.headers"),
                format!("{k:?} is not a header name; use letters, digits and '-'"),
            ));
        }
        if v.chars().any(|c| c == '\r' || c == '\n' || c == '\0') {
            return Err(ConfigError::invalid(
                owner,
                Some("http.headers"),
                format!("the value of {k:?} contains a line break"),
            ));
        }
    }
    Ok(Action::Http {
        method,
        url,
        headers: http.headers,
        body: http.body,
    })
}
