//! The MySQL / MariaDB schema: the base DDL (version 2), the numbered
//! upgrade steps ([`UPGRADES`]) and their side of the shared migration
//! runner (`store::migrate`). DDL commits at once in MySQL, so the
//! migration is serialized by a named lock (`GET_LOCK`) held by one
//! connection instead of a transaction.

use sqlx::pool::PoolConnection;
use sqlx::{Executor, MySql};

use super::{MyBackend, Names};
use crate::error::StoreError;
use crate::store::migrate::{parse_version, Dialect};
use crate::store::sql_row;
use crate::store::SchemaStatus;

/// The version [`schema_sql`] creates. MySQL's first schema is the
/// current one of the other backends (with claim tokens), so it starts at 2;
/// [`UPGRADES`] take it from there.
const BASE_VERSION: i32 = 2;

/// The schema version this build creates and understands.
pub(super) const SCHEMA_VERSION: i32 = BASE_VERSION + UPGRADES.len() as i32;

/// One schema upgrade step: statements (each idempotent) taking the schema
/// from version `n` to `n + 1`, where `n - BASE_VERSION` is the step's index.
type Upgrade = fn(&Names) -> Vec<String>;

/// The upgrade steps, in order; each runs once per prefix under the
/// migration lock, followed by its version bump. Add a step at the end.
const UPGRADES: &[Upgrade] = &[
    add_enqueue_mark,
    add_queue_paused,
    add_traceparent,
    add_slot_tombstones,
    add_concurrency_key,
    rescope_unique_keys,
    add_rates,
    add_unique_until_failed,
    add_pause_notes,
    add_audit,
    add_key_starts,
    add_fair,
    add_queue_limits,
    add_jobdefs,
    add_key_rates,
    add_rollup,
    add_lock_history,
    add_rollup_job,
    // 20 → 21: nothing. It created the fair claim's stored procedure
    // `<prefix>fair_claim` before that moved to the first fair claim
    // (`fair::ready`), so that a user without `CREATE ROUTINE` can
    // migrate; kept so the versions stay the same.
    no_step,
    // 21 → 22: nothing to convert. Rate limits' start logs (`<p>rates`,
    // `<p>key_rates`) are written as runs (`instant*count`,
    // `store::rate::StartLog`), which older builds cannot read; plain
    // instants still read as runs of one. The version keeps older builds
    // from connecting to a store this one has written.
    no_step,
];

/// A step that changes nothing (see its place in [`UPGRADES`]).
fn no_step(_: &Names) -> Vec<String> {
    Vec::new()
}

/// 19 → 20: the rollup keyed by job too (`''` for tasks of no job, and
/// for the rows counted before), so a job defined in the store (kind
/// `command`) has a series of its own; one `ALTER` adds the column and
/// replaces the key. `VARBINARY(255)` (names are at most 255 bytes) keeps
/// the key within InnoDB's 3072 bytes beside two `utf8mb4` names.
fn add_rollup_job(n: &Names) -> Vec<String> {
    add_column(
        n,
        "rollup",
        "job VARBINARY(255) NOT NULL, DROP PRIMARY KEY, \
         ADD PRIMARY KEY (res, bucket, queue, kind, job)",
    )
}

/// 13 → 14: fair claiming (`store::fair`): each queue's rotation cursor
/// (the group its previous fair claim served last) and the index the fair
/// claim walks the distinct keys of a queue's pending tasks and finds each
/// key's first due task on (MySQL has no partial index: the state is in
/// the key, as in the `claim` index).
fn add_fair(n: &Names) -> Vec<String> {
    let mut out = add_column(n, "queues", "fair_cursor VARBINARY(255) NULL");
    let name = format!("{}tasks", n.prefix);
    out.extend(ddl_unless(
        &format!(
            "information_schema.statistics WHERE table_schema = DATABASE() \
             AND table_name = '{name}' AND index_name = 'tasks_key_pending'"
        ),
        &format!(
            "CREATE INDEX tasks_key_pending ON `{name}` \
             (queue, state, concurrency_key, priority, run_at, id)"
        ),
    ));
    out
}

