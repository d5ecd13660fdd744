//! The SQLite backend (feature `sqlite`, on sqlx with SQLite bundled): a
//! durable store in one file, for one process, with no server to run. A
//! service that ships as one binary, an edge device, a CLI tool, a
//! laptop: a crash loses nothing, the tasks resume when the process
//! starts again.
//!
//! - **One process owns the file.** The connection takes SQLite's
//!   exclusive lock (`locking_mode = EXCLUSIVE`) and keeps it: a second
//!   process opening the file is refused at open, with an error saying
//!   so, rather than left to race the first (leases and fencing between
//!   processes are what the Redis and PostgreSQL stores are for). Within
//!   the process, any number of workers and engines share the backend.
//! - **A restart resumes at once**: opening the file hands back what the
//!   process before still held (taken messages, task leases), since only
//!   one process holds a file and that one is gone.
//! - **Durable when a write returns**: WAL with `synchronous = FULL` by
//!   default, so a committed write survives a crash of the process and of
//!   the machine. [`Synchronous::Normal`] is faster and survives a crash
//!   of the process, but a power loss can take the last commits back (the
//!   file stays consistent): a task may then run a step again.
//! - **Every write is atomic, and concurrent writes share a commit**: a
//!   write runs under a savepoint of its own inside the `BEGIN IMMEDIATE`
//!   transaction of its group, its guards read and its effects applied
//!   there, and returns once its group committed (group commit: see
//!   `commit.rs`). A deferred transaction that read before it wrote could
//!   fail with `SQLITE_BUSY` under load; an immediate one holds the write
//!   lock from its first statement.
//! - The schema is a checksummed history of migrations embedded in the
//!   crate (`migrations/*.sql`), as PostgreSQL's: a file written by a
//!   newer version of this library, or one whose history differs, is
//!   refused at open, and a file that is not this library's is refused
//!   before anything is written to it.
//! - Times are this host's clock, in milliseconds since the Unix epoch.
//!
//! This backend is the core a saga engine needs (tasks, the work queue,
//! dead letters, retention), flow-control limits (decided by the limit
//! machine inside the write transaction), and named leases and shared
//! circuit breakers (kept in the process, which alone can hold the file:
//! they go with it, as their holders do); process managers need a store
//! with [`ProcessBackend`](super::ProcessBackend) (memory, Redis,
//! PostgreSQL) for now, and an engine that registers one on this store
//! says so when it is built.
//!
//! Files mirror the seam's: `tasks`, `queue`, `dead_letters`,
//! `housekeeping`, `limits`; `write` (the write vocabulary's
//! interpreter), `commit` (group commit), `migrate` (the migrator), `open`
//! (the file and its settings).

mod commit;
mod dead_letters;
mod housekeeping;
mod limits;
mod migrate;
mod open;
mod queue;
mod tasks;
mod write;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{broadcast, Mutex, Notify};

use commit::{Conn, Counts, Tx};

use super::memory::MemoryBackend;
use super::{Backend, BackendError, Breakers, Leases, Limits};
use crate::model::task::TaskId;

pub use migrate::SCHEMA_VERSION;

/// How hard a commit waits for the disk (SQLite's `synchronous` in WAL
/// mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// Every commit is on the disk when it returns (the default): a crash
    /// of the process or the machine, or a power loss, keeps every write
    /// that returned.
    #[default]
    Full,
    /// Commits reach the disk at checkpoints: a crash of the process keeps
    /// every write, but a power loss or a crash of the machine can take
    /// the last ones back (the file stays consistent). A step whose
    /// completion was taken back runs again.
    Normal,
}

/// Settings of a [`SqliteBackend`].
#[derive(Debug, Clone)]
pub struct SqliteConfig {
    /// A delivered message not settled within this is delivered again
    /// (default 15 s). Running steps keep their message; task leases
    /// default to it too.
    pub visibility_timeout: Duration,
    /// Dead-lettered payloads keep at most this many bytes (default
    /// 256 KiB).
    pub dead_letter_payload_limit: usize,
    /// How hard a commit waits for the disk (default [`Synchronous::Full`]).
    pub synchronous: Synchronous,
    /// Create the file (and its schema) when it does not exist (default
    /// `true`); `false`: a missing file is an error, for a tool that must
    /// not create one by a typo (`sagactl`).
    pub create: bool,
}

impl Default for SqliteConfig {
    fn default() -> Self {
        SqliteConfig {
            visibility_timeout: Duration::from_secs(15),
            dead_letter_payload_limit: 256 * 1024,
            synchronous: Synchronous::Full,
            create: true,
        }
    }
}

/// A store in one SQLite file. Cheap to clone: clones share the file's one
/// connection.
#[derive(Clone)]
pub struct SqliteBackend {
    shared: Arc<Shared>,
}

struct Shared {
    /// The one connection, which holds the file's exclusive lock.
    conn: Arc<Mutex<Conn>>,
    /// Something was put on the queue (or handed back).
    queue_changed: Notify,
    /// A task was written.
    task_changed: Notify,
    cancels: broadcast::Sender<TaskId>,
    config: SqliteConfig,
    path: PathBuf,
    /// What it counts of its writes.
    counts: Counts,
    /// Named leases and shared circuit breakers: the process's own, as the
    /// in-memory store keeps them. Only this process can hold the file, so
    /// only its engines can hold a lease or trip a breaker; both are gone
    /// with the process, as every holder is (a restarted process owes a
    /// crashed one's timer poller nothing, and breakers start closed).
    in_process: Arc<MemoryBackend>,
}

