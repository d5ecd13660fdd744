//! The schema's versions, embedded in the crate and applied in order, one
//! migrator at a time (an advisory lock), each in the transaction that
//! records it: a deployment upgrades in place as its engines start, and an
//! engine older than the schema it finds refuses to run rather than write
//! what the newer one would misread.
//!
//! The SQL names the schema and the notification channels with
//! placeholders (`{schema}`, `{channel}`, ...), filled in here: the schema
//! is a setting, so the migrations cannot be plain files for a generic
//! migrator.

use sqlx::postgres::{PgConnection, PgPool};

use super::{failure, privileges};
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
        name: "process",
        sql: include_str!("migrations/0002_process.sql"),
    },
    Migration {
        version: 3,
        name: "coordination",
        sql: include_str!("migrations/0003_coordination.sql"),
    },
    Migration {
        version: 4,
        name: "limits",
        sql: include_str!("migrations/0004_limits.sql"),
    },
    Migration {
        version: 5,
        name: "early_messages",
        sql: include_str!("migrations/0005_early_messages.sql"),
    },
    Migration {
        version: 6,
        name: "commit_waits",
        sql: include_str!("migrations/0006_commit_waits.sql"),
    },
    Migration {
        version: 7,
        name: "task_write",
        sql: include_str!("migrations/0007_task_write.sql"),
    },
];

/// The schema version this library writes: the newest migration.
pub const SCHEMA_VERSION: i32 = 7;

/// `schema` checked and quoted for SQL. Lower-case letters, digits and
/// `_` only: the name is also part of the notification channels'.
pub(super) fn quoted_schema(schema: &str) -> Result<String, BackendError> {
    let valid = !schema.is_empty()
        && schema.len() <= 48
        && schema.starts_with(|c: char| c.is_ascii_lowercase())
        && schema
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if schema == "public" || schema == "information_schema" || schema.starts_with("pg_") {
        return Err(BackendError::Misconfigured(format!(
            "`{schema}` is a schema of the database's own or of the application's: the engine's \
             tables and functions would sit next to them, and a migration would replace \
             functions of theirs with its own names; give the engine a schema of its own \
             (`PostgresConfig::schema`, sagactl's `--prefix`; default `saga`)"
        )));
    }
    match valid {
        true => Ok(format!("\"{schema}\"")),
        false => Err(BackendError::Misconfigured(format!(
            "`{schema}` is not a schema name this backend uses: lower-case letters, digits and `_`, \
             starting with a letter, at most 48 characters"
        ))),
    }
}

/// The notification channel `what` of `schema`.
pub(super) fn channel(schema: &str, what: &str) -> String {
    format!("{schema}_{what}")
}

/// A migration's SQL for `schema`.
fn filled(sql: &str, schema: &str) -> Result<String, BackendError> {
    Ok(sql
        .replace("{schema}", &quoted_schema(schema)?)
        .replace("{channel}", &channel(schema, "work"))
        .replace("{finished}", &channel(schema, "finished"))
        .replace("{cancellations}", &channel(schema, "cancel"))
        .replace("{timers}", &channel(schema, "timers"))
        .replace("{endpoints}", &channel(schema, "endpoints")))
}

/// What `schema` has applied, in order; `None` when it holds no
/// deployment. A deployment migrated before checksums were kept reads
/// with none.
async fn history(
    conn: &mut PgConnection,
    schema: &str,
) -> Result<Option<Vec<Applied>>, BackendError> {
    let q = quoted_schema(schema)?;
    let Some(checksums) = recorded_checksums(conn, &q).await? else {
        return Ok(None);
    };
    let checksum = if checksums { "checksum" } else { "NULL::text" };
    let rows: Vec<(i32, String, Option<String>)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT version, name, {checksum} FROM {q}.schema_version ORDER BY version"
    )))
    .fetch_all(&mut *conn)
    .await
    .map_err(failure)?;
    Ok(Some(
        rows.into_iter()
            .map(|(version, name, checksum)| Applied {
                version,
                name,
                checksum,
            })
            .collect(),
    ))
}

/// Whether the history table of `q` (quoted) records checksums; `None`
/// when there is no history table.
async fn recorded_checksums(
    conn: &mut PgConnection,
    q: &str,
) -> Result<Option<bool>, BackendError> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_attribute
                         WHERE attrelid = to_regclass($1) AND attname = 'checksum'
                           AND NOT attisdropped)
           FROM (SELECT to_regclass($1) AS t) r WHERE r.t IS NOT NULL",
    )
    .bind(format!("{q}.schema_version"))
    .fetch_optional(&mut *conn)
    .await
    .map_err(failure)
}

/// The version `schema` is at; `None` when it holds no deployment.
pub(super) async fn version_of(pool: &PgPool, schema: &str) -> Result<Option<i32>, BackendError> {
    let mut conn = pool.acquire().await.map_err(failure)?;
    Ok(history(&mut conn, schema)
        .await?
        .map(|rows| rows.last().map_or(0, |row| row.version)))
}

