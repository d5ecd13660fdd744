//! Group commit: the writes of concurrent workers share one transaction,
//! and so one sync of the WAL to the disk.
//!
//! A sync costs milliseconds; the statements of a write, microseconds.
//! Committing each write on its own would hold the store to one write per
//! sync, however many workers wait. So a write runs inside a *group*: the
//! first write after a commit begins the group's transaction (`BEGIN
//! IMMEDIATE`); every write runs under a savepoint of its own within it,
//! so one that fails is rolled back alone; and a write returns only once
//! its group committed. The first of the group's writers to come back for
//! the connection commits the group. The connection's lock is fair (first
//! come, first served): the writers that queued for it while the previous
//! group synced have all joined this group by then, so a group holds
//! every write that arrived during one sync, and a lone writer waits for
//! nobody.
//!
//! What a returned write promises does not change: it is on the disk (under
//! `synchronous = FULL`), and a crash before its group's commit loses it
//! with the whole group, none of which had returned. A group whose commit
//! fails (a full disk, an I/O error), or that SQLite rolled back on its own
//! after a failed statement, fails every write in it with a transient
//! error; one whose caller stopped waiting is committed all the same. (A
//! `COMMIT` whose sync failed may still have reached the disk: its writers
//! were told it failed, as a network store's lost answer would.) Reads run
//! on the same connection, between writes, and see only what is on the
//! disk: a read commits the open group first ([`SqliteBackend::read`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use sqlx::sqlite::SqliteConnection;
use tokio::sync::{Mutex, OwnedMutexGuard};

use super::{failure, SqliteBackend};
use crate::backend::BackendError;

/// The connection, and what is open on it.
pub(super) struct Conn {
    pub(super) conn: SqliteConnection,
    /// The open group, if any: its transaction began (or its `BEGIN` may
    /// have run), and it has not committed.
    group: Option<Arc<Group>>,
    /// A write's savepoint may be open (a write dropped midway, or a
    /// statement that failed): rolled back on the connection's next use.
    in_write: bool,
    /// The open group must be rolled back whole (a write's savepoint could
    /// not be): every use tries until it is, and nothing of it commits.
    doomed: bool,
}

impl Conn {
    pub(super) fn new(conn: SqliteConnection) -> Arc<Mutex<Conn>> {
        Arc::new(Mutex::new(Conn {
            conn,
            group: None,
            in_write: false,
            doomed: false,
        }))
    }

    /// Whether a transaction is open on the connection: SQLite ends one on
    /// its own after some failures (a full disk, an I/O error, even in a
    /// read), which a group must not outlive.
    async fn in_transaction(&mut self) -> Result<bool, BackendError> {
        let mut handle = self.conn.lock_handle().await.map_err(failure)?;
        let raw = handle.as_raw_handle().as_ptr();
        // SAFETY: the locked handle gives this thread the connection alone
        // until it is dropped, and `sqlite3_get_autocommit` only reads it.
        Ok(unsafe { libsqlite3_sys::sqlite3_get_autocommit(raw) } == 0)
    }
}

/// One transaction that the writes of several workers share.
#[derive(Default)]
struct Group {
    /// The connection's `total_changes()` when the group began: whether it
    /// wrote (a group that wrote nothing syncs nothing, and is not
    /// counted). Changes a savepoint rolled back still count.
    changes: OnceLock<i64>,
    /// How its commit went, once it is over.
    done: OnceLock<Result<(), BackendError>>,
}

/// What the store counts of its writes.
#[derive(Default)]
pub(super) struct Counts {
    /// Writes that returned (each one savepoint).
    pub(super) writes: AtomicU64,
    /// Groups committed that changed something (under `FULL`, each one a
    /// sync of the WAL).
    pub(super) commits: AtomicU64,
}

