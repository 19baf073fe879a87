//! A very small HTTP/1.1 client and server on tokio, enough for job actions
//! (`http = { method, url, headers, body }`, plain `http://` only) and the
//! daemon's admin endpoints (`/health`, `/jobs`, `/stats`).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// Send one request; return the status code. Fails on anything but 2xx.
pub async fn request(
    method: &str,
    url: &str,
    headers: &BTreeMap<String, String>,
    body: Option<&str>,
    extra: &[(&str, String)],
    timeout: Duration,
) -> anyhow::Result<u16> {
    let Some(rest) = url.strip_prefix("http://") else {
        bail!("{url}: only http:// URLs are supported by this build");
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let addr = if authority.contains(':') {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    let work = async {
        let mut s = TcpStream::connect(&addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        let body = body.unwrap_or("");
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
        for (k, v) in headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .chain(extra.iter().map(|(k, v)| (*k, v.as_str())))
        {
            if k.contains(['\r', '\n']) || v.contains(['\r', '\n']) {
                bail!("header {k:?} contains a line break");
            }
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        req.push_str(body);
        s.write_all(req.as_bytes()).await?;
        let mut r = BufReader::new(s);
        let mut status = String::new();
        r.read_line(&mut status).await?;
        let code: u16 = status
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .with_context(|| format!("not an HTTP answer: {status:?}"))?;
        let mut rest = Vec::new();
        let _ = r.take(64 * 1024).read_to_end(&mut rest).await;
        if !(200..300).contains(&code) {
            let text = String::from_utf8_lossy(&rest);
            let body = text
                .split("\r\n\r\n")
                .nth(1)
                .unwrap_or("")
                .chars()
                .take(500)
                .collect::<String>();
            bail!("{method} {url}: HTTP {code}: {body}");
        }
        Ok(code)
    };
    tokio::time::timeout(timeout, work)
        .await
        .with_context(|| format!("{method} {url}: no answer within {timeout:?}"))?
}

/// Serve GET requests with `route(path) -> (status, json)` until the task is dropped.
pub async fn serve<F, Fut>(listener: TcpListener, route: F)
where
    F: Fn(String) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = (u16, String)> + Send,
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
            let (method, path) = (
                parts.next().unwrap_or(""),
                parts.next().unwrap_or("/").to_string(),
            );
            let (code, body) = if method == "GET" {
                route(path).await
            } else {
                (405, "{\"error\":\"GET only\"}".into())
            };
            let reason = match code {
                200 => "OK",
                404 => "Not Found",
                405 => "Method Not Allowed",
                _ => "Error",
            };
            let resp = format!("HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
            let _ = r.into_inner().write_all(resp.as_bytes()).await;
        });
    }
}
