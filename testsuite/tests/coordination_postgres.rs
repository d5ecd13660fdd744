//! Coordination between engines on one PostgreSQL database (a private
//! server per test, never the machine's own): one timer poller among two
//! engines and the other taking over once the holder leaves or dies, races
//! between engines for a lease and a probe, the rows of expired runner
//! announcements, and how many lease
//! statements idle engines send (counted by `pg_stat_statements`). The
//! shared circuit breaker across engines is an engine scenario of every
//! store (`tests/engine_scenarios.rs`, `breakers::`).

mod common;

use std::time::{Duration, Instant};

use common::postgres_server::TestPostgres;
use saga_runtime::backend::postgres::{PostgresBackend, PostgresConfig};
use saga_runtime::backend::{BreakerChange, BreakerDecision, Breakers, Leases, Runners};
use saga_runtime::prelude::*;
use sqlx::postgres::PgPool;

/// The engine tests watch timing; they run one at a time so that two
/// servers starting (initdb) do not starve the other's engines.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A backend on `pg` that notices delayed messages (a retry's backoff, a
/// parked task) within 50 ms, as the Redis test's 50 ms block does.
async fn backend(pg: &TestPostgres) -> PostgresBackend {
    let config = PostgresConfig {
        poll_interval: Duration::from_millis(50),
        ..PostgresConfig::default()
    };
    PostgresBackend::connect_url(&pg.url(), config)
        .await
        .expect("connect to the test server")
}

/// A saga for engines that only need one registered.
struct Idle;

#[saga(name = "idle")]
impl Idle {
    #[saga_step(1)]
    async fn one(&self, n: u32) -> Result<u32, StepError> {
        Ok(n)
    }
}

/// The `timers` lease as the database has it: its holder, if unexpired.
async fn timer_holder(pool: &PgPool) -> Option<String> {
    sqlx::query_scalar(
        "SELECT holder FROM saga.named_leases \
         WHERE name = 'timers' AND expires_at > clock_timestamp()",
    )
    .fetch_optional(pool)
    .await
    .unwrap()
}

