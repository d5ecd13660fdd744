//! Without the `metrics` feature: the crate-internal functions of
//! `recording.rs`, same signatures, empty bodies, so that every call the
//! workers make compiles to nothing.

use std::time::Duration;

use super::{BreakerState, DeadLetterKind};
use crate::backend::Backend;
use crate::model::task::TaskStatus;
use crate::saga::state_machine::{Outcome, Phase};

/// Nothing: no duration is recorded.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stopwatch;

#[inline]
pub(crate) fn attempt_started(
    _saga: &'static str,
    _step: &'static str,
    _phase: Phase,
    _retry: bool,
) -> Stopwatch {
    Stopwatch
}

#[inline]
pub(crate) fn attempt_ended(
    _saga: &'static str,
    _step: &'static str,
    _phase: Phase,
    _outcome: &Outcome,
    _since: Stopwatch,
) {
}

#[inline]
pub(crate) fn task_started(_saga: &'static str) {}

#[inline]
pub(crate) fn task_reopened(_saga: &'static str, _action: &'static str) {}

#[inline]
pub(crate) fn task_finished(_saga: &'static str, _status: TaskStatus) {}

#[inline]
pub(crate) fn task_parked(_saga: &str) {}

#[inline]
pub(crate) fn register_sagas(_names: impl IntoIterator<Item = &'static str>) {}

#[inline]
pub(crate) fn breaker_transition(_saga: &'static str, _step: &'static str, _to: BreakerState) {}

#[inline]
pub(crate) fn dead_lettered(_kind: DeadLetterKind) {}

#[inline]
pub(crate) fn process_message(_process: &'static str, _outcome: &'static str) {}

#[inline]
pub(crate) fn bridged(_transport: &str, _n: usize) {}

#[inline]
pub(crate) fn endpoint_full(_endpoint: &str) {}

#[inline]
pub(crate) fn relayed(_transport: &str, _outcome: &'static str) {}

#[inline]
pub(crate) fn process_conflict(_process: &'static str) {}

#[inline]
pub(crate) fn process_batched(_process: &'static str) {}

#[inline]
pub(crate) fn timeout_fired(_process: &'static str, _late: Option<Duration>) {}

/// No round trip to the backend: the gauges are not sampled at all.
#[inline]
pub(crate) async fn sample_queue(_backend: &dyn Backend) {}

/// No round trip to the backend: the task gauge is not sampled at all.
#[inline]
pub(crate) async fn sample_tasks(_backend: &dyn Backend, _sagas: &[&'static str]) {}

#[inline]
pub(crate) fn limit_waited(_limit: &'static str, _cause: crate::backend::LimitCause) {}

#[inline]
pub(crate) fn limit_wait_ended(_limit: &'static str, _waited: std::time::Duration) {}

#[inline]
pub(crate) fn limit_slot_lost(_limit: &'static str) {}

#[inline]
pub(crate) fn limit_in_use(_limit: &'static str, _in_use: u32, _capacity: u32) {}
