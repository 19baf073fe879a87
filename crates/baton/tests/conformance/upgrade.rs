//! Schema upgrades: a store written by schema version 1 (its DDL and key
//! layout copied here as they were) is upgraded in place on connect, keeps
//! its data, and then behaves as the current version does.

use std::time::Duration;

use baton::store::{Finish, TaskClaim, TaskFilter, TaskState, CANCEL_REQUESTED};
use baton::{Store, StoreOptions};

use crate::harness::{exec_sql, Kind};
use crate::TestStore;

/// The SQLite schema of version 1, as `sqlite.rs` created it.
fn sqlite_v1_ddl(p: &str) -> String {
    format!(
        r#"
CREATE TABLE IF NOT EXISTS "{p}meta" (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS "{p}locks" (
    name       TEXT PRIMARY KEY,
    holder     TEXT NOT NULL,
    token      INTEGER NOT NULL,
    locked_at  INTEGER NOT NULL,
    lock_until INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS "{p}tasks" (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    queue            TEXT NOT NULL,
    kind             TEXT NOT NULL,
    payload          TEXT NOT NULL,
    state            TEXT NOT NULL,
    priority         INTEGER NOT NULL,
    attempt          INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL,
    timeout_ms       INTEGER,
    run_at           INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    started_at       INTEGER,
    finished_at      INTEGER,
    lease_until      INTEGER,
    worker           TEXT,
    unique_key       TEXT,
    unique_forever   INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT,
    errors           TEXT NOT NULL DEFAULT '[]',
    progress         TEXT,
    job              TEXT,
    slot             INTEGER
);
CREATE INDEX IF NOT EXISTS "{p}tasks_claim" ON "{p}tasks" (queue, priority, run_at, id)
    WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS "{p}tasks_lease" ON "{p}tasks" (lease_until)
    WHERE state = 'running';
CREATE UNIQUE INDEX IF NOT EXISTS "{p}tasks_unique" ON "{p}tasks" (unique_key)
    WHERE unique_key IS NOT NULL AND (unique_forever OR state IN ('pending', 'running'));
CREATE INDEX IF NOT EXISTS "{p}tasks_finished" ON "{p}tasks" (finished_at)
    WHERE finished_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS "{p}tasks_job" ON "{p}tasks" (job, slot)
    WHERE job IS NOT NULL;
CREATE TABLE IF NOT EXISTS "{p}jobs" (
    name      TEXT PRIMARY KEY,
    last_slot INTEGER,
    paused    INTEGER NOT NULL DEFAULT 0
);
INSERT INTO "{p}meta" (key, value) VALUES ('schema_version', '1')
    ON CONFLICT (key) DO NOTHING;
"#
    )
}

/// The PostgreSQL schema of version 1, as `postgres.rs` created it.
fn postgres_v1_ddl(p: &str) -> String {
    format!(
        r#"
CREATE TABLE IF NOT EXISTS "{p}meta" (
    key   text PRIMARY KEY,
    value text NOT NULL
);
CREATE TABLE IF NOT EXISTS "{p}locks" (
    name       text PRIMARY KEY,
    holder     text NOT NULL,
    token      bigint NOT NULL,
    locked_at  timestamptz NOT NULL,
    lock_until timestamptz NOT NULL
);
CREATE SEQUENCE IF NOT EXISTS "{p}tasks_id_seq";
CREATE TABLE IF NOT EXISTS "{p}tasks" (
    id               bigint PRIMARY KEY DEFAULT nextval('"{p}tasks_id_seq"'),
    queue            text NOT NULL,
    kind             text NOT NULL,
    payload          jsonb NOT NULL,
    state            text NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'running', 'succeeded', 'failed', 'cancelled')),
    priority         integer NOT NULL DEFAULT 0,
    attempt          integer NOT NULL DEFAULT 0,
    max_attempts     integer NOT NULL DEFAULT 1,
    timeout_ms       bigint,
    run_at           timestamptz NOT NULL DEFAULT now(),
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    lease_until      timestamptz,
    worker           text,
    unique_key       text,
    unique_forever   boolean NOT NULL DEFAULT false,
    cancel_requested boolean NOT NULL DEFAULT false,
    last_error       text,
    errors           jsonb NOT NULL DEFAULT '[]'::jsonb,
    progress         jsonb,
    job              text,
    slot             timestamptz
);
ALTER SEQUENCE "{p}tasks_id_seq" OWNED BY "{p}tasks".id;
CREATE INDEX IF NOT EXISTS "{p}tasks_claim" ON "{p}tasks" (queue, priority, run_at, id)
    WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS "{p}tasks_lease" ON "{p}tasks" (lease_until)
    WHERE state = 'running';
CREATE UNIQUE INDEX IF NOT EXISTS "{p}tasks_unique" ON "{p}tasks" (unique_key)
    WHERE unique_key IS NOT NULL AND (unique_forever OR state IN ('pending', 'running'));
CREATE INDEX IF NOT EXISTS "{p}tasks_prune" ON "{p}tasks" (finished_at)
    WHERE state IN ('succeeded', 'failed', 'cancelled');
CREATE INDEX IF NOT EXISTS "{p}tasks_job" ON "{p}tasks" (job, slot)
    WHERE job IS NOT NULL;
CREATE TABLE IF NOT EXISTS "{p}jobs" (
    name      text PRIMARY KEY,
    last_slot timestamptz,
    paused    boolean NOT NULL DEFAULT false
);
INSERT INTO "{p}meta" (key, value) VALUES ('schema_version', '1')
    ON CONFLICT (key) DO NOTHING;
"#
    )
}

/// The v1 data every backend gets, in ms since the epoch relative to `now`:
/// lock `L` (token 5, lapsed), task A pending, task B pending with its
/// cancel requested (possible in v1 after a retry), task C running with a
/// lapsed lease, job `J`.
const SLOT_MS: i64 = 1_600_000_000_000;

