//! The config file's parsing and validation.

use std::time::Duration;

use baton::schedule::spec::{Misfire, Schedule, DEFAULT_MAX_CATCH_UP};
use baton::store::Overlap;

use super::*;

const GOOD: &str = r#"
store = "sqlite://baton.db"

[[queue]]
name = "default"
concurrency = 2
lease = "30s"
per_key_rate = "10/1m"

[[queue]]
name = "slow"
max_running = 3
per_key_max_running = 2
fair = true

[[job]]
name = "tick"
every = "1s"
command = ["sh", "-c", "echo $BATON_SLOT >> ledger"]
queue = "default"
mode = "durable"
misfire = "all"
max_catch_up = 50
overlap = "allow"
max_attempts = 5
timeout = "5m"
jitter = "2s"
priority = -10

[[job]]
name = "nightly"
cron = "0 */6 * * *"
tz = "Asia/Seoul"
queue = "slow"
http = { method = "post", url = "https://example.com/hook", headers = { Authorization = "Bearer x" }, body = "{}" }

[[job]]
name = "runner"
every = "PT30S"
mode = "lock"
at_most = "PT15M"
at_least = "PT30S"
misfire = "none"
grace = "10s"
command = ["true"]
"#;

fn err(text: &str) -> String {
    Config::parse(text).unwrap_err().to_string()
}

/// One job around `body`, with a default schedule/action unless given.
fn job(body: &str) -> String {
    let mut s = String::from("[[job]]\nname = \"j\"\n");
    if !body.contains("cron") && !body.contains("every") {
        s.push_str("every = \"1m\"\n");
    }
    if !body.contains("command") && !body.contains("http") {
        s.push_str("command = [\"true\"]\n");
    }
    s.push_str(body);
    s
}

#[test]
fn parses_a_full_file() {
    let c = Config::parse(GOOD).unwrap();
    assert_eq!(c.store.as_deref(), Some("sqlite://baton.db"));
    assert_eq!(
        c.queues,
        [
            QueueConfig {
                name: "default".into(),
                concurrency: 2,
                lease: Duration::from_secs(30),
                max_running: None,
                per_key_max_running: None,
                rate: None,
                per_key_rate: Some("10/1m".parse().unwrap()),
                fair: false,
            },
            QueueConfig {
                name: "slow".into(),
                concurrency: 1,
                lease: DEFAULT_LEASE,
                max_running: Some(3),
                per_key_max_running: Some(2),
                rate: None,
                per_key_rate: None,
                fair: true,
            },
        ]
    );
    assert_eq!(c.jobs.len(), 3);

    let tick = &c.jobs[0];
    assert_eq!(tick.name, "tick");
    assert_eq!(
        tick.schedule,
        Schedule::every(Duration::from_secs(1)).unwrap()
    );
    assert_eq!(
        tick.action,
        Action::Command(vec![
            "sh".into(),
            "-c".into(),
            "echo $BATON_SLOT >> ledger".into()
        ])
    );
    assert_eq!(tick.mode, Mode::Durable);
    assert_eq!(tick.queue, "default");
    assert_eq!(tick.misfire, Misfire::All);
    assert_eq!(tick.max_catch_up, 50);
    assert_eq!(tick.overlap, Overlap::Allow);
    assert_eq!(tick.max_attempts, 5);
    assert_eq!(tick.timeout, Some(Duration::from_secs(300)));
    assert_eq!(tick.jitter, Duration::from_secs(2));
    assert_eq!(tick.priority, -10);

    let nightly = &c.jobs[1];
    assert_eq!(
        nightly.schedule,
        Schedule::cron("0 */6 * * *", "Asia/Seoul").unwrap()
    );
    assert_eq!(nightly.queue, "slow");
    assert_eq!(
        nightly.action,
        Action::Http {
            method: "POST".into(),
            url: "https://example.com/hook".into(),
            headers: [("Authorization".to_string(), "Bearer x".to_string())].into(),
            body: Some("{}".into()),
        }
    );
    // Defaults.
    assert_eq!(nightly.mode, Mode::Durable);
    assert_eq!(nightly.misfire, Misfire::Latest);
    assert_eq!(nightly.max_catch_up, DEFAULT_MAX_CATCH_UP);
    assert_eq!(nightly.overlap, Overlap::Skip);
    assert_eq!(nightly.max_attempts, DEFAULT_MAX_ATTEMPTS);
    assert_eq!(nightly.timeout, None);
    assert_eq!(nightly.jitter, Duration::ZERO);
    assert_eq!(nightly.priority, 0);
    assert_eq!(nightly.grace, DEFAULT_GRACE);

    let runner = &c.jobs[2];
    assert_eq!(
        runner.mode,
        Mode::Lock {
            at_most: Duration::from_secs(900),
            at_least: Duration::from_secs(30)
        }
    );
    assert_eq!(runner.misfire, Misfire::None);
    assert_eq!(runner.grace, Duration::from_secs(10));
    assert_eq!(runner.max_attempts, 1);
    assert_eq!(
        runner.schedule,
        Schedule::every(Duration::from_secs(30)).unwrap()
    );
}

