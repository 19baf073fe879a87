//! With the `otel` feature (`cargo test -p baton-cli --features otel
//! --test cli -- cli_otel::`): `baton work` with `OTEL_EXPORTER_OTLP_ENDPOINT` set
//! posts its spans to the collector's `/v1/traces` as OTLP protobuf, the
//! attempt's `task` span among them. The collector is a listener in this
//! test that records what it is sent. Without the feature this file is
//! empty.

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use common::{signal, stderr, wait_for, Env};

/// A request the collector received: its request line and body.
type Post = (String, Vec<u8>);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_exports_a_task_span_per_attempt() {
    let Some(e) = Env::new(common::Kind::Sqlite).await else {
        return;
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let posts: Arc<Mutex<Vec<Post>>> = Arc::default();
    let seen = posts.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut r = BufReader::new(stream);
            let mut first = String::new();
            r.read_line(&mut first).unwrap_or(0);
            let mut len = 0usize;
            loop {
                let mut h = String::new();
                if r.read_line(&mut h).unwrap_or(0) <= 2 {
                    break;
                }
                if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0; len];
            let _ = r.read_exact(&mut body);
            seen.lock().unwrap().push((first.trim().to_string(), body));
            let _ = r
                .get_mut()
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
        }
    });
    let out = e.run(&["enqueue", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let log = e.path("work.log");
    let mut kid = e
        .cmd(&["work", "--poll", "100ms", "--shutdown-grace", "1s"])
        .env("BATON_LOG", "info")
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{port}"),
        )
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    wait_for(20, "the task to end", || {
        common::read(&log).contains("task ended")
    });
    signal(&kid, libc::SIGTERM);
    let _ = kid.wait();
    // The last spans are flushed at exit.
    wait_for(10, "an OTLP export", || !posts.lock().unwrap().is_empty());
    let posts = posts.lock().unwrap();
    let (line, body) = &posts[0];
    assert!(line.starts_with("POST /v1/traces "), "{line}");
    let has = |needle: &[u8]| body.windows(needle.len()).any(|w| w == needle);
    // Protobuf keeps strings as they are: the span's name and fields.
    assert!(has(b"task"), "no task span in {body:?}");
    assert!(has(b"command"), "no kind in {body:?}");
    assert!(has(b"succeeded"), "no outcome in {body:?}");
}
