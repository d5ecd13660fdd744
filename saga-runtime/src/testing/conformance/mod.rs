//! The backend conformance suite: what every [`Backend`] must do for the
//! engine to keep its guarantees. The in-memory and Redis backends pass it;
//! run it against your own with [`backend_conformance!`](crate::backend_conformance):
//!
//! ```ignore
//! use std::sync::Arc;
//! use saga_runtime::backend::Backend;
//! use saga_runtime::testing::conformance::VISIBILITY;
//!
//! // A fresh, empty backend whose visibility timeout is `VISIBILITY`, and
//! // whatever must live as long as it (a server process, a temp dir).
//! async fn fresh() -> (Arc<dyn Backend>, ()) {
//!     (Arc::new(MyBackend::new(VISIBILITY)), ())
//! }
//!
//! saga_runtime::backend_conformance!(fresh);
//! ```
//!
//! Each case takes a fresh backend and real (not paused) time: backends
//! that talk to a server cannot follow tokio's paused clock.
//!
//! The cases are grouped by the trait they hold to, one file each: the
//! core a saga-only backend implements (`tasks`, `writes`, `queue`, `dead_letters`,
//! `housekeeping`), then the parts a full backend offers (`process`,
//! `tally`, `endpoint`, `leases`, `breakers`, `limits`, `limit_machine`).

mod breakers;
mod dead_letters;
mod endpoint;
mod housekeeping;
mod leases;
mod limit_machine;
mod limits;
mod process;
mod queue;
mod tally;
mod tasks;
mod writes;

pub use breakers::*;
pub use dead_letters::*;
pub use endpoint::*;
pub use housekeeping::*;
pub use leases::*;
pub use limit_machine::*;
pub use limits::*;
pub use process::*;
pub use queue::*;
pub use tally::*;
pub use tasks::*;
pub use writes::*;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::json;

use crate::backend::{
    Backend, BreakerChange, BreakerDecision, Breakers, Created, DeadLetterQuery, Delivery,
    InstanceStatus, Interest, Lease, Leases, Next, NextAttempt, ProcessBackend, ProcessCommit,
    ProcessInstance, ProcessRefusal, QueueMessage, QueueStats, Retention, Settle, TakenLease,
    TallyOpen, TaskCommit, TaskCursor, TaskQuery, TaskRefusal, WorkItem,
};
use crate::model::task::{
    AuditAction, AuditEntry, TaskId, TaskInstance, TaskStatus, Timestamp, AUDIT_LOG_CAP,
};
use crate::process::tally::TallyProgress;
use crate::process::{Envelope, EnvelopeKind, TallyCheck, TallyRef};

/// The backend's process-manager store, which the process-manager cases
/// need.
fn process_part(b: &Arc<dyn Backend>) -> Arc<dyn ProcessBackend> {
    b.clone().processes().expect(
        "this case needs `Backend::processes`: for a saga-only backend run `backend_conformance!(fresh, core)`",
    )
}

/// The backend's named leases, which the lease case needs.
fn lease_part(b: &Arc<dyn Backend>) -> Arc<dyn Leases> {
    b.clone()
        .leases()
        .expect("this case needs `Backend::leases`: for a saga-only backend run `backend_conformance!(fresh, core)`")
}

/// The backend's shared breakers, which the breaker case needs.
fn breaker_part(b: &Arc<dyn Backend>) -> Arc<dyn Breakers> {
    b.clone()
        .breakers()
        .expect("this case needs `Backend::breakers`: for a saga-only backend run `backend_conformance!(fresh, core)`")
}

/// The visibility timeout the backend under test must be built with.
pub const VISIBILITY: Duration = Duration::from_millis(400);
const TTL: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_millis(50);

/// A task of saga `saga` with two steps.
pub fn task(saga: &str) -> TaskInstance {
    TaskInstance::new(
        saga,
        json!({"n": 1}),
        [("one".to_owned(), 1), ("two".to_owned(), 2)],
    )
}

/// The message that advances `t` at its current sequence number.
pub fn message(t: &TaskInstance) -> QueueMessage {
    QueueMessage {
        task_id: t.id,
        saga: t.saga.clone(),
        seq: t.seq,
    }
}

fn item(t: &TaskInstance) -> WorkItem {
    WorkItem::Saga(message(t))
}

