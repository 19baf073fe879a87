//! Bearer-token auth for the admin server: with any token set, every
//! route but `/livez`, `/readyz` and the dashboard's static page and
//! assets needs `Authorization: Bearer <token>` of a named token whose
//! [`Role`] allows the request (see [`super::tokens`]). The handlers learn
//! who called ([`Caller`]).

use std::sync::Arc;

use axum::extract::{Request, State as Extract};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::Response;

use super::tokens::Role;
pub use super::tokens::TokenSet as Tokens;
use super::{api, State};

/// Who a request is, as records show it: `api:NAME` for the named token
/// it came with, `api:open` on a server without tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller(pub String);

/// Paths anyone may read: the probes and the dashboard's page and assets
/// (they hold no data; the page asks for the token).
fn public(path: &str) -> bool {
    matches!(path, "/livez" | "/readyz" | "/") || path.starts_with("/assets/")
}

/// The auth middleware; it tells the handlers who called ([`Caller`]).
pub async fn require(
    Extract(state): Extract<Arc<State>>,
    mut req: Request,
    next: Next,
) -> Response {
    let tokens = &state.tokens;
    if tokens.is_empty() {
        req.extensions_mut().insert(Caller("api:open".into()));
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
    let Some(cred) = given.and_then(|g| tokens.check(g)) else {
        let why = if given.is_none() {
            "missing credentials: send Authorization: Bearer <token> (BATON_ADMIN_TOKEN or a named token)"
        } else {
            "the bearer token matches no admin token"
        };
        let mut r = api::error(StatusCode::UNAUTHORIZED, why, None);
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
        return r;
    };
    let needed = Role::needed(req.method(), req.uri().path());
    if cred.role < needed {
        let why = format!(
            "the token {:?} has the role {}; this needs {} ({})",
            cred.name,
            cred.role.as_str(),
            needed.as_str(),
            match needed {
                Role::Admin => "deleting tasks and force-releasing locks",
                _ => "changing anything",
            }
        );
        return api::error(StatusCode::FORBIDDEN, &why, None);
    }
    req.extensions_mut()
        .insert(Caller(format!("api:{}", cred.name)));
    next.run(req).await
}
