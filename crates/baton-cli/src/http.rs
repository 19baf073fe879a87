//! A very small HTTP/1.1 client on tokio, enough for job actions
//! (`http = { method, url, headers, body }`, `http://` or `https://`). The
//! admin server is [`crate::admin`].
//!
//! `https://` verifies the server against the system's roots (and the PEM
//! bundle in `SSL_CERT_FILE`, if set), with rustls.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Send one request; return the status code. Fails on anything but 2xx.
pub async fn request(
    method: &str,
    url: &str,
    headers: &BTreeMap<String, String>,
    body: Option<&str>,
    extra: &[(&str, String)],
    timeout: Duration,
) -> anyhow::Result<u16> {
    let (tls, rest) = if let Some(r) = url.strip_prefix("http://") {
        (false, r)
    } else if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else {
        bail!("{url}: not an http:// or https:// URL");
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = host_port(authority, if tls { 443 } else { 80 })
        .with_context(|| format!("{url}: the host part {authority:?} is not host[:port]"))?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.map_or(0, str::len)
    );
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
    req.push_str(body.unwrap_or(""));
    let work = async {
        let tcp = TcpStream::connect((host, port))
            .await
            .with_context(|| format!("connecting to {authority}"))?;
        let (code, answer) = if tls {
            exchange(tls::connect(host, tcp).await?, &req).await?
        } else {
            exchange(tcp, &req).await?
        };
        if !(200..300).contains(&code) {
            let text = String::from_utf8_lossy(&answer);
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

/// `host`, `host:port`, `[v6]` or `[v6]:port`.
fn host_port(authority: &str, default: u16) -> Option<(&str, u16)> {
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (h, after) = v6.split_once(']')?;
            (h, after.strip_prefix(':'))
        }
        None => match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        },
    };
    let port = match port {
        Some(p) => p.parse().ok()?,
        None => default,
    };
    (!host.is_empty()).then_some((host, port))
}

/// Write the request; read the status code and up to 64 KiB of the rest.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    req: &str,
) -> anyhow::Result<(u16, Vec<u8>)> {
    s.write_all(req.as_bytes()).await?;
    s.flush().await?;
    let mut r = BufReader::new(s);
    let mut status = String::new();
    r.read_line(&mut status).await?;
    let code: u16 = status
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("not an HTTP answer: {status:?}"))?;
    let mut rest = Vec::new();
    // The answer's tail is informational; a server that closes without a
    // TLS close_notify must not turn a 2xx into a failure.
    let _ = r.take(64 * 1024).read_to_end(&mut rest).await;
    Ok((code, rest))
}

#[cfg(feature = "tls")]
mod tls {
    use std::sync::{Arc, OnceLock};

    use anyhow::{anyhow, Context};
    use tokio::net::TcpStream;
    use tokio_rustls::client::TlsStream;
    use tokio_rustls::rustls::{self, pki_types::ServerName, ClientConfig, RootCertStore};
    use tokio_rustls::TlsConnector;

    /// One client configuration per process: loading the roots is slow.
    fn config() -> anyhow::Result<Arc<ClientConfig>> {
        static CONFIG: OnceLock<Result<Arc<ClientConfig>, String>> = OnceLock::new();
        CONFIG
            .get_or_init(|| {
                let mut roots = RootCertStore::empty();
                let certs = rustls_native_certs::load_native_certs()
                    .map_err(|e| format!("loading the system's root certificates: {e}"))?;
                let (added, _ignored) = roots.add_parsable_certificates(certs);
                if added == 0 {
                    return Err("no root certificates found (system store or SSL_CERT_FILE)".into());
                }
                let provider = Arc::new(rustls::crypto::ring::default_provider());
                let config = ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(|e| e.to_string())?
                    .with_root_certificates(roots)
                    .with_no_client_auth();
                Ok(Arc::new(config))
            })
            .clone()
            .map_err(|e| anyhow!(e))
    }

    pub async fn connect(host: &str, tcp: TcpStream) -> anyhow::Result<TlsStream<TcpStream>> {
        let name = ServerName::try_from(host.to_string())
            .with_context(|| format!("{host:?} is not a TLS server name"))?;
        TlsConnector::from(config()?)
            .connect(name, tcp)
            .await
            .with_context(|| format!("TLS handshake with {host}"))
    }
}

#[cfg(not(feature = "tls"))]
mod tls {
    use tokio::net::TcpStream;

    pub async fn connect(_host: &str, _tcp: TcpStream) -> anyhow::Result<TcpStream> {
        anyhow::bail!("https:// needs a baton built with the `tls` feature")
    }
}

#[cfg(test)]
mod tests {
    use super::host_port;

    #[test]
    fn host_and_port() {
        assert_eq!(host_port("example.com", 443), Some(("example.com", 443)));
        assert_eq!(
            host_port("example.com:8443", 443),
            Some(("example.com", 8443))
        );
        assert_eq!(host_port("[::1]", 80), Some(("::1", 80)));
        assert_eq!(host_port("[::1]:8080", 80), Some(("::1", 8080)));
        assert_eq!(host_port("h:port", 80), None);
        assert_eq!(host_port(":80", 80), None);
        assert_eq!(host_port("[::1", 80), None);
    }
}
