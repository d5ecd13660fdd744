//! Opening the file: its path from a URL, the connection's settings, the
//! exclusive lock, and the refusals of what is not this library's store.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqliteLockingMode, SqliteSynchronous};
use sqlx::ConnectOptions;

use super::{failure, migrate, SqliteConfig, Synchronous};
use crate::backend::BackendError;

/// The path a `sqlite://` URL names: `sqlite:///abs/path.db` or
/// `sqlite://relative/path.db`.
pub(super) fn path_of(url: &str) -> Result<PathBuf, BackendError> {
    let bad = |why: &str| {
        BackendError::Misconfigured(format!(
            "`{url}` is not a SQLite store's URL: {why} (expected sqlite://path/to/file.db, or \
             sqlite:///absolute/path.db)"
        ))
    };
    let path = url
        .strip_prefix("sqlite://")
        .ok_or_else(|| bad("it does not start with sqlite://"))?;
    if path.is_empty() {
        return Err(bad("it names no file"));
    }
    if path.contains('?') {
        return Err(bad(
            "it has settings (`?..`): set them in `SqliteConfig` and open with \
             `SqliteBackend::open_with`",
        ));
    }
    if path == ":memory:" {
        return Err(bad(
            "an in-memory SQLite database is lost with the process: use the in-memory backend for \
             that (no URL, or `Engine::builder()` without a backend)",
        ));
    }
    Ok(PathBuf::from(path))
}

/// The one connection to the file at `path`: created when allowed, in WAL
/// mode with the exclusive lock taken, checked to be this library's store
/// (or empty) and migrated.
pub(super) async fn connection(
    path: &Path,
    config: &SqliteConfig,
) -> Result<SqliteConnection, BackendError> {
    if !config.create && !path.exists() {
        return Err(BackendError::Misconfigured(format!(
            "there is no store at `{}`: check the path (this tool does not create one)",
            path.display()
        )));
    }
    warn_if_remote(path);
    // What SQLite says of a file it cannot write is an I/O error at best:
    // once it failed, the directory is asked why.
    prepared(path, config)
        .await
        .map_err(|e| unwritable(path).unwrap_or(e))
}