/// 14 → 15: the limits a queue's workers declare (`store::QueueLimits`
/// as JSON), who declared them and when (issue 25); nullable, nothing to
/// convert.
fn add_queue_limits(n: &Names) -> Vec<String> {
    let mut out = add_column(
        n,
        "queues",
        "limits TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL",
    );
    out.extend(add_column(
        n,
        "queues",
        "limits_by VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL",
    ));
    out.extend(add_column(n, "queues", "limits_at DATETIME(6) NULL"));
    out
}

/// 15 → 16: job definitions kept in the store (issue 26): one row a name,
/// a tombstone when deleted (so a name's version never repeats).
fn add_jobdefs(n: &Names) -> Vec<String> {
    let mut out = add_column(n, "jobs", "fingerprint VARCHAR(64) NULL");
    out.push(format!(
        "CREATE TABLE IF NOT EXISTS `{}jobdefs` ( \
             name VARCHAR(255) NOT NULL PRIMARY KEY, \
             version BIGINT NOT NULL, \
             spec MEDIUMTEXT NOT NULL, \
             deleted TINYINT(1) NOT NULL DEFAULT 0, \
             created_at DATETIME(6) NOT NULL, \
             updated_at DATETIME(6) NOT NULL, \
             updated_by VARCHAR(1024) NOT NULL \
         ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
        n.prefix
    ));
    out
}

/// 18 → 19: lock history (issue 27): one row a release, pruned by
/// `released_at` and per lock.
fn add_lock_history(n: &Names) -> Vec<String> {
    vec![format!(
        "CREATE TABLE IF NOT EXISTS {} ( \
             id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, \
             name VARCHAR(1024) NOT NULL, holder VARCHAR(1024) NOT NULL, \
             token BIGINT NOT NULL, acquired_at DATETIME(6) NOT NULL, \
             released_at DATETIME(6) NOT NULL, KEY released_idx (released_at) \
         ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
        n.lock_history
    )]
}

/// 17 → 18: the throughput rollup (issue 27): one row a (resolution,
/// bucket, queue, kind), counts added by each worker's flush, pruned by
/// bucket.
fn add_rollup(n: &Names) -> Vec<String> {
    let counts = crate::store::stats_sql::COUNT_COLS
        .iter()
        .map(|c| format!("{c} BIGINT NOT NULL, "))
        .collect::<String>();
    vec![format!(
        "CREATE TABLE IF NOT EXISTS {} ( \
             res BIGINT NOT NULL, bucket BIGINT NOT NULL, \
             queue VARCHAR(255) NOT NULL, kind VARCHAR(255) NOT NULL, {counts}\
             PRIMARY KEY (res, bucket, queue, kind) \
         ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
        n.rollup
    )]
}

/// 10 → 11: each job's overlap policy (what a worker ending a run reads
/// to skip `job_release` under `skip`/`allow`), and the note, author and
/// time of a job's or queue's last pause or resume (issue 26); all
/// nullable, nothing to convert.
fn add_pause_notes(n: &Names) -> Vec<String> {
    let mut out = add_column(n, "jobs", "overlap VARCHAR(32) NULL");
    for table in ["jobs", "queues"] {
        out.extend(add_column(
            n,
            table,
            "pause_note TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL",
        ));
        out.extend(add_column(
            n,
            table,
            "pause_by VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL",
        ));
        out.extend(add_column(n, table, "pause_at DATETIME(6) NULL"));
    }
    out
}

/// 11 → 12: the audit log (issue 27), one row an operator action, pruned
/// by `at`.
fn add_audit(n: &Names) -> Vec<String> {
    vec![format!(
        "CREATE TABLE IF NOT EXISTS {} ( \
             id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, \
             at DATETIME(6) NOT NULL, \
             actor VARCHAR(1024) NOT NULL, \
             action VARCHAR(1024) NOT NULL, \
             target VARCHAR(1024) NOT NULL, \
             source VARCHAR(1024) NOT NULL, \
             outcome VARCHAR(1024) NOT NULL, \
             KEY at_idx (at) \
         ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
        n.audit
    )]
}