/// `schema`'s history held against this build's migrations.
async fn plan(pool: &PgPool, schema: &str) -> Result<(Option<i32>, Plan), BackendError> {
    let mut conn = pool.acquire().await.map_err(failure)?;
    let applied = history(&mut conn, schema).await?;
    let found = applied
        .as_ref()
        .map(|rows| rows.last().map_or(0, |row| row.version));
    let store = format!("schema `{schema}`");
    let plan = schema_history::plan(MIGRATIONS, applied.as_deref().unwrap_or_default(), &store);
    Ok((found, plan))
}

/// Checks that `schema` holds this build's history, for a tool that must
/// not migrate (sagactl): a deployment migrated before checksums were kept
/// passes (its versions match; recording them is the next migration's).
pub(super) async fn check(pool: &PgPool, schema: &str) -> Result<(), BackendError> {
    match plan(pool, schema).await?.1 {
        Plan::Diverged(text) => Err(BackendError::Misconfigured(text)),
        _ => Ok(()),
    }
}

/// Readies `schema` for an engine at start: nothing to do when it holds
/// every migration of this build, as this build ships them (no DDL, no
/// lock: a role with only `USAGE` and the table and function privileges
/// runs an engine); created or upgraded when older and `migrate` allows
/// it; refused when newer, or when its history differs from this build's.
/// Then the privileges the engine's statements need are checked, so that a
/// missing one is named now rather than by the first statement that needs
/// it, perhaps hours later.
pub(super) async fn prepare(
    pool: &PgPool,
    schema: &str,
    migrate: bool,
) -> Result<(), BackendError> {
    match plan(pool, schema).await? {
        (_, Plan::Current) => {}
        (_, Plan::Newer { newest }) => return Err(newer(schema, newest)),
        (_, Plan::Diverged(text)) => return Err(BackendError::Misconfigured(text)),
        (found, Plan::Migrate { .. }) if migrate => run(pool, schema).await.map_err(|e| {
            BackendError::Misconfigured(format!(
                "schema `{schema}` {} and this engine could not bring it to version \
                 {SCHEMA_VERSION}: {e}",
                at(found)
            ))
        })?,
        (Some(SCHEMA_VERSION), Plan::Migrate { .. }) => {
            return Err(BackendError::Misconfigured(format!(
                "schema `{schema}` is at version {SCHEMA_VERSION}, migrated by a version of this \
                 library that kept no checksums of its migrations, and this engine does not \
                 migrate (`PostgresConfig::migrate` is off): run the migration once as the \
                 schema's owner (`PostgresBackend::migrate`, `sagactl migrate`) to record them; \
                 it changes nothing else"
            )))
        }
        (found, Plan::Migrate { .. }) => {
            return Err(BackendError::Misconfigured(format!(
                "schema `{schema}` {}, and this engine needs version {SCHEMA_VERSION} and does not \
                 migrate (`PostgresConfig::migrate` is off): run the migration first, as the \
                 schema's owner (`PostgresBackend::migrate`, `sagactl migrate`)",
                at(found)
            )))
        }
    }
    privileges::missing(pool, schema).await
}

/// Where a schema's version stands, in words.
fn at(found: Option<i32>) -> String {
    match found {
        Some(v) => format!("is at version {v}"),
        None => "holds no deployment yet".to_owned(),
    }
}

/// Refusal of a schema written by a newer library.
fn newer(schema: &str, current: i32) -> BackendError {
    BackendError::Misconfigured(format!(
        "schema `{schema}` is at version {current}, written by a newer version of this library \
         than this one (which knows up to {SCHEMA_VERSION}): upgrade this engine, or give it \
         another schema (`PostgresConfig::schema`)"
    ))
}

/// Creates or upgrades `schema` to [`SCHEMA_VERSION`], recording each
/// migration's checksum; under an advisory lock, so that of several
/// migrators one applies and the others find it done.
pub(super) async fn run(pool: &PgPool, schema: &str) -> Result<(), BackendError> {
    let q = quoted_schema(schema)?;
    let mut tx = pool.begin().await.map_err(failure)?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
        .bind(format!("saga-runtime migrations of {schema}"))
        .execute(&mut *tx)
        .await
        .map_err(failure)?;
    history_table(&mut tx, schema, &q).await?;
    let applied = history(&mut tx, schema).await?.unwrap_or_default();
    let store = format!("schema `{schema}`");
    let (from, adopt) = match schema_history::plan(MIGRATIONS, &applied, &store) {
        Plan::Current => return tx.commit().await.map_err(failure),
        Plan::Newer { newest } => return Err(newer(schema, newest)),
        Plan::Diverged(text) => return Err(BackendError::Misconfigured(text)),
        Plan::Migrate { from, adopt } => (from, adopt),
    };
    // Applied before checksums were kept: recorded as this build's (their
    // versions match; the migrations were not released before).
    for migration in MIGRATIONS.iter().filter(|m| adopt.contains(&m.version)) {
        sqlx::query(sql!(
            "UPDATE {q}.schema_version SET checksum = $2 WHERE version = $1"
        ))
        .bind(migration.version)
        .bind(migration.checksum())
        .execute(&mut *tx)
        .await
        .map_err(failure)?;
    }
    for migration in MIGRATIONS.iter().filter(|m| m.version > from) {
        let Migration { version, name, .. } = migration;
        sqlx::raw_sql(sqlx::AssertSqlSafe(filled(migration.sql, schema)?))
            .execute(&mut *tx)
            .await
            .map_err(|e| {
                BackendError::Misconfigured(format!(
                    "migration {version} ({name}) of schema `{schema}` failed: {e}"
                ))
            })?;
        sqlx::query(sql!(
            "INSERT INTO {q}.schema_version (version, name, checksum) VALUES ($1, $2, $3)"
        ))
        .bind(version)
        .bind(name)
        .bind(migration.checksum())
        .execute(&mut *tx)
        .await
        .map_err(failure)?;
    }
    tx.commit().await.map_err(failure)
}

