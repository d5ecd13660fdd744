//! The zip-upload saga from the README: in memory, or on the store `--url`
//! names (the README's first command: a SQLite file).
//!
//! Upload a zip to (fake) S3 with transient failures, capture a payment, then
//! call a webhook behind a circuit breaker. Several tasks run with different
//! fates; each prints a timeline of attempts, delays, outcomes and
//! compensations, and its final status.
//!
//! ```text
//! cargo run --example create_zip                       # in-memory backend
//! cargo run --example create_zip -- --url sqlite://zip.db    # durable, in one file
//! cargo run --features redis --example create_zip -- --redis redis://127.0.0.1:6379 --workers 2
//! cargo run --features redis --example create_zip -- --redis redis://127.0.0.1:6379 --worker-only --workers 2
//! cargo run --features postgres --example create_zip -- --url postgres://postgres@127.0.0.1:5432/postgres --workers 2
//! ```
//!
//! With `--url URL` (or `--redis URL`, or `REDIS_URL`: a SQLite, Redis or
//! PostgreSQL URL), tasks live in that store: kill the demo mid-run (Ctrl-C,
//! or `kill -9`) and run it again, and it first finishes the tasks
//! the killed run left, from the store. On Redis or PostgreSQL any number
//! of processes share the work: run `--worker-only` in one terminal and the
//! demo in another; each timeline line names the worker (process id) that
//! ran it (a SQLite file belongs to one process).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use saga_runtime::prelude::*;
use saga_runtime::{AuditAction, AuditEntry, TaskFilter};
use serde::{Deserialize, Serialize};

