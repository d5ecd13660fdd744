//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod brokers;
pub mod endpoint_shop;
pub mod http_client;
pub mod nats_server;
pub mod ops_sagas;
pub mod postgres_server;
pub mod prometheus;
pub mod rabbitmq_server;
pub mod redis_cluster;
pub mod redis_sentinel;
pub mod redis_server;
pub mod stores;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use saga_runtime::{AuditAction, TaskInstance, TaskStatus};
use tokio::time::Instant;

/// A shared, ordered record of what step bodies did.
#[derive(Clone, Default)]
pub struct Journal(Arc<Mutex<Vec<(String, Instant)>>>);

impl Journal {
    /// Records an event; returns how many events with this label came before.
    pub fn record(&self, label: impl Into<String>) -> usize {
        let label = label.into();
        let mut events = self.0.lock().unwrap();
        let before = events.iter().filter(|(l, _)| *l == label).count();
        events.push((label, Instant::now()));
        before
    }

    pub fn labels(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(l, _)| l.clone())
            .collect()
    }

    pub fn count(&self, label: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(l, _)| l == label)
            .count()
    }

    /// Milliseconds between consecutive events with this label.
    pub fn gaps_ms(&self, label: &str) -> Vec<u128> {
        let events = self.0.lock().unwrap();
        let times: Vec<Instant> = events
            .iter()
            .filter(|(l, _)| l == label)
            .map(|(_, t)| *t)
            .collect();
        times
            .windows(2)
            .map(|w| (w[1] - w[0]).as_millis())
            .collect()
    }
}

/// The sequence of status changes in a task's audit log.
pub fn status_changes(task: &TaskInstance) -> Vec<(TaskStatus, TaskStatus)> {
    task.audit_log
        .iter()
        .filter_map(|e| match e.action {
            AuditAction::StatusChanged { from, to } => Some((from, to)),
            _ => None,
        })
        .collect()
}

/// Polls until `f` holds, advancing (paused) time in small steps.
pub async fn eventually(mut f: impl FnMut() -> bool) {
    for _ in 0..10_000 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("condition never became true");
}

/// Polls `done` every 10 ms until it holds; panics naming `what` after 60 s
/// (of tokio's clock: virtual seconds under a paused clock).
pub async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !done().await {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
