//! A message that aborts its worker process, with a worker process that
//! dies each time, once for every store: the messages in flight beside it
//! are cut short too, but once recovered each runs alone, so the culprit
//! crashes alone and is parked at the delivery cap while the innocent ones
//! lose nothing (no delivery toward their cap, no attempt of their retry
//! budget).

use std::time::{Duration, Instant};

use saga_runtime::prelude::*;
use sagas_tests::chaos::{Brittle, Chaos, ChaosConfig};

use super::rig::{Rig, Worker};
use crate::common::stores::ScenarioStore;

/// An engine that starts and reads tasks, running no workers.
async fn client<S: ScenarioStore>(rig: &Rig<S>) -> Engine {
    let recorder = rig.recorder().await;
    let chaos = ChaosConfig {
        max_work: Duration::ZERO,
        failure_rate: 0.0,
        record: false,
        poison: None,
    };
    Engine::builder()
        .backend_arc(rig.store.backend(Duration::from_millis(500)).await)
        .saga(Chaos::new(recorder.clone(), "client", chaos))
        .saga(Brittle(Chaos::new(recorder, "client", chaos)))
        .workers(0)
        .build()
        .await
        .unwrap()
}

/// How a crash loop is run: the worker's visibility timeout, its task
/// lease (`None`: the visibility timeout) and which saga the tasks run.
struct Loop {
    visibility_ms: u64,
    lease_ms: Option<u64>,
    brittle: bool,
}

/// What came of a crash loop.
struct Looped<S> {
    crashes: usize,
    poison: TaskId,
    good: Vec<TaskInstance>,
    client: Engine,
    _rig: Rig<S>,
}

impl<S> Looped<S> {
    /// The steps of good tasks that counted other than one attempt (no
    /// step fails: each counts exactly one, whatever crashes cut short),
    /// with what their audit says of them.
    fn charged(&self) -> Vec<String> {
        let mut charged = Vec::new();
        for task in &self.good {
            for step in &task.steps {
                if step.attempts_in_budget() == 1 {
                    continue;
                }
                let audit: Vec<String> = task
                    .audit_log
                    .iter()
                    .filter(|e| e.step.as_deref() == Some(step.name.as_str()))
                    .map(|e| {
                        format!(
                            "{:?} #{:?} by {:?}: {}",
                            e.action,
                            e.attempt,
                            e.worker,
                            e.error.as_deref().unwrap_or("")
                        )
                    })
                    .collect();
                charged.push(format!(
                    "task {} step {} ({:?}): {} attempts, {} in its budget: {step:?}\n    {}",
                    task.id,
                    step.name,
                    task.status,
                    step.attempt_count,
                    step.attempts_in_budget(),
                    audit.join("\n    ")
                ));
            }
        }
        charged
    }

    /// The culprit alone is dead-lettered, for crashing each delivery.
    async fn culprit_parked(&self) {
        let task = self.client.task(self.poison).await.unwrap().unwrap();
        assert_eq!(task.status, TaskStatus::DeadLettered, "{task:#?}");
        let reason = task.error.clone().unwrap_or_default();
        assert!(reason.contains("without completing"), "{reason}");
        assert!(
            self.crashes >= 4,
            "each delivery of the culprit crashed ({})",
            self.crashes
        );
        let letters = self
            .client
            .dead_letters(Default::default())
            .await
            .unwrap()
            .letters;
        assert_eq!(letters.len(), 1, "only the culprit: {letters:#?}");
        assert_eq!(letters[0].task_id, Some(self.poison));
    }
}