async fn write_v1_sql(ts: &TestStore, p: &str, now_ms: i64) {
    let past = now_ms - 60_000;
    match ts.kind {
        Kind::Sqlite => {
            let rows = format!(
                r#"
INSERT INTO "{p}locks" VALUES ('L', 'old-holder', 5, {past}, {past});
INSERT INTO "{p}tasks" (queue, kind, payload, state, priority, attempt, max_attempts,
    run_at, created_at) VALUES ('up', 'a', '{{"v":1}}', 'pending', 0, 0, 3, {past}, {past});
INSERT INTO "{p}tasks" (queue, kind, payload, state, priority, attempt, max_attempts,
    run_at, created_at, cancel_requested, last_error)
    VALUES ('up', 'b', '{{"v":2}}', 'pending', 0, 1, 3, {past}, {past}, 1, 'e1');
INSERT INTO "{p}tasks" (queue, kind, payload, state, priority, attempt, max_attempts,
    run_at, created_at, started_at, lease_until, worker)
    VALUES ('up', 'c', '{{"v":3}}', 'running', 0, 1, 3, {past}, {past}, {past}, {past}, 'w');
INSERT INTO "{p}jobs" VALUES ('J', {SLOT_MS}, 0);
"#
            );
            exec_sql(ts, &(sqlite_v1_ddl(p) + "\n" + &rows)).await;
        }
        Kind::Postgres => {
            let rows = format!(
                r#"
INSERT INTO "{p}locks" VALUES ('L', 'old-holder', 5, now() - interval '1 minute',
    now() - interval '1 minute');
INSERT INTO "{p}tasks" (queue, kind, payload, state, attempt, max_attempts, run_at)
    VALUES ('up', 'a', '{{"v":1}}', 'pending', 0, 3, now() - interval '1 minute');
INSERT INTO "{p}tasks" (queue, kind, payload, state, attempt, max_attempts, run_at,
    cancel_requested, last_error)
    VALUES ('up', 'b', '{{"v":2}}', 'pending', 1, 3, now() - interval '1 minute', true, 'e1');
INSERT INTO "{p}tasks" (queue, kind, payload, state, attempt, max_attempts, run_at,
    started_at, lease_until, worker)
    VALUES ('up', 'c', '{{"v":3}}', 'running', 1, 3, now() - interval '1 minute',
        now() - interval '1 minute', now() - interval '1 minute', 'w');
INSERT INTO "{p}jobs" VALUES ('J', to_timestamp({SLOT_MS} / 1000.0), false);
"#
            );
            exec_sql(ts, &(postgres_v1_ddl(p) + "\n" + &rows)).await;
        }
        Kind::Redis | Kind::Mysql => unreachable!(),
    }
}

/// The Redis keys of version 1, written as its scripts wrote them.
async fn write_v1_redis(ts: &TestStore, p: &str, now_ms: i64) {
    let past = now_ms - 60_000;
    let b = format!("{p}{{baton}}:");
    let mut c = redis_conn(ts).await;
    let shift: i64 = 8_796_093_022_208;
    let pad = |id: i64| format!("{id:016}");
    let mut pipe = redis::pipe();
    pipe.cmd("HSET")
        .arg(format!("{p}lock:L"))
        .arg(&["holder", "old-holder", "token", "5"])
        .arg(&[
            "locked_at",
            &past.to_string(),
            "lock_until",
            &past.to_string(),
        ])
        .ignore();
    pipe.cmd("PEXPIRE")
        .arg(format!("{p}lock:L"))
        .arg(86_400_000)
        .ignore();
    for (id, kind, state, attempt, cancel) in [
        (1, "a", "pending", "0", "0"),
        (2, "b", "pending", "1", "1"),
        (3, "c", "running", "1", "0"),
    ] {
        let k = format!("{b}task:{id}");
        pipe.cmd("HSET")
            .arg(&k)
            .arg(&["id", &id.to_string(), "queue", "up", "kind", kind])
            .arg(&["payload", &format!("{{\"v\":{id}}}"), "priority", "0"])
            .arg(&["attempt", attempt, "max_attempts", "3"])
            .arg(&["run_at", &past.to_string(), "created_at", &past.to_string()])
            .arg(&["cancel_requested", cancel, "state", state])
            .ignore();
        pipe.cmd("ZADD")
            .arg(format!("{b}ids"))
            .arg(id)
            .arg(pad(id))
            .ignore();
        pipe.cmd("HINCRBY")
            .arg(format!("{b}counts:up"))
            .arg(state)
            .arg(1)
            .ignore();
        if state == "pending" {
            pipe.cmd("ZADD")
                .arg(format!("{b}q:up:ready"))
                .arg(128 * shift + past)
                .arg(pad(id))
                .ignore();
        } else {
            pipe.cmd("HSET")
                .arg(&k)
                .arg(&[
                    "started_at",
                    &past.to_string(),
                    "lease_until",
                    &past.to_string(),
                ])
                .arg(&["worker", "w"])
                .ignore();
            pipe.cmd("ZADD")
                .arg(format!("{b}running"))
                .arg(past)
                .arg(pad(id))
                .ignore();
        }
    }
    pipe.cmd("SET").arg(format!("{b}seq")).arg(3).ignore();
    pipe.cmd("SADD")
        .arg(format!("{b}queues"))
        .arg("up")
        .ignore();
    pipe.cmd("HSET")
        .arg(format!("{b}job:J"))
        .arg(&["last_slot", &SLOT_MS.to_string(), "paused", "0"])
        .ignore();
    pipe.cmd("SADD").arg(format!("{b}jobs")).arg("J").ignore();
    pipe.cmd("SET").arg(format!("{b}schema")).arg(1).ignore();
    // Keys baton did not write, beside its own under the old lock key
    // form: ShedLock's lock (a string with a 15-minute lease), a hash
    // of another tool, a hash with baton's field names and one more.
    for (key, ttl) in FOREIGN_LOCK_KEYS {
        let key = format!("{p}{key}");
        match key.rsplit(':').next() {
            Some("daemon-runner") => {
                pipe.cmd("SET").arg(&key).arg(SHEDLOCK_VALUE).ignore();
            }
            Some("other-tool") => {
                pipe.cmd("HSET")
                    .arg(&key)
                    .arg(&["owner", "someone", "until", "soon"])
                    .ignore();
            }
            _ => {
                pipe.cmd("HSET")
                    .arg(&key)
                    .arg(&["holder", "x", "token", "1", "locked_at", "1"])
                    .arg(&["lock_until", "1", "extra", "field"])
                    .ignore();
            }
        }
        if *ttl > 0 {
            pipe.cmd("PEXPIRE").arg(&key).arg(*ttl).ignore();
        }
    }
    // As an earlier build's lock index step left it: a foreign name in
    // baton's lock index.
    pipe.cmd("SADD")
        .arg(format!("{b}locks"))
        .arg("daemon-runner")
        .ignore();
    // One command at a time: on a cluster the keys live on several nodes.
    for cmd in pipe.cmd_iter() {
        cmd.query_async::<()>(&mut c).await.unwrap();
    }
}

/// ShedLock's value for `lock:daemon-runner`.
const SHEDLOCK_VALUE: &str = "ADDED:2026-12-01T20:00:00.000Z@pod-a";

/// Keys under the old lock key form that baton did not write, with their
/// TTL in ms (0: none).
const FOREIGN_LOCK_KEYS: &[(&str, i64)] = &[
    ("lock:daemon-runner", 900_000),
    ("lock:other-tool", 600_000),
    ("lock:lookalike", 0),
];

