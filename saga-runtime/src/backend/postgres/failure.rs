//! What a failed statement means for the engine (retry or not) and what
//! it says to the person reading it: the server's message, its SQLSTATE,
//! detail and hint, and for a missing privilege which one to grant. Not
//! sqlx's rendering, which ends in the server's C source line and names
//! no fix.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgDatabaseError};
use sqlx::Connection;

use crate::backend::BackendError;

/// A statement's failure as a [`BackendError`]: transient (retried) for a
/// lost or refused connection, a timeout, a serialization failure or a
/// deadlock; a refusal otherwise.
pub(crate) fn failure(error: sqlx::Error) -> BackendError {
    use sqlx::Error as E;
    let transient = match &error {
        E::Io(_) | E::PoolTimedOut | E::PoolClosed | E::Tls(_) | E::Protocol(_) => true,
        E::WorkerCrashed => true,
        E::Database(db) => db.code().is_some_and(|code| {
            let code = code.as_ref();
            // Connection exceptions, operator intervention (shutdown,
            // crash, cannot connect now), query cancelled (a statement
            // timeout), serialization failure, deadlock, lock timeout.
            code.starts_with("08")
                || code.starts_with("57")
                || code == "40001"
                || code == "40P01"
                || code == "55P03"
        }),
        _ => false,
    };
    let error: Arc<dyn std::error::Error + Send + Sync> = match &error {
        E::Database(_) => Arc::new(DatabaseFailure(error)),
        _ => Arc::new(error),
    };
    match transient {
        true => BackendError::Unavailable(error),
        false => BackendError::Rejected(error),
    }
}

/// A stored value that does not read.
pub(crate) fn corrupt(error: impl std::fmt::Display) -> BackendError {
    BackendError::Corrupt(error.to_string())
}

/// An error the server answered, told as the server said it.
#[derive(Debug)]
struct DatabaseFailure(sqlx::Error);

impl std::fmt::Display for DatabaseFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sqlx::Error::Database(db) = &self.0 else {
            return self.0.fmt(f);
        };
        write!(f, "{}", db.message())?;
        if let Some(code) = db.code() {
            write!(f, " (SQLSTATE {code})")?;
        }
        if let Some(pg) = db.try_downcast_ref::<PgDatabaseError>() {
            if let Some(detail) = pg.detail() {
                write!(f, ": {detail}")?;
            }
            if let Some(hint) = pg.hint() {
                write!(f, "; hint: {hint}")?;
            }
        }
        if db.code().as_deref() == Some("42501") {
            write!(f, "; {}", grant_for(db.message()))?;
        }
        Ok(())
    }
}

impl std::error::Error for DatabaseFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// What to grant for the server's "permission denied for <object>" (or
/// "must be owner of"): the privilege an engine's role needs on it.
fn grant_for(message: &str) -> String {
    let object = message
        .strip_prefix("permission denied for ")
        .unwrap_or(message);
    let kind = object.split_whitespace().next().unwrap_or("");
    match kind {
        "database" => "creating the schema needs CREATE on the database: migrate as a role \
                       that has it, or have the schema created for its owner first \
                       (`PostgresBackend::migrate`, `sagactl migrate`); an engine whose schema \
                       is current runs no DDL"
            .to_owned(),
        "schema" => format!(
            "the engine's role needs USAGE on its schema (GRANT USAGE ON SCHEMA {} TO <the \
             engine's role>), and CREATE on it only to migrate",
            object.split_whitespace().nth(1).unwrap_or("<schema>")
        ),
        "table" | "relation" => "the engine's role needs SELECT, INSERT, UPDATE and DELETE on \
                                 its schema's tables (GRANT SELECT, INSERT, UPDATE, DELETE ON \
                                 ALL TABLES IN SCHEMA <schema> TO <role>)"
            .to_owned(),
        "function" => "the engine's role needs EXECUTE on its schema's functions (GRANT EXECUTE \
                       ON ALL FUNCTIONS IN SCHEMA <schema> TO <role>)"
            .to_owned(),
        "sequence" => "the engine's role needs USAGE on its schema's sequences (GRANT USAGE ON \
                       ALL SEQUENCES IN SCHEMA <schema> TO <role>)"
            .to_owned(),
        _ if message.starts_with("must be owner") => "a migration replaces the schema's \
                       functions and tables: run it as the role that owns them \
                       (`PostgresBackend::migrate`, `sagactl migrate`)"
            .to_owned(),
        _ => "grant the engine's role the privilege named".to_owned(),
    }
}

/// One direct connection to `options`, closed again: what a pool hides.
/// A refused connection is retried inside the pool until its acquire
/// timeout, which then says only "pool timed out", seconds after the
/// server said no; connected once at start, the server's answer is told
/// at once (refused, no such host, authentication, no such database).
pub(crate) async fn reach(options: &PgConnectOptions) -> Result<(), BackendError> {
    let place = format!("{}:{}", options.get_host(), options.get_port());
    let why = match tokio::time::timeout(
        Duration::from_secs(10),
        sqlx::PgConnection::connect_with(options),
    )
    .await
    {
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
            return Ok(());
        }
        Err(_) => "no answer within 10 s".to_owned(),
        Ok(Err(sqlx::Error::Io(io))) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            "connection refused: is the server running, and listening on this port?".to_owned()
        }
        Ok(Err(e)) => match failure(e) {
            // Authentication, no such database: not worth a retry.
            BackendError::Rejected(e) => {
                return Err(BackendError::Rejected(e));
            }
            e => e.to_string(),
        },
    };
    Err(BackendError::unavailable(format!(
        "cannot connect to PostgreSQL at {place}: {why}"
    )))
}

/// `error` from the first statement on a pool the application made,
/// told better when it is the pool giving up ([`reach`] says why).
pub(crate) async fn at_start(options: &PgConnectOptions, error: BackendError) -> BackendError {
    let BackendError::Unavailable(source) = &error else {
        return error;
    };
    if !matches!(
        source.downcast_ref::<sqlx::Error>(),
        Some(sqlx::Error::PoolTimedOut)
    ) {
        return error;
    }
    reach(options).await.err().unwrap_or(error)
}

#[cfg(test)]
mod tests {
    use super::grant_for;

    #[test]
    fn each_missing_privilege_names_its_grant() {
        for (message, grant) in [
            (
                "permission denied for database app",
                "CREATE on the database",
            ),
            (
                "permission denied for schema saga",
                "GRANT USAGE ON SCHEMA saga TO",
            ),
            (
                "permission denied for table tasks",
                "ON ALL TABLES IN SCHEMA",
            ),
            ("permission denied for function take", "GRANT EXECUTE"),
            ("permission denied for sequence s", "ALL SEQUENCES"),
            ("must be owner of function take", "the role that owns them"),
        ] {
            assert!(grant_for(message).contains(grant), "{message}");
        }
    }
}