#[test]
fn the_example_file_parses() {
    let c = Config::parse(include_str!("../../../../examples/baton.toml")).unwrap();
    assert_eq!(c.store.as_deref(), Some("sqlite://baton.db"));
    let runner = c.jobs.iter().find(|j| j.name == "daemon-runner").unwrap();
    assert_eq!(
        runner.schedule,
        Schedule::every(Duration::from_secs(30)).unwrap()
    );
    assert_eq!(
        runner.mode,
        Mode::Lock {
            at_most: Duration::from_secs(15 * 60),
            at_least: Duration::from_secs(30)
        }
    );
    assert!(matches!(runner.action, Action::Command(_)));
    let batch = c.jobs.iter().find(|j| j.name == "batch-6h").unwrap();
    assert_eq!(
        batch.schedule,
        Schedule::cron("0 */6 * * *", "Asia/Seoul").unwrap()
    );
    assert_eq!(batch.mode, Mode::Durable);
    assert_eq!(batch.max_attempts, 3);
    assert!(c.queues.iter().any(|q| q.name == batch.queue));
    // From a file, errors and all.
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/baton.toml");
    assert_eq!(Config::from_file(path).unwrap(), c);
}

#[test]
fn fixed_delay_is_a_lock_mode_schedule() {
    let c = Config::parse(
            "[[job]]\nname = \"d\"\nfixed_delay = \"PT30S\"\nmode = \"lock\"\nat_most = \"PT15M\"\ncommand = [\"true\"]\n",
        )
        .unwrap();
    assert_eq!(c.jobs[0].fixed_delay, Some(Duration::from_secs(30)));
    let e = err("[[job]]\nname = \"d\"\nfixed_delay = \"30s\"\ncommand = [\"true\"]\n");
    assert!(
        e.starts_with("job \"d\": fixed_delay: only with mode = \"lock\""),
        "{e}"
    );
    let e = err("[[job]]\nname = \"d\"\nfixed_delay = \"30s\"\nevery = \"1s\"\nmode = \"lock\"\nat_most = \"1m\"\ncommand = [\"true\"]\n");
    assert!(e.contains("exactly one of cron or every"), "{e}");
}