/// The schema and its history table, created when missing, and the
/// history's checksum column added to a table made before it existed.
async fn history_table(tx: &mut PgConnection, schema: &str, q: &str) -> Result<(), BackendError> {
    // `CREATE SCHEMA IF NOT EXISTS` needs `CREATE` on the database even
    // when the schema exists: an upgrade by the schema's owner, who need
    // not have it, creates nothing it finds.
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
            .bind(schema)
            .fetch_one(&mut *tx)
            .await
            .map_err(failure)?;
    if !exists {
        sqlx::raw_sql(sql!("CREATE SCHEMA {q}"))
            .execute(&mut *tx)
            .await
            .map_err(failure)?;
    }
    match recorded_checksums(tx, q).await? {
        Some(true) => Ok(()),
        Some(false) => sqlx::raw_sql(sql!(
            "ALTER TABLE {q}.schema_version ADD COLUMN checksum text"
        ))
        .execute(&mut *tx)
        .await
        .map(drop)
        .map_err(failure),
        None => sqlx::raw_sql(sql!(
            "CREATE TABLE {q}.schema_version (
                 version integer PRIMARY KEY,
                 name text NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now(),
                 checksum text
             );"
        ))
        .execute(&mut *tx)
        .await
        .map(drop)
        .map_err(failure),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_checked_and_quoted() {
        assert_eq!(quoted_schema("saga").unwrap(), "\"saga\"");
        assert_eq!(quoted_schema("orders_2").unwrap(), "\"orders_2\"");
        for bad in [
            "",
            "Saga",
            "2x",
            "a-b",
            "a\"b",
            "a b",
            &"x".repeat(49),
            "public",
            "pg_catalog",
            "information_schema",
        ] {
            assert!(quoted_schema(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_newest_migration_is_the_schema_version() {
        assert_eq!(MIGRATIONS.last().map(|m| m.version), Some(SCHEMA_VERSION));
        for (n, Migration { version, .. }) in MIGRATIONS.iter().enumerate() {
            assert_eq!(
                *version as usize,
                n + 1,
                "versions go 1, 2, 3, ... without gaps"
            );
        }
    }

    #[test]
    fn placeholders_are_all_filled() {
        for Migration { name, sql, .. } in MIGRATIONS {
            let sql = filled(sql, "saga").unwrap();
            for placeholder in [
                "{schema}",
                "{channel}",
                "{finished}",
                "{cancellations}",
                "{timers}",
                "{endpoints}",
            ] {
                assert!(!sql.contains(placeholder), "{name}: {placeholder} left");
            }
        }
    }

    /// A released migration is history: a deployment recorded its
    /// checksum, and an engine refuses a schema whose recorded migrations
    /// differ from its own. Editing one fails here, before it fails a
    /// deployment.
    #[test]
    fn released_migrations_are_never_edited() {
        // A new migration adds its line; no line changes.
        const RELEASED: &[(i32, &str)] = &[
            (
                1,
                "b7d5c6eece4d4312ed86b7ff2c36f67962a8ce4e352025893c15b37518e9791a",
            ),
            (
                2,
                "3bc5d73be87a5450874fb88128bdd1623b29f77ee3735f5fba96010d3397625d",
            ),
            (
                3,
                "a91e0f117fdbd345720e70020162a50c4290ed306166977ac80190b83b20591a",
            ),
            (
                4,
                "53af454f0a6c7600048e066a88b3fad2e3e76ac012b17c7a05a37c60163364a4",
            ),
            (
                5,
                "ddc0c8819d56a311cab34704d2e9dae5365c6747f952539c99bff0a58ec57a4b",
            ),
            (
                6,
                "95193b1c6776d30f00fa2f8a326a33a258893832c2944e5d24fc1c69e923c316",
            ),
            (
                7,
                "9dc0d02bcca6f0dfb4698224face74cb7f22e2a1bc08f5dffca8d63121d7aef7",
            ),
        ];
        assert_eq!(
            RELEASED.len(),
            MIGRATIONS.len(),
            "a migration without its line"
        );
        for (migration, (version, released)) in MIGRATIONS.iter().zip(RELEASED) {
            assert_eq!(migration.version, *version);
            assert_eq!(
                migration.checksum(),
                *released,
                "migration {} ({}) was edited after its release: restore it (deployments \
                 applied it as released) and put the change in a new migration",
                migration.version,
                migration.name
            );
        }
    }
}
