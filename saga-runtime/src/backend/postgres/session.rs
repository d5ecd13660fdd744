//! Where an engine statement runs: on a connection whose statement and
//! lock timeouts are the configured ones ([`PostgresConfig::statement_timeout`],
//! [`PostgresConfig::lock_timeout`]), so that no statement of the engine
//! waits behind a lock, or runs, for longer than the settings say.
//!
//! A pool the backend made sets them on each of its connections. So does
//! a pool whose connections start with them (the `options` startup
//! parameter, as [`PostgresConfig::session_options`] writes it): its
//! statements run as they are. On any other pool (an application's,
//! passed to `connect_with`), setting them on its connections would change
//! the application's own sessions: there each engine statement runs in a
//! transaction of its own that sets them for itself alone (`SET LOCAL`),
//! at the price of two round trips more per statement. A statement cut
//! short, or a session dropped half-way, leaves the connection as it was
//! (the transaction rolls back, and its settings with it).

use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool};
use sqlx::{Postgres, Transaction};

use super::PostgresConfig;

/// Runs one engine statement, `run!(self, query, fetch_one)` for
/// `query.fetch_one(pool).await`, on a [`Session`]: the answer comes once
/// the statement's transaction (if it has one of its own) has committed.
macro_rules! run {
    ($backend:expr, $query:expr, $method:ident) => {
        async {
            let mut session = $backend.session().await?;
            let out = $query.$method(session.conn()).await?;
            session.done().await?;
            Ok::<_, sqlx::Error>(out)
        }
        .await
    };
}

/// The configured timeouts as settings, in milliseconds (at most what the
/// server takes: 0 is none).
fn settings(config: &PostgresConfig) -> [(&'static str, u128); 2] {
    let ms = |d: Duration| d.as_millis().min(i32::MAX as u128);
    [
        ("statement_timeout", ms(config.statement_timeout)),
        ("lock_timeout", ms(config.lock_timeout)),
    ]
}

/// `SET` statements of the configured timeouts (`SET LOCAL` with `local`).
pub(super) fn set_statements(config: &PostgresConfig, local: bool) -> String {
    let scope = if local { "LOCAL " } else { "" };
    settings(config)
        .iter()
        .map(|(name, ms)| format!("SET {scope}{name} = {ms}"))
        .collect::<Vec<_>>()
        .join("; ")
}

impl PostgresConfig {
    /// `options` with this configuration's statement and lock timeouts
    /// added as startup settings (`-c statement_timeout=.. -c
    /// lock_timeout=..`): every connection of a pool made from them starts
    /// with them, so that
    /// [`connect_with`](super::PostgresBackend::connect_with) runs the
    /// engine's statements on it as they are. On a pool without them each
    /// engine statement sets them in a transaction of its own, two round
    /// trips more. (Some connection poolers refuse startup settings:
    /// PgBouncer needs `ignore_startup_parameters = options`.)
    pub fn session_options(&self, options: PgConnectOptions) -> PgConnectOptions {
        options.options(settings(self))
    }
}

/// Whether connections made with `options` start with the configured
/// timeouts (as [`PostgresConfig::session_options`] writes them).
fn starts_bounded(options: &PgConnectOptions, config: &PostgresConfig) -> bool {
    let given: Vec<&str> = options
        .get_options()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    settings(config).iter().all(|(name, ms)| {
        let wanted = format!("{name}={ms}");
        given.windows(2).any(|w| w[0] == "-c" && w[1] == wanted)
    })
}

/// How the backend's statements get their timeouts.
#[derive(Clone)]
pub(super) struct Statements {
    pool: PgPool,
    /// The statement that opens a statement's own transaction with the
    /// timeouts set in it; `None` when every connection has them.
    begin: Option<String>,
}

impl Statements {
    /// On `pool`: its connections have the timeouts when `own` (the
    /// backend made it and sets them) or when they start with them.
    pub(super) fn new(pool: PgPool, config: &PostgresConfig, own: bool) -> Statements {
        let bounded = own || starts_bounded(&pool.connect_options(), config);
        let begin = (!bounded).then(|| format!("BEGIN; {}", set_statements(config, true)));
        Statements { pool, begin }
    }

    /// Whether each statement sets the timeouts in a transaction of its own.
    pub(super) fn per_transaction(&self) -> bool {
        self.begin.is_some()
    }

    /// A connection for one statement (see [`run!`]).
    pub(super) async fn session(&self) -> Result<Session, sqlx::Error> {
        match &self.begin {
            None => Ok(Session::Pooled(self.pool.acquire().await?)),
            Some(begin) => Ok(Session::Own(self.pool.begin_with(sql!("{begin}")).await?)),
        }
    }

    /// A transaction for several statements, the timeouts in force.
    pub(super) async fn begin(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        match &self.begin {
            None => self.pool.begin().await,
            Some(begin) => self.pool.begin_with(sql!("{begin}")).await,
        }
    }
}

/// A connection one statement runs on.
pub(super) enum Session {
    /// The pool's connection, which has the timeouts.
    Pooled(PoolConnection<Postgres>),
    /// A transaction of the statement's own, which sets them.
    Own(Transaction<'static, Postgres>),
}

impl Session {
    pub(super) fn conn(&mut self) -> &mut PgConnection {
        match self {
            Session::Pooled(conn) => conn,
            Session::Own(tx) => tx,
        }
    }

    /// Done with it: a transaction of its own commits.
    pub(super) async fn done(self) -> Result<(), sqlx::Error> {
        match self {
            Session::Pooled(_) => Ok(()),
            Session::Own(tx) => tx.commit().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_with_the_timeouts_are_recognised_and_others_are_not() {
        let config = PostgresConfig {
            statement_timeout: Duration::from_millis(4000),
            lock_timeout: Duration::from_millis(1500),
            ..PostgresConfig::default()
        };
        let plain = PgConnectOptions::new();
        assert!(!starts_bounded(&plain, &config));
        let bounded = config.session_options(plain.clone());
        assert!(
            starts_bounded(&bounded, &config),
            "{:?}",
            bounded.get_options()
        );
        // With other settings of the application's beside them.
        let mixed = config.session_options(plain.clone().options([("search_path", "app")]));
        assert!(starts_bounded(&mixed, &config));
        // Another value, or one of the two only: not what was configured.
        let other = PostgresConfig {
            lock_timeout: Duration::from_millis(1501),
            ..config.clone()
        };
        assert!(!starts_bounded(&bounded, &other));
        let one = plain.options([("statement_timeout", "4000")]);
        assert!(!starts_bounded(&one, &config));
        assert_eq!(
            set_statements(&config, true),
            "SET LOCAL statement_timeout = 4000; SET LOCAL lock_timeout = 1500"
        );
    }
}