/// 40 good tasks and one whose step aborts the process, on a worker that
/// runs 8 messages at once, restarted each time it dies, until every task
/// has ended.
async fn crash_loop<S: ScenarioStore>(how: Loop) -> Looped<S> {
    let rig = Rig::<S>::start();
    let client = client(&rig).await;
    let start = |n: u64| {
        let client = &client;
        async move {
            match how.brittle {
                true => client.start::<Brittle>(n).await.unwrap(),
                false => client.start::<Chaos>(n).await.unwrap(),
            }
        }
    };
    let mut good = Vec::new();
    for n in 1..=20u64 {
        good.push(start(n).await);
    }
    let poison = start(666).await;
    for n in 21..=40u64 {
        good.push(start(n).await);
    }
    let visibility = how.visibility_ms.to_string();
    let lease = how.lease_ms.map(|ms| ms.to_string());
    let mut envs = vec![
        ("WORKERS", "1"),
        ("CONCURRENCY", "8"),
        ("POISON", "666"),
        ("MAX_DELIVERIES", "4"),
        ("VISIBILITY_MS", visibility.as_str()),
        ("MAX_WORK_MS", "300"),
        ("FAILURE_RATE", "0"),
        ("RECORD", "0"),
        ("HOUSEKEEPING_MS", "200"),
        ("IDLE_CONSUMER_MS", "1000"),
        ("BRITTLE", "1"),
    ];
    if let Some(lease) = &lease {
        envs.push(("LOCK_TTL_MS", lease));
    }
    let mut worker = Worker(rig.spawn_worker(&envs));
    let mut crashes = 0;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(90);
    loop {
        let mut open = 0;
        for id in good.iter().chain([&poison]) {
            let task = client.task(*id).await.unwrap().unwrap();
            open += usize::from(!task.status.is_terminal());
        }
        if open == 0 {
            break;
        }
        if Instant::now() >= deadline {
            for id in good.iter().chain([&poison]) {
                let task = client.task(*id).await.unwrap().unwrap();
                if !task.status.is_terminal() {
                    let steps = &task.steps;
                    eprintln!("open {} {:?} {:?}", task.id, task.status, steps);
                    for e in task.audit_log.iter().rev().take(6) {
                        eprintln!(
                            "    {:?} {:?} {:?} {:?} {:?}",
                            e.at, e.action, e.step, e.attempt, e.worker
                        );
                    }
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "{open} tasks still open after {crashes} crashes"
        );
        if worker.exited() {
            crashes += 1;
            eprintln!(
                "crash {crashes} at {:.1} s",
                started.elapsed().as_secs_f64()
            );
            worker = Worker(rig.spawn_worker(&envs));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(worker);
    eprintln!(
        "{} crashes, {:.1} s",
        crashes,
        started.elapsed().as_secs_f64()
    );
    let mut tasks = Vec::new();
    for id in &good {
        tasks.push(client.task(*id).await.unwrap().unwrap());
    }
    Looped {
        crashes,
        poison,
        good: tasks,
        client,
        _rig: rig,
    }
}

/// Before recovered messages ran alone, each crash cost the tasks in
/// flight beside the culprit an attempt and a delivery, and some ended
/// `Compensated` or parked.
pub async fn a_crash_loop_costs_the_tasks_beside_it_nothing<S: ScenarioStore>() {
    let looped = crash_loop::<S>(Loop {
        visibility_ms: 500,
        lease_ms: None,
        brittle: false,
    })
    .await;
    looped.culprit_parked().await;
    for task in &looped.good {
        assert_eq!(task.status, TaskStatus::Completed, "innocent: {task:#?}");
    }
    let charged = looped.charged();
    assert!(
        charged.is_empty(),
        "innocent tasks were charged attempts:\n{}",
        charged.join("\n")
    );
}

/// The settings (visibility 1 s, a task lease of 2 s, longer than
/// it) with two retries a step: a charge for a neighbour's crashes would
/// soon exhaust an innocent task and compensate it.
pub async fn a_crash_loop_exhausts_no_innocent_with_two_retries<S: ScenarioStore>() {
    let looped = crash_loop::<S>(Loop {
        visibility_ms: 1000,
        lease_ms: Some(2000),
        brittle: true,
    })
    .await;
    let charged = looped.charged();
    for task in &looped.good {
        assert_eq!(
            task.status,
            TaskStatus::Completed,
            "innocent: {}\n{}",
            task.id,
            charged.join("\n")
        );
    }
    assert!(
        charged.is_empty(),
        "innocent tasks were charged attempts:\n{}",
        charged.join("\n")
    );
    looped.culprit_parked().await;
}

/// The same for a process manager: one handler aborts the process on one
/// message among 20 good ones, each of which takes a while, so several are
/// in flight beside the culprit. Before recovered messages ran alone, a
/// good message was dead-lettered beside the poison one in about half the
/// runs (its deliveries spent by the culprit's crashes).
pub async fn a_crashing_handler_costs_the_messages_beside_it_nothing<S: ScenarioStore>() {
    use sagas_tests::crashy::{Crashy, Job};
    let rig = Rig::<S>::start();
    let client = Engine::builder()
        .backend_arc(rig.store.backend(Duration::from_millis(500)).await)
        .process_manager(Crashy { poison: None })
        .workers(0)
        .build()
        .await
        .unwrap();
    let job = |n: u64| Job {
        id: format!("job-{n}"),
        n,
        work_ms: 300,
    };
    for n in 1..=10 {
        client.publish(job(n)).await.unwrap();
    }
    client.publish(job(666)).await.unwrap();
    for n in 11..=20 {
        client.publish(job(n)).await.unwrap();
    }
    let envs = [
        ("PROCESS", "1"),
        ("PM_POISON", "666"),
        ("WORKERS", "1"),
        ("CONCURRENCY", "8"),
        ("MAX_DELIVERIES", "4"),
        // Five times the work: a message waiting to run
        // alone is kept invisible by a touch every third of this, and on a
        // loaded machine (two cores, the other scenarios beside it) a
        // touch that came late let an innocent be read again and counted.
        ("VISIBILITY_MS", "1500"),
        ("RECORD", "0"),
        ("HOUSEKEEPING_MS", "200"),
        ("IDLE_CONSUMER_MS", "1000"),
    ];
    let mut worker = Worker(rig.spawn_worker(&envs));
    let mut crashes = 0;
    let deadline = Instant::now() + Duration::from_secs(90);
    let applied = loop {
        let letters = client
            .dead_letters(Default::default())
            .await
            .unwrap()
            .letters;
        let mut applied = Vec::new();
        for n in 1..=20u64 {
            let instance = client
                .process_instance::<Crashy>(&format!("job-{n}"))
                .await
                .unwrap();
            if instance.is_some_and(|i| i.state["applied"] == n) {
                applied.push(n);
            }
        }
        if !letters.is_empty() && applied.len() + letters.len() >= 21 {
            assert_eq!(letters.len(), 1, "only the culprit: {letters:#?}");
            assert!(letters[0].payload.contains("job-666"), "{letters:#?}");
            break applied;
        }
        assert!(
            Instant::now() < deadline,
            "{} applied, {} dead-lettered after {crashes} crashes",
            applied.len(),
            letters.len()
        );
        if worker.exited() {
            crashes += 1;
            worker = Worker(rig.spawn_worker(&envs));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    drop(worker);
    assert_eq!(applied.len(), 20, "every good message applied: {applied:?}");
    assert!(
        crashes >= 4,
        "each delivery of the culprit crashed ({crashes})"
    );
}
