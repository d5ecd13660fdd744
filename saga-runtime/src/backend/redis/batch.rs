//! Group commit of task writes.
//!
//! A busy engine has many tasks in flight, and every step ends in a task
//! write (`record_attempt`, `record_next`, `commit`). Sent one by one, each
//! write is a script call of its own, and on both sides most of its cost is
//! the call, not the work: the server parses the call and sets up the Lua
//! arguments, the client frames and routes the reply. So writes go through
//! one writer per backend, which sends a write at once when nothing is
//! waiting and, while [`IN_FLIGHT`] calls are on their way, gathers what
//! arrives into one call of `TASK_WRITES` (per partition: one call touches
//! one slot). Alone a write costs what it did; under load a call carries
//! many.
//!
//! Nothing about a write changes: each runs under `pcall` as its own script
//! would, with its own checks, and answers on its own. A write whose batch
//! is lost with the connection learns it as it would have alone (the
//! outcome is unknown, the caller treats it as a failed write).

use std::sync::{Arc, Mutex};

use redis::aio::ConnectionManager;
use redis::{ErrorKind, RedisError, Script, ToRedisArgs, Value};
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::scripts as s;
use super::unavailable;
use crate::backend::BackendError;

/// Batches on their way to Redis at once. One keeps the server busy while
/// the next batch gathers; more would only make batches smaller.
const IN_FLIGHT: usize = 2;

/// At most this many writes in one call: a call runs alone on the server,
/// and a long one holds every other client up.
const MAX_WRITES: usize = 64;

/// At most this many bytes of arguments in one call, for the same reason.
const MAX_BYTES: usize = 1 << 20;

/// Which task write (the function's index in `TASK_WRITES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TaskWrite {
    RecordAttempt = 1,
    RecordNext = 2,
    Commit = 3,
}

impl TaskWrite {
    fn script(self) -> &'static Script {
        match self {
            TaskWrite::RecordAttempt => &s::RECORD_ATTEMPT,
            TaskWrite::RecordNext => &s::RECORD_NEXT,
            TaskWrite::Commit => &s::COMMIT,
        }
    }
}

/// One task write: its script's keys and arguments.
pub(super) struct Write {
    kind: TaskWrite,
    /// The partition whose slot every key is in.
    partition: u16,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl Write {
    pub(super) fn new(kind: TaskWrite, partition: u16) -> Self {
        Write {
            kind,
            partition,
            keys: Vec::with_capacity(12),
            args: Vec::with_capacity(24),
        }
    }

    pub(super) fn key(mut self, key: impl ToRedisArgs) -> Self {
        self.keys.extend(key.to_redis_args());
        self
    }

    pub(super) fn arg(mut self, arg: impl ToRedisArgs) -> Self {
        self.args.extend(arg.to_redis_args());
        self
    }

    fn bytes(&self) -> usize {
        self.keys.iter().chain(&self.args).map(Vec::len).sum()
    }

    /// The write as a call of its own script.
    fn alone(&self) -> redis::ScriptInvocation<'static> {
        let mut call = self.kind.script().prepare_invoke();
        for key in &self.keys {
            call.key(key);
        }
        for arg in &self.args {
            call.arg(arg);
        }
        call
    }
}

struct Pending {
    write: Write,
    reply: oneshot::Sender<Result<Value, BackendError>>,
}

/// The writer of one backend: a task that sends what callers submit.
pub(super) struct Writer {
    conn: ConnectionManager,
    /// Started on first use, in the caller's runtime, and again if that
    /// runtime went away (a backend may outlive the runtime it was first
    /// used in, as in tests).
    queue: Mutex<Option<mpsc::UnboundedSender<Pending>>>,
}

impl Writer {
    pub(super) fn new(conn: ConnectionManager) -> Self {
        Writer {
            conn,
            queue: Mutex::new(None),
        }
    }

    /// Sends `write`, alone or with others; its reply (an error reply as
    /// an error).
    pub(super) async fn write(&self, write: Write) -> Result<Value, BackendError> {
        let (reply, answer) = oneshot::channel();
        self.submit(Pending { write, reply });
        answer
            .await
            .unwrap_or_else(|_| Err(lost("the writer stopped before answering")))
    }

