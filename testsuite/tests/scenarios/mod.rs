//! The engine scenarios every store must pass: production faults (a worker
//! SIGKILLed mid-step, a server crash, cut connections, a poison message,
//! hung steps, an unreadable record) and the regressions they once caused,
//! each written once against [`ScenarioStore`] and generated for every
//! store by [`engine_scenarios!`], next to `backend_conformance!` (which
//! tests the backend's operations one by one; these test an engine on it).
//! Flow-control limits (`limits`) are proved the same way, two engines
//! standing in for two machines, and so are tallies checked by processes
//! (`tally`) and endpoints read by consumers (`endpoints`).
//!
//! A scenario that only one store can have (Redis consumer groups, a
//! PostgreSQL row lock) stays in that store's file. SQLite, whose file
//! belongs to one process, runs those that engines in one process can
//! (`tests/sqlite.rs`, `on_sqlite`): no second process on the store, no
//! server to crash, no connection to cut.
//!
//! [`ScenarioStore`]: crate::common::stores::ScenarioStore

#![allow(dead_code)]

pub mod breakers;
pub mod chaos;
pub mod crash_isolation;
pub mod endpoints;
pub mod faults;
pub mod leases;
pub mod limits;
pub mod outcomes;
pub mod process;
pub mod rig;
pub mod runners;
pub mod tally;

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
    (limits; $($store:ident: $ty:ty),+ $(,)?) => {
        engine_scenarios!(@stores limits [$($store: $ty),+] [
            limits::a_concurrency_of_three_holds_across_two_engines_and_is_used,
            limits::a_rate_of_fifty_a_second_starts_250_plus_the_burst_in_five_seconds,
            limits::a_rate_holds_when_the_demand_meets_engines_just_started,
            limits::a_keyed_limit_keeps_two_merchants_independent,
            limits::a_sigkilled_workers_slot_comes_back_after_its_lease_and_not_before,
            limits::a_sigkilled_timer_holders_slot_comes_back_once_the_timers_are_taken_over,
            limits::a_long_wait_is_audited_once,
            limits::a_parked_task_is_cancelled_at_once_from_either_engine,
            limits::a_limited_handler_runs_one_at_a_time_across_instances_and_engines,
        ]);
    };
    (leases; $($store:ident: $ty:ty),+ $(,)?) => {
        engine_scenarios!(@stores leases [$($store: $ty),+] [
            leases::a_step_longer_than_the_lock_ttl_keeps_its_lease_and_runs_once,
            leases::cancellation_requested_in_one_process_reaches_a_step_running_in_another,
        ]);
    };
    (outcomes; $($store:ident: $ty:ty),+ $(,)?) => {
        engine_scenarios!(@stores outcomes [$($store: $ty),+] [
            outcomes::a_charge_lost_with_a_killed_worker_is_refunded_by_its_key_when_the_task_is_cancelled,
            outcomes::a_charge_lost_with_a_killed_worker_is_refunded_by_its_key_when_its_retry_fails_for_good,
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
            process::an_order_is_correlated_timed_out_tallied_and_invoiced,
        ]);
    };
    (tally; $($store:ident: $ty:ty),+ $(,)?) => {
        engine_scenarios!(@stores tally [$($store: $ty),+] [
            tally::a_tally_checked_by_eight_processes_with_duplicates_one_killed_completes_exactly_once,
        ]);
    };
    (endpoints; $($store:ident: $ty:ty),+ $(,)?) => {
        engine_scenarios!(@stores endpoints [$($store: $ty),+] [
            endpoints::a_consumer_killed_mid_handler_leaves_its_message_to_another_and_the_endpoint_is_trimmed,
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