/// What a caller asks for. The `scenario` fields make the fake services
/// misbehave so that the example shows every outcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CreateZipRequest {
    pub name: String,
    pub files: Vec<String>,
    pub card: String,
    /// The upload fails this many times with "503 Slow Down" first.
    pub flaky_uploads: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UploadResult {
    pub bucket: String,
    pub key: String,
    pub bytes: u64,
    pub card: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PaymentResult {
    pub payment_id: String,
    pub key: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Receipt {
    pub payment_id: String,
    pub url: String,
}

/// Stand-ins for S3, a payment provider and a webhook endpoint.
#[derive(Default)]
pub struct FakeServices {
    objects: Mutex<BTreeSet<String>>,
    upload_failures: Mutex<HashMap<String, u32>>,
    refunds: Mutex<Vec<String>>,
    /// Set for the tasks that meet a dead webhook (per process: with Redis,
    /// the demo also marks those requests by name, below).
    webhook_down: AtomicBool,
}

pub struct CreateZip {
    services: Arc<FakeServices>,
}

#[saga(name = "create-zip")]
#[cancellable]
impl CreateZip {
    #[saga_step(1)]
    #[retry_policy(max_retries = 5, backoff = exponential, base_delay_ms = 200, on_exhausted = compensate)]
    #[compensation_retry_policy(max_retries = 2, backoff = constant, base_delay_ms = 100)]
    async fn upload_to_s3(
        &self,
        req: CreateZipRequest,
        ctx: &StepContext,
    ) -> Result<UploadResult, StepError> {
        let key = format!("zips/{}.zip", req.name);
        {
            let mut failures = self.services.upload_failures.lock().unwrap();
            let seen = failures.entry(key.clone()).or_insert(0);
            if *seen < req.flaky_uploads {
                *seen += 1;
                return Err(StepError::transient(format!(
                    "S3 503 Slow Down (attempt {})",
                    ctx.attempt()
                )));
            }
        }
        self.services.objects.lock().unwrap().insert(key.clone());
        Ok(UploadResult {
            bucket: "exports".into(),
            key,
            bytes: 1024 * req.files.len() as u64,
            card: req.card,
        })
    }

    #[compensate(upload_to_s3)]
    async fn delete_upload(&self, uploaded: UploadResult) -> Result<(), StepError> {
        if uploaded.key.contains("legal") {
            return Err(StepError::transient(
                "S3 AccessDenied: bucket policy forbids deletes under legal hold",
            ));
        }
        self.services.objects.lock().unwrap().remove(&uploaded.key);
        Ok(())
    }

    #[saga_step(2)]
    #[retry_policy(max_retries = 1, backoff = constant, base_delay_ms = 0, on_exhausted = compensate)]
    async fn capture_payment(
        &self,
        uploaded: UploadResult,
        ctx: &StepContext,
    ) -> Result<PaymentResult, StepError> {
        match uploaded.card.as_str() {
            "declined" => Err(StepError::permanent("card declined (insufficient funds)")),
            "3ds" => {
                // Waiting for the customer's 3-D Secure approval, which never
                // comes in this example: the task gets cancelled instead.
                tokio::select! {
                    _ = ctx.cancelled() => Err(StepError::permanent("3-D Secure challenge abandoned")),
                    _ = tokio::time::sleep(Duration::from_secs(60)) => Err(StepError::permanent("3-D Secure timed out")),
                }
            }
            _ => Ok(PaymentResult {
                payment_id: format!("pay_{}", &ctx.task_id().to_string()[..8]),
                key: uploaded.key,
            }),
        }
    }

    #[compensate(capture_payment)]
    async fn refund(&self, paid: PaymentResult) -> Result<(), StepError> {
        self.services.refunds.lock().unwrap().push(paid.payment_id);
        Ok(())
    }

    #[saga_step(3)]
    #[retry_policy(max_retries = 2, backoff = exponential, base_delay_ms = 100)]
    #[circuit_breaker(failure_threshold = 3, duration_secs = 30)]
    async fn notify_webhook(&self, paid: PaymentResult) -> Result<Receipt, StepError> {
        if self.services.webhook_down.load(Ordering::SeqCst) || paid.key.contains("webhook-down") {
            return Err(StepError::transient("webhook: connection refused"));
        }
        Ok(Receipt {
            url: format!("https://exports.example/{}", paid.key),
            payment_id: paid.payment_id,
        })
    }
}

fn request(name: &str, card: &str, flaky_uploads: u32) -> CreateZipRequest {
    CreateZipRequest {
        name: name.into(),
        files: vec!["a.pdf".into(), "b.pdf".into()],
        card: card.into(),
        flaky_uploads,
    }
}

fn describe(entry: &AuditEntry) -> String {
    let step = entry.step.as_deref().unwrap_or("");
    let attempt = entry
        .attempt
        .map(|a| format!("attempt {a}"))
        .unwrap_or_default();
    let error = entry.error.as_deref().unwrap_or("");
    match &entry.action {
        AuditAction::StatusChanged { from, to } => format!("status  {from} -> {to}"),
        AuditAction::AttemptFailed {
            retry_in_ms: Some(ms),
            ..
        } => {
            format!("{step:<16} {attempt:<10} failed: {error}; retry in {ms} ms")
        }
        AuditAction::AttemptFailed {
            retry_in_ms: None,
            permanent,
        } => {
            let why = if *permanent {
                "permanent, no retry"
            } else {
                "retries exhausted"
            };
            format!("{step:<16} {attempt:<10} failed: {error} ({why})")
        }
        AuditAction::CircuitOpen => format!("{step:<16} {:<10} rejected: {error}", "-"),
        AuditAction::StepCompleted => format!("{step:<16} {attempt:<10} completed"),
        AuditAction::CompensationAttemptFailed { retry_in_ms } => {
            let then = retry_in_ms
                .map(|ms| format!("; retry in {ms} ms"))
                .unwrap_or_default();
            format!("{step:<16} {attempt:<10} compensation failed: {error}{then}")
        }
        AuditAction::StepCompensated => format!("{step:<16} {attempt:<10} compensated"),
        AuditAction::CompensationFailed => format!(
            "{step:<16} {:<10} COMPENSATION FAILED, operator needed (trace {})",
            "",
            entry.trace_id.as_deref().unwrap_or("")
        ),
        AuditAction::CancellationRequested => "cancellation requested".to_owned(),
        other => format!("{other:?} {step} {error}"),
    }
}

fn print_timeline(label: &str, task: &TaskInstance) {
    let started = task.created_at.0;
    let took = task.finished_at.map(|f| f.0 - started).unwrap_or(0);
    println!("\n{label}  ->  {}  ({took} ms)", task.status);
    for entry in &task.audit_log {
        let worker = entry
            .worker
            .as_deref()
            .map(|w| format!("  [{w}]"))
            .unwrap_or_default();
        println!(
            "  +{:>5} ms  {}{worker}",
            entry.at.0.saturating_sub(started),
            describe(entry)
        );
    }
    if let Some(error) = &task.error {
        println!("  error: {error}");
    }
}

struct Args {
    redis: Option<String>,
    workers: usize,
    worker_only: bool,
}

fn args() -> Result<Args, String> {
    let mut args = Args {
        redis: std::env::var("REDIS_URL").ok(),
        workers: 4,
        worker_only: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--redis" | "--url" => args.redis = Some(it.next().ok_or("--redis needs a URL")?),
            "--workers" => {
                let n = it.next().ok_or("--workers needs a number")?;
                args.workers = n
                    .parse()
                    .map_err(|_| format!("--workers: `{n}` is not a number"))?;
            }
            "--worker-only" => args.worker_only = true,
            other => {
                return Err(format!(
                    "unknown argument `{other}`; expected --url URL (or --redis URL), --workers N, --worker-only"
                ))
            }
        }
    }
    if args.worker_only && args.redis.is_none() {
        return Err("--worker-only needs --url URL (a Redis or a PostgreSQL): in-memory tasks live in one process, and a SQLite file belongs to one".into());
    }
    Ok(args)
}

/// The tasks an earlier run left unfinished in the store (it was killed,
/// or its machine went down): the workers took them up again as soon as
/// the engine started; this waits for them and shows how each ended.
async fn resume(engine: &Engine) -> Result<(), Box<dyn std::error::Error>> {
    let mut unfinished = Vec::new();
    for status in [
        TaskStatus::Pending,
        TaskStatus::Running,
        TaskStatus::Compensating,
    ] {
        let filter = TaskFilter::new()
            .saga("create-zip")
            .status(status)
            .limit(100);
        unfinished.extend(engine.tasks(filter).await?.tasks);
    }
    if unfinished.is_empty() {
        return Ok(());
    }
    println!(
        "resuming {} task(s) an earlier run left unfinished",
        unfinished.len()
    );
    for task in unfinished {
        let name = task.input["name"].as_str().unwrap_or("?").to_owned();
        print_timeline(&format!("{name} (resumed)"), &engine.wait(task.id).await?);
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = args()?;
    let services = Arc::new(FakeServices::default());
    let mut builder = Engine::builder().saga(CreateZip {
        services: services.clone(),
    });
    if let Some(url) = &args.redis {
        let backend = saga_runtime::backend::connect(url).await.map_err(|e| {
            format!(
                "cannot use the store at {}: {e}",
                saga_runtime::backend::redacted(url)
            )
        })?;
        builder = builder.backend_arc(backend);
    }
    if args.worker_only {
        let engine = builder.workers(0).build().await?;
        println!(
            "{} workers (pid {}) serving create-zip tasks from {}; Ctrl-C to stop",
            args.workers,
            std::process::id(),
            saga_runtime::backend::redacted(args.redis.as_deref().unwrap_or(""))
        );
        // Ctrl-C (or SIGTERM) lets the steps in progress finish first.
        engine
            .run_workers_until(args.workers, saga_runtime::shutdown_signal())
            .await?;
        return Ok(());
    }
    let engine = builder.workers(args.workers).build().await?;
    if args.redis.is_some() {
        resume(&engine).await?;
    }
    let suffix = if args.redis.is_some() {
        format!("-{}", &TaskId::new().to_string()[..4])
    } else {
        String::new()
    };
    let name = |n: &str| format!("{n}{suffix}");

    let completed = engine
        .start::<CreateZip>(request(&name("report-q3"), "ok", 2))
        .await?;
    let compensated = engine
        .start::<CreateZip>(request(&name("holiday-photos"), "declined", 0))
        .await?;
    let compensation_failed = engine
        .start::<CreateZip>(request(&name("legal-contracts"), "declined", 0))
        .await?;
    let cancelled = engine
        .start::<CreateZip>(request(&name("big-archive"), "3ds", 0))
        .await?;

    // Let the 3-D Secure wait begin, then cancel that task.
    loop {
        let task = engine.task(cancelled).await?.expect("task exists");
        if task.steps[1].attempt_count > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let result = engine.cancel::<CreateZip>(cancelled).await?;
    println!("cancel big-archive: {result:?}");

    for (label, id) in [
        ("report-q3", completed),
        ("holiday-photos", compensated),
        ("legal-contracts", compensation_failed),
        ("big-archive", cancelled),
    ] {
        print_timeline(label, &engine.wait(id).await?);
    }
    // The one that completed hands back the saga's output, typed.
    let receipt: Receipt = engine.wait_output::<CreateZip>(completed).await?;
    println!("\nreport-q3's receipt: {receipt:?}");

    // The webhook goes down: the first task trips the circuit breaker, the
    // next one is rejected at once without calling the webhook (when both run
    // in this process: the breaker is per process).
    services.webhook_down.store(true, Ordering::SeqCst);
    for label in ["webhook-down-1", "webhook-down-2"] {
        let id = engine
            .start::<CreateZip>(request(&name(label), "ok", 0))
            .await?;
        print_timeline(label, &engine.wait(id).await?);
    }

    println!(
        "\nobjects left in this process's bucket: {:?}",
        services.objects.lock().unwrap()
    );
    println!(
        "refunds issued by this process: {}",
        services.refunds.lock().unwrap().len()
    );
    Ok(())
}
