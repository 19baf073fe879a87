//! Bearer-token auth for the admin server: with a token set, every route
//! but `/livez`, `/readyz` and the dashboard's static page and assets needs
//! `Authorization: Bearer <token>`; the optional read-only token may only
//! read (GET/HEAD). Tokens are compared in constant time and never logged.

use std::sync::Arc;

use axum::extract::{Request, State as Extract};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use subtle::ConstantTimeEq;

use super::{api, State};

/// The admin tokens: full access and read-only. Its `Debug` hides them.
#[derive(Clone, Default)]
pub struct Tokens {
    /// Reads and writes.
    pub full: Option<String>,
    /// Reads only.
    pub read: Option<String>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("full", &self.full.as_ref().map(|_| "<hidden>"))
            .field("read", &self.read.as_ref().map(|_| "<hidden>"))
            .finish()
    }
}

impl Tokens {
    /// No token at all: the server is open, so it binds loopback only.
    pub fn is_empty(&self) -> bool {
        self.full.is_none() && self.read.is_none()
    }
}

/// What a request's credentials allow.
#[derive(Debug, PartialEq, Eq)]
enum Access {
    Full,
    Read,
    None,
}

fn same(a: &str, b: &str) -> bool {
    // Lengths are not secret; the bytes are compared in constant time.
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

fn access(tokens: &Tokens, given: Option<&str>) -> Access {
    let Some(given) = given else {
        return Access::None;
    };
    // Both are compared, so the time does not tell which one matched.
    let full = tokens.full.as_deref().is_some_and(|t| same(t, given));
    let read = tokens.read.as_deref().is_some_and(|t| same(t, given));
    if full {
        Access::Full
    } else if read {
        Access::Read
    } else {
        Access::None
    }
}

/// Paths anyone may read: the probes and the dashboard's page and assets
/// (they hold no data; the page asks for the token).
fn public(path: &str) -> bool {
    matches!(path, "/livez" | "/readyz" | "/") || path.starts_with("/assets/")
}

/// Who a request is to the API, as a pause or resume records it: the
/// credential it came with (`api:admin`, the admin token; `api:open`, a
/// server without tokens). The read-only token cannot change anything,
/// so it never records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller(pub &'static str);

/// The auth middleware; it tells the handlers who called ([`Caller`]).
pub async fn require(
    Extract(state): Extract<Arc<State>>,
    mut req: Request,
    next: Next,
) -> Response {
    let tokens = &state.tokens;
    if tokens.is_empty() {
        req.extensions_mut().insert(Caller("api:open"));
        return next.run(req).await;
    }
    if public(req.uri().path()) {
        return next.run(req).await;
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let reads = matches!(*req.method(), Method::GET | Method::HEAD);
    match access(tokens, given) {
        Access::Full => {
            req.extensions_mut().insert(Caller("api:admin"));
            next.run(req).await
        }
        Access::Read if reads => next.run(req).await,
        Access::Read => api::error(
            StatusCode::FORBIDDEN,
            "the read-only token may only read (GET); use the admin token (BATON_ADMIN_TOKEN) to change anything",
            None,
        ),
        Access::None => {
            let why = if given.is_none() {
                "missing credentials: send Authorization: Bearer <token> (BATON_ADMIN_TOKEN)"
            } else {
                "the bearer token does not match the admin token"
            };
            let mut r = api::error(StatusCode::UNAUTHORIZED, why, None);
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
            r
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_grant_what_they_should() {
        let t = Tokens {
            full: Some("admin-secret".into()),
            read: Some("reader".into()),
        };
        assert_eq!(access(&t, Some("admin-secret")), Access::Full);
        assert_eq!(access(&t, Some("reader")), Access::Read);
        assert_eq!(access(&t, Some("admin-secreT")), Access::None);
        assert_eq!(access(&t, Some("admin")), Access::None);
        assert_eq!(access(&t, Some("")), Access::None);
        assert_eq!(access(&t, None), Access::None);
        assert!(!format!("{t:?}").contains("secret"));
    }
}
