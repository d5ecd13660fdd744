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
