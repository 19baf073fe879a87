//! The PostgreSQL schema: the base DDL (version 1), the numbered upgrade
//! steps ([`UPGRADES`]) and the migration that runs them.

use super::sql::UNIQUE_PRED;
use super::{Names, PgBackend};
use crate::error::StoreError;
use crate::store::migrate::{parse_version, quoted_tables, Dialect};
use crate::store::sql_row::{self, corrupt};
use crate::store::SchemaStatus;
use crate::store::CANCEL_REQUESTED;

/// The version [`schema_sql`] creates; [`UPGRADES`] take it from there.
const BASE_VERSION: i32 = 1;

/// The schema version this build creates and understands: the base plus
/// one per upgrade step.
const SCHEMA_VERSION: i32 = BASE_VERSION + UPGRADES.len() as i32;

/// One schema upgrade step: SQL (one or more idempotent statements) taking
/// the schema from version `n` to `n + 1`, where `n - BASE_VERSION` is the
/// step's index in [`UPGRADES`].
type Upgrade = fn(&Names) -> String;

/// The upgrade steps, in order. Each runs once per prefix, in the
/// migration's transaction under its advisory lock, together with the
/// version bump. Add a step at the end (and nothing else:
/// [`SCHEMA_VERSION`] follows).
const UPGRADES: &[Upgrade] = &[
    // 1 → 2: per-task claim tokens; a pending task whose cancel was
    // requested (possible before 2) is cancelled.
    upgrade_claim_token,
    // 2 → 3: the `queues` table (a queue's paused flag).
    upgrade_queues,
    // 3 → 4: the enqueuer's trace context on each task.
    upgrade_traceparent,
    // 4 → 5: fewer index writes per transition (see the function).
    upgrade_lean_indexes,
    // 5 → 6: slot tombstones (a pruned slot's key stays taken, DESIGN.md
    // S1) and each job's queue.
    upgrade_slot_tombstones,
    // 6 → 7: each task's concurrency key (a per-key capped claim counts
    // the running ones per key from the `tasks_running` index of 4 → 5).
    upgrade_concurrency_key,
    // 7 → 8: unique keys scoped by kind and queue (issue 29): the keys of
    // existing tasks rewritten into the default scope's composite.
    upgrade_unique_scope,
    // 8 → 9: rate limits' start logs.
    upgrade_rates,
    // 9 → 10: a third unique hold, `UntilFailed` (issue 29).
    upgrade_unique_until_failed,
    // 10 → 11: fair claiming: each queue's rotation cursor and the index
    // the fair claim finds each key's first pending task with.
    upgrade_fair,
    // 11 → 12: each job's overlap policy, and the note, author and time
    // of a job's or queue's last pause or resume (issue 26).
    upgrade_pause_notes,
    // 12 → 13: the audit log (issue 27).
    upgrade_audit,
    // 13 → 14: debounce and throttle: the index a throttled enqueue finds
    // its key's last start with.
    upgrade_key_starts,
    // 14 → 15: the limits each queue's workers declare (issue 25).
    upgrade_queue_limits,
    // 15 → 16: job definitions kept in the store (issue 26).
    upgrade_jobdefs,
    // 16 → 17: rates per concurrency key: each key's start log.
    upgrade_key_rates,
    // 17 → 18: the throughput rollup (issue 27).
    upgrade_rollup,
    // 18 → 19: lock history (issue 27).
    upgrade_lock_history,
    // 19 → 20: the rollup per schedule job (issue 27).
    upgrade_rollup_job,
    // 20 → 21: the fair claim in one call (issue 25): the function
    // `<prefix>fair_claim`.
    super::fair::function_sql,
    // 21 → 22: the capped claim and the claim under a rate per key in one
    // call each (issue 25): the functions `<prefix>capped_claim` and
    // `<prefix>key_rated_claim`, and each key's log as `int8[]`.
    upgrade_claim_functions,
    // 22 → 23: the capped claim grants a buffer under a cap per key only
    // where the walked keys have places to spare (issue 25): the function
    // `<prefix>capped_claim` replaced.
    super::capped::function_sql,
    // 23 → 24: the claim under a rate per key does less under the queue's
    // lock (issue 25): the function `<prefix>key_rated_claim` replaced,
    // and its log writes made cheaper.
    upgrade_key_rated_claim,
    // 24 → 25: the claim under a rate per key takes its instant after its
    // keys' locks and keeps a period's starts in each key's log, not
    // `max` (issue 25): the function `<prefix>key_rated_claim` replaced.
    super::key_rate_fn::function_sql,
    // 25 → 26: a claim under a cap per key alone, while the queue runs
    // tasks of many keys, takes the queue's lock shared and its keys'
    // locks, so claims of other keys run at once (issue 25): the function
    // `<prefix>capped_claim` replaced.
    super::capped::function_sql,
];