fn envelope(n: u32) -> Envelope {
    Envelope {
        message_id: format!("m-{n}"),
        process: "pm".into(),
        message_type: "T".into(),
        payload: json!({"n": n}),
        kind: EnvelopeKind::Message,
        instance_id: None,
        generation: None,
        failures: 0,
        key: None,
        key_field: None,
        traceparent: None,
        due_ms: None,
        hops: 0,
        hold_until: None,
    }
}

/// Receives until a message arrives (or panics after a few seconds),
/// moving due delayed messages as the engine's timer poller would. A task
/// lease the backend took with the delivery is released, so that cases
/// about the queue and cases about leases stay apart.
pub async fn receive(b: &dyn Backend, consumer: &str) -> Delivery {
    let d = receive_leased(b, consumer).await;
    if let Some(TakenLease::Held { locked, .. }) = &d.lease {
        assert!(
            b.unlock(&locked.lease).await.unwrap(),
            "a taken lease is held"
        );
    }
    d
}

/// [`receive`], keeping a lease taken with the delivery.
pub async fn receive_leased(b: &dyn Backend, consumer: &str) -> Delivery {
    for _ in 0..100 {
        b.release_due(100).await.unwrap();
        if let Some(d) = b.receive(consumer, Interest::ALL, WAIT).await.unwrap() {
            return d;
        }
    }
    panic!("no message arrived");
}

/// Asserts that nothing is delivered for `d`.
pub async fn nothing_for(b: &dyn Backend, consumer: &str, d: Duration) {
    let until = tokio::time::Instant::now() + d;
    while tokio::time::Instant::now() < until {
        b.release_due(100).await.unwrap();
        if let Some(m) = b.receive(consumer, Interest::ALL, WAIT).await.unwrap() {
            panic!("unexpected message {m:?}");
        }
    }
}

async fn create(b: &dyn Backend, t: &TaskInstance) {
    let created = b.create_task(t, &message(t)).await.unwrap();
    assert!(matches!(created, Created::New), "{created:?}");
}

async fn lock(b: &dyn Backend, id: TaskId) -> Lease {
    b.lock_and_load(id, TTL)
        .await
        .unwrap()
        .expect("the lock is free")
        .lease
}

fn commit<'a>(task: &'a TaskInstance, lease: &'a Lease, settle: Settle<'a>) -> TaskCommit<'a> {
    TaskCommit {
        task,
        stored_status: task.status,
        lease,
        next: None,
        settle,
        unless_cancelled: false,
        expire_after: None,
    }
}

fn query(saga: &str) -> TaskQuery {
    TaskQuery {
        saga: saga.into(),
        status: None,
        created_from: None,
        created_to: None,
        after: None,
        limit: 100,
    }
}

/// A process-manager instance `id`, not stored yet.
fn instance(id: &str) -> ProcessInstance {
    let now = Timestamp::now();
    ProcessInstance {
        process: "pm".into(),
        id: id.into(),
        generation: format!("{id}-1"),
        started_by: None,
        state: json!({"n": 0}),
        status: InstanceStatus::Active,
        version: 0,
        keys: Vec::new(),
        processed: Vec::new(),
        audit_log: Vec::new(),
        created_at: now,
        updated_at: now,
    }
}

/// A write of `i` claiming the correlation entries `add`.
fn write<'a>(i: &'a ProcessInstance, add: &[(&str, &str)]) -> ProcessCommit<'a> {
    ProcessCommit {
        tombstone_ttl: Duration::from_secs(3600),
        add_keys: add
            .iter()
            .map(|(f, v)| (f.to_string(), v.to_string()))
            .collect(),
        ..ProcessCommit::new(Some(i), Settle::Nothing)
    }
}

