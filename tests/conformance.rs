//! The backend conformance suite (`saga_runtime::testing::conformance`),
//! run unchanged against every backend: the in-memory one and Redis (a
//! private redis-server per case, with three partitions).

mod common;

mod memory {
    use std::sync::Arc;

    use saga_runtime::backend::memory::MemoryBackend;
    use saga_runtime::backend::Backend;
    use saga_runtime::testing::conformance::VISIBILITY;

    async fn fresh() -> (Arc<dyn Backend>, ()) {
        (
            Arc::new(MemoryBackend::with_visibility_timeout(VISIBILITY)),
            (),
        )
    }

    saga_runtime::backend_conformance!(fresh);
}

mod redis {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::common::redis_server::TestRedis;
    use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
    use saga_runtime::backend::Backend;
    use saga_runtime::testing::conformance::VISIBILITY;

    async fn fresh() -> (Arc<dyn Backend>, TestRedis) {
        let server = TestRedis::start();
        let config = RedisConfig {
            visibility_timeout: VISIBILITY,
            block: Duration::from_millis(50),
            partitions: Some(3),
            ..RedisConfig::default()
        };
        let backend = RedisBackend::connect_with(&server.url(), config)
            .await
            .unwrap();
        (Arc::new(backend), server)
    }

    saga_runtime::backend_conformance!(fresh);
}

mod postgres {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use crate::common::postgres_server::TestPostgres;
    use saga_runtime::backend::postgres::{PostgresBackend, PostgresConfig};
    use saga_runtime::backend::Backend;
    use saga_runtime::testing::conformance::VISIBILITY;

    /// One server for the whole suite; each case in a schema of its own.
    async fn start() -> TestPostgres {
        TestPostgres::start()
    }

    async fn fresh(server: &TestPostgres) -> (Arc<dyn Backend>, ()) {
        static CASE: AtomicUsize = AtomicUsize::new(0);
        let config = PostgresConfig {
            schema: format!("case_{}", CASE.fetch_add(1, Ordering::SeqCst)),
            visibility_timeout: VISIBILITY,
            poll_interval: Duration::from_millis(50),
            ..PostgresConfig::default()
        };
        let backend = PostgresBackend::connect_url(&server.url(), config)
            .await
            .expect("connect to the test server");
        (Arc::new(backend), ())
    }

    saga_runtime::backend_conformance!(on_postgres, in_turn: fresh, sharing: start, core);

    /// The coordination cases (named leases, shared breakers) on their
    /// own: the process-manager cases (process store, tallies, endpoints)
    /// are not there yet on PostgreSQL, so the full suite cannot run; once
    /// they are, `on_postgres` runs everything and this test goes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn coordination_on_postgres() {
        use saga_runtime::testing::conformance::{
            named_leases_have_one_holder_at_a_time, run_in_turn,
            shared_breakers_open_probe_once_and_close,
        };
        let server = start().await;
        let mut failed = Vec::new();
        let (backend, ()) = fresh(&server).await;
        let name = "named_leases_have_one_holder_at_a_time";
        if !run_in_turn(name, named_leases_have_one_holder_at_a_time(backend)).await {
            failed.push(name);
        }
        let (backend, ()) = fresh(&server).await;
        let name = "shared_breakers_open_probe_once_and_close";
        if !run_in_turn(name, shared_breakers_open_probe_once_and_close(backend)).await {
            failed.push(name);
        }
        assert!(failed.is_empty(), "conformance cases failed: {failed:?}");
    }
}
