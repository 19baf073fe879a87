//! A very small HTTP/1.1 server on tokio for the daemon's admin endpoints
//! (`/health`, `/jobs`, `/stats`, `/metrics`). Job actions' client is in
//! `http_client.rs`.

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// Serve GET requests with `route(path) -> Reply` until the task is
/// dropped (the path without its query string).
/// An answer of [`serve`]'s router.
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

impl Reply {
    /// A JSON answer.
    pub fn json(status: u16, body: String) -> Reply {
        Reply {
            status,
            content_type: "application/json",
            body,
        }
    }
}

pub async fn serve<F, Fut>(listener: TcpListener, route: F)
where
    F: Fn(String) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Reply> + Send,
{
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let route = route.clone();
        tokio::spawn(async move {
            let mut r = BufReader::new(stream);
            let mut line = String::new();
            if r.read_line(&mut line).await.is_err() {
                return;
            }
            // Skip the headers.
            let mut h = String::new();
            while r.read_line(&mut h).await.is_ok_and(|n| n > 2) {
                h.clear();
            }
            let mut parts = line.split_whitespace();
            let method = parts.next().unwrap_or("");
            let target = parts.next().unwrap_or("/");
            let path = target.split('?').next().unwrap_or("/").to_string();
            let Reply {
                status: code,
                content_type,
                body,
            } = if method == "GET" {
                route(path).await
            } else {
                Reply::json(405, "{\"error\":\"GET only\"}".into())
            };
            let reason = match code {
                200 => "OK",
                404 => "Not Found",
                405 => "Method Not Allowed",
                _ => "Error",
            };
            let resp = format!("HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
            let _ = r.into_inner().write_all(resp.as_bytes()).await;
        });
    }
}
