//! Starting tasks and publishing messages in the caller's own PostgreSQL
//! transaction (feature `postgres`): the task or the message exists if and
//! only if the caller's business write commits. No dual write: an order
//! row and the saga that ships it commit together or not at all.
//!
//! ```no_run
//! # use saga_runtime::prelude::*;
//! # struct Ship;
//! # #[saga] impl Ship { #[saga_step(1)] async fn a(&self, order: u64) -> Result<u64, StepError> { Ok(order) } }
//! # async fn run(engine: Engine, pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! let mut tx = pool.begin().await?;
//! sqlx::query("INSERT INTO orders (id) VALUES (42)").execute(&mut *tx).await?;
//! let task = engine.start_in::<Ship>(&mut tx, 42).await?;
//! tx.commit().await?; // the order and its task, or neither
//! # let _ = task; Ok(()) }
//! ```
//!
//! The transaction must be on the database the engine's
//! [`PostgresBackend`] uses (its schema is named in every statement, so the
//! transaction's `search_path` does not matter). Nothing is retried here:
//! a failure is the caller's transaction's to handle.

use super::client::keyed_id;
use super::Engine;
use crate::backend::postgres::PostgresBackend;
use crate::backend::QueueMessage;
use crate::error::Error;
use crate::model::task::{TaskId, TaskInstance};
use crate::process::Message;
use crate::saga::Saga;

impl Engine {
    /// Starts a task of saga `S` in `tx`: it runs once `tx` commits, and
    /// never exists if `tx` rolls back.
    pub async fn start_in<S: Saga>(
        &self,
        tx: &mut sqlx::PgTransaction<'_>,
        input: S::Input,
    ) -> Result<TaskId, Error> {
        let task = self.new_task::<S>(TaskId::new(), &input)?;
        self.create_in(tx, &task, None).await
    }

    /// [`start_in`](Self::start_in) at most once per `key`, as
    /// [`start_with_key`](Self::start_with_key): a second call with the
    /// same key returns the first task's id (waiting, if another
    /// transaction is creating it, for that one to end); a reused key with
    /// another input is [`Error::KeyReused`].
    pub async fn start_with_key_in<S: Saga>(
        &self,
        tx: &mut sqlx::PgTransaction<'_>,
        key: &str,
        input: S::Input,
    ) -> Result<TaskId, Error> {
        let task = self.new_task::<S>(keyed_id(S::NAME, key), &input)?;
        self.create_in(tx, &task, Some(key)).await
    }

    /// Publishes `msg` in `tx` to every registered process manager that
    /// handles its type; returns how many that is. The message is
    /// delivered once `tx` commits, and never if it rolls back.
    pub async fn publish_in<M: Message>(
        &self,
        tx: &mut sqlx::PgTransaction<'_>,
        msg: M,
    ) -> Result<usize, Error> {
        let message_id = uuid::Uuid::new_v4().to_string();
        let payload = serde_json::to_value(&msg)?;
        let items = self.published(&message_id, M::TYPE, &payload);
        if !items.is_empty() {
            self.postgres()?.enqueue_in(tx, &items).await?;
        }
        Ok(items.len())
    }

    async fn create_in(
        &self,
        tx: &mut sqlx::PgTransaction<'_>,
        task: &TaskInstance,
        key: Option<&str>,
    ) -> Result<TaskId, Error> {
        let first = QueueMessage {
            task_id: task.id,
            saga: task.saga.clone(),
            seq: 0,
        };
        match (self.postgres()?.create_in(tx, task, &first).await?, key) {
            (None, _) => {
                tracing::info!(task_id = %task.id, saga = %task.saga, "task started in the caller's transaction");
                if let Some(saga) = self.registered_name(&task.saga) {
                    crate::metrics::task_started(saga);
                }
                Ok(task.id)
            }
            (Some(existing), _) if existing.saga != task.saga => Err(Error::WrongSaga {
                task: task.id,
                expected: task.saga.clone(),
                actual: existing.saga,
            }),
            (Some(_), None) => Ok(task.id),
            (Some(existing), Some(_)) if existing.input == task.input => Ok(task.id),
            (Some(_), Some(key)) => Err(Error::KeyReused {
                key: key.to_owned(),
                task: task.id,
            }),
        }
    }

    /// The engine's backend as the PostgreSQL one, which a caller's
    /// transaction needs.
    fn postgres(&self) -> Result<&PostgresBackend, Error> {
        let backend: &dyn std::any::Any = &*self.rt.backend;
        backend.downcast_ref::<PostgresBackend>().ok_or_else(|| {
            Error::Config(
                "starting or publishing in a transaction needs the PostgreSQL backend \
                 (`.backend(PostgresBackend::connect_with(pool, config).await?)`)"
                    .to_owned(),
            )
        })
    }
}
