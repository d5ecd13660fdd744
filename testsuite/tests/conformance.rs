//! The backend conformance suite (`saga_runtime::testing::conformance`),
//! run unchanged against every backend: the in-memory one, Redis (a
//! private redis-server per case, with three partitions; in record layout
//! 2, and again as a deployment that still writes layout 1) and PostgreSQL
//! (one private server, a schema per case).

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

/// The same on a deployment that ran before record layout 2 (its key
/// layout recorded, no record layout): tasks are written in layout 1,
/// their fence, claims and cancellation flag in keys of their own.
mod redis_layout_1 {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::common::redis_server::TestRedis;
    use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
    use saga_runtime::backend::Backend;
    use saga_runtime::testing::conformance::VISIBILITY;

    async fn fresh() -> (Arc<dyn Backend>, TestRedis) {
        let server = TestRedis::start();
        let _: () = redis::cmd("SET")
            .arg("saga:layout")
            .arg("3")
            .query(&mut server.conn())
            .unwrap();
        let config = RedisConfig {
            visibility_timeout: VISIBILITY,
            block: Duration::from_millis(50),
            partitions: Some(3),
            ..RedisConfig::default()
        };
        let backend = RedisBackend::connect_with(&server.url(), config)
            .await
            .unwrap();
        assert!(!backend.writes_steps_apart().await.unwrap());
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

    saga_runtime::backend_conformance!(on_postgres, in_turn: fresh, sharing: start);
}