/// 16 → 17: rates per concurrency key (`store::key_rate`): one start log
/// per (queue, key), found by `free_at` for the earliest held-back key and
/// by `idle_at` for pruning (a held-back key's pending tasks are probed on
/// `tasks_key_pending` of 13 → 14).
fn add_key_rates(n: &Names) -> Vec<String> {
    vec![format!(
        "CREATE TABLE IF NOT EXISTS {} ( \
             queue VARBINARY(255) NOT NULL, \
             ckey VARBINARY(255) NOT NULL, \
             starts MEDIUMTEXT CHARACTER SET ascii COLLATE ascii_bin NOT NULL, \
             free_at BIGINT NOT NULL DEFAULT 0, \
             idle_at BIGINT NOT NULL DEFAULT 0, \
             PRIMARY KEY (queue, ckey), \
             KEY free_idx (queue, free_at), \
             KEY idle_idx (queue, idle_at) \
         ) ENGINE=InnoDB",
        n.key_rates
    )]
}

/// 12 → 13: debounce and throttle: the index a throttled enqueue finds its
/// key's last start with (the tasks by unique key and start).
fn add_key_starts(n: &Names) -> Vec<String> {
    let name = format!("{}tasks", n.prefix);
    ddl_unless(
        &format!(
            "information_schema.statistics WHERE table_schema = DATABASE() \
             AND table_name = '{name}' AND index_name = 'tasks_key_starts'"
        ),
        &format!("CREATE INDEX tasks_key_starts ON `{name}` (unique_key, started_at)"),
    )
}

/// 9 → 10: a third unique hold, `UniqueHold::UntilFailed` (a succeeded
/// task keeps its key, issue 29): the column `unique_until_failed` (0 on
/// every existing task, so each keeps its hold: `unique_forever` forever,
/// the rest unfinished) and `live_key` recomputed by [`LIVE_KEY`], which
/// reads it (a table rebuild; running it again sets the same expression).
fn add_unique_until_failed(n: &Names) -> Vec<String> {
    let mut out = add_column(
        n,
        "tasks",
        "unique_until_failed TINYINT(1) NOT NULL DEFAULT 0",
    );
    out.push(format!(
        "ALTER TABLE {} MODIFY COLUMN live_key VARBINARY(1024) AS ({LIVE_KEY}) STORED",
        n.tasks
    ));
    out
}

/// `live_key`: the task's unique key while it is taken (its
/// `UniqueHold`: `unique_forever`, `unique_until_failed` or neither), else
/// NULL; unique. The expression since schema 10.
const LIVE_KEY: &str = "CASE WHEN unique_forever = 1 \
     OR state IN ('pending', 'running') \
     OR (unique_until_failed = 1 AND state = 'succeeded') THEN unique_key END";

/// 7 → 8: unique keys scoped by kind and queue (issue 29). The key of
/// every task that is no job's run and has a key from before scopes is
/// rewritten into the default scope's composite
/// (`store::UniqueKey::upgraded`, spelled the same; a composite over 1024
/// bytes leaves the key as it was). Idempotent: a composite starts with
/// the separator and is left alone.
fn rescope_unique_keys(n: &Names) -> Vec<String> {
    let s = "CHAR(31)";
    vec![format!(
        "UPDATE {} SET unique_key = CONCAT({s}, 'k', {s}, queue, {s}, kind, {s}, {s}, {s}, \
             unique_key) \
         WHERE unique_key IS NOT NULL AND job IS NULL AND LEFT(unique_key, 1) <> {s} \
             AND LENGTH(queue) + LENGTH(kind) + LENGTH(unique_key) + 7 <= {}",
        n.tasks,
        crate::store::MAX_STORED_KEY_LEN
    )]
}

/// 8 → 9: rate limits' start logs (`store::rate`).
fn add_rates(n: &Names) -> Vec<String> {
    vec![format!(
        "CREATE TABLE IF NOT EXISTS {} ( \
         name VARBINARY(300) PRIMARY KEY, \
         starts MEDIUMTEXT CHARACTER SET ascii COLLATE ascii_bin NOT NULL \
         ) ENGINE=InnoDB",
        n.rates
    )]
}

/// 6 → 7: each task's concurrency key (a per-key capped claim counts a
/// queue's running tasks per key through the `claim` index's
/// `(queue, state)` prefix).
fn add_concurrency_key(n: &Names) -> Vec<String> {
    add_column(n, "tasks", "concurrency_key VARBINARY(255) NULL")
}