    fn submit(&self, pending: Pending) {
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let pending = match queue.as_ref() {
            Some(q) => match q.send(pending) {
                Ok(()) => return,
                Err(mpsc::error::SendError(pending)) => pending,
            },
            None => pending,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(self.conn.clone(), rx));
        let _ = tx.send(pending);
        *queue = Some(tx);
    }
}

fn lost(why: &'static str) -> BackendError {
    BackendError::Unavailable(Arc::new(RedisError::from((ErrorKind::Io, why))))
}

/// The writer's loop: waits for a write, then for a free call, then takes
/// everything that arrived meanwhile.
async fn run(conn: ConnectionManager, mut queue: mpsc::UnboundedReceiver<Pending>) {
    let calls = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut held: Option<Pending> = None;
    loop {
        let first = match held.take() {
            Some(p) => p,
            None => match queue.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        let Ok(permit) = calls.clone().acquire_owned().await else {
            return;
        };
        let mut batch = vec![first];
        let mut bytes = batch[0].write.bytes();
        while batch.len() < MAX_WRITES && bytes < MAX_BYTES {
            match queue.try_recv() {
                Ok(p) if p.write.partition == batch[0].write.partition => {
                    bytes += p.write.bytes();
                    batch.push(p);
                }
                // Another slot: it starts the next call.
                Ok(p) => {
                    held = Some(p);
                    break;
                }
                Err(_) => break,
            }
        }
        let conn = conn.clone();
        tokio::spawn(async move {
            send(conn, batch).await;
            drop(permit);
        });
    }
}

async fn send(mut conn: ConnectionManager, batch: Vec<Pending>) {
    if batch.len() == 1 {
        let reply = alone(&mut conn, &batch[0].write).await;
        let _ = batch.into_iter().next().map(|p| p.reply.send(reply));
        return;
    }
    let mut call = s::TASK_WRITES.prepare_invoke();
    call.arg(batch.len());
    for p in &batch {
        call.arg(p.write.kind as u8)
            .arg(p.write.keys.len())
            .arg(p.write.args.len());
    }
    for p in &batch {
        for key in &p.write.keys {
            call.key(key);
        }
    }
    for p in &batch {
        for arg in &p.write.args {
            call.arg(arg);
        }
    }
    match call.invoke_async::<Value>(&mut conn).await {
        Ok(Value::Array(replies)) if replies.len() == batch.len() => {
            for (p, reply) in batch.into_iter().zip(replies) {
                let _ = p.reply.send(answer(reply));
            }
        }
        Ok(other) => {
            let error = BackendError::Corrupt(format!("a batch of task writes answered {other:?}"));
            for p in batch {
                let _ = p.reply.send(Err(error.clone()));
            }
        }
        // Refused as a whole before it ran (not a connection lost with
        // the outcome unknown): each write is sent alone, so that nothing
        // about one write can fail another.
        Err(e) if !is_transient(&e) => {
            for p in batch {
                let reply = alone(&mut conn, &p.write).await;
                let _ = p.reply.send(reply);
            }
        }
        Err(e) => {
            let error = unavailable(e);
            for p in batch {
                let _ = p.reply.send(Err(error.clone()));
            }
        }
    }
}

/// One write's reply in a batch: an error comes as {'error', message}.
fn answer(reply: Value) -> Result<Value, BackendError> {
    let Value::Array(items) = &reply else {
        return Ok(reply);
    };
    let message = match items.as_slice() {
        [Value::BulkString(tag), Value::BulkString(message)] if tag == b"error" => {
            String::from_utf8_lossy(message).into_owned()
        }
        _ => return Ok(reply),
    };
    let (code, detail) = message.split_once(' ').unwrap_or((&message, ""));
    Err(unavailable(redis::make_extension_error(
        code.to_owned(),
        Some(detail.to_owned()),
    )))
}

async fn alone(conn: &mut ConnectionManager, write: &Write) -> Result<Value, BackendError> {
    write
        .alone()
        .invoke_async::<Value>(conn)
        .await
        .and_then(Value::extract_error)
        .map_err(unavailable)
}

fn is_transient(e: &RedisError) -> bool {
    matches!(unavailable(e.clone()), BackendError::Unavailable(_))
}