/// The capped claim and the claim under a rate per key as functions
/// (`capped.rs`, `key_rate_fn.rs`), created or replaced, and each key's
/// start log in `<p>key_rates` as the array `log` (µs, latest first) the
/// function reads: the text column `starts` converted, then dropped (a
/// re-run finds it gone and converts nothing).
fn upgrade_claim_functions(n: &Names) -> String {
    let kr = &n.key_rates;
    let lit = kr.replace('\'', "''");
    format!(
        "ALTER TABLE {kr} ADD COLUMN IF NOT EXISTS log int8[] NOT NULL DEFAULT '{{}}';\n\
         DO $step$ BEGIN\n\
             IF EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '{lit}'::regclass\n\
                        AND attname = 'starts' AND NOT attisdropped) THEN\n\
                 UPDATE {kr} SET log = ARRAY(\n\
                     SELECT x::int8 FROM unnest(string_to_array(starts, ' ')) AS s(x)\n\
                     WHERE x <> '' ORDER BY 1 DESC)\n\
                 WHERE starts <> '';\n\
                 ALTER TABLE {kr} DROP COLUMN starts;\n\
             END IF;\n\
         END $step$;\n\
         {}\n{}",
        super::capped::function_sql(n),
        super::key_rate_fn::function_sql(n)
    )
}

/// The rollup keyed by job too (`''` for tasks of no job, and for the
/// rows counted before), so a job defined in the store (kind `command`)
/// has a series of its own: the column added and the primary key, found
/// by its table, replaced.
fn upgrade_rollup_job(n: &Names) -> String {
    let r = &n.rollup;
    format!(
        "ALTER TABLE {r} ADD COLUMN IF NOT EXISTS job text NOT NULL DEFAULT ''; \
         DO $baton$ DECLARE c text; BEGIN \
           SELECT conname INTO c FROM pg_constraint \
             WHERE conrelid = '{r}'::regclass AND contype = 'p'; \
           IF c IS NOT NULL THEN \
             EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', '{r}', c); \
           END IF; \
         END $baton$; \
         ALTER TABLE {r} ADD PRIMARY KEY (res, bucket, queue, kind, job);"
    )
}

/// The limits a queue's workers declare (`store::QueueLimits` as JSON),
/// who declared them and when: nullable, nothing to convert.
fn upgrade_queue_limits(n: &Names) -> String {
    format!(
        "ALTER TABLE {} ADD COLUMN IF NOT EXISTS limits text, \
             ADD COLUMN IF NOT EXISTS limits_by text, \
             ADD COLUMN IF NOT EXISTS limits_at timestamptz;",
        n.queues
    )
}

/// Job definitions kept in the store: one row a name, a tombstone when
/// deleted (so a name's version never repeats).
fn upgrade_jobdefs(n: &Names) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS \"{}jobdefs\" (\
             name text PRIMARY KEY, version int8 NOT NULL, spec text NOT NULL, \
             deleted boolean NOT NULL DEFAULT false, created_at timestamptz NOT NULL, \
             updated_at timestamptz NOT NULL, updated_by text NOT NULL); \
         ALTER TABLE {} ADD COLUMN IF NOT EXISTS fingerprint text;",
        n.prefix, n.jobs
    )
}

/// Lock history: one row a release, pruned by `released_at` and per lock.
fn upgrade_lock_history(n: &Names) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\
             id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, name text NOT NULL, \
             holder text NOT NULL, token int8 NOT NULL, acquired_at timestamptz NOT NULL, \
             released_at timestamptz NOT NULL);",
        n.lock_history
    )
}