/// A write: statements run on [`Tx::c`]; [`Tx::commit`] ends it. Dropped
/// without a commit, its savepoint is rolled back before the connection's
/// next use.
pub(super) struct Tx {
    conn: OwnedMutexGuard<Conn>,
    group: Arc<Group>,
    backend: SqliteBackend,
}

impl Tx {
    /// The connection the write is on.
    pub(super) fn c(&mut self) -> &mut SqliteConnection {
        &mut self.conn.conn
    }

    /// Ends the write, and returns once its group committed (a write that
    /// its guards refused, or that found what it reads, waits too: the
    /// state it read may be another write's of the same group, not yet on
    /// the disk).
    ///
    /// The end runs as a task of its own: a caller that stops waiting (a
    /// timeout, a dropped request) neither leaves its savepoint half ended
    /// nor its group open, seen by every read and lost by a crash however
    /// long it waited.
    pub(super) async fn commit(self) -> Result<(), BackendError> {
        let counts = self.backend.clone();
        let done = tokio::spawn(self.end())
            .await
            .unwrap_or_else(|e| Err(BackendError::unavailable(e)));
        if done.is_ok() {
            counts.shared.counts.writes.fetch_add(1, Ordering::Relaxed);
        }
        done
    }

    async fn end(self) -> Result<(), BackendError> {
        let Tx {
            mut conn,
            group,
            backend,
        } = self;
        sqlx::query("RELEASE w")
            .execute(&mut conn.conn)
            .await
            .map_err(failure)?;
        conn.in_write = false;
        drop(conn);
        backend.flush(&group).await
    }
}

impl SqliteBackend {
    /// The connection, for a read or to begin a write. A write left open
    /// is rolled back first (see [`Conn::in_write`]); if that cannot be
    /// done by its savepoint (SQLite itself rolled the whole transaction
    /// back after a full disk or an I/O error), the whole group is rolled
    /// back and fails.
    pub(super) async fn conn(&self) -> Result<OwnedMutexGuard<Conn>, BackendError> {
        let mut conn = self.shared.conn.clone().lock_owned().await;
        if conn.in_write && !conn.doomed {
            match sqlx::raw_sql("ROLLBACK TO w; RELEASE w")
                .execute(&mut conn.conn)
                .await
            {
                Ok(_) => conn.in_write = false,
                Err(e) => {
                    tracing::debug!(error = %e, "a write's savepoint would not roll back");
                    conn.doomed = true;
                }
            }
        }
        if conn.doomed {
            abandon(
                &mut conn,
                "a write in it failed and could not be undone alone",
            )
            .await?;
        }
        Ok(conn)
    }

    /// Begins a write, in the open group or a new one (whose `BEGIN
    /// IMMEDIATE` holds the write lock from its first statement: see the
    /// module documentation of the store).
    pub(super) async fn begin(&self) -> Result<Tx, BackendError> {
        self.write_on(self.conn().await?).await
    }

    /// Begins a write on `conn`, taken by [`conn`](Self::conn) to read
    /// first: what was read stays as it was until the write ends.
    pub(super) async fn write_on(
        &self,
        mut conn: OwnedMutexGuard<Conn>,
    ) -> Result<Tx, BackendError> {
        // A group whose transaction SQLite ended (after a failed statement,
        // a read's too) is over: a savepoint now would begin a transaction
        // of its own, which its `RELEASE` would commit alone.
        if conn.group.is_some() && !conn.in_transaction().await? {
            abandon(&mut conn, "SQLite rolled it back after a failed statement").await?;
        }
        let group = match &conn.group {
            Some(group) => group.clone(),
            None => {
                let group = Arc::new(Group::default());
                // Open from before its `BEGIN`: one whose answer was lost is
                // rolled back by the next use.
                conn.group = Some(group.clone());
                conn.in_write = true;
                sqlx::query("BEGIN IMMEDIATE")
                    .execute(&mut conn.conn)
                    .await
                    .map_err(failure)?;
                let changes = total_changes(&mut conn.conn).await?;
                let _ = group.changes.set(changes);
                group
            }
        };
        conn.in_write = true;
        sqlx::query("SAVEPOINT w")
            .execute(&mut conn.conn)
            .await
            .map_err(failure)?;
        Ok(Tx {
            conn,
            group,
            backend: self.clone(),
        })
    }