#[test]
fn from_file_errors_name_the_path() {
    let e = Config::from_file("/nonexistent/baton.toml").unwrap_err();
    assert!(matches!(e.kind, ConfigErrorKind::Io(_)));
    assert!(
        e.to_string()
            .starts_with("/nonexistent/baton.toml: cannot read"),
        "{e}"
    );

    let dir = std::env::temp_dir().join(format!("baton-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("bad.toml");
    std::fs::write(&p, job("every = \"1x\"")).unwrap();
    let e = Config::from_file(&p).unwrap_err().to_string();
    assert!(
        e.starts_with(&format!("{}: job \"j\": every:", p.display())),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn empty_file_and_jobs_only() {
    // Nothing to run is refused, not served silently.
    for text in ["", "store = \"sqlite://x.db\"\n"] {
        let e = err(text);
        assert!(
            e.starts_with("config: has no [[job]] and no [[queue]]"),
            "{e}"
        );
    }
    // A queue alone is fine (workers only).
    Config::parse("[[queue]]\nname = \"q\"\n").unwrap();
    // The default queue is implicit for durable jobs...
    let c = Config::parse(&job("")).unwrap();
    assert_eq!(
        c.queues,
        [QueueConfig {
            name: "default".into(),
            concurrency: 1,
            lease: DEFAULT_LEASE,
            max_running: None,
            per_key_max_running: None,
            rate: None,
            per_key_rate: None,
            fair: false,
        }]
    );
    // ...and not added for lock-mode jobs.
    let c = Config::parse(&job("mode = \"lock\"\nat_most = \"1m\"")).unwrap();
    assert!(c.queues.is_empty());
}

#[test]
fn schedule_errors() {
    assert_eq!(
        err(&job("every = \"1x\"")),
        "job \"j\": every: \"1x\" is not a duration; use a number with a unit (500ms, 30s, \
             15m, 1h30m, 2d) or ISO-8601 (PT15M, PT30S, P1DT2H)"
    );
    let e = err(&job("every = \"50ms\""));
    assert!(e.starts_with("job \"j\": every: 50ms is too short"), "{e}");
    let e = err(&job("every = \"0s\""));
    assert!(e.starts_with("job \"j\": every:"), "{e}");
    let e = err("[[job]]\nname = \"nightly\"\ncommand = [\"true\"]\n");
    assert!(
        e.starts_with("job \"nightly\": give exactly one of cron or every"),
        "{e}"
    );
    let e = err(&job("cron = \"@daily\"\nevery = \"1m\""));
    assert!(
        e.starts_with("job \"j\": give exactly one of cron or every"),
        "{e}"
    );
    let e = err(&job("cron = \"0 0 * *\""));
    assert!(
        e.starts_with("job \"j\": cron: \"0 0 * *\" is not a cron expression"),
        "{e}"
    );
    assert!(e.contains("5 fields"), "{e}");
    let e = err(&job("cron = \"@daily\"\ntz = \"Mars/Olympus\""));
    assert!(
        e.starts_with("job \"j\": tz: \"Mars/Olympus\" is not an IANA time zone"),
        "{e}"
    );
    let e = err(&job("every = \"1m\"\ntz = \"UTC\""));
    assert!(e.starts_with("job \"j\": tz: only with cron"), "{e}");
}

#[test]
fn action_errors() {
    let e = err("[[job]]\nname = \"j\"\nevery = \"1m\"\n");
    assert_eq!(e, "job \"j\": give exactly one of command or http");
    let e = err(&job(
        "command = [\"true\"]\nhttp = { url = \"https://example.com\" }",
    ));
    assert_eq!(e, "job \"j\": give exactly one of command or http");
    let e = err(&job("command = []"));
    assert!(e.starts_with("job \"j\": command: is empty"), "{e}");
    for cmd in ["[\"\"]", "[\"  \", \"x\"]"] {
        let e = err(&job(&format!("command = {cmd}")));
        assert!(
            e.starts_with("job \"j\": command: names no program"),
            "{cmd}: {e}"
        );
    }
    let e = err(&job("http = { url = \"ftp://example.com\" }"));
    assert!(e.starts_with("job \"j\": http.url:"), "{e}");
    let e = err(&job("http = { url = \"https://\" }"));
    assert!(e.starts_with("job \"j\": http.url:"), "{e}");
    let e = err(&job("http = { url = \"https://x\", method = \"PO ST\" }"));
    assert!(e.starts_with("job \"j\": http.method:"), "{e}");
    let e = err(&job(
        "http = { url = \"https://x\", headers = { \"A B\" = \"c\" } }",
    ));
    assert!(e.starts_with("job \"j\": http.headers:"), "{e}");
    let e = err(&job(
        "http = { url = \"https://x\", headers = { A = \"b\\nc\" } }",
    ));
    assert!(e.starts_with("job \"j\": http.headers:"), "{e}");
    // GET with no body and no headers is fine.
    let c = Config::parse(&job(
        "http = { method = \"GET\", url = \"http://127.0.0.1:8080/x\" }",
    ))
    .unwrap();
    assert!(
        matches!(&c.jobs[0].action, Action::Http { method, body: None, .. } if method == "GET")
    );
}

#[test]
fn mode_errors() {
    let e = err(&job("mode = \"lock\""));
    assert!(
        e.starts_with("job \"j\": at_most: is required with mode = \"lock\""),
        "{e}"
    );
    let e = err(&job(
        "mode = \"lock\"\nat_most = \"30s\"\nat_least = \"1m\"",
    ));
    assert_eq!(
        e,
        "job \"j\": at_least: 1m is longer than at_most (30s); use at most at_most"
    );
    let e = err(&job("mode = \"lock\"\nat_most = \"0s\""));
    assert!(e.starts_with("job \"j\": at_most: \"0s\" is zero"), "{e}");
    let e = err(&job("mode = \"lock\"\nat_most = \"15 minutes\""));
    assert!(
        e.starts_with("job \"j\": at_most: \"15 minutes\" is not a duration"),
        "{e}"
    );
    for key in [
        "queue = \"default\"",
        "max_attempts = 2",
        "priority = 1",
        "overlap = \"allow\"",
    ] {
        let e = err(&job(&format!("mode = \"lock\"\nat_most = \"1m\"\n{key}")));
        let field = key.split(' ').next().unwrap();
        assert!(
            e.starts_with(&format!("job \"j\": {field}: only with mode = \"durable\"")),
            "{e}"
        );
    }
    for key in ["at_most = \"1m\"", "at_least = \"1s\""] {
        let e = err(&job(key));
        let field = key.split(' ').next().unwrap();
        assert_eq!(e, format!("job \"j\": {field}: only with mode = \"lock\""));
    }
    // at_least equal to at_most is allowed.
    Config::parse(&job(
        "mode = \"lock\"\nat_most = \"1m\"\nat_least = \"60s\"",
    ))
    .unwrap();
    let e = err(&job("mode = \"exclusive\""));
    assert!(e.contains("unknown variant `exclusive`"), "{e}");
    assert!(e.contains("line 5"), "{e}");
}

#[test]
fn range_errors() {
    for (body, want) in [
        (
            "max_attempts = 0",
            "job \"j\": max_attempts: 0 is out of range; use 1..=10000",
        ),
        (
            "priority = 101",
            "job \"j\": priority: 101 is out of range; use -100..=100",
        ),
        (
            "priority = -101",
            "job \"j\": priority: -101 is out of range; use -100..=100",
        ),
        (
            "max_catch_up = 0",
            "job \"j\": max_catch_up: 0 is out of range; use 1..=100000",
        ),
    ] {
        assert_eq!(err(&job(body)), want);
    }
    Config::parse(&job("priority = -100")).unwrap();
    Config::parse(&job("priority = 100")).unwrap();
    let e = err("[[queue]]\nname = \"q\"\nmax_running = 0\n");
    assert_eq!(
        e.to_string(),
        "queue \"q\": max_running: 0 is out of range; use 1..=10000"
    );
    let e = err("[[queue]]\nname = \"q\"\nper_key_max_running = 0\n");
    assert_eq!(
        e.to_string(),
        "queue \"q\": per_key_max_running: 0 is out of range; use 1..=10000"
    );
    for bad in ["0/1m", "10/0s", "ten a minute", "api=10/1m"] {
        let e = err(&format!(
            "[[queue]]\nname = \"q\"\nper_key_rate = {bad:?}\n"
        ));
        assert!(e.starts_with("queue \"q\": per_key_rate: "), "{bad}: {e}");
    }
    let e = err("[[queue]]\nname = \"q\"\nper_key_rate = \"10/1m\"\nfair = true\n");
    assert_eq!(
        e,
        "queue \"q\": per_key_rate: cannot be combined with fair = true yet; drop one of the two"
    );
    let e = err("[[queue]]\nname = \"q\"\nfair = \"yes\"\n");
    assert_eq!(
        e,
        "queue \"q\": fair: \"yes\" is not a boolean; use fair = true or fair = false"
    );
    let e = err("[[queue]]\nname = \"q\"\nconcurrency = 0\n");
    assert_eq!(
        e,
        "queue \"q\": concurrency: 0 is out of range; use 1..=10000"
    );
    let e = err("[[queue]]\nname = \"q\"\nlease = \"0s\"\n");
    assert!(e.starts_with("queue \"q\": lease: \"0s\" is zero"), "{e}");
    let e = err(&job("timeout = \"soon\""));
    assert!(
        e.starts_with("job \"j\": timeout: \"soon\" is not a duration"),
        "{e}"
    );
    let e = err(&job("jitter = \"-1s\""));
    assert!(e.starts_with("job \"j\": jitter:"), "{e}");
    let e = err(&job("grace = \"x\""));
    assert!(e.starts_with("job \"j\": grace:"), "{e}");
    let e = err(&job("misfire = \"sometimes\""));
    assert!(e.contains("unknown variant `sometimes`"), "{e}");
}

#[test]
fn name_errors() {
    let e = err("[[job]]\nname = \"\"\nevery = \"1m\"\ncommand = [\"true\"]\n");
    assert_eq!(e, "job #1: name: is empty");
    let long = "x".repeat(256);
    let e = err(&format!("[[queue]]\nname = \"{long}\"\n"));
    assert_eq!(e, "queue #1: name: is 256 bytes; use at most 255");
    Config::parse(&format!("[[queue]]\nname = \"{}\"\n", "x".repeat(255))).unwrap();
    let e = err("[[queue]]\nname = \"a\\tb\"\n");
    assert_eq!(e, "queue #1: name: \"a\\tb\" contains a control character");
    let e = err(&format!("{}\n{}", job(""), job("")));
    assert_eq!(
        e,
        "job \"j\": name: is declared twice; job names must be unique"
    );
    let e = err("[[queue]]\nname = \"q\"\n[[queue]]\nname = \"q\"\n");
    assert_eq!(
        e,
        "queue \"q\": name: is declared twice; queue names must be unique"
    );
    // A job and a queue may share a name.
    Config::parse(&format!(
        "[[queue]]\nname = \"j\"\n{}",
        job("queue = \"j\"")
    ))
    .unwrap();
    let e = err("[[job]]\nevery = \"1m\"\ncommand = [\"true\"]\n");
    assert!(e.contains("missing field `name`"), "{e}");
}

#[test]
fn undeclared_queue_is_refused() {
    let e = err(&job("queue = \"fast\""));
    assert!(
        e.starts_with("job \"j\": queue: \"fast\" is not declared"),
        "{e}"
    );
    let e = err(&job("queue = \"\""));
    assert_eq!(e, "job \"j\": queue: is empty");
}

#[test]
fn unknown_keys_are_refused_with_line_and_column() {
    let e = err(&job("max_atempts = 3"));
    assert!(e.contains("unknown field `max_atempts`"), "{e}");
    assert!(e.contains("line 5, column 1"), "{e}");
    let e = err("stor = \"sqlite://x\"\n");
    assert!(e.contains("unknown field `stor`"), "{e}");
    let e = err("[[queue]]\nname = \"q\"\nconcurency = 2\n");
    assert!(e.contains("unknown field `concurency`"), "{e}");
    let e = err(&job("http = { url = \"https://x\", data = \"y\" }"));
    assert!(e.contains("unknown field `data`"), "{e}");
    let e = err("[[jobs]]\nname = \"x\"\n");
    assert!(e.contains("unknown field `jobs`"), "{e}");
    let e = err("this is not toml");
    assert!(e.contains("line 1"), "{e}");
    let e = err(&job("max_attempts = \"3\""));
    assert!(e.contains("invalid type"), "{e}");
    let e = err("store = \"  \"\n");
    assert!(e.starts_with("store: is empty"), "{e}");
}

#[test]
fn durations_are_bounded() {
    let e = err(&job("every = \"3651d\""));
    assert_eq!(
        e,
        "job \"j\": every: 3651d is too long; use at most 10 years (3650d)"
    );
    Config::parse(&job("every = \"3650d\"")).unwrap();
    let e = err(&job("timeout = \"4000d\""));
    assert!(
        e.starts_with("job \"j\": timeout: 4000d is too long"),
        "{e}"
    );
    let e = err(&job("mode = \"lock\"\nat_most = \"4000d\""));
    assert!(
        e.starts_with("job \"j\": at_most: 4000d is too long"),
        "{e}"
    );
    let e = err("[[queue]]\nname = \"q\"\nlease = \"4000d\"\n");
    assert!(
        e.starts_with("queue \"q\": lease: 4000d is too long"),
        "{e}"
    );
}

#[test]
fn quartz_forms_get_a_hint() {
    let e = err(&job("cron = \"0 0 12 * * ? 2026\""));
    assert!(
        e.starts_with("job \"j\": cron: \"0 0 12 * * ? 2026\" has 7 fields (Quartz's year field)"),
        "{e}"
    );
    let e = err(&job("cron = \"0 0 12 ? * 2-6\""));
    assert!(e.contains("Quartz counts 1-7 from Sunday"), "{e}");
    // `?` with named days, and 6 fields with seconds, are cron as documented.
    Config::parse(&job("cron = \"0 0 12 ? * MON-FRI\"")).unwrap();
    Config::parse(&job("cron = \"*/10 * * * * *\"")).unwrap();
}

/// `start_at` and `end_at` are RFC 3339 instants, the end after the
/// start; a bad one is refused naming the field and the form.
#[test]
fn start_and_end_at() {
    let c = Config::parse(&job(
        "start_at = \"2027-01-01T09:00:00+09:00\"\nend_at = \"2027-02-01T00:00:00Z\"",
    ))
    .unwrap();
    let j = &c.jobs[0];
    assert_eq!(
        j.start_at.map(|t| t.to_rfc3339()).as_deref(),
        Some("2027-01-01T00:00:00+00:00")
    );
    assert_eq!(j.job().end_at, j.end_at);
    let c = Config::parse(&job("catch_up_window = \"1h\"")).unwrap();
    assert_eq!(
        c.jobs[0].job().catch_up_window,
        Some(Duration::from_secs(3600))
    );
    let e = err(&job("catch_up_window = \"0s\""));
    assert!(e.contains("catch_up_window"), "{e}");
    let e = err(&job("start_at = \"tomorrow\""));
    assert!(e.contains("start_at") && e.contains("RFC 3339"), "{e}");
    let e = err(&job(
        "start_at = \"2027-01-01T00:00:00Z\"\nend_at = \"2026-01-01T00:00:00Z\"",
    ));
    assert!(
        e.contains("end_at") && e.contains("not after start_at"),
        "{e}"
    );
}

#[test]
fn overlap_policies_parse_forbid_is_skip_and_unknown_names_the_field() {
    for (text, want) in [
        ("skip", Overlap::Skip),
        ("forbid", Overlap::Skip),
        ("allow", Overlap::Allow),
        ("buffer_one", Overlap::BufferOne),
        ("buffer_all", Overlap::BufferAll),
        ("cancel_other", Overlap::CancelOther),
        ("terminate_other", Overlap::TerminateOther),
    ] {
        let c = Config::parse(&job(&format!("overlap = \"{text}\""))).unwrap();
        assert_eq!(c.jobs[0].overlap, want, "{text}");
        assert_eq!(c.jobs[0].job().overlap, want, "{text}");
    }
    let e = err(&job("overlap = \"replace\""));
    assert!(
        e.contains("overlap") && e.contains("replace") && e.contains("buffer_one"),
        "{e}"
    );
}