/// The throughput rollup: one row a (resolution, bucket, queue, kind),
/// counts added by each worker's flush, pruned by bucket.
fn upgrade_rollup(n: &Names) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\
             res int8 NOT NULL, bucket int8 NOT NULL, queue text NOT NULL, kind text NOT NULL, \
             succeeded int8 NOT NULL, failed int8 NOT NULL, dead int8 NOT NULL, \
             cancelled int8 NOT NULL, wait_n int8 NOT NULL, wait_ms int8 NOT NULL, \
             wait_max_ms int8 NOT NULL, run_n int8 NOT NULL, run_ms int8 NOT NULL, \
             run_max_ms int8 NOT NULL, PRIMARY KEY (res, bucket, queue, kind));",
        n.rollup
    )
}

/// The jobs' `overlap` (what a worker ending a run reads to skip
/// `job_release` under `skip`/`allow`) and the pause records of jobs and
/// queues (`pause_note`, `pause_by`, `pause_at`), all nullable: nothing to
/// convert.
fn upgrade_pause_notes(n: &Names) -> String {
    let notes = "ADD COLUMN IF NOT EXISTS pause_note text, \
         ADD COLUMN IF NOT EXISTS pause_by text, \
         ADD COLUMN IF NOT EXISTS pause_at timestamptz";
    format!(
        "ALTER TABLE {} ADD COLUMN IF NOT EXISTS overlap text, {notes}; \
         ALTER TABLE {} {notes};",
        n.jobs, n.queues
    )
}

/// The audit log: one row an operator action, pruned by `at`.
fn upgrade_audit(n: &Names) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {t} (\
             id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, \
             at timestamptz NOT NULL, actor text NOT NULL, action text NOT NULL, \
             target text NOT NULL, source text NOT NULL, outcome text NOT NULL); \
         CREATE INDEX IF NOT EXISTS \"{p}audit_at\" ON {t} (at);",
        t = n.audit,
        p = n.prefix
    )
}

/// The claim under a rate per key, replaced (`key_rate_fn.rs`: each walked
/// key's log count read by index, arrays grown in place, each old log read
/// by its primary key), each key's log turned from instants into runs
/// (instant, count; `store::rate::StartLog`), and rewritten more cheaply: the
/// index by `free_at` keeps only used-up keys (`free_at > 0`; a key under
/// its rate, the usual case, adds no entry), and the table leaves a fifth
/// of each page free, so a log rewrite that changes no indexed column
/// (`idle_at` is rounded up to a whole grace, `store::key_rate::idle_at`)
/// stays on its page without new index entries (heap-only).
fn upgrade_key_rated_claim(n: &Names) -> String {
    let (p, kr) = (&n.prefix, &n.key_rates);
    format!(
        "UPDATE {kr} SET log = (SELECT coalesce(array_agg(e.v ORDER BY g.t DESC, e.j), '{{}}') \
             FROM (SELECT s.t, count(*) AS c FROM unnest(log) AS s(t) GROUP BY s.t) AS g \
             CROSS JOIN LATERAL (VALUES (1, g.t), (2, g.c)) AS e(j, v)); \
         DROP INDEX IF EXISTS \"{p}key_rates_free\"; \
         CREATE INDEX \"{p}key_rates_free\" ON {kr} (queue, free_at) WHERE free_at > 0; \
         ALTER TABLE {kr} SET (fillfactor = 80); {}",
        super::key_rate_fn::function_sql(n)
    )
}

/// The index `store::KeySeen::last_start` is read from: the tasks with a
/// unique key that have started, by key and start.
/// Rates per concurrency key (`store::key_rate`): one start log per
/// (queue, key), found by `free_at` for the earliest held-back key and by
/// `idle_at` for pruning.
fn upgrade_key_rates(n: &Names) -> String {
    let (p, kr) = (&n.prefix, &n.key_rates);
    format!(
        "CREATE TABLE IF NOT EXISTS {kr} (queue text NOT NULL, ckey text NOT NULL, \
             starts text NOT NULL DEFAULT '', free_at int8 NOT NULL DEFAULT 0, \
             idle_at int8 NOT NULL DEFAULT 0, PRIMARY KEY (queue, ckey)); \
         CREATE INDEX IF NOT EXISTS \"{p}key_rates_free\" ON {kr} (queue, free_at); \
         CREATE INDEX IF NOT EXISTS \"{p}key_rates_idle\" ON {kr} (queue, idle_at);"
    )
}

fn upgrade_key_starts(n: &Names) -> String {
    let (p, t) = (&n.prefix, &n.tasks);
    format!(
        "CREATE INDEX IF NOT EXISTS \"{p}tasks_key_starts\" ON {t} (unique_key, started_at) \
         WHERE unique_key IS NOT NULL AND started_at IS NOT NULL;"
    )
}