/// Generates the conformance tests for a backend from `$factory`: an async
/// fn returning `(Arc<dyn Backend>, Guard)`, where the guard lives as long
/// as the case (a server process, a temporary directory; `()` if
/// nothing).
///
/// - `backend_conformance!(fresh)`: one `#[tokio::test]` per case, each on
///   a fresh backend: the core cases (tasks, queue, dead letters,
///   housekeeping) and those of every part a full backend offers
///   (process store, tallies, endpoints, leases, breakers).
/// - `backend_conformance!(fresh, core)`: the core cases only, for a
///   backend that runs sagas alone (its [`Backend::processes`],
///   [`Backend::leases`] and [`Backend::breakers`] are `None`).
/// - `backend_conformance!(name, in_turn: fresh, sharing: start)`: one
///   test `name` that starts what the cases share (`start().await`, kept
///   for the whole test) and runs every case in turn, each on a backend
///   from `fresh(&shared).await`: for a deployment too heavy to start once
///   per case (a cluster the cases share, each under a prefix of its
///   own). Every case runs; the test fails naming those that failed.
///   `, core` at the end runs the core cases only.
#[macro_export]
macro_rules! backend_conformance {
    ($factory:path, core) => {
        $crate::__conformance_cases!(
            [$factory];
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
            a_commit_keeps_its_delay_whatever_the_cancellation_flag,
            a_writes_guards_are_checked_fence_version_cancellation,
            each_effect_is_applied_only_when_the_write_carries_it,
            a_write_that_puts_nothing_keeps_the_version_and_still_claims,
            undecodable_entries_are_delivered_alone,
            workers_take_only_what_they_run,
            queue_stats_count_what_is_not_settled,
            dead_lettering_paging_and_requeue,
            cancellation_flags_and_notifications,
            retention_removes_finished_tasks,
            paged_listing_by_status_and_time,
            housekeeping_caps_dead_letters,
        );
    };
    ($name:ident, in_turn: $factory:path, sharing: $start:path, core) => {
        $crate::__conformance_cases!(
            [$name, in_turn: $factory, sharing: $start];
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
            a_commit_keeps_its_delay_whatever_the_cancellation_flag,
            a_writes_guards_are_checked_fence_version_cancellation,
            each_effect_is_applied_only_when_the_write_carries_it,
            a_write_that_puts_nothing_keeps_the_version_and_still_claims,
            undecodable_entries_are_delivered_alone,
            workers_take_only_what_they_run,
            queue_stats_count_what_is_not_settled,
            dead_lettering_paging_and_requeue,
            cancellation_flags_and_notifications,
            retention_removes_finished_tasks,
            paged_listing_by_status_and_time,
            housekeeping_caps_dead_letters,
        );
    };
    ($($how:tt)*) => {
        $crate::__conformance_cases!(
            [$($how)*];
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
            a_commit_keeps_its_delay_whatever_the_cancellation_flag,
            a_writes_guards_are_checked_fence_version_cancellation,
            each_effect_is_applied_only_when_the_write_carries_it,
            a_write_that_puts_nothing_keeps_the_version_and_still_claims,
            undecodable_entries_are_delivered_alone,
            workers_take_only_what_they_run,
            queue_stats_count_what_is_not_settled,
            dead_lettering_paging_and_requeue,
            parking_what_never_was_on_the_queue,
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
            held_messages_are_released_by_the_write_that_creates_or_claims,
            holds_are_refused_when_the_instance_exists_or_the_cap_is_reached,
            named_leases_have_one_holder_at_a_time,
            shared_breakers_open_probe_once_and_close,
            limits_hold_slots_and_hand_them_on_in_line,
            limits_expire_renew_and_never_free_twice,
            limits_pace_starts_and_book_tokens_in_order,
            limits_keep_keys_apart_and_wake_delayed_messages,
            limits_pace_waiters_that_come_back_late,
            limits_a_waiter_that_leaves_frees_its_place,
            limits_decide_as_the_machine_does,
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    ([$name:ident, in_turn: $factory:path, sharing: $start:path]; $($case:ident),* $(,)?) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let shared = $start().await;
            let mut failed: ::std::vec::Vec<&str> = ::std::vec::Vec::new();
            $(
                let (backend, guard) = $factory(&shared).await;
                let passed = $crate::testing::conformance::run_in_turn(
                    stringify!($case),
                    $crate::testing::conformance::$case(backend),
                )
                .await;
                drop(guard);
                if !passed {
                    failed.push(stringify!($case));
                }
            )*
            assert!(failed.is_empty(), "conformance cases failed: {failed:?}");
        }
    };
    ([$factory:path]; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let (backend, _guard) = $factory().await;
                $crate::testing::conformance::$case(backend).await;
            }
        )*
    };
}

/// Runs one case of an in-turn conformance test: prints its name and
/// outcome, and catches its panic so that the cases after it still run.
#[doc(hidden)]
pub async fn run_in_turn(name: &str, case: impl std::future::Future<Output = ()>) -> bool {
    use futures::FutureExt;
    let started = std::time::Instant::now();
    let outcome = std::panic::AssertUnwindSafe(case).catch_unwind().await;
    let took = started.elapsed();
    match outcome {
        Ok(()) => {
            println!("conformance {name} ... ok ({took:.1?})");
            true
        }
        Err(_) => {
            println!("conformance {name} ... FAILED ({took:.1?})");
            false
        }
    }
}