/// 5 → 6: slot tombstones (a pruned slot's key stays taken, DESIGN.md S1)
/// and each job's queue.
fn add_slot_tombstones(n: &Names) -> Vec<String> {
    let mut out = vec![format!(
        "CREATE TABLE IF NOT EXISTS {} ( \
         unique_key VARBINARY(1024) PRIMARY KEY, \
         job VARBINARY(255) NOT NULL, \
         slot DATETIME(6) NULL, \
         task_id BIGINT NOT NULL, \
         state VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, \
         last_error MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, \
         finished_at DATETIME(6) NULL \
         ) ENGINE=InnoDB",
        n.slots
    )];
    out.extend(add_column(n, "jobs", "queue VARBINARY(255) NULL"));
    out
}

/// 2 → 3: the `enqueue_mark` column, by which a multi-row insert finds its
/// own rows' ids (see `tasks::insert_tasks`).
fn add_enqueue_mark(n: &Names) -> Vec<String> {
    add_column(n, "tasks", "enqueue_mark BIGINT NULL")
}

/// 3 → 4: the `paused` flag on `<p>queues` (claims skip a paused queue).
fn add_queue_paused(n: &Names) -> Vec<String> {
    add_column(n, "queues", "paused TINYINT(1) NOT NULL DEFAULT 0")
}

/// 4 → 5: the enqueuer's trace context on each task.
fn add_traceparent(n: &Names) -> Vec<String> {
    add_column(n, "tasks", "traceparent VARCHAR(512) NULL")
}

/// Add a column (`decl` starts with its name) to `<prefix><table>` unless
/// it is there. MySQL 8 has no `ADD COLUMN IF NOT EXISTS`, so the `ALTER`
/// is prepared only when the column is missing; adding a nullable (or
/// defaulted) last column is an instant change on MySQL 8.0.12+ and
/// MariaDB 10.3+.
fn add_column(n: &Names, table: &str, decl: &str) -> Vec<String> {
    // The prefix is validated (letters, digits, '_', ':', '-'), so it can
    // stand inside a string literal.
    let name = format!("{}{table}", n.prefix);
    let column = decl.split_whitespace().next().unwrap_or_default();
    ddl_unless(
        &format!(
            "information_schema.columns WHERE table_schema = DATABASE() \
             AND table_name = '{name}' AND column_name = '{column}'"
        ),
        &format!("ALTER TABLE `{name}` ADD COLUMN {decl}"),
    )
}

/// Run `ddl` (no single quotes in it) only when `SELECT COUNT(*) FROM
/// {rows}` is 0: DDL made idempotent with a prepared statement, as MySQL
/// has neither `ADD COLUMN IF NOT EXISTS` (MariaDB has) nor `CREATE INDEX
/// IF NOT EXISTS`.
fn ddl_unless(rows: &str, ddl: &str) -> Vec<String> {
    vec![
        format!("SET @baton_ddl = IF((SELECT COUNT(*) FROM {rows}) = 0, '{ddl}', 'DO 0')"),
        "PREPARE baton_ddl FROM @baton_ddl".to_string(),
        "EXECUTE baton_ddl".to_string(),
        "DEALLOCATE PREPARE baton_ddl".to_string(),
    ]
}

