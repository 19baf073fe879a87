//! Property tests of the config loader (proptest): any text, and configs
//! assembled from the real keys with good and bad values, either load
//! with every rule holding or are refused with a one-line error; a valid
//! config's values read back as written.
//!
//! A long run: `PROPTEST_CASES=20000 cargo test -p baton-cli --bin baton props`.

use std::time::Duration;

use proptest::prelude::*;

use super::*;

/// A value for a key: mostly plausible, sometimes wrong in type or range.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("\"1s\"".to_string()),
        Just("\"0s\"".to_string()),
        Just("\"soon\"".to_string()),
        Just("\"PT15M\"".to_string()),
        Just("\"99999d\"".to_string()),
        Just("\"0 */6 * * *\"".to_string()),
        Just("\"61 * * * *\"".to_string()),
        Just("\"Europe/Berlin\"".to_string()),
        Just("\"Mars/Base\"".to_string()),
        Just("\"durable\"".to_string()),
        Just("\"lock\"".to_string()),
        Just("\"latest\"".to_string()),
        Just("\"forbid\"".to_string()),
        Just("\"default\"".to_string()),
        Just("\"\"".to_string()),
        Just("[\"true\"]".to_string()),
        Just("[]".to_string()),
        Just("{ url = \"http://127.0.0.1:1/x\" }".to_string()),
        Just("{ url = \"ftp://x\" }".to_string()),
        (-200i64..20_000).prop_map(|n| n.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        Just("true".to_string()),
        Just("1.5".to_string()),
        "[a-z0-9 ]{0,12}".prop_map(|s| format!("{s:?}")),
    ]
}

const JOB_KEYS: &[&str] = &[
    "name",
    "cron",
    "tz",
    "every",
    "fixed_delay",
    "command",
    "http",
    "queue",
    "mode",
    "at_most",
    "at_least",
    "misfire",
    "max_catch_up",
    "grace",
    "overlap",
    "max_attempts",
    "timeout",
    "jitter",
    "priority",
    "bogus",
];
const QUEUE_KEYS: &[&str] = &[
    "name",
    "concurrency",
    "lease",
    "max_running",
    "per_key_max_running",
    "rate",
    "per_key_rate",
    "fair",
    "bogus",
];

/// A config file of a few `[[job]]` and `[[queue]]` tables with random keys.
fn config_text() -> impl Strategy<Value = String> {
    let table = |keys: &'static [&'static str]| {
        prop::collection::vec((prop::sample::select(keys), value()), 0..8)
    };
    (
        prop::collection::vec(table(JOB_KEYS), 0..3),
        prop::collection::vec(table(QUEUE_KEYS), 0..3),
    )
        .prop_map(|(jobs, queues)| {
            let mut out = String::new();
            for (header, tables) in [("[[job]]", jobs), ("[[queue]]", queues)] {
                for t in tables {
                    out.push_str(header);
                    out.push('\n');
                    let mut seen = std::collections::HashSet::new();
                    for (k, v) in t {
                        // TOML refuses a key twice; that case is the parser's.
                        if seen.insert(k) {
                            out.push_str(&format!("{k} = {v}\n"));
                        }
                    }
                }
            }
            out
        })
}

/// What every loaded config satisfies.
fn check_loaded(c: &Config) -> Result<(), TestCaseError> {
    let mut names = std::collections::HashSet::new();
    for j in &c.jobs {
        prop_assert!(!j.name.is_empty() && j.name.len() <= MAX_NAME_BYTES);
        prop_assert!(names.insert(j.name.clone()), "job {:?} twice", j.name);
        prop_assert!((-100..=100).contains(&j.priority));
        prop_assert!((1..=10_000).contains(&j.max_attempts));
        prop_assert!(j.max_catch_up >= 1);
        prop_assert!(j.timeout.is_none_or(|t| !t.is_zero() && t <= MAX_DURATION));
        prop_assert!(j.jitter <= MAX_DURATION && j.grace <= MAX_DURATION);
        if j.mode == Mode::Durable {
            prop_assert!(
                c.queues.iter().any(|q| q.name == j.queue),
                "job {:?} uses undeclared queue {:?}",
                j.name,
                j.queue
            );
        }
        if let Action::Command(argv) = &j.action {
            prop_assert!(argv.first().is_some_and(|p| !p.trim().is_empty()));
        }
    }
    let mut qnames = std::collections::HashSet::new();
    for q in &c.queues {
        prop_assert!(!q.name.is_empty() && q.name.len() <= MAX_NAME_BYTES);
        prop_assert!(qnames.insert(q.name.clone()), "queue {:?} twice", q.name);
        prop_assert!(q.concurrency >= 1 && i64::from(q.concurrency) <= MAX_CONCURRENCY);
        prop_assert!(!q.lease.is_zero() && q.lease <= MAX_DURATION);
    }
    Ok(())
}

proptest! {
    #[test]
    fn any_text_loads_or_is_refused_on_one_line(text in any::<String>()) {
        match Config::parse(&text) {
            Ok(c) => check_loaded(&c)?,
            Err(e) => prop_assert!(!e.to_string().contains('\n'), "{e}"),
        }
    }

    #[test]
    fn assembled_configs_load_or_are_refused_on_one_line(text in config_text()) {
        match Config::parse(&text) {
            Ok(c) => check_loaded(&c)?,
            Err(e) => {
                let line = e.to_string();
                prop_assert!(!line.contains('\n'), "{line}");
                // It says where: a job or queue, the file's structure, or a line.
                prop_assert!(
                    line.starts_with("job ")
                        || line.starts_with("queue ")
                        || line.starts_with("line ")
                        || line.starts_with("config")
                        || line.starts_with("store")
                        || line.starts_with("not valid TOML"),
                    "{line}"
                );
            }
        }
    }

    #[test]
    fn a_valid_config_reads_back(
        name in "[a-z][a-z0-9_-]{0,20}",
        every_ms in 100u64..=86_400_000,
        concurrency in 1u32..=10_000,
        lease_s in 1u64..=3600,
        priority in -100i32..=100,
        attempts in 1u32..=10_000,
        program in "[ -~]{0,9}[!-~][ -~]{0,10}",
        args in prop::collection::vec("[ -~]{1,20}", 0..3),
    ) {
        // A program of only blanks is refused (see `validate_action`).
        let cmd: Vec<String> = std::iter::once(program).chain(args).collect();
        let every = baton::format_duration(Duration::from_millis(every_ms));
        let text = format!(
            "[[queue]]\nname = \"q\"\nconcurrency = {concurrency}\nlease = \"{lease_s}s\"\n\n\
             [[job]]\nname = {name:?}\nevery = {every:?}\nqueue = \"q\"\npriority = {priority}\n\
             max_attempts = {attempts}\ncommand = {}\n",
            toml::Value::Array(cmd.iter().cloned().map(toml::Value::String).collect())
        );
        let c = Config::parse(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(c.jobs.len(), 1);
        let j = &c.jobs[0];
        prop_assert_eq!(&j.name, &name);
        prop_assert_eq!(&j.schedule, &baton::schedule::spec::Schedule::every(Duration::from_millis(every_ms)).unwrap());
        prop_assert_eq!(j.priority, priority);
        prop_assert_eq!(j.max_attempts, attempts);
        prop_assert_eq!(&j.action, &Action::Command(cmd.clone()));
        let q = c.queues.iter().find(|q| q.name == "q").unwrap();
        prop_assert_eq!(q.concurrency, concurrency);
        prop_assert_eq!(q.lease, Duration::from_secs(lease_s));
    }
}
