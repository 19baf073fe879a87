//! Opening the client: a `redis://` or `rediss://` URL, with TLS files
//! named in its query as PostgreSQL URLs name them.

use std::collections::HashMap;

use crate::error::StoreError;
use crate::store::redact;

/// Files a `rediss://` URL may name in its query, as PostgreSQL URLs do:
/// a CA to trust instead of the system's roots, and a client certificate
/// with its key (mutual TLS). Paths are read when connecting.
pub(super) const TLS_PARAMS: [&str; 3] = ["sslrootcert", "sslcert", "sslkey"];

/// Open a client for `url`, taking [`TLS_PARAMS`] out of its query.
pub(super) fn open_client(url: &str) -> Result<redis::Client, StoreError> {
    let bad =
        |e: &dyn std::fmt::Display| StoreError::Config(format!("redis URL {:?}: {e}", redact(url)));
    let mut parsed = url::Url::parse(url).map_err(|e| bad(&e))?;
    if matches!(parsed.scheme(), "redis" | "rediss")
        && parsed.host_str().is_none_or(|h| h.is_empty())
    {
        return Err(bad(
            &"no host; use redis://HOST[:PORT][/DB] (or rediss:// for TLS), e.g. redis://127.0.0.1:6379",
        ));
    }
    let mut files: HashMap<&str, String> = HashMap::new();
    let mut rest: Vec<(String, String)> = Vec::new();
    for (k, v) in parsed.query_pairs() {
        match TLS_PARAMS.iter().find(|p| **p == k) {
            Some(p) => {
                files.insert(p, v.into_owned());
            }
            None => rest.push((k.into_owned(), v.into_owned())),
        }
    }
    if files.is_empty() {
        return redis::Client::open(url).map_err(|e| bad(&e));
    }
    if parsed.scheme() != "rediss" {
        return Err(bad(&"sslrootcert, sslcert and sslkey need a rediss:// URL"));
    }
    if rest.is_empty() {
        parsed.set_query(None);
    } else {
        parsed.query_pairs_mut().clear().extend_pairs(&rest);
    }
    open_tls_client(parsed.as_str(), &files).map_err(|e| bad(&e))
}

#[cfg(feature = "tls")]
fn open_tls_client(url: &str, files: &HashMap<&str, String>) -> Result<redis::Client, String> {
    redis::Client::build_with_tls(url, certificates(files)?).map_err(|e| e.to_string())
}

/// The certificates [`TLS_PARAMS`] name (read now), for a single-node or a
/// cluster client.
#[cfg(feature = "tls")]
pub(super) fn certificates(
    files: &HashMap<&str, String>,
) -> Result<redis::TlsCertificates, String> {
    let read = |param: &str| -> Result<Option<Vec<u8>>, String> {
        files
            .get(param)
            .map(|path| std::fs::read(path).map_err(|e| format!("{param}={path}: {e}")))
            .transpose()
    };
    let client_tls = match (read("sslcert")?, read("sslkey")?) {
        (Some(client_cert), Some(client_key)) => Some(redis::ClientTlsConfig {
            client_cert,
            client_key,
        }),
        (None, None) => None,
        _ => {
            return Err("sslcert and sslkey go together (a client certificate and its key)".into())
        }
    };
    Ok(redis::TlsCertificates {
        client_tls,
        root_cert: read("sslrootcert")?,
    })
}

#[cfg(not(feature = "tls"))]
fn open_tls_client(_url: &str, _files: &HashMap<&str, String>) -> Result<redis::Client, String> {
    Err("this build of baton has no TLS (cargo feature `tls`)".into())
}

#[cfg(test)]
mod url_props {
    use proptest::prelude::*;

    proptest! {
        /// Opening a client parses the URL without connecting: any text
        /// after `redis://` or `rediss://` gives a client or a config
        /// error naming the URL; never a panic.
        #[test]
        fn open_client_never_panics(
            tls in any::<bool>(),
            rest in prop_oneof![any::<String>(), "[a-z0-9.:@/?=&%-]{0,40}"],
        ) {
            let url = format!("{}://{rest}", if tls { "rediss" } else { "redis" });
            match super::open_client(&url) {
                Ok(_) => {}
                Err(crate::StoreError::Config(m)) => prop_assert!(m.starts_with("redis URL"), "{m}"),
                Err(e) => prop_assert!(false, "{e}"),
            }
        }
    }
}