    /// Returns once `group` committed (committing it, if no other writer
    /// of it has yet), with how that went.
    async fn flush(&self, group: &Arc<Group>) -> Result<(), BackendError> {
        if let Some(done) = group.done.get() {
            return done.clone();
        }
        let conn = self.conn().await;
        if let Some(done) = group.done.get() {
            return done.clone();
        }
        // The group is open and doomed (its rollback did not go through
        // yet): none of it will commit.
        let mut conn = conn?;
        if !conn.group.as_ref().is_some_and(|g| Arc::ptr_eq(g, group)) {
            // Every way a group ends records how it went: unreachable.
            return Err(BackendError::unavailable("a write's group was lost"));
        }
        self.commit_group(&mut conn, group).await
    }

    /// The connection for a read, which sees only what is on the disk: a
    /// group still open is committed first (its writers are answered by
    /// that commit). A read on the one connection would see the open
    /// group's writes, and a caller could act on one that a crash before
    /// the commit takes back (a status `wait` returned, say, in a process
    /// that then exits).
    pub(super) async fn read(&self) -> Result<OwnedMutexGuard<Conn>, BackendError> {
        let mut conn = self.conn().await?;
        if let Some(group) = conn.group.clone() {
            // A failed commit is its writers' to hear: the group was
            // rolled back, and what is read is what is on the disk. One
            // that could not be rolled back fails the read.
            if let Err(e) = self.commit_group(&mut conn, &group).await {
                if conn.doomed {
                    return Err(e);
                }
            }
        }
        Ok(conn)
    }

    /// Commits `group`, the open one on `conn`, and records how it went.
    async fn commit_group(&self, conn: &mut Conn, group: &Arc<Group>) -> Result<(), BackendError> {
        let wrote = match (total_changes(&mut conn.conn).await, group.changes.get()) {
            (Ok(now), Some(then)) => now != *then,
            _ => true,
        };
        match sqlx::query("COMMIT").execute(&mut conn.conn).await {
            Ok(_) => {
                conn.group = None;
                if wrote {
                    self.shared.counts.commits.fetch_add(1, Ordering::Relaxed);
                }
                let _ = group.done.set(Ok(()));
                Ok(())
            }
            Err(e) => {
                let e = failure(e);
                conn.doomed = true;
                abandon(conn, &format!("its commit failed: {e}")).await?;
                Err(e)
            }
        }
    }
}

/// Rolls the open group back (it failed: `why`), and fails its writers with
/// a transient error saying so; marked [`doomed`](Conn::doomed) until the
/// rollback went through. SQLite may have ended the transaction on its own
/// already: then there is none to roll back, and that is no error.
async fn abandon(conn: &mut Conn, why: &str) -> Result<(), BackendError> {
    conn.doomed = true;
    match sqlx::query("ROLLBACK").execute(&mut conn.conn).await {
        Ok(_) => {}
        Err(e) if e.to_string().contains("no transaction is active") => {}
        // Perhaps still open: the next use tries again.
        Err(e) => return Err(failure(e)),
    }
    conn.doomed = false;
    conn.in_write = false;
    if let Some(group) = conn.group.take() {
        let _ = group.done.set(Err(BackendError::unavailable(format!(
            "the write's group of writes was rolled back: {why}"
        ))));
    }
    Ok(())
}

/// The rows the connection changed since it opened.
async fn total_changes(c: &mut SqliteConnection) -> Result<i64, BackendError> {
    sqlx::query_scalar("SELECT total_changes()")
        .fetch_one(c)
        .await
        .map_err(failure)
}
