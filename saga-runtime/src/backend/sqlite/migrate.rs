//! The file's schema as a history of migrations embedded in the crate,
//! applied in order in the transaction that records them, decided by the
//! same plan as PostgreSQL's (`backend/schema_history.rs`): a file of a
//! newer build, or whose history differs from this build's, is refused.

use std::path::Path;

use sqlx::sqlite::SqliteConnection;
use sqlx::Row;

use super::{failure, now_ms};
use crate::backend::schema_history::{self, Applied, Migration, Plan};
use crate::backend::BackendError;

/// The migrations. A released migration is history: never edited, a
/// change is a new one (the test `released_migrations_are_never_edited`
/// pins the checksum each was released with).
pub(super) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "core",
        sql: include_str!("migrations/0001_core.sql"),
    },
    Migration {
        version: 2,
        name: "receipts",
        sql: include_str!("migrations/0002_receipts.sql"),
    },
];

/// The schema version this library writes: the newest migration.
pub const SCHEMA_VERSION: i32 = 2;

/// The history table (a name no application table is likely to have).
const HISTORY: &str = "saga_schema_history";

/// Checks the file's history and applies what it lacks.
pub(super) async fn prepare(conn: &mut SqliteConnection, path: &Path) -> Result<(), BackendError> {
    let store = format!("the store at `{}`", path.display());
    let applied = history(conn, &store).await?;
    match schema_history::plan(MIGRATIONS, &applied, &store) {
        Plan::Current => Ok(()),
        Plan::Newer { newest } => Err(BackendError::Misconfigured(format!(
            "{store} is at schema version {newest}, written by a newer version of this library \
             than this one (which knows up to {SCHEMA_VERSION}): upgrade this program, or give it \
             a file of its own"
        ))),
        Plan::Diverged(text) => Err(BackendError::Misconfigured(text)),
        Plan::Migrate { from, .. } => run(conn, from).await,
    }
}

/// Refuses, by reading only, a file that holds another program's tables
/// (or that is not a database: its first read fails).
pub(super) async fn refuse_foreign(
    conn: &mut SqliteConnection,
    path: &Path,
) -> Result<(), BackendError> {
    history(conn, &format!("the store at `{}`", path.display()))
        .await
        .map(drop)
}

/// What the file applied; empty for a new file. A file that holds tables
/// but no history is another program's, and refused.
async fn history(conn: &mut SqliteConnection, store: &str) -> Result<Vec<Applied>, BackendError> {
    let tables: Vec<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table'")
            .fetch_all(&mut *conn)
            .await
            .map_err(failure)?;
    if !tables.iter().any(|t| t == HISTORY) {
        let theirs: Vec<&String> = tables
            .iter()
            .filter(|t| !t.starts_with("sqlite_"))
            .collect();
        return match theirs.is_empty() {
            true => Ok(Vec::new()),
            false => Err(BackendError::Misconfigured(format!(
                "{store} holds tables that are not this library's ({}): give the store a file \
                 of its own",
                theirs
                    .iter()
                    .take(5)
                    .map(|t| t.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        };
    }
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT version, name, checksum FROM {HISTORY} ORDER BY version"
    )))
    .fetch_all(&mut *conn)
    .await
    .map_err(failure)?;
    rows.iter()
        .map(|row| {
            Ok(Applied {
                version: row.try_get(0).map_err(super::corrupt)?,
                name: row.try_get(1).map_err(super::corrupt)?,
                checksum: row.try_get(2).map_err(super::corrupt)?,
            })
        })
        .collect()
}

/// Applies the migrations after `from`, all in one transaction with the
/// rows that record them.
async fn run(conn: &mut SqliteConnection, from: i32) -> Result<(), BackendError> {
    let mut script = format!(
        "BEGIN IMMEDIATE;\nCREATE TABLE IF NOT EXISTS {HISTORY} (version INTEGER PRIMARY KEY, \
         name TEXT NOT NULL, checksum TEXT NOT NULL, applied_ms INTEGER NOT NULL) STRICT;\n"
    );
    for m in MIGRATIONS.iter().filter(|m| m.version > from) {
        script.push_str(m.sql);
        script.push_str(&format!(
            "\n;INSERT INTO {HISTORY} (version, name, checksum, applied_ms) VALUES ({}, '{}', \
             '{}', {});\n",
            m.version,
            m.name,
            m.checksum(),
            now_ms()
        ));
    }
    script.push_str("COMMIT;");
    let done = sqlx::raw_sql(sqlx::AssertSqlSafe(script))
        .execute(&mut *conn)
        .await;
    if let Err(e) = done {
        let _ = sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await;
        return Err(failure(e));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A released migration is never edited: its checksum is pinned here.
    /// A change to the schema is a new migration.
    #[test]
    fn released_migrations_are_never_edited() {
        let pinned = [
            "9c611e8aea7f1b9b49873e713468c635677db0a3e897a7cab8da222a289950a0",
            "b6635361bb7085aec9a3fbb25bb445c11003207c87e24d03be7e05d484fd18fe",
        ];
        for (m, pin) in MIGRATIONS.iter().zip(pinned) {
            assert_eq!(
                m.checksum(),
                pin,
                "migration {} ({}) was edited",
                m.version,
                m.name
            );
        }
        assert_eq!(MIGRATIONS.len(), pinned.len());
        assert_eq!(MIGRATIONS.last().map(|m| m.version), Some(SCHEMA_VERSION));
    }
}
