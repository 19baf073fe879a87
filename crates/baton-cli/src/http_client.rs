//! The HTTP client for job actions (`http = { method, url, headers, body }`),
//! on reqwest (HTTP/1.1).
//!
//! `https://` verifies the server against the system's roots (and the PEM
//! bundle in `SSL_CERT_FILE`, if set), with rustls on ring. Up to 5
//! redirects are followed, never from `https://` down to `http://`
//! (reqwest drops `Authorization` and cookies when a redirect changes
//! host). Each action opens a fresh connection (no idle pool: actions are
//! minutes apart). Header names go out title-cased (`Baton-Slot`), as
//! before. Errors name the method and the URL, with any password
//! and query string hidden, and the cause.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

/// How many redirects an action follows.
const MAX_REDIRECTS: usize = 5;
/// How much of a failed answer's body the error quotes.
const ERROR_BODY_CHARS: usize = 500;
/// How much of a failed answer's body is read at most.
const ERROR_BODY_BYTES: usize = 64 * 1024;

/// Send one request; return the status code. Fails on anything but 2xx,
/// on no answer within `timeout` (connect, send and the whole answer's
/// head), and on bad header names or values.
pub async fn request(
    method: &str,
    url: &str,
    headers: &BTreeMap<String, String>,
    body: Option<&str>,
    extra: &[(&str, String)],
    timeout: Duration,
) -> anyhow::Result<u16> {
    let shown = redact_url(url);
    let what = format!("{method} {shown}");
    let parsed = reqwest::Url::parse(url).map_err(|e| anyhow!("{what}: not a valid URL ({e})"))?;
    match parsed.scheme() {
        "http" => {}
        "https" if cfg!(feature = "tls") => {}
        "https" => bail!("{what}: https:// needs a baton built with the `tls` feature"),
        other => bail!("{what}: the scheme {other:?} is not http:// or https://"),
    }
    let method = reqwest::Method::from_bytes(method.as_bytes())
        .map_err(|_| anyhow!("{what}: {method:?} is not an HTTP method"))?;
    let mut map = HeaderMap::new();
    for (k, v) in headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .chain(extra.iter().map(|(k, v)| (*k, v.as_str())))
    {
        let name = HeaderName::from_bytes(k.as_bytes())
            .map_err(|_| anyhow!("{what}: {k:?} is not a header name"))?;
        let value = HeaderValue::from_str(v)
            .map_err(|_| anyhow!("{what}: the value of header {k:?} is not a valid header value (no line breaks or control characters)"))?;
        map.append(name, value);
    }
    let mut req = client()
        .with_context(|| what.clone())?
        .request(method, parsed)
        .headers(map)
        .timeout(timeout);
    if let Some(b) = body {
        req = req.body(b.to_string());
    }
    let mut resp = req
        .send()
        .await
        .map_err(|e| anyhow!("{what}: {}", cause(e, timeout)))?;
    let code = resp.status().as_u16();
    if !resp.status().is_success() {
        // Quote the start of the answer: it usually says why.
        let mut text = Vec::new();
        let read = async {
            while let Ok(Some(chunk)) = resp.chunk().await {
                text.extend_from_slice(&chunk);
                if text.len() >= ERROR_BODY_BYTES {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(2), read).await;
        let quoted: String = String::from_utf8_lossy(&text)
            .chars()
            .take(ERROR_BODY_CHARS)
            .collect();
        bail!("{what}: HTTP {code}: {quoted}");
    }
    Ok(code)
}

/// A reqwest error and its causes, one line, without the URL (the caller
/// names it, redacted): connection refused, the certificate's problem, a
/// refused redirect…
fn cause(e: reqwest::Error, timeout: Duration) -> String {
    if e.is_timeout() {
        return format!("no answer within {}", baton::format_duration(timeout));
    }
    let e = e.without_url();
    let mut out = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// The process's client: built once (loading the system's roots is slow).
fn client() -> anyhow::Result<reqwest::Client> {
    static CLIENT: OnceLock<Result<reqwest::Client, String>> = OnceLock::new();
    CLIENT
        .get_or_init(|| build().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(|e| anyhow!(e))
}

fn build() -> anyhow::Result<reqwest::Client> {
    let policy = reqwest::redirect::Policy::custom(|attempt| {
        let downgrade = attempt.url().scheme() == "http"
            && attempt.previous().iter().any(|u| u.scheme() == "https");
        if downgrade {
            attempt.error("refused a redirect from https:// to http://")
        } else if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
        } else {
            attempt.follow()
        }
    });
    let builder = reqwest::Client::builder()
        .redirect(policy)
        .pool_max_idle_per_host(0)
        // `Baton-Slot`, not `baton-slot`: names are case-insensitive, but
        // hand-written receivers often match them exactly.
        .http1_title_case_headers()
        .user_agent(concat!("baton/", env!("CARGO_PKG_VERSION")));
    #[cfg(feature = "tls")]
    let builder = builder.use_preconfigured_tls(tls::config()?);
    builder.build().context("building the HTTP client")
}

/// `url` with any password and the query string hidden (they often carry
/// secrets).
pub fn redact_url(url: &str) -> String {
    let shown = baton::store::redact(url);
    match shown.split_once('?') {
        Some((head, _)) => format!("{head}?…"),
        None => shown,
    }
}

#[cfg(feature = "tls")]
mod tls {
    use std::sync::Arc;

    use anyhow::{anyhow, bail};
    use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};

    /// rustls with the system's roots (and `SSL_CERT_FILE`'s), on ring.
    pub fn config() -> anyhow::Result<ClientConfig> {
        let mut roots = RootCertStore::empty();
        let certs = rustls_native_certs::load_native_certs()
            .map_err(|e| anyhow!("loading the system's root certificates: {e}"))?;
        let (added, _ignored) = roots.add_parsable_certificates(certs);
        if added == 0 {
            bail!("no root certificates found (system store or SSL_CERT_FILE)");
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        Ok(ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| anyhow!("TLS protocol versions: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth())
    }
}

#[cfg(test)]
mod tests {
    use super::{redact_url, request};
    use std::collections::BTreeMap;
    use std::time::Duration;

    /// A refused connection: the error names the method, the URL without
    /// its password and query, and the cause.
    #[tokio::test]
    async fn errors_name_the_redacted_url_and_the_cause() {
        // A port nothing listens on: bind, note it, close.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let url = format!("http://bob:hunter2@127.0.0.1:{port}/run?token=s3cret");
        let none = BTreeMap::new();
        let e = request("POST", &url, &none, None, &[], Duration::from_secs(5))
            .await
            .expect_err("nothing listens");
        let text = format!("{e:#}");
        assert!(
            text.starts_with(&format!("POST http://bob:***@127.0.0.1:{port}/run?…: ")),
            "{text}"
        );
        assert!(
            !text.contains("hunter2") && !text.contains("s3cret"),
            "{text}"
        );
        assert!(text.to_lowercase().contains("refused"), "{text}");
    }

    /// A server that accepts and never answers: the attempt ends at the
    /// timeout and says so.
    #[tokio::test]
    async fn no_answer_ends_at_the_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let hold = tokio::spawn(async move {
            let mut kept = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                kept.push(s);
            }
        });
        let url = format!("http://127.0.0.1:{port}/slow");
        let t0 = std::time::Instant::now();
        let e = request(
            "GET",
            &url,
            &BTreeMap::new(),
            None,
            &[],
            Duration::from_millis(300),
        )
        .await
        .expect_err("no answer");
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
        assert!(format!("{e:#}").contains("no answer within 300ms"), "{e:#}");
        hold.abort();
    }

    /// A server that redirects forever: followed 5 times, then refused.
    #[tokio::test]
    async fn redirect_loops_stop() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let h2 = hits.clone();
        let server = tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                h2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.1 302 Found\r\nLocation: /again\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    .await;
            }
        });
        let url = format!("http://127.0.0.1:{port}/start");
        let e = request(
            "GET",
            &url,
            &BTreeMap::new(),
            None,
            &[],
            Duration::from_secs(5),
        )
        .await
        .expect_err("a loop");
        assert!(format!("{e:#}").contains("more than 5 redirects"), "{e:#}");
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 6);
        server.abort();
    }

    /// Bad header names and values are refused before anything is sent.
    #[tokio::test]
    async fn bad_headers_are_refused() {
        let mut h = BTreeMap::new();
        h.insert("A B".to_string(), "x".to_string());
        let e = request(
            "GET",
            "http://127.0.0.1:1/",
            &h,
            None,
            &[],
            Duration::from_secs(1),
        )
        .await
        .expect_err("bad name");
        assert!(format!("{e:#}").contains("is not a header name"), "{e:#}");
        let mut h = BTreeMap::new();
        h.insert("A".to_string(), "x\ny".to_string());
        let e = request(
            "GET",
            "http://127.0.0.1:1/",
            &h,
            None,
            &[],
            Duration::from_secs(1),
        )
        .await
        .expect_err("bad value");
        assert!(
            format!("{e:#}").contains("not a valid header value"),
            "{e:#}"
        );
    }

    #[test]
    fn urls_are_redacted() {
        assert_eq!(
            redact_url("https://u:secret@h.example/x?token=abc"),
            "https://u:***@h.example/x?…"
        );
        assert_eq!(redact_url("http://h:8080/run"), "http://h:8080/run");
    }
}