/// Every foreign key of the v1 fixture kept its value and its TTL
/// through the upgrade (a TTL no longer than it was, and still there).
async fn foreign_keys_untouched(ts: &TestStore, p: &str) {
    let mut c = redis_conn(ts).await;
    for (key, ttl) in FOREIGN_LOCK_KEYS {
        let key = format!("{p}{key}");
        let left: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut c)
            .await
            .unwrap();
        if *ttl > 0 {
            assert!(
                left > ttl - 120_000 && left <= *ttl,
                "{key}: TTL {left} ms, was {ttl} ms"
            );
        } else {
            assert_eq!(left, -1, "{key}: no TTL before, none after");
        }
    }
    let v: String = redis::cmd("GET")
        .arg(format!("{p}lock:daemon-runner"))
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(v, SHEDLOCK_VALUE);
    let h: std::collections::BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg(format!("{p}lock:other-tool"))
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(h.len(), 2, "{h:?}");
    let h: std::collections::BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg(format!("{p}lock:lookalike"))
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(h.len(), 5, "{h:?}");
}

/// The schema version the store records (SQL: the meta row; Redis: the key).
async fn recorded_version(ts: &TestStore, p: &str) -> i64 {
    match ts.kind {
        Kind::Sqlite => {
            let pool = sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(1)
                .connect(&ts.url)
                .await
                .unwrap();
            let v: String = sqlx::query_scalar(&format!(
                "SELECT value FROM \"{p}meta\" WHERE key = 'schema_version'"
            ))
            .fetch_one(&pool)
            .await
            .unwrap();
            pool.close().await;
            v.parse().unwrap()
        }
        Kind::Postgres => {
            let (pool, mut tx) = crate::harness::pg_tx(ts).await;
            let v: String = sqlx::query_scalar(&format!(
                "SELECT value FROM \"{p}meta\" WHERE key = 'schema_version'"
            ))
            .persistent(false)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
            tx.commit().await.unwrap();
            pool.close().await;
            v.parse().unwrap()
        }
        Kind::Mysql => {
            let pool = mysql_pool(ts).await;
            let v: Vec<u8> = sqlx::query_scalar(&format!(
                "SELECT value FROM `{p}meta` WHERE `key` = 'schema_version'"
            ))
            .fetch_one(&pool)
            .await
            .unwrap();
            pool.close().await;
            String::from_utf8(v).unwrap().parse().unwrap()
        }
        Kind::Redis => {
            let mut c = redis_conn(ts).await;
            redis::cmd("GET")
                .arg(format!("{p}{{baton}}:schema"))
                .query_async(&mut c)
                .await
                .unwrap()
        }
    }
}

/// A PostgreSQL tasks table's indexes as `suffix method[ WHERE state]`
/// (the name after `<prefix>tasks_`, and the first state its predicate
/// names), sorted, plus `fillfactor=70` checked on the table.
async fn postgres_task_indexes(ts: &TestStore, p: &str) -> Vec<String> {
    let (pool, mut tx) = crate::harness::pg_tx(ts).await;
    let table = format!("\"{p}tasks\"");
    let opts: Option<Vec<String>> =
        sqlx::query_scalar("SELECT reloptions FROM pg_class WHERE oid = $1::regclass")
            .bind(&table)
            .persistent(false)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
    assert_eq!(opts, Some(vec!["fillfactor=70".to_string()]), "{table}");
    let rows: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT c.relname::text, am.amname::text, pg_get_expr(i.indpred, i.indrelid) \
         FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
         JOIN pg_am am ON am.oid = c.relam WHERE i.indrelid = $1::regclass",
    )
    .bind(&table)
    .persistent(false)
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    pool.close().await;
    let mut out: Vec<String> = rows
        .into_iter()
        .map(|(name, am, pred)| {
            let suffix = name.strip_prefix(&format!("{p}tasks_")).unwrap_or(&name);
            let state = pred.as_deref().and_then(|pred| {
                ["pending", "running"]
                    .into_iter()
                    .find(|s| pred.contains(&format!("'{s}'")))
            });
            match state {
                Some(s) => format!("{suffix} {am} WHERE {s}"),
                None => format!("{suffix} {am}"),
            }
        })
        .collect();
    out.sort();
    out
}

/// Delete a lock's record behind the store's back, as restoring a backup
/// taken before the lock was ever granted would.
pub async fn delete_lock_record(ts: &TestStore, name: &str) {
    match ts.kind {
        Kind::Sqlite => {
            let pool = sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(1)
                .connect(&ts.url)
                .await
                .unwrap();
            sqlx::query(&format!(
                "DELETE FROM \"{}locks\" WHERE name = ?1",
                ts.prefix
            ))
            .bind(name)
            .execute(&pool)
            .await
            .unwrap();
            pool.close().await;
        }
        Kind::Postgres => {
            let (pool, mut tx) = crate::harness::pg_tx(ts).await;
            sqlx::query(&format!(
                "DELETE FROM \"{}locks\" WHERE name = $1",
                ts.prefix
            ))
            .bind(name)
            .persistent(false)
            .execute(&mut *tx)
            .await
            .unwrap();
            tx.commit().await.unwrap();
            pool.close().await;
        }
        Kind::Mysql => {
            let pool = mysql_pool(ts).await;
            let r = sqlx::query(&format!("DELETE FROM `{}locks` WHERE name = ?", ts.prefix))
                .bind(name)
                .execute(&pool)
                .await
                .unwrap();
            assert_eq!(r.rows_affected(), 1, "the lock row existed");
            pool.close().await;
        }
        Kind::Redis => {
            let mut c = redis_conn(ts).await;
            let n: i64 = redis::cmd("DEL")
                .arg(format!("{}{{baton:lock:{name}}}", ts.prefix))
                .query_async(&mut c)
                .await
                .unwrap();
            assert_eq!(n, 1, "the lock key existed");
        }
    }
}

/// A plain connection to the test's Redis.
pub async fn redis_conn(ts: &TestStore) -> baton_testkit::cluster::RedisConn {
    baton_testkit::cluster::connect(&ts.url).await
}

/// A plain one-connection pool on the test's MySQL.
async fn mysql_pool(ts: &TestStore) -> sqlx::MySqlPool {
    sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .connect(&ts.url)
        .await
        .unwrap()
}

