//! Starting a saga in the caller's own PostgreSQL transaction: the task
//! exists if and only if the business write commits.

mod common;

use std::time::Duration;

use common::postgres_server::TestPostgres;
use saga_runtime::backend::postgres::sqlx::{self, PgPool};
use saga_runtime::backend::postgres::{PostgresBackend, PostgresConfig};
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

fn config() -> PostgresConfig {
    PostgresConfig {
        visibility_timeout: Duration::from_secs(2),
        poll_interval: Duration::from_millis(100),
        ..PostgresConfig::default()
    }
}

async fn pool(server: &TestPostgres) -> PgPool {
    let pool = PgPool::connect(&server.url()).await.expect("connect");
    sqlx::query("CREATE TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY)")
        .execute(&pool)
        .await
        .expect("the business table");
    pool
}

async fn engine(pool: &PgPool, workers: usize) -> Engine {
    let backend = PostgresBackend::connect_with(pool.clone(), config())
        .await
        .expect("the backend");
    Engine::builder()
        .backend(backend)
        .saga(Ship)
        .workers(workers)
        .build()
        .await
        .expect("the engine")
}

async fn queued(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM saga.queue")
        .fetch_one(pool)
        .await
        .expect("count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_transaction_leaves_no_task_and_a_committed_one_runs() {
    let server = TestPostgres::start();
    let pool = pool(&server).await;
    let engine = engine(&pool, 2).await;

    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO orders (id) VALUES (1)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let abandoned = engine.start_in::<Ship>(&mut tx, 1).await.unwrap();
    tx.rollback().await.unwrap();
    assert!(engine.task(abandoned).await.unwrap().is_none());
    assert_eq!(queued(&pool).await, 0, "no message left behind");

    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO orders (id) VALUES (2)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let shipped = engine.start_in::<Ship>(&mut tx, 2).await.unwrap();
    assert!(
        engine.task(shipped).await.unwrap().is_none(),
        "invisible until the transaction commits"
    );
    tx.commit().await.unwrap();
    assert_eq!(
        engine.wait_output::<Ship>(shipped).await.unwrap(),
        "order 2 shipped"
    );
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(orders, 1, "the rolled-back order is gone with its task");
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_the_commit_and_the_pick_up_loses_nothing() {
    let mut server = TestPostgres::start();
    let pool = pool(&server).await;
    // Only starts tasks: nothing picks them up before the crash.
    let starter = engine(&pool, 0).await;
    let mut ids = Vec::new();
    for order in 0..5 {
        let mut tx = pool.begin().await.unwrap();
        sqlx::query("INSERT INTO orders (id) VALUES ($1)")
            .bind(order)
            .execute(&mut *tx)
            .await
            .unwrap();
        ids.push(
            starter
                .start_in::<Ship>(&mut tx, order as u64)
                .await
                .unwrap(),
        );
        tx.commit().await.unwrap();
    }
    starter.shutdown().await;
    drop(pool);
    server.crash();
    server.restart();
    let pool = PgPool::connect(&server.url()).await.unwrap();
    let workers = engine(&pool, 2).await;
    for (order, id) in ids.into_iter().enumerate() {
        assert_eq!(
            workers.wait_output::<Ship>(id).await.unwrap(),
            format!("order {order} shipped")
        );
    }
    workers.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_start_in_a_transaction_starts_once() {
    let server = TestPostgres::start();
    let pool = pool(&server).await;
    let engine = engine(&pool, 1).await;
    let mut tx = pool.begin().await.unwrap();
    let first = engine
        .start_with_key_in::<Ship>(&mut tx, "order-7", 7)
        .await
        .unwrap();
    let again = engine
        .start_with_key_in::<Ship>(&mut tx, "order-7", 7)
        .await
        .unwrap();
    assert_eq!(first, again, "the same key in the same transaction");
    tx.commit().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    let reused = engine
        .start_with_key_in::<Ship>(&mut tx, "order-7", 8)
        .await;
    assert!(
        matches!(reused, Err(saga_runtime::Error::KeyReused { .. })),
        "{reused:?}"
    );
    tx.rollback().await.unwrap();
    assert_eq!(
        engine.wait_output::<Ship>(first).await.unwrap(),
        "order 7 shipped"
    );
    engine.shutdown().await;
}

#[tokio::test]
async fn starting_in_a_transaction_needs_the_postgres_backend() {
    let server = TestPostgres::start();
    let pool = pool(&server).await;
    let memory = Engine::builder().saga(Ship).build().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    let refused = memory.start_in::<Ship>(&mut tx, 1).await;
    assert!(
        matches!(&refused, Err(saga_runtime::Error::Config(why)) if why.contains("PostgreSQL")),
        "{refused:?}"
    );
}