/// The base schema, one statement each (MySQL runs DDL one at a time
/// and commits it at once, so each is `IF NOT EXISTS`).
fn schema_sql(n: &Names) -> Vec<String> {
    let (meta, locks, tasks, jobs, queues) = (&n.meta, &n.locks, &n.tasks, &n.jobs, &n.queues);
    vec![
        format!(
            "CREATE TABLE IF NOT EXISTS {meta} ( \
             `key` VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin PRIMARY KEY, \
             value VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL \
             ) ENGINE=InnoDB"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {locks} ( \
             name VARBINARY(255) PRIMARY KEY, \
             holder VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, \
             token BIGINT NOT NULL, \
             locked_at DATETIME(6) NOT NULL, \
             lock_until DATETIME(6) NOT NULL \
             ) ENGINE=InnoDB"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {tasks} ( \
             id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, \
             queue VARBINARY(255) NOT NULL, \
             kind VARBINARY(255) NOT NULL, \
             payload LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, \
             state VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, \
             priority INT NOT NULL DEFAULT 0, \
             attempt INT NOT NULL DEFAULT 0, \
             max_attempts INT NOT NULL DEFAULT 1, \
             timeout_ms BIGINT NULL, \
             run_at DATETIME(6) NOT NULL, \
             created_at DATETIME(6) NOT NULL, \
             started_at DATETIME(6) NULL, \
             finished_at DATETIME(6) NULL, \
             lease_until DATETIME(6) NULL, \
             worker VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, \
             unique_key VARBINARY(1024) NULL, \
             unique_forever TINYINT(1) NOT NULL DEFAULT 0, \
             cancel_requested TINYINT(1) NOT NULL DEFAULT 0, \
             claim_token BIGINT NOT NULL DEFAULT 0, \
             last_error MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, \
             errors LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, \
             progress LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, \
             job VARBINARY(255) NULL, \
             slot DATETIME(6) NULL, \
             enqueue_mark BIGINT NULL, \
             live_key VARBINARY(1024) AS (CASE WHEN unique_forever = 1 \
                 OR state IN ('pending', 'running') THEN unique_key END) STORED, \
             UNIQUE KEY live_key (live_key), \
             KEY claim (queue, state, priority, run_at, id), \
             KEY lease (state, lease_until), \
             KEY prune (state, finished_at), \
             KEY job (job, state, slot) \
             ) ENGINE=InnoDB"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {jobs} ( \
             name VARBINARY(255) PRIMARY KEY, \
             last_slot DATETIME(6) NULL, \
             paused TINYINT(1) NOT NULL DEFAULT 0 \
             ) ENGINE=InnoDB"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {queues} ( \
             queue VARBINARY(255) PRIMARY KEY \
             ) ENGINE=InnoDB"
        ),
    ]
}

/// Create the schema if absent and run the upgrade steps from the recorded
/// version under the migration lock (see the module docs).
pub(super) async fn migrate(b: &MyBackend) -> Result<(), StoreError> {
    crate::store::migrate::run(&mut Migration { b, conn: None }).await
}

/// The recorded version against [`SCHEMA_VERSION`] (a read, no DDL).
pub(super) async fn status(b: &MyBackend) -> Result<SchemaStatus, StoreError> {
    let read: Result<Option<Vec<u8>>, sqlx::Error> =
        sqlx::query_scalar(&read_version_sql(&b.names))
            .fetch_optional(&b.pool)
            .await;
    let read = read.map(|v| v.map(|v| String::from_utf8_lossy(&v).into_owned()));
    sql_row::schema_status(read, i64::from(SCHEMA_VERSION))
}

/// Drop every table of the prefix in one statement, then its fair claim
/// procedure, under the migration's lock (a migration at that moment runs
/// before or after). DDL commits on its own in MySQL: there is no
/// transaction to roll back.
pub(super) async fn remove(b: &MyBackend) -> Result<(), StoreError> {
    let mut conn = b.pool.acquire().await?;
    let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 60)")
        .bind(lock_name(&b.names))
        .fetch_one(&mut *conn)
        .await?;
    if got != Some(1) {
        return Err(StoreError::Unavailable(format!(
            "removing tables with prefix {:?}: could not take the migration lock within 60 s",
            b.names.prefix
        )));
    }
    let tables = crate::store::migrate::quoted_tables(&b.names.prefix, '`');
    let mut dropped = sqlx::query(&format!("DROP TABLE IF EXISTS {tables}"))
        .execute(&mut *conn)
        .await;
    if dropped.is_ok() {
        let procedure = super::fair::procedure_name(&b.names);
        dropped = sqlx::query(&format!("DROP PROCEDURE IF EXISTS {procedure}"))
            .execute(&mut *conn)
            .await;
    }
    let released = sqlx::query("SELECT RELEASE_LOCK(?)")
        .bind(lock_name(&b.names))
        .execute(&mut *conn)
        .await;
    dropped?;
    released?;
    Ok(())
}

fn read_version_sql(n: &Names) -> String {
    format!(
        "SELECT value FROM {} WHERE `key` = 'schema_version'",
        n.meta
    )
}

/// A version read from the meta table (bytes), parsed.
fn version_of(v: Option<Vec<u8>>) -> Result<Option<i64>, StoreError> {
    v.map(|v| parse_version(&String::from_utf8_lossy(&v)))
        .transpose()
}

/// The name of the migration lock, one per prefix.
fn lock_name(n: &Names) -> String {
    format!("baton-migrate:{}", n.prefix)
}

