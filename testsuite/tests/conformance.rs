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

/// SQLite: a file of its own per case, in a temporary directory. The
/// store has the saga core, flow-control limits, leases and breakers
/// (process managers are not on it yet).
mod sqlite {
    use std::sync::Arc;

    use saga_runtime::backend::sqlite::{SqliteBackend, SqliteConfig};
    use saga_runtime::backend::Backend;
    use saga_runtime::testing::conformance::VISIBILITY;

    async fn fresh() -> (Arc<dyn Backend>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let config = SqliteConfig {
            visibility_timeout: VISIBILITY,
            ..SqliteConfig::default()
        };
        let backend = SqliteBackend::open_with(dir.path().join("saga.db"), config)
            .await
            .unwrap();
        (Arc::new(backend), dir)
    }

    saga_runtime::backend_conformance!(fresh, core);

    /// Limits, leases and breakers: what coordinates the engines.
    mod coordination {
        use super::fresh;

        saga_runtime::__conformance_cases!(
            [fresh];
            limits_hold_slots_and_hand_them_on_in_line,
            limits_expire_renew_and_never_free_twice,
            limits_pace_starts_and_book_tokens_in_order,
            limits_keep_keys_apart_and_wake_delayed_messages,
            limits_pace_waiters_that_come_back_late,
            limits_a_waiter_that_leaves_frees_its_place,
            limits_decide_as_the_machine_does,
            named_leases_have_one_holder_at_a_time,
            shared_breakers_open_probe_once_and_close,
        );
    }
}
