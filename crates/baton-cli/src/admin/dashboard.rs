//! The dashboard at `/`: one HTML page, its script and stylesheet, all
//! compiled into the binary (no CDN, no build step). The page reads and
//! steers through `/api/v1` with the token kept in sessionStorage.

use std::sync::Arc;

use axum::http::header;
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use axum::Router;

use super::State;

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/app.js");
const STYLE: &str = include_str!("assets/style.css");

/// The dashboard's routes.
pub fn routes() -> Router<Arc<State>> {
    Router::new()
        .route("/", get(|| async { Html(INDEX) }))
        .route(
            "/assets/app.js",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
                    SCRIPT,
                )
                    .into_response()
            }),
        )
        .route(
            "/assets/style.css",
            get(|| async {
                ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE).into_response()
            }),
        )
}