/// The unique index's predicate before schema 10 (the base DDL creates it
/// so; step 9 → 10 replaces it with [`UNIQUE_PRED`]).
const UNIQUE_PRED_BEFORE_10: &str =
    "unique_key IS NOT NULL AND (unique_forever OR state IN ('pending', 'running'))";

/// The hold `UniqueHold::UntilFailed` (a succeeded task keeps its key):
/// the column `unique_until_failed` (false on every existing task, so
/// each keeps its hold: `unique_forever` forever, the rest unfinished) and
/// the unique index rebuilt on [`UNIQUE_PRED`], which reads it (in the
/// migration's transaction: enqueues wait for it).
fn upgrade_unique_until_failed(n: &Names) -> String {
    let (p, t) = (&n.prefix, &n.tasks);
    format!(
        "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS unique_until_failed boolean NOT NULL \
             DEFAULT false; \
         DROP INDEX IF EXISTS \"{p}tasks_unique\"; \
         CREATE UNIQUE INDEX IF NOT EXISTS \"{p}tasks_unique\" ON {t} (unique_key) \
             WHERE {UNIQUE_PRED};"
    )
}

/// The fair claim (`store::fair`) walks the distinct keys of a queue's
/// pending tasks and each key's first due one on this index, and keeps the
/// group it served last in `queues.fair_cursor`.
fn upgrade_fair(n: &Names) -> String {
    let (p, t) = (&n.prefix, &n.tasks);
    format!(
        "ALTER TABLE {} ADD COLUMN IF NOT EXISTS fair_cursor text; \
         CREATE INDEX IF NOT EXISTS \"{p}tasks_key_pending\" \
             ON {t} (queue, concurrency_key, priority, run_at, id) WHERE state = 'pending';",
        n.queues
    )
}

/// Rewrite the key of every task that is no job's run and has a key from
/// before scopes into the default scope's composite
/// (`store::UniqueKey::upgraded`, spelled the same; a composite over 1024
/// bytes leaves the key as it was). Idempotent: a composite starts with
/// the separator and is left alone.
fn upgrade_unique_scope(n: &Names) -> String {
    let s = "chr(31)";
    format!(
        "UPDATE {} SET unique_key = {s} || 'k' || {s} || queue || {s} || kind || {s} \
             || {s} || {s} || unique_key \
         WHERE unique_key IS NOT NULL AND job IS NULL AND left(unique_key, 1) <> {s} \
             AND octet_length(queue) + octet_length(kind) + octet_length(unique_key) + 7 \
                 <= {};",
        n.tasks,
        crate::store::MAX_STORED_KEY_LEN
    )
}

fn upgrade_rates(n: &Names) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (name text PRIMARY KEY, starts text NOT NULL DEFAULT '');",
        n.rates
    )
}

fn upgrade_concurrency_key(n: &Names) -> String {
    format!(
        "ALTER TABLE {} ADD COLUMN IF NOT EXISTS concurrency_key text;",
        n.tasks
    )
}

fn upgrade_slot_tombstones(n: &Names) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} ( \
             unique_key  text PRIMARY KEY, \
             job         text NOT NULL, \
             slot        timestamptz, \
             task_id     bigint NOT NULL, \
             state       text NOT NULL, \
             last_error  text, \
             finished_at timestamptz \
         ); \
         ALTER TABLE {} ADD COLUMN IF NOT EXISTS queue text;",
        n.slots, n.jobs
    )
}

fn upgrade_traceparent(n: &Names) -> String {
    format!(
        "ALTER TABLE {} ADD COLUMN IF NOT EXISTS traceparent text;",
        n.tasks
    )
}

/// Cheaper transitions. The running set is indexed by `queue` instead of
/// `lease_until`, so a heartbeat (which changes only `lease_until`) changes
/// no indexed column and can be a HOT update; rescue walks the running
/// set (bounded by the workers' concurrency) and the capped claim counts a
/// queue's running tasks from the same index. Pages are filled to 70% on
/// insert, so a claim's or finish's new row version usually lands on the
/// same page and a heartbeat's has room to be HOT; existing pages keep
/// their fill until rewritten.
fn upgrade_lean_indexes(n: &Names) -> String {
    let (p, t) = (&n.prefix, &n.tasks);
    format!(
        "ALTER TABLE {t} SET (fillfactor = 70); \
         CREATE INDEX IF NOT EXISTS \"{p}tasks_running\" ON {t} (queue) \
             WHERE state = 'running'; \
         DROP INDEX IF EXISTS \"{p}tasks_lease\";"
    )
}

