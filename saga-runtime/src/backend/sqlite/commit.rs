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
//! fails (a full disk, an I/O error) fails every write in it. Reads run on
//! the same connection, between writes: they see the newest writes,
//! including those of a group whose commit is still under way.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use sqlx::sqlite::SqliteConnection;
use tokio::sync::MutexGuard;

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
}

impl Conn {
    pub(super) fn new(conn: SqliteConnection) -> Self {
        Conn {
            conn,
            group: None,
            in_write: false,
        }
    }
}

/// One transaction that the writes of several workers share.
#[derive(Default)]
struct Group {
    /// The connection's `total_changes()` when the group began: whether it
    /// wrote (a group that wrote nothing syncs nothing, and is not
    /// counted).
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
pub(super) struct Tx<'a> {
    conn: MutexGuard<'a, Conn>,
    group: Arc<Group>,
    backend: &'a SqliteBackend,
}

impl Tx<'_> {
    /// The connection the write is on.
    pub(super) fn c(&mut self) -> &mut SqliteConnection {
        &mut self.conn.conn
    }

    /// Ends the write, and returns once its group committed (a write that
    /// its guards refused waits too: the state it read may be another
    /// write's of the same group, not yet on the disk).
    pub(super) async fn commit(mut self) -> Result<(), BackendError> {
        sqlx::query("RELEASE w")
            .execute(self.c())
            .await
            .map_err(failure)?;
        self.conn.in_write = false;
        let Tx {
            conn,
            group,
            backend,
        } = self;
        drop(conn);
        // The group commits even if this caller stops waiting (a timeout,
        // a dropped request): a write left in an open transaction would be
        // seen by every read and lost by a crash, however long it waited.
        let flushing = {
            let backend = backend.clone();
            tokio::spawn(async move { backend.flush(&group).await })
        };
        let done = flushing
            .await
            .unwrap_or_else(|e| Err(BackendError::unavailable(e)));
        if done.is_ok() {
            backend.shared.counts.writes.fetch_add(1, Ordering::Relaxed);
        }
        done
    }
}

impl SqliteBackend {
    /// The connection, for a read or to begin a write. A write left open
    /// is rolled back first (see [`Conn::in_write`]); if that cannot be
    /// done by its savepoint (SQLite itself rolled the whole transaction
    /// back after a full disk or an I/O error), the whole group is rolled
    /// back and fails.
    pub(super) async fn conn(&self) -> Result<MutexGuard<'_, Conn>, BackendError> {
        let mut conn = self.shared.conn.lock().await;
        if conn.in_write {
            let undone = sqlx::raw_sql("ROLLBACK TO w; RELEASE w")
                .execute(&mut conn.conn)
                .await;
            conn.in_write = false;
            if let Err(e) = undone {
                abandon(&mut conn, failure(e)).await?;
            }
        }
        Ok(conn)
    }

    /// Begins a write, in the open group or a new one (whose `BEGIN
    /// IMMEDIATE` holds the write lock from its first statement: see the
    /// module documentation of the store).
    pub(super) async fn begin(&self) -> Result<Tx<'_>, BackendError> {
        self.write_on(self.conn().await?).await
    }

    /// Begins a write on `conn`, taken by [`conn`](Self::conn) to read
    /// first: what was read stays as it was until the write ends.
    pub(super) async fn write_on<'a>(
        &'a self,
        mut conn: MutexGuard<'a, Conn>,
    ) -> Result<Tx<'a>, BackendError> {
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
            backend: self,
        })
    }

    /// Returns once `group` committed (committing it, if no other writer
    /// of it has yet), with how that went.
    async fn flush(&self, group: &Arc<Group>) -> Result<(), BackendError> {
        if let Some(done) = group.done.get() {
            return done.clone();
        }
        let mut conn = self.conn().await?;
        if let Some(done) = group.done.get() {
            return done.clone();
        }
        if !conn.group.as_ref().is_some_and(|g| Arc::ptr_eq(g, group)) {
            // Every way a group ends records how it went: unreachable.
            return Err(BackendError::unavailable("a write's group was lost"));
        }
        let wrote = match (total_changes(&mut conn.conn).await, group.changes.get()) {
            (Ok(now), Some(then)) => now != *then,
            _ => true,
        };
        let done = sqlx::query("COMMIT")
            .execute(&mut conn.conn)
            .await
            .map(|_| ())
            .map_err(failure);
        match &done {
            Ok(()) => {
                conn.group = None;
                let _ = group.done.set(Ok(()));
                if wrote {
                    self.shared.counts.commits.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) => abandon(&mut conn, e.clone()).await?,
        }
        done
    }
}

/// Rolls the open group back after `why`, and fails its writers with it.
/// SQLite may have ended the transaction on its own already: then there is
/// none to roll back, and that is no error.
async fn abandon(conn: &mut Conn, why: BackendError) -> Result<(), BackendError> {
    match sqlx::query("ROLLBACK").execute(&mut conn.conn).await {
        Ok(_) => {}
        Err(e) if e.to_string().contains("no transaction is active") => {}
        // Perhaps still open: the next use tries again.
        Err(e) => {
            conn.in_write = true;
            return Err(failure(e));
        }
    }
    if let Some(group) = conn.group.take() {
        let _ = group.done.set(Err(why));
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
