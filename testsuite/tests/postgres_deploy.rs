//! Deploying on PostgreSQL as production does: a deploy job migrates as
//! the schema's owner, engines run as a role that only uses the schema,
//! and what goes wrong at start (a missing privilege, a schema behind, a
//! closed port, a schema that is the application's) is said with the fix,
//! never with the password. One server for every scenario, each in a
//! schema of its own.

mod common;

use common::postgres_server::TestPostgres;
use saga_runtime::backend::postgres::{PostgresBackend, PostgresConfig, SCHEMA_VERSION};
use saga_runtime::backend::Lease;
use saga_runtime::prelude::*;

struct Ship;

#[saga(name = "ship")]
impl Ship {
    #[saga_step(1)]
    async fn pack(&self, order: u64) -> Result<u64, StepError> {
        Ok(order)
    }

    #[saga_step(2)]
    async fn send(&self, order: u64) -> Result<String, StepError> {
        Ok(format!("order {order} shipped"))
    }
}

fn config(schema: &str, migrate: bool) -> PostgresConfig {
    PostgresConfig {
        schema: schema.to_owned(),
        migrate,
        ..PostgresConfig::default()
    }
}

/// A login role (with a password the errors must not show) that may use
/// `schema`, or, with `except`, all but that one privilege.
fn engine_role(server: &TestPostgres, role: &str, schema: &str, except: Option<&str>) -> String {
    server.psql(&format!(
        "CREATE ROLE {role} LOGIN PASSWORD 'hunter2';
         GRANT USAGE ON SCHEMA {schema} TO {role};
         GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role};
         GRANT USAGE ON ALL SEQUENCES IN SCHEMA {schema} TO {role};
         GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} TO {role};
         {}",
        except.unwrap_or("")
    ));
    format!(
        "postgres://{role}:hunter2@127.0.0.1:{}/postgres",
        server.port()
    )
}