fn upgrade_queues(n: &Names) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} ( \
             name   text PRIMARY KEY, \
             paused boolean NOT NULL DEFAULT false \
         );",
        n.queues
    )
}

fn upgrade_claim_token(n: &Names) -> String {
    let t = &n.tasks;
    format!(
        "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS claim_token bigint NOT NULL DEFAULT 0; \
         UPDATE {t} SET state = 'cancelled', finished_at = now(), \
             last_error = '{CANCEL_REQUESTED}' \
         WHERE state = 'pending' AND cancel_requested;"
    )
}

/// The base schema (version 1), every statement idempotent.
fn schema_sql(n: &Names) -> String {
    let p = &n.prefix;
    let (meta, locks, tasks, jobs) = (&n.meta, &n.locks, &n.tasks, &n.jobs);
    format!(
        r#"
CREATE TABLE IF NOT EXISTS {meta} (
key   text PRIMARY KEY,
value text NOT NULL
);
CREATE TABLE IF NOT EXISTS {locks} (
name       text PRIMARY KEY,
holder     text NOT NULL,
token      bigint NOT NULL,
locked_at  timestamptz NOT NULL,
lock_until timestamptz NOT NULL
);
CREATE SEQUENCE IF NOT EXISTS "{p}tasks_id_seq";
CREATE TABLE IF NOT EXISTS {tasks} (
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
ALTER SEQUENCE "{p}tasks_id_seq" OWNED BY {tasks}.id;
CREATE INDEX IF NOT EXISTS "{p}tasks_claim" ON {tasks} (queue, priority, run_at, id)
WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS "{p}tasks_lease" ON {tasks} (lease_until)
WHERE state = 'running';
CREATE UNIQUE INDEX IF NOT EXISTS "{p}tasks_unique" ON {tasks} (unique_key)
WHERE {UNIQUE_PRED_BEFORE_10};
CREATE INDEX IF NOT EXISTS "{p}tasks_prune" ON {tasks} (finished_at)
WHERE state IN ('succeeded', 'failed', 'cancelled');
CREATE INDEX IF NOT EXISTS "{p}tasks_job" ON {tasks} (job, slot)
WHERE job IS NOT NULL;
CREATE TABLE IF NOT EXISTS {jobs} (
name      text PRIMARY KEY,
last_slot timestamptz,
paused    boolean NOT NULL DEFAULT false
);
"#
    )
}

/// The recorded version against [`SCHEMA_VERSION`] (a read, no DDL).
pub(super) async fn status(b: &PgBackend) -> Result<SchemaStatus, StoreError> {
    let read = b.qs(&b.sql.schema_version).fetch_optional(b.exec()).await;
    sql_row::schema_status(read, i64::from(SCHEMA_VERSION))
}

/// The key of the migration's advisory lock for the prefix.
fn migration_lock_key(n: &Names) -> String {
    format!("baton-migrate:{}", n.prefix)
}

/// Drop every table of the prefix and its id sequence, in one transaction
/// under the migration's advisory lock (a process migrating at that moment
/// waits, then creates the schema anew).
pub(super) async fn remove(b: &PgBackend) -> Result<(), StoreError> {
    let n = &b.names;
    let mut tx = b.begin().await?;
    b.q("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(migration_lock_key(n))
        .execute(&mut *tx)
        .await?;
    let drop = format!(
        "DROP FUNCTION IF EXISTS {}, {}, {}; \
         DROP TABLE IF EXISTS {} CASCADE; DROP SEQUENCE IF EXISTS \"{}tasks_id_seq\"",
        super::fair::function_name(n),
        super::capped::function_name(n),
        super::key_rate_fn::function_name(n),
        quoted_tables(&n.prefix, '"'),
        n.prefix
    );
    sqlx::Executor::execute(&mut *tx, sqlx::raw_sql(&drop)).await?;
    tx.commit().await?;
    Ok(())
}

/// Create the schema if absent and run the upgrade steps from the recorded
/// version, in one transaction under an advisory lock per prefix (so
/// processes that connect at once take turns), through the shared runner
/// (`store::migrate`). A schema already at this version gets no DDL:
/// running `CREATE INDEX IF NOT EXISTS` anyway takes table locks that can
/// deadlock with live workers' transactions.
pub(super) async fn migrate(b: &PgBackend) -> Result<(), StoreError> {
    crate::store::migrate::run(&mut Migration { b, tx: None }).await
}

/// The PostgreSQL side of the shared migration runner: the lock is a
/// transaction holding `pg_advisory_xact_lock` on the prefix.
struct Migration<'a> {
    b: &'a PgBackend,
    tx: Option<sqlx::Transaction<'static, sqlx::Postgres>>,
}

impl Migration<'_> {
    /// The transaction [`Dialect::lock`] began.
    fn tx(&mut self) -> Result<&mut sqlx::PgConnection, StoreError> {
        self.tx
            .as_deref_mut()
            .ok_or_else(|| StoreError::Backend("postgres migration: not locked".into()))
    }
}

