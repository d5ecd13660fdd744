//! The engine scenarios every store must pass: production faults (a worker
//! SIGKILLed mid-step, a server crash, cut connections, a poison message,
//! hung steps, an unreadable record) and the regressions they once caused,
//! each written once against [`ScenarioStore`] and generated for every
//! store by [`engine_scenarios!`], next to `backend_conformance!` (which
//! tests the backend's operations one by one; these test an engine on it).
//!
//! A scenario that only one store can have (Redis consumer groups, a
//! PostgreSQL row lock) stays in that store's file.
//!
//! [`ScenarioStore`]: crate::common::stores::ScenarioStore

#![allow(dead_code)]

pub mod breakers;
pub mod chaos;
pub mod crash_isolation;
pub mod faults;
pub mod process;
pub mod rig;
pub mod runners;

/// One `#[tokio::test]` per scenario of a suite, in a module per suite
/// and store (`faults::postgres::hung_steps_time_out_...`):
/// `engine_scenarios!(faults; redis: TestRedis, postgres: TestPostgres)`.
/// Chaos has a test binary of its own (`tests/engine_chaos.rs`), so that
/// it does not share the machine with the timing-sensitive scenarios.
macro_rules! engine_scenarios {
    (faults; $($store:ident: $ty:ty),+ $(,)?) => {
        engine_scenarios!(@stores faults [$($store: $ty),+] [
            faults::a_worker_killed_mid_step_hands_its_task_over_after_the_visibility_timeout,
            faults::an_engine_rides_out_a_server_crash_and_restart,
            faults::an_unreadable_task_record_is_dead_lettered_alone_and_holds_nothing_up,
            faults::callers_ride_out_cut_connections_and_keyed_starts_are_idempotent,
            faults::a_message_that_kills_its_worker_is_dead_lettered_after_the_cap,
            faults::hung_steps_time_out_and_every_task_still_finishes,
            faults::a_retry_backoff_holds_neither_a_worker_nor_the_lock,
            faults::a_handed_back_message_comes_back_promptly,
            faults::finished_tasks_leave_nothing_behind_once_retention_passes,
            faults::a_cancellation_cuts_a_retrys_wait_short_but_not_a_compensations,
        ]);
    };
    (chaos; $($store:ident: $ty:ty),+ $(,)?) => {
        engine_scenarios!(@stores chaos [$($store: $ty),+] [
            chaos::every_task_ends_under_sigkills_cut_connections_and_a_server_crash,
        ]);
    };
    (crash_isolation; $($store:ident: $ty:ty),+ $(,)?) => {
        engine_scenarios!(@stores crash_isolation [$($store: $ty),+] [
            crash_isolation::a_crash_loop_costs_the_tasks_beside_it_nothing,
            crash_isolation::a_crash_loop_exhausts_no_innocent_with_two_retries,
            crash_isolation::a_crashing_handler_costs_the_messages_beside_it_nothing,
        ]);
    };
    (breakers; $($store:ident: $ty:ty),+ $(,)?) => {
        engine_scenarios!(@stores breakers [$($store: $ty),+] [
            breakers::a_shared_breaker_opens_and_probes_across_engines_and_parked_tasks_finish,
            breakers::a_long_outage_behind_a_shared_waiting_breaker_compensates_nothing,
        ]);
    };
    (runners; $($store:ident: $ty:ty),+ $(,)?) => {
        engine_scenarios!(@stores runners [$($store: $ty),+] [
            runners::announcements_are_per_engine_and_expire,
        ]);
    };
    (process; $($store:ident: $ty:ty),+ $(,)?) => {
        engine_scenarios!(@stores process [$($store: $ty),+] [
            process::a_thousand_messages_to_one_instance_from_four_workers_count_exactly_a_thousand,
            process::a_thousand_messages_to_one_pessimistic_instance_from_four_workers_count_exactly_a_thousand,
            process::racing_starting_messages_create_one_instance,
            process::state_and_timeouts_survive_a_worker_restart_and_a_server_crash,
            process::mixed_saga_and_process_traffic_flows_without_waiting_for_redelivery,
            process::an_unreadable_instance_is_left_out_of_listings,
            process::a_recreated_instance_gets_no_old_timeouts_and_late_duplicates_start_nothing,
            process::an_instance_records_when_it_was_last_written,
        ]);
    };
    (@stores $suite:ident [$($store:ident: $ty:ty),+] $cases:tt) => {
        mod $suite {
            #[allow(unused_imports)]
            use super::*;
            $(
                mod $store {
                    #[allow(unused_imports)]
                    use super::*;
                    engine_scenarios!(@cases $ty; $cases);
                }
            )+
        }
    };
    (@cases $ty:ty; [$($module:ident :: $case:ident),+ $(,)?]) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                crate::scenarios::$module::$case::<$ty>().await;
            }
        )+
    };
}