impl std::fmt::Debug for SqliteBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteBackend")
            .field("path", &self.shared.path)
            .finish_non_exhaustive()
    }
}

impl SqliteBackend {
    /// Opens (or creates) the store in the file at `path`, with the
    /// default settings.
    pub async fn open(path: impl Into<PathBuf>) -> Result<Self, BackendError> {
        SqliteBackend::open_with(path, SqliteConfig::default()).await
    }

    /// Opens the store at a `sqlite://path` URL (`sqlite:///abs/path` or
    /// `sqlite://relative/path`), with the default settings.
    pub async fn connect(url: &str) -> Result<Self, BackendError> {
        SqliteBackend::connect_with(url, SqliteConfig::default()).await
    }

    /// Opens the store at a `sqlite://path` URL with `config`.
    pub async fn connect_with(url: &str, config: SqliteConfig) -> Result<Self, BackendError> {
        SqliteBackend::open_with(open::path_of(url)?, config).await
    }

    /// Opens (or creates) the store in the file at `path` with `config`:
    /// takes the file's exclusive lock, checks that it is this library's
    /// (or empty) and migrates its schema.
    pub async fn open_with(
        path: impl Into<PathBuf>,
        config: SqliteConfig,
    ) -> Result<Self, BackendError> {
        let path = path.into();
        let conn = open::connection(&path, &config).await?;
        Ok(SqliteBackend {
            shared: Arc::new(Shared {
                conn: Conn::new(conn),
                queue_changed: Notify::new(),
                task_changed: Notify::new(),
                cancels: broadcast::channel(1024).0,
                config,
                path,
                counts: Counts::default(),
                in_process: Arc::new(MemoryBackend::new()),
            }),
        })
    }

    /// How many transactions that changed something this store committed
    /// since it opened: under [`Synchronous::Full`] each is a sync of the
    /// WAL to the disk, and holds the writes of every worker that wrote
    /// meanwhile (group commit: see [`writes`](Self::writes)). What the
    /// benchmark reports per step, and a test holds to a count.
    pub fn commits(&self) -> u64 {
        self.shared.counts.commits.load(Ordering::Relaxed)
    }

    /// How many writes returned since the store opened (each one atomic,
    /// in the transaction of its group; a write its guards refused, or
    /// that changed nothing, counts here and commits nothing): with one
    /// worker, about as many as [`commits`](Self::commits); with many,
    /// more.
    pub fn writes(&self) -> u64 {
        self.shared.counts.writes.load(Ordering::Relaxed)
    }

    /// The file this store is in.
    pub fn path(&self) -> &std::path::Path {
        &self.shared.path
    }

    fn queue_changed(&self) {
        self.shared.queue_changed.notify_waiters();
    }

    fn task_changed(&self) {
        self.shared.task_changed.notify_waiters();
    }
}

/// The saga core, flow-control limits, named leases and shared breakers
/// (see the module documentation).
impl Backend for SqliteBackend {
    fn limits(self: Arc<Self>) -> Option<Arc<dyn Limits>> {
        Some(self)
    }

    fn leases(self: Arc<Self>) -> Option<Arc<dyn Leases>> {
        Some(self.shared.in_process.clone())
    }

    fn breakers(self: Arc<Self>) -> Option<Arc<dyn Breakers>> {
        Some(self.shared.in_process.clone())
    }
}

/// This host's time, in milliseconds since the Unix epoch.
fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `d` in milliseconds, saturating.
fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// What a failed statement means for the caller: a full disk, a file made
/// read-only or a busy file are transient (the same write may succeed
/// once an operator acted); a corrupt file is corrupt; anything else is a
/// refusal.
fn failure(error: sqlx::Error) -> BackendError {
    let code = match &error {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
        sqlx::Error::Io(_) => return BackendError::unavailable(error),
        // The connection's thread is gone, and with it the file's lock:
        // nothing this store does can succeed again (reopen the store).
        sqlx::Error::WorkerCrashed => return BackendError::Rejected(Arc::new(error)),
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => {
            return BackendError::Corrupt(error.to_string());
        }
        _ => None,
    };
    let extended = code.as_deref().and_then(|c| c.parse::<i32>().ok());
    // SQLITE_READONLY_DBMOVED: the file was deleted or renamed under the
    // store; waiting will not bring it back.
    if extended == Some(1032) {
        return BackendError::Rejected(Arc::new(error));
    }
    // The primary result code is the low byte of the extended one.
    let primary = extended.map(|c| c & 0xff);
    match primary {
        // SQLITE_CORRUPT, SQLITE_NOTADB.
        Some(11 | 26) => BackendError::Corrupt(error.to_string()),
        // SQLITE_BUSY, SQLITE_LOCKED, SQLITE_NOMEM, SQLITE_READONLY,
        // SQLITE_IOERR, SQLITE_FULL, SQLITE_CANTOPEN.
        Some(5 | 6 | 7 | 8 | 10 | 13 | 14) => BackendError::unavailable(error),
        _ => BackendError::Rejected(Arc::new(error)),
    }
}

/// A stored value that does not read.
fn corrupt(error: impl std::fmt::Display) -> BackendError {
    BackendError::Corrupt(error.to_string())
}
