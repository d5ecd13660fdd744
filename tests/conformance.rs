//! The backend conformance suite (`saga_runtime::testing::conformance`),
//! run unchanged against every backend: the in-memory one, Redis (a
//! private redis-server per case, with three partitions) and PostgreSQL
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

    // The core and the process-manager cases (process store, tallies,
    // endpoints). The lease and breaker cases wait for the coordination
    // tables (`migrations/0003_coordination.sql`); once they are there,
    // this becomes `backend_conformance!(on_postgres, in_turn: fresh,
    // sharing: start)`.
    saga_runtime::__conformance_cases!(
        [on_postgres, in_turn: fresh, sharing: start];
        create_load_and_fresh_copies,
        versions_and_concurrent_updates,
        attempt_claims,
        writes_stamp_updated_at,
        a_lease_taken_with_a_delivery_is_the_tasks_lock,
        going_on_with_a_task_records_the_next_attempt,
        the_audit_log_is_appended_and_capped,
        lock_contention_expiry_extension_and_stale_release,
        locking_a_missing_task_takes_nothing,
        stale_fence_writes_are_refused,
        redelivery_after_visibility_timeout_and_touch,
        release_is_prompt_delayed_and_answers_the_delivery,
        commit_is_atomic_enqueue_ack_and_unlock,
        an_accepted_cancellation_refuses_guarded_commits,
        undecodable_entries_are_delivered_alone,
        workers_take_only_what_they_run,
        queue_stats_count_what_is_not_settled,
        dead_lettering_paging_and_requeue,
        cancellation_flags_and_notifications,
        retention_removes_finished_tasks,
        paged_listing_by_status_and_time,
        housekeeping_caps_dead_letters,
        process_instances_versions_and_correlation_entries,
        process_tombstones_refuse_late_duplicates,
        tallies_count_each_item_once_and_complete_once,
        tallies_without_items_complete_at_once_and_expire,
        endpoints_deliver_to_groups_claim_settle_and_trim,
        endpoints_claim_an_idle_message_behind_busy_ones,
        process_outbox_schedule_and_single_delivery_of_due_entries,
    );
}