/// MySQL's first schema is version 2 (it never had a version 1); version 3
/// added `enqueue_mark`, version 4 the queues' `paused`, version 5 the
/// tasks' `traceparent`, version 6 slot tombstones and the jobs' `queue`,
/// version 7 the tasks' `concurrency_key`, version 8 the unique keys
/// rewritten into their default scope, version 9 rate limits' start logs,
/// version 10 the until-failed hold, version 11 the jobs' policies and the pause notes
/// of jobs and queues, version 12 the audit log, version 13 the key-starts index,
/// version 14 fair claiming's cursor and index, version 15 the queues'
/// declared limits, version 16 job definitions, version 17 rates per key,
/// version 18 the throughput rollup, version 19 lock history, version 20 the rollup per job,
/// version 21 nothing (the fair claim procedure, once its step, is made by
/// the first fair claim; dropped here too, when there). A fresh
/// store records the current version; a version-2 store (the
/// columns dropped, the version set back) is upgraded in place, keeps its
/// tasks, enqueues with the right ids, keeps trace contexts, pauses
/// queues and claims fairly; a store recording a newer version
/// than this build's is refused, untouched.
async fn mysql_versions(ts: TestStore) {
    let p = &ts.prefix;
    let current = ts.store.backend().schema_status().await.unwrap().expected;
    assert_eq!(recorded_version(&ts, p).await, current);
    {
        let pool = mysql_pool(&ts).await;
        let b = ts.store.backend();
        let before = b
            .task_insert_many(&[task_for_upgrade("old"), task_for_upgrade("old")])
            .await
            .unwrap();
        for sql in [
            format!("ALTER TABLE `{p}tasks` DROP COLUMN enqueue_mark"),
            format!("ALTER TABLE `{p}queues` DROP COLUMN paused"),
            format!("ALTER TABLE `{p}tasks` DROP COLUMN traceparent"),
            format!("DROP INDEX tasks_key_pending ON `{p}tasks`"),
            format!("ALTER TABLE `{p}queues` DROP COLUMN fair_cursor"),
            format!("ALTER TABLE `{p}tasks` DROP COLUMN concurrency_key"),
            format!(
                "ALTER TABLE `{p}jobs` DROP COLUMN overlap, DROP COLUMN pause_note, \
                 DROP COLUMN pause_by, DROP COLUMN pause_at"
            ),
            format!(
                "ALTER TABLE `{p}queues` DROP COLUMN pause_note, DROP COLUMN pause_by, \
                 DROP COLUMN pause_at"
            ),
            format!("DROP PROCEDURE IF EXISTS `{p}fair_claim`"),
            format!("UPDATE `{p}meta` SET value = '2' WHERE `key` = 'schema_version'"),
        ] {
            sqlx::query(&sql).execute(&pool).await.unwrap();
        }
        assert_eq!(recorded_version(&ts, p).await, 2);
        let opts = StoreOptions {
            prefix: Some(p.clone()),
            max_connections: 2,
            ..StoreOptions::default()
        };
        let upgraded = Store::connect_with(&ts.url, opts.clone()).await.unwrap();
        assert_eq!(
            recorded_version(&ts, p).await,
            current,
            "upgraded to the current"
        );
        // Connecting again finds the column and changes nothing.
        Store::connect_with(&ts.url, opts).await.unwrap();
        let ub = upgraded.backend();
        for e in &before {
            assert_eq!(ub.task_get(e.id).await.unwrap().unwrap().queue, "old");
        }
        let tasks: Vec<_> = (0..5)
            .map(|i| {
                let mut t = task_for_upgrade("new");
                t.payload = serde_json::json!({ "i": i });
                t
            })
            .collect();
        let after = ub.task_insert_many(&tasks).await.unwrap();
        for (i, e) in after.iter().enumerate() {
            let info = ub.task_get(e.id).await.unwrap().unwrap();
            assert_eq!(info.payload, serde_json::json!({ "i": i }));
        }
        let q = baton::queue::Queue::new(upgraded.clone());
        let traced = q
            .enqueue(
                baton::queue::TaskBuilder::new("k", serde_json::json!({}))
                    .queue("traced")
                    .traceparent(TRACEPARENT),
            )
            .await
            .unwrap();
        let info = ub.task_get(traced.id).await.unwrap().unwrap();
        assert_eq!(info.traceparent.as_deref(), Some(TRACEPARENT));
        q.pause("new").await.unwrap();
        let req = TaskClaim {
            queue: "new",
            worker: "w",
            limit: 10,
            lease: Duration::from_secs(30),
            max_running: None,
            per_key_max_running: None,
            buffered: 0,
            fair: false,
        };
        assert!(ub.task_claim(&req).await.unwrap().is_empty(), "paused");
        q.resume("new").await.unwrap();
        let fair = TaskClaim { fair: true, ..req };
        assert_eq!(
            ub.task_claim(&fair).await.unwrap().len(),
            5,
            "resumed, fair"
        );
        pool.close().await;
    }
    // The durability check reads the server's settings (the test server
    // flushes every commit and has no binary log).
    let warnings = ts.store.backend().warnings().await.unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    let pool = mysql_pool(&ts).await;
    sqlx::query(&format!(
        "UPDATE `{p}meta` SET value = '99' WHERE `key` = 'schema_version'"
    ))
    .execute(&pool)
    .await
    .unwrap();
    let opts = StoreOptions {
        prefix: Some(p.clone()),
        max_connections: 2,
        ..StoreOptions::default()
    };
    let err = Store::connect_with(&ts.url, opts).await.unwrap_err();
    assert!(
        err.to_string().contains("newer than this build"),
        "a newer schema must be refused: {err}"
    );
    assert_eq!(recorded_version(&ts, p).await, 99, "left untouched");
    pool.close().await;
}

/// The trace context the upgraded stores are given.
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// A plain task for the MySQL upgrade check.
fn task_for_upgrade(queue: &str) -> baton::store::NewTask {
    baton::store::NewTask {
        queue: queue.into(),
        kind: "k".into(),
        payload: serde_json::json!({}),
        priority: 0,
        run_at: baton::store::RunAt::Now,
        max_attempts: 1,
        timeout: None,
        unique_key: None,
        unique_hold: baton::queue::UniqueHold::Unfinished,
        job: None,
        slot: None,
        traceparent: None,
        concurrency_key: None,
        key_policy: None,
    }
}