/// [`connection`]'s work: connect, refuse what is not this library's,
/// WAL, migrate, hand back what a dead process held.
async fn prepared(path: &Path, config: &SqliteConfig) -> Result<SqliteConnection, BackendError> {
    let options = SqliteConnectOptions::from_str("sqlite://")
        .map_err(failure)?
        .filename(path)
        .create_if_missing(config.create)
        // Held from the first write until the connection closes: a second
        // process cannot open the file behind this one's back. (WAL is set
        // below, once the file is known to be this library's: switching
        // the journal mode writes to the file.)
        .locking_mode(SqliteLockingMode::Exclusive)
        .synchronous(match config.synchronous {
            Synchronous::Full => SqliteSynchronous::Full,
            Synchronous::Normal => SqliteSynchronous::Normal,
        })
        .foreign_keys(false)
        // Only another process waits for the lock (this one has one
        // connection): not for long.
        .busy_timeout(Duration::from_secs(1));
    let mut conn = options.connect().await.map_err(|e| opening(path, e))?;
    // Reads only: a file of another program's is refused untouched.
    migrate::refuse_foreign(&mut conn, path)
        .await
        .map_err(|e| match e {
            BackendError::Unavailable(e) if text_of_lock(&e.to_string()) => {
                in_use(path, &e.to_string())
            }
            BackendError::Corrupt(text) => not_a_database(path, &text),
            other => other,
        })?;
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode = WAL")
        .fetch_one(&mut conn)
        .await
        .map_err(|e| opening(path, e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(BackendError::Misconfigured(format!(
            "`{}` cannot be put in WAL mode (it stays in `{mode}`): keep the store on a local \
             disk that allows its `-wal` and `-shm` files beside it",
            path.display()
        )));
    }
    // The exclusive lock is taken by the first write: take it now, so that
    // a second process is refused at open rather than at its first write.
    sqlx::raw_sql("BEGIN IMMEDIATE; COMMIT")
        .execute(&mut conn)
        .await
        .map_err(|e| opening(path, e))?;
    migrate::prepare(&mut conn, path).await?;
    release_the_dead(&mut conn).await?;
    Ok(conn)
}

/// Hands back what the process that held the file before this one still
/// held when it ended: the messages it had taken and the task leases it
/// had. One process owns a file, and this one has just taken it, so that
/// one is gone (killed, crashed, or stopped without settling): its work
/// resumes now, not a visibility timeout later. Each message keeps its
/// delivery count, so one that kills every process that takes it still
/// reaches its cap and is dead-lettered.
async fn release_the_dead(conn: &mut SqliteConnection) -> Result<(), BackendError> {
    sqlx::raw_sql(
        "BEGIN IMMEDIATE; \
         UPDATE queue SET taken = 0, due_ms = MIN(due_ms, since_ms) WHERE taken = 1; \
         UPDATE tasks SET lock_token = NULL, lock_until = NULL WHERE lock_token IS NOT NULL; \
         COMMIT",
    )
    .execute(&mut *conn)
    .await
    .map_err(failure)?;
    Ok(())
}

/// Whether a failure's text is SQLite's for a file another connection
/// holds.
fn text_of_lock(text: &str) -> bool {
    text.contains("locked")
}

fn in_use(path: &Path, why: &str) -> BackendError {
    BackendError::Misconfigured(format!(
        "`{}` is open in another process: a SQLite store belongs to one process (it holds the \
         file's exclusive lock); stop the other one, or give this one a file of its own ({why})",
        path.display()
    ))
}

fn not_a_database(path: &Path, why: &str) -> BackendError {
    BackendError::Misconfigured(format!(
        "`{}` is not a SQLite database (or it is damaged): point the store at a file of its own, \
         or restore this one from a backup ({why})",
        path.display()
    ))
}

/// What a failure to open `path` means, in words: another process has
/// it, it is not a database, or it cannot be opened or written where it
/// is (a missing directory, permissions, a read-only filesystem).
fn opening(path: &Path, error: sqlx::Error) -> BackendError {
    let code = match &error {
        sqlx::Error::Database(db) => db.code().and_then(|c| c.parse::<i32>().ok()),
        _ => None,
    };
    let text = error.to_string();
    match code.map(|c| c & 0xff) {
        // SQLITE_PERM, SQLITE_READONLY, SQLITE_CANTOPEN.
        Some(3 | 8 | 14) => {
            return BackendError::Misconfigured(format!(
                "`{}` cannot be opened for writing: check that its directory exists and that \
                 this process may write there and to the file ({text})",
                path.display()
            ))
        }
        // SQLITE_BUSY, SQLITE_LOCKED.
        Some(5 | 6) => return in_use(path, &text),
        // SQLITE_CORRUPT, SQLITE_NOTADB.
        Some(11 | 26) => return not_a_database(path, &text),
        _ => {}
    }
    failure(error)
}

/// Why the store cannot write where `path` is (a read-only file system,
/// a directory this process may not write to), if that is why it failed
/// to open: asked by creating and removing a file of its own beside it.
/// Never by opening the store's file itself: closing any descriptor of a
/// file drops every POSIX lock the process holds on it, the lock of a
/// store already open on it included (SQLite's "how to corrupt", 2.2).
fn unwritable(path: &Path) -> Option<BackendError> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let probe = dir.join(format!(".saga-write-probe-{}", std::process::id()));
    let created = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe);
    let why = match created {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            return None;
        }
        Err(e) if e.kind() == std::io::ErrorKind::ReadOnlyFilesystem => {
            "it is on a read-only file system: mount it writable, or copy the file to a \
             writable disk"
        }
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            "this process may not write to its directory: give it write permission there and \
             on the file"
        }
        Err(_) => return None,
    };
    Some(BackendError::Misconfigured(format!(
        "`{}` cannot be written: {why} (the store writes to it, and keeps `-wal` and `-shm` \
         files beside it)",
        path.display()
    )))
}

/// Warns when `path` is on a network filesystem, whose locks SQLite cannot
/// trust: two hosts could both believe they hold the file, and corrupt it.
fn warn_if_remote(path: &Path) {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let Ok(dir) = dir.canonicalize() else { return };
    let Ok(mounts) = std::fs::read_to_string("/proc/mounts") else {
        return;
    };
    let mount = mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let (_, at, kind) = (fields.next()?, fields.next()?, fields.next()?);
            dir.starts_with(at).then_some((at.len(), kind))
        })
        .max_by_key(|(len, _)| *len);
    const REMOTE: [&str; 9] = [
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "9p",
        "ceph",
        "glusterfs",
        "fuse.sshfs",
    ];
    if let Some((_, kind)) = mount.filter(|(_, kind)| REMOTE.contains(kind)) {
        tracing::warn!(
            path = %path.display(),
            filesystem = kind,
            "the SQLite store is on a network filesystem, whose locks SQLite cannot rely on: keep \
             it on a local disk (or run PostgreSQL)"
        );
    }
}
