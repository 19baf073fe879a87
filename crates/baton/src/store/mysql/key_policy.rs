//! Debounce and throttle on MySQL (`store::key_policy`), in the insert's
//! transaction: the queue's row in `<p>queues` locked first (as a capped
//! claim does), so the enqueues with a policy of one queue take turns —
//! racing inserts of one unique key would otherwise deadlock on InnoDB's
//! duplicate-key share locks once the losers lock the winner's row — then
//! the key's holder locked with `SELECT … FOR UPDATE` on `live_key`, the
//! key's last start read from the `tasks_key_starts` index.

use chrono::{DateTime, Utc};
use sqlx::{MySqlConnection, Row};

use super::tasks::insert_plain;
use super::Names;
use crate::error::StoreError;
use crate::store::{from_ms, Enqueued, KeySeen, KeyTx, NewTask, Wake};

/// Insert `tasks`, some with a policy, in order on `conn` (inside the
/// caller's transaction): each with a policy by `store::enqueue_keyed`,
/// the others as `insert_plain` does, one at a time.
pub(super) async fn insert_with_policies(
    conn: &mut MySqlConnection,
    n: &Names,
    tasks: &[NewTask],
) -> Result<(Vec<Enqueued>, Vec<Wake>), StoreError> {
    let mut out = Vec::with_capacity(tasks.len());
    let mut tx = KeyedTx {
        conn,
        n,
        wakes: Vec::new(),
    };
    for task in tasks {
        if task.key_policy.is_some() {
            super::claim::lock_queue_row_on(tx.conn, n, &task.queue).await?;
        }
        out.push(if task.key_policy.is_some() {
            crate::store::enqueue_keyed(&mut tx, task).await?
        } else {
            tx.key_insert(task).await?
        });
    }
    Ok((out, tx.wakes))
}

struct KeyedTx<'a> {
    conn: &'a mut MySqlConnection,
    n: &'a Names,
    /// To send once the transaction commits.
    wakes: Vec<Wake>,
}

#[async_trait::async_trait]
impl KeyTx for KeyedTx<'_> {
    async fn key_seen(&mut self, key: &str) -> Result<KeySeen, StoreError> {
        let t = &self.n.tasks;
        let holder = sqlx::query(&format!(
            "SELECT id, state FROM {t} WHERE live_key = ? FOR UPDATE"
        ))
        .bind(key)
        .fetch_optional(&mut *self.conn)
        .await?;
        let holder = match &holder {
            Some(r) => (
                Some(r.try_get::<i64, _>(0)?),
                Some(String::from_utf8_lossy(&r.try_get_unchecked::<Vec<u8>, _>(1)?).into_owned()),
            ),
            None => (None, None),
        };
        // The key's last start (`tasks_key_starts`) and now.
        let last: Option<(i64, DateTime<Utc>)> = sqlx::query_as(&format!(
            "SELECT id, started_at FROM {t} WHERE unique_key = ? AND started_at IS NOT NULL \
             ORDER BY started_at DESC LIMIT 1"
        ))
        .bind(key)
        .fetch_optional(&mut *self.conn)
        .await?;
        let now: DateTime<Utc> = sqlx::query_scalar(&self.n.now_select)
            .fetch_one(&mut *self.conn)
            .await?;
        KeySeen::from_columns(
            (holder.0, holder.1.as_deref()),
            (last.map(|l| l.0), last.map(|l| l.1.timestamp_millis())),
            now.timestamp_millis(),
        )
    }

    async fn key_hand_over(&mut self, id: i64) -> Result<(), StoreError> {
        sqlx::query(&format!(
            "UPDATE {} SET unique_key = NULL, unique_forever = 0, unique_until_failed = 0 \
             WHERE id = ?",
            self.n.tasks
        ))
        .bind(id)
        .execute(&mut *self.conn)
        .await?;
        Ok(())
    }

    async fn key_replace(
        &mut self,
        id: i64,
        task: &NewTask,
        run_at_ms: i64,
    ) -> Result<bool, StoreError> {
        let at = from_ms(run_at_ms)?;
        let done = sqlx::query(&format!(
            "UPDATE {} SET payload = ?, priority = ?, run_at = ? WHERE id = ? AND state = 'pending'",
            self.n.tasks
        ))
        .bind(task.payload.to_string())
        .bind(task.priority)
        .bind(at)
        .bind(id)
        .execute(&mut *self.conn)
        .await?
        .rows_affected()
            == 1;
        if done {
            self.wakes.push(Wake {
                queue: task.queue.clone(),
                due: Some(at),
            });
        }
        Ok(done)
    }

    async fn key_insert(&mut self, task: &NewTask) -> Result<Enqueued, StoreError> {
        let plain = NewTask {
            key_policy: None,
            ..task.clone()
        };
        let (mut e, w) =
            insert_plain(self.conn, self.n, std::slice::from_ref(&plain), None).await?;
        self.wakes.extend(w);
        e.pop()
            .ok_or_else(|| StoreError::Backend("insert returned no result".into()))
    }
}
