//! Process managers on a private PostgreSQL, what only PostgreSQL has: a
//! timer poller that leaves an idle database alone, told by a
//! notification when a timeout can be due (counted in the server's
//! statement log). The process-manager scenarios every store passes
//! (contention from two engines, racing starters, restarts, a deleted
//! instance's late duplicates and stale timeouts, unreadable records, an
//! order correlated, timed out, tallied and invoiced) are in
//! `tests/scenarios/process.rs`; tallies checked by processes in
//! `tests/scenarios/tally.rs`, endpoints in `tests/scenarios/endpoints.rs`.
//! The engines' timer poller lease is proven in
//! `tests/coordination_postgres.rs`.

mod common;

use std::time::Duration;

use common::postgres_server::TestPostgres;
use common::until;
use saga_runtime::backend::postgres::{PostgresBackend, PostgresConfig};
use saga_runtime::backend::{ProcessCommit, ProcessStore, Settle};
use saga_runtime::process::{Envelope, EnvelopeKind};
use saga_runtime::task::Timestamp;

/// A backend on `pg` in schema `schema`.
async fn backend(pg: &TestPostgres, schema: &str) -> PostgresBackend {
    let config = PostgresConfig {
        schema: schema.into(),
        visibility_timeout: Duration::from_secs(2),
        poll_interval: Duration::from_millis(50),
        ..PostgresConfig::default()
    };
    PostgresBackend::connect_url(&pg.url(), config)
        .await
        .expect("connect to the test server")
}

// ---------------------------------------------------------------------------
// The timer poller's queries.

/// How many statements the server ran that mention `what` (a server
/// started with `log_statement = all`).
fn statements(pg: &TestPostgres, what: &str) -> usize {
    let log = pg.psql("SELECT pg_read_file(current_setting('data_directory') || '/../server.log')");
    log.lines()
        .filter(|l| l.contains("statement: ") || l.contains("execute "))
        .filter(|l| l.contains(what))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timer_poller_queries_only_once_a_timeout_can_be_due() {
    let pg = TestPostgres::start_with(&[("log_statement", "all")]);
    let backend = backend(&pg, "saga").await;
    // The listener is up once the first notification can reach it.
    until("listening", async || {
        pg.psql("SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%'") != "0"
    })
    .await;
    // (`listening` is set just after the server saw the LISTEN.)
    tokio::time::sleep(Duration::from_millis(200)).await;
    let now = || Timestamp::now().0;
    for _ in 0..50 {
        assert_eq!(backend.process_release_due(now(), 10).await.unwrap(), 0);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        statements(&pg, "release_timers") <= 2,
        "an idle poller asked {} times",
        statements(&pg, "release_timers")
    );

    // A timeout scheduled elsewhere: its notification tells when to look.
    let remind = Envelope {
        message_id: "r-1".into(),
        process: "pm".into(),
        message_type: "Remind".into(),
        payload: serde_json::json!(null),
        kind: EnvelopeKind::Timeout,
        instance_id: Some("i-1".into()),
        generation: None,
        failures: 0,
        key: None,
        key_field: None,
        traceparent: None,
        due_ms: None,
        hops: 0,
        hold_until: None,
    };
    let due = now() + 400;
    let commit = ProcessCommit {
        schedule: vec![(due, remind)],
        ..ProcessCommit::new(None, Settle::Nothing)
    };
    backend.process_commit("pm", commit).await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = statements(&pg, "release_timers");
    while now() < due {
        assert_eq!(backend.process_release_due(now(), 10).await.unwrap(), 0);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        statements(&pg, "release_timers"),
        before,
        "no query before the due time"
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(backend.process_release_due(now(), 10).await.unwrap(), 1);
    assert!(backend.process_scheduled().await.unwrap().is_empty());
}