async fn refusal(url: &str, config: PostgresConfig) -> String {
    match PostgresBackend::connect_url(url, config).await {
        Ok(_) => panic!("{url} was accepted"),
        Err(e) => {
            let text = e.to_string();
            assert!(!text.contains("hunter2"), "the password shown: {text}");
            text
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_run_as_a_role_that_cannot_migrate_and_start_failures_say_the_fix() {
    let server = TestPostgres::start();

    // The deploy job migrates; again, it finds the schema current.
    let before = PostgresBackend::migrate(&server.url(), &config("orders", true))
        .await
        .unwrap();
    assert_eq!(before, None, "the schema held no deployment");
    let again = PostgresBackend::migrate(&server.url(), &config("orders", true))
        .await
        .unwrap();
    assert_eq!(again, Some(SCHEMA_VERSION));

    // An engine whose role has no CREATE on the database runs: its
    // schema is current, so it runs no DDL (it ran CREATE SCHEMA IF NOT
    // EXISTS at every start: "permission denied for database").
    let url = engine_role(&server, "orders_app", "orders", None);
    let backend = PostgresBackend::connect_url(&url, config("orders", true))
        .await
        .expect("the least-privilege role connects");
    let engine = Engine::builder()
        .backend(backend)
        .saga(Ship)
        .workers(1)
        .build()
        .await
        .unwrap();
    let id = engine.start::<Ship>(7).await.unwrap();
    assert_eq!(
        engine.wait_output::<Ship>(id).await.unwrap(),
        "order 7 shipped"
    );
    engine.shutdown().await;

    // A schema a DBA made for its owner, who has no CREATE on the
    // database: the owner's deploy job migrates it (CREATE SCHEMA IF NOT
    // EXISTS needed CREATE on the database even for a schema that exists).
    server.psql(
        "CREATE ROLE shop_owner LOGIN PASSWORD 'hunter2';
         CREATE SCHEMA shop AUTHORIZATION shop_owner;",
    );
    let owner = format!(
        "postgres://shop_owner:hunter2@127.0.0.1:{}/postgres",
        server.port()
    );
    match PostgresBackend::migrate(&owner, &config("shop", true)).await {
        Ok(before) => assert_eq!(before, None),
        Err(e) => panic!("the schema's owner could not migrate it: {e}"),
    }

    // One privilege short: named, with the grants.
    PostgresBackend::migrate(&server.url(), &config("billing", true))
        .await
        .unwrap();
    let url = engine_role(
        &server,
        "billing_app",
        "billing",
        Some("REVOKE DELETE ON billing.tasks FROM billing_app;"),
    );
    let text = refusal(&url, config("billing", true)).await;
    assert!(
        text.contains("role `billing_app` lacks")
            && text.contains("DELETE on table billing.tasks")
            && text
                .contains("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA billing"),
        "{text}"
    );

    // A schema not migrated yet: an engine that may not migrate says to
    // run the migration; one that may, but whose role cannot, says which
    // privilege that takes.
    let url = engine_role(&server, "late_app", "public", None);
    let text = refusal(&url, config("late", false)).await;
    assert!(
        text.contains("holds no deployment yet") && text.contains("sagactl migrate"),
        "{text}"
    );
    let text = refusal(&url, config("late", true)).await;
    assert!(
        text.contains("permission denied for database")
            && text.contains("CREATE on the database")
            && !text.contains(" at line "),
        "{text}"
    );

    // A schema of the application's, or of the database's, is refused.
    for schema in ["public", "pg_catalog"] {
        let text = refusal(&server.url(), config(schema, true)).await;
        assert!(text.contains("a schema of its own"), "{text}");
    }

    // A closed port: "connection refused", not "pool timed out".
    let closed = common::redis_server::free_port();
    let text = refusal(
        &format!("postgres://orders_app:hunter2@127.0.0.1:{closed}/postgres"),
        config("orders", true),
    )
    .await;
    assert!(
        text.contains(&format!(
            "cannot connect to PostgreSQL at 127.0.0.1:{closed}"
        )) && text.contains("connection refused"),
        "{text}"
    );
}

/// The schema's history: each applied migration's checksum is recorded; a
/// deployment whose recorded migrations differ from this build's is
/// refused with what to do; one migrated before checksums were kept is
/// adopted by the next migration and, until then, refused only by an
/// engine that may not migrate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_whose_applied_migrations_differ_is_refused_and_an_old_one_is_adopted() {
    let server = TestPostgres::start();
    PostgresBackend::migrate(&server.url(), &config("history", true))
        .await
        .unwrap();
    let recorded = server
        .psql("SELECT count(*) FROM history.schema_version WHERE checksum ~ '^[0-9a-f]{64}$'");
    assert_eq!(
        recorded.trim(),
        SCHEMA_VERSION.to_string(),
        "every checksum recorded"
    );

    // Migration 2 as another build applied it: refused by an engine (even
    // one that may migrate: it would not repair it), by the migrator, and
    // by sagactl's attach; nothing is changed.
    server.psql("UPDATE history.schema_version SET checksum = 'beef' WHERE version = 2");
    let text = refusal(&server.url(), config("history", true)).await;
    assert!(
        text.contains("schema `history` applied migration 2 (process) with checksum `beef`")
            && text.contains("a change is a new migration"),
        "{text}"
    );
    let migrated = PostgresBackend::migrate(&server.url(), &config("history", true)).await;
    assert!(
        matches!(&migrated, Err(e) if e.to_string().contains("migration 2 (process)")),
        "{:?}",
        migrated.map(|_| ())
    );
    match PostgresBackend::attach(&server.url(), config("history", false)).await {
        Ok(_) => panic!("sagactl attached to a diverged schema"),
        Err(e) => assert!(e.to_string().contains("checksum `beef`"), "{e}"),
    }
    assert_eq!(
        server
            .psql("SELECT checksum FROM history.schema_version WHERE version = 2")
            .trim(),
        "beef"
    );

    // Migrated before checksums were kept (no column): an engine that may
    // not migrate says to run the migration once; the migration records
    // the checksums and applies nothing; then engines start.
    server.psql("ALTER TABLE history.schema_version DROP COLUMN checksum");
    let text = refusal(&server.url(), config("history", false)).await;
    assert!(
        text.contains("kept no checksums") && text.contains("sagactl migrate"),
        "{text}"
    );
    let before = PostgresBackend::migrate(&server.url(), &config("history", true))
        .await
        .unwrap();
    assert_eq!(before, Some(SCHEMA_VERSION));
    let recorded = server
        .psql("SELECT count(*) FROM history.schema_version WHERE checksum ~ '^[0-9a-f]{64}$'");
    assert_eq!(recorded.trim(), SCHEMA_VERSION.to_string(), "adopted");
    PostgresBackend::connect_url(&server.url(), config("history", false))
        .await
        .expect("an adopted schema is current");

    // A gap in the history (a row deleted by hand) is refused.
    server.psql("DELETE FROM history.schema_version WHERE version = 1");
    let text = refusal(&server.url(), config("history", true)).await;
    assert!(text.contains("records migration 2 where 1"), "{text}");
}

/// A task write as an engine of the previous revision (schema 6) made it:
/// one of the functions it called, by the arguments it passed, with the
/// task's stored head (it would send its own), no step rows and no audit
/// entries; `code|version|claimed`.
fn old_write(server: &TestPostgres, call: &str, id: TaskId, lease: &Lease) -> String {
    let head = format!("(SELECT head FROM side.tasks WHERE id = '{id}')");
    let version = format!("(SELECT version FROM side.tasks WHERE id = '{id}')");
    let common = format!(
        "'{id}', {}, {version}, 'pending', {head}, '[]', '[]', 100",
        lease.fence
    );
    server.psql(&match call {
        "record_attempt" => format!(
            "SELECT code, version, claimed FROM side.record_attempt({common}, 'one:1', false, \
             NULL, '{}', NULL, NULL, 1000)",
            lease.token
        ),
        _ => format!(
            "SELECT code, version, true FROM side.commit_task({common}, false, '{}', NULL, 0, \
             'ack', (SELECT id FROM side.queue WHERE task_id = '{id}'), \
             (SELECT claim FROM side.queue WHERE task_id = '{id}'), NULL, NULL, NULL, NULL, NULL)",
            lease.token
        ),
    })
}

/// During a rolling deploy, engines of the previous revision write tasks
/// with `record_attempt` and `commit_task`, and this one with
/// `apply_task_write` (migration 7), which stores the same: each accepts
/// what the other wrote (versions, fences, claims, the lease, the
/// message). Without migration 7's promise (the old functions kept, the
/// same rows written) one of these writes would be refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_previous_revisions_writes_and_this_ones_go_together() {
    use saga_runtime::backend::{Settle, TaskCommit, TaskStore};
    use saga_runtime::testing::conformance::{message, receive, task};

    let server = TestPostgres::start();
    let b = PostgresBackend::connect_url(&server.url(), config("side", true))
        .await
        .unwrap();
    let ttl = std::time::Duration::from_secs(30);

    // Recorded by this revision, committed by the previous one.
    let t = task("ship");
    b.create_task(&t, &message(&t)).await.unwrap();
    let _delivery = receive(&b, "w").await;
    let locked = b.lock_and_load(t.id, ttl).await.unwrap().unwrap();
    let (lease, cur) = (locked.lease, locked.task.unwrap());
    let (v, claimed) = b
        .record_attempt(&cur, TaskStatus::Pending, &lease, "one:1")
        .await
        .unwrap()
        .unwrap();
    assert!(claimed);
    assert_eq!(
        old_write(&server, "commit_task", t.id, &lease),
        format!("0|{}|t", v + 1),
        "the previous revision commits on this one's attempt"
    );
    let again = b.lock_and_load(t.id, ttl).await.unwrap().unwrap();
    assert_eq!(again.task.map(|t| t.version), Some(v + 1));
    assert!(
        again.lease.fence > lease.fence,
        "the commit released the lease"
    );
    assert_eq!(
        server.psql(&format!(
            "SELECT count(*) FROM side.queue WHERE task_id = '{}'",
            t.id
        )),
        "0",
        "and acknowledged the message"
    );

    // Recorded by the previous revision, committed by this one.
    let t = task("ship");
    b.create_task(&t, &message(&t)).await.unwrap();
    let delivery = receive(&b, "w").await;
    let lease = b.lock_and_load(t.id, ttl).await.unwrap().unwrap().lease;
    assert_eq!(
        old_write(&server, "record_attempt", t.id, &lease),
        "0|2|t",
        "the previous revision records an attempt"
    );
    let cur = b.load_task(t.id).await.unwrap().unwrap();
    let (_, claimed) = b
        .record_attempt(&cur, TaskStatus::Pending, &lease, "one:1")
        .await
        .unwrap()
        .unwrap();
    assert!(!claimed, "this revision sees the previous one's claim");
    let mut cur = b.load_task(t.id).await.unwrap().unwrap();
    cur.status = TaskStatus::Completed;
    let commit = TaskCommit {
        task: &cur,
        stored_status: TaskStatus::Pending,
        lease: &lease,
        next: None,
        settle: Settle::Ack(&delivery),
        expire_after: None,
        unless_cancelled: false,
    };
    assert_eq!(b.commit(commit).await.unwrap(), Ok(4));
    assert_eq!(
        b.load_task(t.id).await.unwrap().map(|t| t.status),
        Some(TaskStatus::Completed)
    );
}