/// The MySQL side of the shared migration runner: the lock is `GET_LOCK`
/// on the one connection every locked step runs on.
struct Migration<'a> {
    b: &'a MyBackend,
    conn: Option<PoolConnection<MySql>>,
}

impl Migration<'_> {
    /// The connection [`Dialect::lock`] took the lock on.
    fn conn(&mut self) -> Result<&mut sqlx::MySqlConnection, StoreError> {
        self.conn
            .as_deref_mut()
            .ok_or_else(|| StoreError::Backend("mysql migration: not locked".into()))
    }
}

#[async_trait::async_trait]
impl Dialect for Migration<'_> {
    fn name(&self) -> &'static str {
        "mysql"
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
        let v: Option<Vec<u8>> = sqlx::query_scalar(&read_version_sql(&self.b.names))
            .fetch_optional(&self.b.pool)
            .await?;
        version_of(v)
    }

    async fn lock(&mut self) -> Result<(), StoreError> {
        let mut conn = self.b.pool.acquire().await?;
        let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 60)")
            .bind(lock_name(&self.b.names))
            .fetch_one(&mut *conn)
            .await?;
        if got != Some(1) {
            return Err(StoreError::Unavailable(format!(
                "migration of tables with prefix {:?}: could not take the migration lock within 60 s",
                self.b.names.prefix
            )));
        }
        self.conn = Some(conn);
        Ok(())
    }

    async fn recorded_version(&mut self) -> Result<Option<i64>, StoreError> {
        let sql = read_version_sql(&self.b.names);
        let read: Result<Option<Vec<u8>>, sqlx::Error> =
            sqlx::query_scalar(&sql).fetch_optional(self.conn()?).await;
        match read {
            Ok(v) => version_of(v),
            Err(e) if sql_row::is_missing_table(&e) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn create(&mut self) -> Result<i64, StoreError> {
        let n = &*self.b.names;
        for stmt in schema_sql(n) {
            self.conn()?.execute(stmt.as_str()).await?;
        }
        sqlx::query(&format!(
            "INSERT INTO {} (`key`, value) VALUES ('schema_version', ?) \
             ON DUPLICATE KEY UPDATE `key` = `key`",
            n.meta
        ))
        .bind(BASE_VERSION.to_string())
        .execute(self.conn()?)
        .await?;
        Ok(BASE_VERSION.into())
    }

    async fn run_step(&mut self, index: usize) -> Result<(), StoreError> {
        let step = UPGRADES.get(index).ok_or_else(|| {
            StoreError::Corrupt(format!("schema upgrade step {index}: no such step"))
        })?;
        for stmt in step(&self.b.names) {
            self.conn()?.execute(stmt.as_str()).await?;
        }
        Ok(())
    }

    async fn record_version(&mut self, version: i64) -> Result<(), StoreError> {
        sqlx::query(&format!(
            "UPDATE {} SET value = ? WHERE `key` = 'schema_version'",
            self.b.names.meta
        ))
        .bind(version.to_string())
        .execute(self.conn()?)
        .await?;
        Ok(())
    }

    /// The named lock is released whatever happened (each DDL statement
    /// committed on its own).
    async fn unlock(&mut self, _commit: bool) -> Result<(), StoreError> {
        let Some(mut conn) = self.conn.take() else {
            return Ok(());
        };
        sqlx::query("DO RELEASE_LOCK(?)")
            .bind(lock_name(&self.b.names))
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    /// A read, and a row insert only when it is missing (so a connect to
    /// a migrated store by a read-only user writes nothing).
    async fn write_identity(&mut self) -> Result<(), StoreError> {
        let b = self.b;
        let have: Option<Vec<u8>> = sqlx::query_scalar(&format!(
            "SELECT value FROM {} WHERE `key` = 'store_id'",
            b.names.meta
        ))
        .fetch_optional(&b.pool)
        .await?;
        if have.is_some() {
            return Ok(());
        }
        sqlx::query(&format!(
            "INSERT INTO {} (`key`, value) VALUES ('store_id', ?) \
             ON DUPLICATE KEY UPDATE `key` = `key`",
            b.names.meta
        ))
        .bind(crate::store::new_store_id())
        .execute(&b.pool)
        .await?;
        Ok(())
    }
}