#[async_trait::async_trait]
impl Dialect for Migration<'_> {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn prefix(&self) -> &str {
        &self.b.names.prefix
    }

    fn base_version(&self) -> i64 {
        BASE_VERSION.into()
    }

    fn step_count(&self) -> usize {
        UPGRADES.len()
    }

    async fn peek_version(&mut self) -> Result<Option<i64>, StoreError> {
        let b = self.b;
        let v: Option<String> = b.qs(&b.sql.schema_version).fetch_optional(b.exec()).await?;
        v.as_deref().map(parse_version).transpose()
    }

    async fn lock(&mut self) -> Result<(), StoreError> {
        let b = self.b;
        let mut tx = b.begin().await?;
        b.q("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
            .bind(migration_lock_key(&b.names))
            .execute(&mut *tx)
            .await?;
        self.tx = Some(tx);
        Ok(())
    }

    /// Read under the migration's lock, from `pg_class` itself (this
    /// statement's snapshot), not through `to_regclass`: a name lookup
    /// that takes no lock reads the backend's catalog cache, which still
    /// says "absent" when this backend looked before the lock (`peek_version`)
    /// and another process created the schema while it waited (an advisory
    /// lock processes no catalog invalidations). Running the base DDL on a
    /// live schema then takes table locks that deadlock with its workers.
    async fn recorded_version(&mut self) -> Result<Option<i64>, StoreError> {
        let b = self.b;
        let has_meta: bool = b
            .qs("SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c \
                 JOIN pg_catalog.pg_namespace s ON s.oid = c.relnamespace \
                 WHERE c.relname = $1 AND s.nspname = ANY (current_schemas(false)))")
            .bind(format!("{}meta", b.names.prefix))
            .fetch_one(self.tx()?)
            .await?;
        if !has_meta {
            return Ok(None);
        }
        let v: Option<String> = b
            .qs(&b.sql.schema_version)
            .fetch_optional(self.tx()?)
            .await?;
        v.as_deref().map(parse_version).transpose()
    }

    /// The base DDL runs on a store without a recorded version only: on an
    /// upgraded one it would recreate what a later step dropped.
    async fn create(&mut self) -> Result<i64, StoreError> {
        let b = self.b;
        let schema = schema_sql(&b.names);
        sqlx::Executor::execute(self.tx()?, schema.as_str()).await?;
        b.q(&format!(
            "INSERT INTO {} (key, value) VALUES ('schema_version', $1) \
             ON CONFLICT (key) DO NOTHING",
            b.names.meta
        ))
        .bind(BASE_VERSION.to_string())
        .execute(self.tx()?)
        .await?;
        Ok(BASE_VERSION.into())
    }

    async fn run_step(&mut self, index: usize) -> Result<(), StoreError> {
        let step = UPGRADES
            .get(index)
            .ok_or_else(|| corrupt("schema upgrade step", index))?;
        let sql = step(&self.b.names);
        sqlx::Executor::execute(self.tx()?, sql.as_str()).await?;
        Ok(())
    }

    async fn record_version(&mut self, version: i64) -> Result<(), StoreError> {
        let b = self.b;
        b.q(&format!(
            "UPDATE {} SET value = $1 WHERE key = 'schema_version'",
            b.names.meta
        ))
        .bind(version.to_string())
        .execute(self.tx()?)
        .await?;
        Ok(())
    }

    async fn unlock(&mut self, commit: bool) -> Result<(), StoreError> {
        match self.tx.take() {
            Some(tx) if commit => Ok(tx.commit().await?),
            // Dropped: rolled back, and the advisory lock with it.
            _ => Ok(()),
        }
    }

    /// A read, and a row insert only when it is missing (so a connect to
    /// a migrated store by a read-only user writes nothing).
    async fn write_identity(&mut self) -> Result<(), StoreError> {
        write_identity(self.b).await
    }
}

