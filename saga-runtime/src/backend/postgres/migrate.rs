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

use sqlx::postgres::PgPool;

use super::{failure, privileges};
use crate::backend::BackendError;

/// The migrations: version, name, SQL.
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "core", include_str!("migrations/0001_core.sql")),
    (2, "process", include_str!("migrations/0002_process.sql")),
    (
        3,
        "coordination",
        include_str!("migrations/0003_coordination.sql"),
    ),
    (4, "limits", include_str!("migrations/0004_limits.sql")),
    (
        5,
        "early_messages",
        include_str!("migrations/0005_early_messages.sql"),
    ),
];

/// The schema version this library writes: the newest migration.
pub const SCHEMA_VERSION: i32 = 5;

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

/// The version `schema` is at; `None` when it holds no deployment.
pub(super) async fn version_of(pool: &PgPool, schema: &str) -> Result<Option<i32>, BackendError> {
    let q = quoted_schema(schema)?;
    let table: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
        .bind(format!("{q}.schema_version"))
        .fetch_one(pool)
        .await
        .map_err(failure)?;
    if table.is_none() {
        return Ok(None);
    }
    sqlx::query_scalar(sql!("SELECT max(version) FROM {q}.schema_version"))
        .fetch_one(pool)
        .await
        .map_err(failure)
}

/// Readies `schema` for an engine at start: nothing to do when it is at
/// [`SCHEMA_VERSION`] (no DDL, no lock: a role with only `USAGE` and the
/// table and function privileges runs an engine); created or upgraded
/// when older and `migrate` allows it; refused when newer. Then the
/// privileges the engine's statements need are checked, so that a missing
/// one is named now rather than by the first statement that needs it,
/// perhaps hours later.
pub(super) async fn prepare(
    pool: &PgPool,
    schema: &str,
    migrate: bool,
) -> Result<(), BackendError> {
    match version_of(pool, schema).await? {
        Some(v) if v == SCHEMA_VERSION => {}
        Some(v) if v > SCHEMA_VERSION => return Err(newer(schema, v)),
        found if migrate => run(pool, schema).await.map_err(|e| {
            BackendError::Misconfigured(format!(
                "schema `{schema}` {} and this engine could not bring it to version \
                 {SCHEMA_VERSION}: {e}",
                at(found)
            ))
        })?,
        found => {
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

/// Creates or upgrades `schema` to [`SCHEMA_VERSION`].
pub(super) async fn run(pool: &PgPool, schema: &str) -> Result<(), BackendError> {
    let q = quoted_schema(schema)?;
    let mut tx = pool.begin().await.map_err(failure)?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
        .bind(format!("saga-runtime migrations of {schema}"))
        .execute(&mut *tx)
        .await
        .map_err(failure)?;
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
    sqlx::raw_sql(sql!(
        "CREATE TABLE IF NOT EXISTS {q}.schema_version (
             version integer PRIMARY KEY,
             name text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         );"
    ))
    .execute(&mut *tx)
    .await
    .map_err(failure)?;
    let current: Option<i32> =
        sqlx::query_scalar(sql!("SELECT max(version) FROM {q}.schema_version"))
            .fetch_one(&mut *tx)
            .await
            .map_err(failure)?;
    let current = current.unwrap_or(0);
    if current > SCHEMA_VERSION {
        return Err(newer(schema, current));
    }
    for (version, name, sql) in MIGRATIONS.iter().filter(|(v, _, _)| *v > current) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(filled(sql, schema)?))
            .execute(&mut *tx)
            .await
            .map_err(|e| {
                BackendError::Misconfigured(format!(
                    "migration {version} ({name}) of schema `{schema}` failed: {e}"
                ))
            })?;
        sqlx::query(sql!(
            "INSERT INTO {q}.schema_version (version, name) VALUES ($1, $2)"
        ))
        .bind(version)
        .bind(name)
        .execute(&mut *tx)
        .await
        .map_err(failure)?;
    }
    tx.commit().await.map_err(failure)
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
        assert_eq!(MIGRATIONS.last().map(|m| m.0), Some(SCHEMA_VERSION));
        for (n, (version, _, _)) in MIGRATIONS.iter().enumerate() {
            assert_eq!(
                *version as usize,
                n + 1,
                "versions go 1, 2, 3, ... without gaps"
            );
        }
    }

    #[test]
    fn placeholders_are_all_filled() {
        for (_, name, sql) in MIGRATIONS {
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
}
