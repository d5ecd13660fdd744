//! Which engines run what (`Runners`), once for every store that keeps
//! announcements: each engine's announcement lasts until its own expiry
//! (an engine with a shorter TTL, as in a rolling deploy that changes it,
//! once cut the whole set on Redis), leaving removes only the engine that
//! leaves, and engines that die without leaving stop counting at their
//! TTL. Saga versions the same way.

use std::sync::Arc;
use std::time::Duration;

use saga_runtime::backend::Runners;

use crate::common::stores::ScenarioStore;

async fn runners<S: ScenarioStore>(store: &S) -> Arc<dyn Runners> {
    store
        .backend(Duration::from_secs(30))
        .await
        .runners()
        .expect("a store shared by engines keeps announcements")
}

pub async fn announcements_are_per_engine_and_expire<S: ScenarioStore>() {
    let store = S::start();
    let backend = runners(&store).await;
    assert!(!backend.process_runner_alive("pinger").await.unwrap());

    // (A name twice is one announcement.)
    let long = Some(Duration::from_secs(30));
    backend
        .announce_processes("long", &["pinger", "pinger"], long)
        .await
        .unwrap();
    backend
        .announce_processes("short", &["pinger"], Some(Duration::from_millis(200)))
        .await
        .unwrap();
    backend
        .announce_processes("short", &["pinger"], None)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        backend.process_runner_alive("pinger").await.unwrap(),
        "`long` announced itself for 30 s a moment ago"
    );
    backend
        .announce_processes("long", &["pinger"], None)
        .await
        .unwrap();
    assert!(
        !backend.process_runner_alive("pinger").await.unwrap(),
        "the last runner left"
    );

    // Engines that die without leaving: alive until their TTL, then not.
    for n in 0..5 {
        backend
            .announce_processes(
                &format!("dead-{n}"),
                &["pinger", "ponger"],
                Some(Duration::from_millis(200)),
            )
            .await
            .unwrap();
    }
    assert!(backend.process_runner_alive("ponger").await.unwrap());
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!backend.process_runner_alive("pinger").await.unwrap());
    assert!(!backend.process_runner_alive("ponger").await.unwrap());

    // Saga versions: announced by the forms an engine records, each its
    // own; gone when the engine leaves.
    let runs = ["ship".to_owned(), "ship@2".to_owned()];
    backend.announce_sagas("a", &runs, long).await.unwrap();
    assert!(backend.saga_runner_alive("ship@2").await.unwrap());
    assert!(!backend.saga_runner_alive("ship@3").await.unwrap());
    assert!(
        !backend.process_runner_alive("ship").await.unwrap(),
        "a saga's announcement is not a process manager's"
    );
    backend.announce_sagas("a", &runs, None).await.unwrap();
    assert!(!backend.saga_runner_alive("ship@2").await.unwrap());
}