/// Write the store's identity if none is recorded (once; see
/// `StoreIdentity`).
async fn write_identity(b: &PgBackend) -> Result<(), StoreError> {
    let n = &*b.names;
    let have: Option<String> = b
        .qs(&format!(
            "SELECT value FROM {} WHERE key = 'store_id'",
            n.meta
        ))
        .fetch_optional(b.exec())
        .await?;
    if have.is_some() {
        return Ok(());
    }
    b.q(&format!(
        "INSERT INTO {} (key, value) VALUES ('store_id', $1) ON CONFLICT (key) DO NOTHING",
        n.meta
    ))
    .bind(crate::store::new_store_id())
    .execute(b.exec())
    .await?;
    Ok(())
}

/// The store's identity and task id counter (a read; nothing at all when
/// the tables are missing).
pub(super) async fn identity(b: &PgBackend) -> Result<crate::store::StoreIdentity, StoreError> {
    let n = &*b.names;
    let seq = format!("\"{}tasks_id_seq\"", n.prefix);
    let read: Result<(Option<String>, i64), sqlx::Error> = sqlx::query_as(&format!(
        "SELECT (SELECT value FROM {} WHERE key = 'store_id'), \
             (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {seq})",
        n.meta
    ))
    .persistent(b.mode != super::PoolMode::Transaction)
    .fetch_one(b.exec())
    .await;
    match read {
        Ok((id, last_task_id)) => Ok(crate::store::StoreIdentity { id, last_task_id }),
        Err(e) if sql_row::is_missing_table(&e) => Ok(crate::store::StoreIdentity::default()),
        Err(e) => Err(e.into()),
    }
}

/// Raise the task id sequence to the store's clock in µs when it is more
/// than [`ID_FLOOR_SLACK_US`](crate::store::ID_FLOOR_SLACK_US) behind it
/// (DESIGN.md I1). `setval` is not atomic with the `nextval` of other
/// connections, so two things keep it from handing an id out twice: floors
/// take turns under an advisory lock (a slower floor never lowers a later
/// one's value), and the clock it writes is read at the `setval`
/// (`clock_timestamp()`, volatile: after the row was read, and after any
/// wait for the lock), so the ids others took in between (fewer than one
/// per µs) stay below it.
pub(super) async fn floor_ids(b: &PgBackend) -> Result<(), StoreError> {
    let n = &*b.names;
    let seq = format!("\"{}tasks_id_seq\"", n.prefix);
    let now_us = "floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint";
    let mut tx = b.begin().await?;
    b.q("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(format!("baton-id-floor:{}", n.prefix))
        .execute(&mut *tx)
        .await?;
    let raised: Result<Option<i64>, sqlx::Error> = b
        .qs(&format!(
            "SELECT setval('{seq}', {now_us}) FROM {seq} \
             WHERE (CASE WHEN is_called THEN last_value ELSE 0 END) < {now_us} - $1"
        ))
        .bind(crate::store::ID_FLOOR_SLACK_US)
        .fetch_optional(&mut *tx)
        .await;
    match raised {
        Ok(to) => {
            tx.commit().await?;
            if let Some(to) = to {
                tracing::debug!(prefix = %n.prefix, "postgres: task ids floored at {to}");
            }
            Ok(())
        }
        // Not migrated (no sequence yet): nothing to floor.
        Err(e) if sql_row::is_missing_table(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// An `UPDATE` of no row: refused at once (25006) by a server that takes
/// no writes, a no-op (no row locked, nothing logged) by one that does.
pub(super) async fn write_probe(b: &PgBackend) -> Result<(), StoreError> {
    let probe = format!("UPDATE {} SET value = value WHERE false", b.names.meta);
    match b.q(&probe).execute(b.exec()).await {
        Ok(_) => Ok(()),
        Err(e) if sql_row::is_missing_table(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