pub async fn v1_store_upgrades_in_place(ts: TestStore) {
    if let Kind::Mysql = ts.kind {
        return mysql_versions(ts).await;
    }
    let p = match ts.kind {
        Kind::Redis => format!("{}v1:", ts.prefix),
        _ => format!("{}v1_", ts.prefix),
    };
    let now_ms = ts.store.now().await.unwrap().timestamp_millis();
    match ts.kind {
        Kind::Redis => write_v1_redis(&ts, &p, now_ms).await,
        _ => write_v1_sql(&ts, &p, now_ms).await,
    }
    assert_eq!(recorded_version(&ts, &p).await, 1);
    let opts = StoreOptions {
        prefix: Some(p.clone()),
        max_connections: 2,
        ..StoreOptions::default()
    };
    let store = Store::connect_with(&ts.url, opts.clone()).await.unwrap();
    assert!(recorded_version(&ts, &p).await > 1, "the version moved on");
    if let Kind::Postgres = ts.kind {
        // Schema 5's indexes (6 added the slot tombstones, 7 the
        // concurrency key, 8 the unique keys' scopes, 9 rate limits, 10
        // the until-failed hold's column and unique predicate, 11 fair
        // claiming's `key_pending`, 12 the jobs' policies and pause notes, 13
        // the audit log, its own table, 14 throttle's `key_starts`), on the
        // upgraded store and on a fresh one.
        let current = ts.store.backend().schema_status().await.unwrap().expected;
        assert_eq!(recorded_version(&ts, &p).await, current);
        for prefix in [p.as_str(), ts.prefix.as_str()] {
            assert_eq!(
                postgres_task_indexes(&ts, prefix).await,
                [
                    "claim btree WHERE pending",
                    "job btree",
                    "key_pending btree WHERE pending",
                    "key_starts btree",
                    "pkey btree",
                    "prune btree",
                    "running btree WHERE running",
                    "unique btree WHERE pending",
                ],
                "prefix {prefix}"
            );
        }
    }
    let b = store.backend();

    // The throughput rollup (SQLite 14, PostgreSQL 15, MySQL 14; Redis
    // keys made by the first flush) takes and answers counts.
    let bucket = chrono::DateTime::<chrono::Utc>::from_timestamp_millis(
        baton::store::stats::bucket_of(b.now().await.unwrap().timestamp_millis(), 60),
    )
    .unwrap();
    let counted = baton::store::StatsCounts {
        succeeded: 3,
        ..Default::default()
    };
    // Keyed by job too (the last SQL step): a job's row and the kind's
    // row of no job stay apart.
    let stats_row = |job: Option<&str>| baton::store::StatsRow {
        res_secs: 60,
        bucket,
        queue: "q".into(),
        kind: "k".into(),
        job: job.map(String::from),
        counts: counted,
    };
    b.stats_add(&[stats_row(None), stats_row(Some("J"))])
        .await
        .unwrap();
    let read = b
        .stats_read(&baton::store::StatsQuery {
            res_secs: 60,
            since: bucket,
            queue: None,
            kind: None,
            job: None,
        })
        .await
        .unwrap();
    assert_eq!(read.len(), 2, "{read:?}");
    assert_eq!(read[0].counts, counted);
    assert_eq!(read[1].job.as_deref(), Some("J"));

    // The data survived.
    let lock = b.lock_get("L").await.unwrap().expect("lock kept");
    assert_eq!((lock.holder.as_str(), lock.token.0), ("old-holder", 5));
    let jobs = b.job_list().await.unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].name, "J");
    // The last step's definitions table (hash on Redis) is there.
    let spec = serde_json::json!({"every": "1m"});
    let put = baton::store::JobDefPut {
        name: "J",
        spec: &spec,
        expected: None,
        by: "t",
    };
    assert_eq!(
        b.jobdef_put(&put).await.unwrap(),
        baton::store::JobDefWrite::Written { version: 1 }
    );
    assert_eq!(
        jobs[0].last_slot.map(|s| s.timestamp_millis()),
        Some(SLOT_MS)
    );
    // A job of an older store has no recorded queue until it registers.
    assert_eq!(jobs[0].queue, None);
    assert_eq!(
        b.job_register(&baton::store::JobRegister::new("J").queue("jq"))
            .await
            .unwrap()
            .queue
            .as_deref(),
        Some("jq")
    );
    let all = b.task_list(&TaskFilter::default()).await.unwrap();
    assert_eq!(all.len(), 3);
    let by_kind = |k: &str| all.iter().find(|t| t.kind == k).unwrap().clone();
    let (a, bt, c) = (by_kind("a"), by_kind("b"), by_kind("c"));
    assert_eq!(a.state, TaskState::Pending);
    assert_eq!(a.payload, serde_json::json!({"v": 1}));
    assert_eq!((c.state, c.attempt), (TaskState::Running, 1));

    // The new behaviour: lock tokens floored at the store clock.
    if let Kind::Redis = ts.kind {
        let mut conn = redis_conn(&ts).await;
        let ttl: i64 = redis::cmd("PTTL")
            .arg(format!("{p}{{baton:lock:L}}"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(ttl, -1, "the upgrade removed the lock key's TTL");
        let old: i64 = redis::cmd("EXISTS")
            .arg(format!("{p}lock:L"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(old, 0, "baton's own lock key moved into its namespace");
        // Schema 8: one hash tag per queue, job and lock; nothing left
        // under the old single tag but the index keys.
        for (key, there) in [
            ("{baton}:lock:L", 0),
            ("{baton}:task:1", 0),
            ("{baton}:ids", 0),
            ("{baton}:running", 0),
            ("{baton}:q:up:ready", 0),
            ("{baton}:counts:up", 0),
            ("{baton}:job:J", 0),
            ("{baton}:jobs", 0),
            ("{baton:q:up}:task:1", 1),
            ("{baton:q:up}:task:3", 1),
            ("{baton:q:up}:sched", 1),
            ("{baton:q:up}:running", 1),
            ("{baton:q:jq}:job:J", 1),
            ("{baton}:where", 1),
        ] {
            let n: i64 = redis::cmd("EXISTS")
                .arg(format!("{p}{key}"))
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(n, there, "{p}{key} after the upgrade to schema 8");
        }
        foreign_keys_untouched(&ts, &p).await;
    }
    // The lock is listed (on Redis, through the index the upgrade built).
    let listed: Vec<String> = b
        .lock_list()
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.name)
        .collect();
    assert_eq!(
        listed,
        ["L"],
        "the upgraded store lists its lock, and no key baton did not write"
    );
    let floor = store.now().await.unwrap().timestamp_micros();
    let g = b
        .lock_acquire(&baton::store::LockAcquire {
            name: "L",
            holder: "new-holder",
            at_most: Duration::from_secs(10),
        })
        .await
        .unwrap();
    match g {
        baton::store::Acquire::Granted { token, .. } => {
            assert!(token.0 > 5 && i64::try_from(token.0).unwrap() >= floor)
        }
        other => panic!("lapsed v1 lock not granted: {other:?}"),
    }
    // The v1 running task with a lapsed lease is rescued; the claim takes
    // it and A with fresh tokens, and never the cancel-requested B.
    assert_eq!(b.task_rescue_many().await.unwrap().requeued, 1);
    let req = TaskClaim {
        queue: "up",
        worker: "w2",
        limit: 5,
        lease: Duration::from_secs(30),
        max_running: None,
        per_key_max_running: None,
        buffered: 0,
        fair: false,
    };
    let got = b.task_claim(&req).await.unwrap();
    let mut ids: Vec<i64> = got.iter().map(|t| t.id).collect();
    ids.sort_unstable();
    let mut want = vec![a.id, c.id];
    want.sort_unstable();
    assert_eq!(ids, want, "claimed A and C only");
    for t in &got {
        assert!(i64::try_from(t.token.0).unwrap() >= floor);
        assert!(b
            .task_finish_many(&[(t.claim(), Finish::HandBack)])
            .await
            .map(|r| r == [true])
            .unwrap());
    }
    let b_now = b.task_get(bt.id).await.unwrap().unwrap();
    assert_eq!(b_now.state, TaskState::Cancelled, "B's cancel is honoured");
    assert_eq!(b_now.last_error.as_deref(), Some(CANCEL_REQUESTED));
    let again = b.task_claim(&req).await.unwrap();
    assert_eq!(again.len(), 2);
    for t in &again {
        let old = got.iter().find(|o| o.id == t.id).unwrap();
        assert!(t.token > old.token);
        assert!(
            !b.task_finish_many(&[(old.claim(), Finish::HandBack)])
                .await
                .map(|r| r == [true])
                .unwrap(),
            "a stale hand-back is refused"
        );
        assert!(b
            .task_finish_many(&[(t.claim(), Finish::Succeeded)])
            .await
            .map(|r| r == [true])
            .unwrap());
    }
    // New tasks work, and connecting again changes nothing.
    let q = baton::queue::Queue::new(store.clone());
    let d = q
        .enqueue(
            baton::queue::TaskBuilder::new("d", serde_json::json!({}))
                .queue("up")
                .traceparent(TRACEPARENT),
        )
        .await
        .unwrap();
    // The upgraded store keeps a task's trace context (the last upgrade's
    // column or field); the v1 tasks have none.
    let info = b.task_get(d.id).await.unwrap().unwrap();
    assert_eq!(info.traceparent.as_deref(), Some(TRACEPARENT));
    assert_eq!(b.task_get(a.id).await.unwrap().unwrap().traceparent, None);
    // The upgraded store pauses queues (the last upgrade's table or key).
    q.pause("up").await.unwrap();
    assert!(b.task_claim(&req).await.unwrap().is_empty(), "paused");
    q.resume("up").await.unwrap();
    // It keeps pause notes (the pause-notes step's columns or fields):
    // on a queue, and on the version-1 job `J`, which has no recorded
    // policy.
    let why = baton::store::PauseNote::default()
        .note("after upgrade")
        .by("t");
    q.pause_with("up", why).await.unwrap();
    let st = q.stats().await.unwrap();
    let up = st.iter().find(|s| s.queue == "up").unwrap();
    assert_eq!(
        up.pause_change.as_ref().and_then(|c| c.note.as_deref()),
        Some("after upgrade")
    );
    q.resume("up").await.unwrap();
    assert!(baton::schedule::set_paused_with(&store, "J", true, why)
        .await
        .unwrap());
    let j = b.job_get("J").await.unwrap().unwrap();
    assert_eq!(j.overlap, None);
    assert_eq!(j.pause_change.unwrap().by.as_deref(), Some("t"));
    baton::schedule::set_paused(&store, "J", false)
        .await
        .unwrap();
    if let Kind::Redis = ts.kind {
        // baton's lock of the same name beside ShedLock's is its own.
        let g = b
            .lock_acquire(&baton::store::LockAcquire {
                name: "daemon-runner",
                holder: "baton",
                at_most: Duration::from_secs(10),
            })
            .await
            .unwrap();
        assert!(matches!(g, baton::store::Acquire::Granted { .. }), "{g:?}");
        foreign_keys_untouched(&ts, &p).await;
    }
    let before = recorded_version(&ts, &p).await;
    let second = Store::connect_with(&ts.url, opts).await.unwrap();
    assert_eq!(recorded_version(&ts, &p).await, before);
    assert_eq!(
        second
            .backend()
            .task_list(&TaskFilter::default())
            .await
            .unwrap()
            .len(),
        4
    );
}

/// `schema_status` reads the recorded version without changing it: current
/// on a migrated store; older, newer or missing after the record is set
/// back, forward or removed behind the store's back, each named in
/// `problem()` with both versions.
pub async fn schema_status_reports_the_recorded_version(ts: TestStore) {
    let p = ts.prefix.clone();
    let b = ts.store.backend();
    let st = b.schema_status().await.unwrap();
    assert!(st.is_current(), "{st:?}");
    assert_eq!(st.found, Some(recorded_version(&ts, &p).await));
    assert_eq!(st.problem(), None);
    let expected = st.expected;

    crate::harness::set_schema_version(&ts, &p, Some(expected - 1)).await;
    let st = b.schema_status().await.unwrap();
    assert_eq!((st.found, st.expected), (Some(expected - 1), expected));
    assert!(!st.is_current());
    let why = st.problem().unwrap();
    assert!(
        why.contains(&format!("version {}", expected - 1))
            && why.contains("older")
            && why.contains(&expected.to_string()),
        "{why}"
    );
    // A read only: nothing was upgraded.
    assert_eq!(recorded_version(&ts, &p).await, expected - 1);

    crate::harness::set_schema_version(&ts, &p, Some(expected + 1)).await;
    let st = b.schema_status().await.unwrap();
    assert_eq!(st.found, Some(expected + 1));
    assert!(st.problem().unwrap().contains("newer"));

    crate::harness::set_schema_version(&ts, &p, None).await;
    let st = b.schema_status().await.unwrap();
    assert_eq!(st.found, None);
    assert!(!st.is_current());

    // An unused prefix: no schema at all (SQL: not even the meta table).
    let fresh = match ts.kind {
        Kind::Redis => format!("{p}none:"),
        _ => format!("{p}none_"),
    };
    let opts = StoreOptions {
        prefix: Some(fresh),
        max_connections: 1,
        migrate: false,
        ..StoreOptions::default()
    };
    let other = Store::connect_with(&ts.url, opts).await.unwrap();
    let st = other.backend().schema_status().await.unwrap();
    assert_eq!(st.found, None, "{st:?}");
}

/// Eight processes connecting to a new prefix at once all migrate it and
/// agree on one schema (created once: each enqueues, and all eight tasks
/// are there; the recorded version is the build's); a migration run
/// again changes nothing.
pub async fn concurrent_first_connects_migrate_once(ts: TestStore) {
    use baton::queue::{Queue, TaskBuilder};
    let fresh = match ts.kind {
        Kind::Redis => format!("{}f:", ts.prefix),
        _ => format!("{}f_", ts.prefix),
    };
    let mut connects = Vec::new();
    for _ in 0..8 {
        let (url, prefix) = (ts.url.clone(), fresh.clone());
        connects.push(tokio::spawn(async move {
            let opts = StoreOptions {
                max_connections: 1,
                ..StoreOptions::prefixed(prefix)
            };
            let s = Store::connect_with(&url, opts).await?;
            Queue::new(s.clone())
                .enqueue(TaskBuilder::new("k", serde_json::json!({})))
                .await?;
            Ok::<Store, baton::Error>(s)
        }));
    }
    let mut stores = Vec::new();
    for c in connects {
        stores.push(c.await.unwrap().expect("a concurrent first connect"));
    }
    let s = &stores[0];
    s.backend().migrate().await.unwrap();
    let st = s.schema_status().await.unwrap();
    assert_eq!(st.found, Some(st.expected), "{st:?}");
    let stats = Queue::new(s.clone()).stats().await.unwrap();
    assert_eq!(stats.len(), 1, "{stats:?}");
    assert_eq!(stats[0].pending, 8, "{stats:?}");
    s.remove_schema().await.unwrap();
}

/// `Store::remove_schema` leaves nothing of the prefix — connecting again
/// finds no version, and a new schema there is empty (no task, lock, job
/// cursor or queue flag survived) — and nothing of a neighbouring prefix
/// is touched, even one that begins with this one.
pub async fn remove_schema_leaves_nothing_of_the_prefix(ts: TestStore) {
    use baton::lock::{LockOptions, Locker};
    use baton::queue::{Queue, TaskBuilder};
    let p = ts.prefix.clone();
    let neighbour = match ts.kind {
        Kind::Redis => format!("{p}x:"),
        _ => format!("{p}x_"),
    };
    let open = |prefix: String, migrate: bool| {
        let url = ts.url.clone();
        async move {
            let opts = StoreOptions {
                migrate,
                max_connections: 2,
                ..StoreOptions::prefixed(prefix)
            };
            Store::connect_with(&url, opts).await.unwrap()
        }
    };
    let fill = |s: Store| async move {
        let q = Queue::new(s.clone());
        q.enqueue(TaskBuilder::new("k", serde_json::json!({})).unique_key("u"))
            .await
            .unwrap();
        q.pause("default").await.unwrap();
        let opts = LockOptions::new(Duration::from_secs(60));
        let lease = Locker::new(s.clone()).try_lock("l", &opts).await.unwrap();
        std::mem::forget(lease); // held, as by a process that died
                                 // A fair claim (MySQL: it creates the prefix's procedure).
        s.backend()
            .task_claim(&baton::store::TaskClaim {
                queue: "fq",
                worker: "w",
                limit: 1,
                lease: Duration::from_secs(30),
                max_running: None,
                per_key_max_running: None,
                buffered: 0,
                fair: true,
            })
            .await
            .unwrap();
        s.backend()
            .job_register(&baton::store::JobRegister::new("j"))
            .await
            .unwrap();
        let spec = serde_json::json!({"every": "1m"});
        baton::schedule::definitions::create(&s, "d", &spec, "t")
            .await
            .unwrap();
    };
    fill(ts.store.clone()).await;
    let other = open(neighbour.clone(), true).await;
    fill(other.clone()).await;

    ts.store.remove_schema().await.unwrap();
    assert_eq!(ts.store.schema_status().await.unwrap().found, None);
    ts.store.remove_schema().await.unwrap(); // nothing there: fine
    if ts.kind == Kind::Mysql {
        // The fair claim procedure goes with the tables; the neighbour's stays.
        let pool = mysql_pool(&ts).await;
        let count = |name: String| {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, i64>(
                    "SELECT COUNT(*) FROM information_schema.routines \
                     WHERE routine_schema = DATABASE() AND routine_name = ?",
                )
                .bind(name)
                .fetch_one(&pool)
                .await
                .unwrap()
            }
        };
        assert_eq!(
            count(format!("{p}fair_claim")).await,
            0,
            "procedure dropped"
        );
        assert_eq!(count(format!("{neighbour}fair_claim")).await, 1);
        pool.close().await;
    }
    if ts.kind == Kind::Postgres {
        // The claim functions go with the tables; the neighbour's stay.
        // (Connected as baton connects, in a transaction, unnamed
        // statements: also behind a transaction pooler.)
        let (pool, mut tx) = crate::harness::pg_tx(&ts).await;
        let mut count = async |prefix: &str| -> i64 {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM pg_proc WHERE proname = ANY($1)")
                .persistent(false)
                .bind(
                    ["fair_claim", "capped_claim", "key_rated_claim"]
                        .map(|f| format!("{prefix}{f}"))
                        .to_vec(),
                )
                .fetch_one(&mut *tx)
                .await
                .unwrap()
        };
        assert_eq!(count(&p).await, 0, "functions dropped");
        assert_eq!(count(&neighbour).await, 3);
        tx.rollback().await.unwrap();
        pool.close().await;
    }

    let again = open(p.clone(), true).await;
    let q = Queue::new(again.clone());
    assert!(q.tasks(&TaskFilter::default()).await.unwrap().is_empty());
    assert!(q.stats().await.unwrap().iter().all(|s| !s.paused));
    assert!(Locker::new(again.clone()).list().await.unwrap().is_empty());
    assert!(baton::schedule::job_statuses(&again)
        .await
        .unwrap()
        .is_empty());
    assert!(again.backend().jobdef_list().await.unwrap().is_empty());
    assert_eq!(again.backend().jobdef_revision().await.unwrap(), 0);

    // The neighbour kept everything.
    let q = Queue::new(other.clone());
    assert_eq!(q.tasks(&TaskFilter::default()).await.unwrap().len(), 1);
    assert!(q.stats().await.unwrap().iter().any(|s| s.paused));
    assert_eq!(Locker::new(other.clone()).list().await.unwrap().len(), 1);
    assert_eq!(
        baton::schedule::job_statuses(&other).await.unwrap().len(),
        1
    );
    assert_eq!(other.backend().jobdef_list().await.unwrap().len(), 1);
    other.remove_schema().await.unwrap();
}

/// The last schema step (unique key scopes, issue 29): keys written before
/// it (as given, store-wide) are rewritten into the default scope's
/// composite, so an enqueue of the same key, kind and queue after the
/// upgrade still finds the task enqueued before it; a schedule slot's key
/// and a key whose composite would not fit stay as they were; running the
/// step again changes nothing.
pub async fn unique_keys_are_rescoped_on_upgrade(ts: TestStore) {
    use baton::queue::{Queue, TaskBuilder, UniqueKey, UniqueScope};
    let p = ts.prefix.clone();
    let b = ts.store.backend();
    // What a build before scopes wrote: the key as given.
    let old = |kind: &str, key: &str| baton::store::NewTask {
        kind: kind.into(),
        unique_key: Some(key.into()),
        ..task_for_upgrade("uq")
    };
    let long = "x".repeat(1020);
    let slot = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
    let slot_task = TaskBuilder::new("nightly", serde_json::json!({}))
        .queue("uq")
        .slot("nightly", slot)
        .unique_key(baton::store::slot_key("nightly", slot))
        .unique_forever(true)
        .build()
        .unwrap();
    let ids: Vec<i64> = b
        .task_insert_many(&[
            old("email", "42"),
            old("report", "r"),
            old("email", &long),
            slot_task.clone(),
        ])
        .await
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect();
    let [email, report, long_id, slot_id] = ids[..] else {
        panic!("{ids:?}");
    };
    // A finished task's key is rewritten too (a retry takes it again).
    b.task_cancel(report).await.unwrap();
    let expected = b.schema_status().await.unwrap().expected;
    let opts = StoreOptions {
        prefix: Some(p.clone()),
        max_connections: 2,
        ..StoreOptions::default()
    };
    let key_of = |s: &Store, id: i64| {
        let s = s.clone();
        async move { s.backend().task_get(id).await.unwrap().unwrap().unique_key }
    };
    for round in 0..2 {
        // Back to before the unique-scope step (the version it upgrades
        // from, on each store; later steps do not move it).
        let before_scope = match ts.kind {
            Kind::Sqlite => 6,
            Kind::Postgres | Kind::Mysql => 7,
            Kind::Redis => 9,
        };
        crate::harness::set_schema_version(&ts, &p, Some(before_scope)).await;
        let store = Store::connect_with(&ts.url, opts.clone()).await.unwrap();
        assert_eq!(recorded_version(&ts, &p).await, expected, "round {round}");
        assert_eq!(
            key_of(&store, email).await,
            UniqueKey::upgraded("uq", "email", "42"),
            "round {round}: rewritten once"
        );
        assert_eq!(
            key_of(&store, report).await,
            UniqueKey::upgraded("uq", "report", "r")
        );
        assert_eq!(
            key_of(&store, long_id).await,
            Some(long.clone()),
            "did not fit"
        );
        assert_eq!(
            key_of(&store, slot_id).await,
            slot_task.unique_key,
            "a slot's key"
        );
    }
    let store = Store::connect_with(&ts.url, opts).await.unwrap();
    let q = Queue::new(store.clone());
    let k = |kind: &str, key: &str| {
        TaskBuilder::new(kind, serde_json::json!({}))
            .queue("uq")
            .unique_key(key)
    };
    // Code that upgraded without changes still dedupes against the task
    // enqueued before the upgrade...
    let again = q.enqueue(k("email", "42")).await.unwrap();
    assert_eq!((again.id, again.inserted), (email, false));
    // ...another kind with the same key string is its own task now...
    assert!(q.enqueue(k("report", "42")).await.unwrap().inserted);
    // ...and the rewritten key of a finished task is taken by its retry.
    let holder = q.enqueue(k("report", "r")).await.unwrap();
    assert!(holder.inserted);
    assert!(matches!(
        store.backend().task_retry(report).await,
        Err(baton::StoreError::Conflict(_))
    ));
    // The key that did not fit is still compared as given (global).
    if !matches!(ts.kind, Kind::Redis) {
        let wide = q
            .enqueue(k("email", &long).unique_scope(UniqueScope::Global))
            .await
            .unwrap();
        assert_eq!((wide.id, wide.inserted), (long_id, false));
    }
}

/// The until-failed hold's step (SQLite 8 → 9, PostgreSQL and MySQL
/// 9 → 10, Redis 11 → 12) keeps every existing task's hold: a forever key
/// stays taken by its succeeded task, an unfinished key is free once its
/// task succeeded and taken while it is pending. The SQL stores are put
/// back as the step found them (no `unique_until_failed` column, the old
/// unique predicate); Redis had nothing to convert.
pub async fn unique_holds_survive_the_hold_upgrade(ts: TestStore) {
    use baton::queue::{Queue, TaskBuilder, UniqueHold};
    let p = ts.prefix.clone();
    let q = Queue::new(ts.store.clone());
    let b = ts.store.backend();
    let k = |queue: &str, key: &str, hold: UniqueHold| {
        TaskBuilder::new("k", serde_json::json!({}))
            .queue(queue)
            .unique_key(key)
            .unique_hold(hold)
            .max_attempts(1)
    };
    let forever = q.enqueue(k("hf", "f", UniqueHold::Forever)).await.unwrap();
    let plain = q
        .enqueue(k("hu", "u", UniqueHold::Unfinished))
        .await
        .unwrap();
    let pending = q
        .enqueue(k("hp", "p", UniqueHold::Unfinished))
        .await
        .unwrap();
    for queue in ["hf", "hu"] {
        crate::unique::run_one(&ts.store, queue, baton::store::Finish::Succeeded).await;
    }
    let old_pred = "unique_key IS NOT NULL AND (unique_forever OR state IN ('pending', 'running'))";
    let undo: Vec<String> = match ts.kind {
        Kind::Sqlite | Kind::Postgres => vec![
            format!("DROP INDEX \"{p}tasks_unique\""),
            format!("ALTER TABLE \"{p}tasks\" DROP COLUMN unique_until_failed"),
            format!(
                "CREATE UNIQUE INDEX \"{p}tasks_unique\" ON \"{p}tasks\" (unique_key) \
                 WHERE {old_pred}"
            ),
        ],
        Kind::Mysql => vec![
            format!(
                "ALTER TABLE `{p}tasks` MODIFY COLUMN live_key VARBINARY(1024) AS \
                 (CASE WHEN unique_forever = 1 OR state IN ('pending', 'running') \
                 THEN unique_key END) STORED"
            ),
            format!("ALTER TABLE `{p}tasks` DROP COLUMN unique_until_failed"),
        ],
        Kind::Redis => vec![],
    };
    for sql in &undo {
        exec_sql(&ts, sql).await;
    }
    let expected = b.schema_status().await.unwrap().expected;
    // Back to before the hold's step (the version it upgrades from, on
    // each store; later steps do not move it).
    let before_hold = match ts.kind {
        Kind::Sqlite => 8,
        Kind::Postgres | Kind::Mysql => 9,
        Kind::Redis => 11,
    };
    crate::harness::set_schema_version(&ts, &p, Some(before_hold)).await;
    let opts = StoreOptions {
        prefix: Some(p.clone()),
        max_connections: 2,
        ..StoreOptions::default()
    };
    let store = Store::connect_with(&ts.url, opts).await.unwrap();
    assert_eq!(recorded_version(&ts, &p).await, expected);
    let q = Queue::new(store.clone());
    let again = |queue: &'static str, key: &'static str| {
        let q = q.clone();
        async move {
            q.enqueue(k(queue, key, UniqueHold::Unfinished))
                .await
                .unwrap()
        }
    };
    let hold_of = |id: i64| {
        let s = store.clone();
        async move { s.backend().task_get(id).await.unwrap().unwrap().unique_hold }
    };
    assert_eq!(hold_of(forever.id).await, UniqueHold::Forever);
    assert_eq!(hold_of(plain.id).await, UniqueHold::Unfinished);
    let f = again("hf", "f").await;
    assert_eq!(
        (f.id, f.inserted),
        (forever.id, false),
        "forever stays forever"
    );
    let u = again("hu", "u").await;
    assert!(
        u.inserted && u.id != plain.id,
        "unfinished stays unfinished"
    );
    let pend = again("hp", "p").await;
    assert_eq!(
        (pend.id, pend.inserted),
        (pending.id, false),
        "pending holds"
    );
    // The upgraded store keeps an until-failed key through success.
    let uf = q
        .enqueue(k("huf", "x", UniqueHold::UntilFailed))
        .await
        .unwrap();
    crate::unique::run_one(&store, "huf", baton::store::Finish::Succeeded).await;
    let dup = q
        .enqueue(k("huf", "x", UniqueHold::Unfinished))
        .await
        .unwrap();
    assert_eq!(
        (dup.id, dup.inserted),
        (uf.id, false),
        "until-failed after the upgrade"
    );
}