/// Waits up to `within` for a holder of the `timers` lease other than
/// `not`; how long it took and who.
async fn next_holder(pool: &PgPool, not: Option<&str>, within: Duration) -> (Duration, String) {
    let started = Instant::now();
    while started.elapsed() < within {
        match timer_holder(pool).await {
            Some(holder) if Some(holder.as_str()) != not => return (started.elapsed(), holder),
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    panic!("no engine took the timers lease within {within:?} (the last holder: {not:?})");
}

/// An engine with the default timer poll (100 ms), so its `timers` lease
/// lives 2 s.
async fn idle_engine(pg: &TestPostgres) -> Engine {
    Engine::builder()
        .backend(backend(pg).await)
        .saga(Idle)
        .build()
        .await
        .unwrap()
}

/// The engines' `timers` lease TTL at the default timer poll.
const TIMER_TTL: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_engines_elect_one_timer_poller_and_the_other_takes_over_on_shutdown() {
    let _serial = SERIAL.lock().await;
    let pg = TestPostgres::start();
    let pool = PgPool::connect(&pg.url()).await.unwrap();
    let a = idle_engine(&pg).await;
    let (_, first) = next_holder(&pool, None, TIMER_TTL).await;
    let b = idle_engine(&pg).await;
    // Both poll now: the holder keeps the lease (renewing it before it
    // expires), and the other never takes it.
    let watched = Instant::now();
    while watched.elapsed() < TIMER_TTL * 2 {
        assert_eq!(
            timer_holder(&pool).await.as_deref(),
            Some(first.as_str()),
            "one holder while it runs, its lease never lapsing"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The holder leaves (releasing its lease): the other takes over at its
    // next look, within the TTL.
    a.shutdown().await;
    let (took, second) = next_holder(&pool, Some(&first), TIMER_TTL).await;
    assert_ne!(first, second);
    assert!(took <= TIMER_TTL, "taken over after {took:?}");
    // And keeps it.
    tokio::time::sleep(TIMER_TTL).await;
    assert_eq!(timer_holder(&pool).await, Some(second));
    b.shutdown().await;
    assert_eq!(timer_holder(&pool).await, None, "released on shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_timer_lease_of_an_engine_that_died_is_taken_over_once_it_expires() {
    let _serial = SERIAL.lock().await;
    let pg = TestPostgres::start();
    let pool = PgPool::connect(&pg.url()).await.unwrap();
    // An engine killed just after renewing: its lease has a full TTL left
    // and is never released.
    let dead = backend(&pg).await;
    assert!(dead.named_lease("timers", "dead", TIMER_TTL).await.unwrap());
    let killed = Instant::now();
    let live = idle_engine(&pg).await;
    assert_eq!(timer_holder(&pool).await.as_deref(), Some("dead"));
    let (_, holder) = next_holder(&pool, Some("dead"), TIMER_TTL * 2).await;
    let after = killed.elapsed();
    assert!(
        after >= TIMER_TTL - Duration::from_millis(50),
        "not taken while the dead engine's lease held: {after:?}"
    );
    // It looks every quarter of the TTL.
    assert!(
        after <= TIMER_TTL + TIMER_TTL / 4 + Duration::from_millis(300),
        "taken over {after:?} after the last renewal"
    );
    assert_ne!(holder, "dead");
    live.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_engines_racing_for_a_lease_or_a_probe_one_wins() {
    let _serial = SERIAL.lock().await;
    let pg = TestPostgres::start();
    let engines: Vec<PostgresBackend> =
        futures::future::join_all((0..4).map(|_| backend(&pg))).await;
    let ttl = Duration::from_secs(30);
    for round in 0..5 {
        let name = format!("lease-{round}");
        let takers = (0..16).map(|n| {
            let b = engines[n % engines.len()].clone();
            let name = name.clone();
            async move { b.named_lease(&name, &format!("t{n}"), ttl).await.unwrap() }
        });
        let won = futures::future::join_all(takers).await;
        assert_eq!(won.iter().filter(|w| **w).count(), 1, "{won:?}");
    }

    // A breaker whose break is over: of many callers at once, one probes.
    let open = Duration::from_millis(200);
    let probe_ttl = Duration::from_secs(30);
    let mut changes = Vec::new();
    for b in &engines[..3] {
        changes.push(
            b.breaker_report("s:step", None, Some(true), 3, open)
                .await
                .unwrap(),
        );
    }
    assert_eq!(
        changes,
        [None, None, Some(BreakerChange::Opened)],
        "counted across engines"
    );
    for round in 0..3 {
        tokio::time::sleep(open + Duration::from_millis(50)).await;
        let callers = (0..16).map(|n| {
            let b = engines[n % engines.len()].clone();
            async move {
                let token = format!("r{round}-p{n}");
                let decision = b.breaker_acquire("s:step", probe_ttl, &token).await;
                (token, decision.unwrap())
            }
        });
        let decisions = futures::future::join_all(callers).await;
        let probes: Vec<_> = decisions
            .iter()
            .filter(|(_, d)| matches!(d, BreakerDecision::Call { probe: true, .. }))
            .collect();
        assert_eq!(probes.len(), 1, "one probe at a time: {decisions:?}");
        assert!(
            decisions.iter().all(|(_, d)| matches!(
                d,
                BreakerDecision::Open { .. } | BreakerDecision::Call { probe: true, .. }
            )),
            "the others wait: {decisions:?}"
        );
        // The probe fails: open again for another break.
        let reopened = engines[1]
            .breaker_report("s:step", Some(&probes[0].0), Some(true), 3, open)
            .await
            .unwrap();
        assert_eq!(reopened, Some(BreakerChange::Opened));
    }
}

/// The rows of engines whose announcements expired go with the next
/// announcement (any engine's), so the table holds about one row per live
/// engine and process manager however often engines restart. (What the
/// announcements mean is an engine scenario of every store:
/// `tests/engine_scenarios.rs`, `runners::`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rows_of_expired_runner_announcements_go_with_the_next() {
    let _serial = SERIAL.lock().await;
    let pg = TestPostgres::start();
    let backend = backend(&pg).await;
    let pool = PgPool::connect(&pg.url()).await.unwrap();
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
    tokio::time::sleep(Duration::from_millis(400)).await;
    backend
        .announce_processes("live", &["other"], Some(Duration::from_secs(30)))
        .await
        .unwrap();
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT process, member FROM saga.process_runners ORDER BY 1, 2")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(rows, [("other".to_owned(), "live".to_owned())]);
}

/// Calls of statements matching `pattern` since the last reset.
fn statement_calls(pg: &TestPostgres, pattern: &str) -> u64 {
    pg.psql(&format!(
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements \
         WHERE query LIKE '{pattern}' AND query NOT LIKE '%pg_stat_statements%'"
    ))
    .parse()
    .unwrap()
}

/// What idle engines send for the `timers` lease, counted by the server
/// (`pg_stat_statements`): the holder renews it every quarter of its TTL
/// (2 s at the default 100 ms timer poll: 2 a second), not on every poll
/// (10 a second), and an engine that does not hold it looks as often.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_engines_renew_the_timer_lease_a_few_times_a_second() {
    let _serial = SERIAL.lock().await;
    let mut pg = TestPostgres::start();
    pg.psql("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'");
    pg.crash();
    pg.restart();
    pg.psql("CREATE EXTENSION pg_stat_statements");
    // The default settings, as an idle engine of a deployment has them.
    let idle = || async {
        let backend = PostgresBackend::connect(&pg.url()).await.unwrap();
        Engine::builder()
            .backend(backend)
            .saga(Idle)
            .build()
            .await
            .unwrap()
    };
    const WINDOW: Duration = Duration::from_secs(5);
    let per_second = |calls: u64| calls as f64 / WINDOW.as_secs_f64();

    let a = idle().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    pg.psql("SELECT pg_stat_statements_reset()");
    tokio::time::sleep(WINDOW).await;
    let one = per_second(statement_calls(&pg, "%named_lease%"));
    let all_one = per_second(statement_calls(&pg, "%"));

    let b = idle().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    pg.psql("SELECT pg_stat_statements_reset()");
    tokio::time::sleep(WINDOW).await;
    let two = per_second(statement_calls(&pg, "%named_lease%"));
    let all_two = per_second(statement_calls(&pg, "%"));
    println!(
        "lease statements a second: {one:.1} from one idle engine ({all_one:.1} statements in all), \
         {two:.1} from two ({all_two:.1} in all)"
    );
    assert!(
        one <= 3.0,
        "one idle engine: {one:.1} lease statements a second"
    );
    assert!(
        two <= 5.0,
        "two idle engines: {two:.1} lease statements a second"
    );
    a.shutdown().await;
    b.shutdown().await;
}
