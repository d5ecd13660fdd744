//! The web console over live traffic: a create-zip-like saga started every
//! 300 ms with a mix of fates, and a small process manager, behind
//! `Api::new(engine).token(..)`.
//!
//! ```text
//! cargo run --features http,metrics --example console                          # in-memory backend, port 8080
//! cargo run --features http,metrics,redis --example console -- --redis redis://127.0.0.1:6379 --port 0 --token s3cret
//! cargo run --features http,metrics --example console -- --read-only           # no token: the API only reads
//! cargo run --features http,metrics --example console -- --public-reads        # a token for changes, reads open to anyone
//! ```
//!
//! Open the printed URL. Most tasks complete; some retry first; some are
//! compensated (card declined); a steady trickle ends `CompensationFailed`
//! (a delete under legal hold, which lifts after a few tries: "Retry
//! compensation" then works) or `DeadLettered` (a webhook that is down
//! for its first three calls: "Requeue" then completes the task). A few
//! wait 20 s for a 3-D Secure approval, long enough to cancel them. One of
//! each of the failures is started first, so they exist within a second
//! or two. Paste the printed token into the console: it asks for it before
//! it shows anything (unless `--public-reads`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use saga_runtime::http::Api;
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

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
    pub key: String,
    pub bytes: u64,
    pub card: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PaymentResult {
    pub payment_id: String,
    pub key: String,
}

/// Stand-ins for S3, a payment provider and a webhook endpoint: each
/// counts the calls it failed, per object key.
#[derive(Default)]
pub struct FakeServices {
    failures: Mutex<HashMap<(&'static str, String), u32>>,
}

impl FakeServices {
    /// Whether call `what` on `key` fails: it does its first `times` times.
    fn fails(&self, what: &'static str, key: &str, times: u32) -> bool {
        let mut failures = self.failures.lock().unwrap();
        let seen = failures.entry((what, key.to_owned())).or_insert(0);
        *seen += 1;
        *seen <= times
    }
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
        if self.services.fails("upload", &key, req.flaky_uploads) {
            let attempt = ctx.attempt();
            return Err(StepError::transient(format!(
                "S3 503 Slow Down (attempt {attempt})"
            )));
        }
        let bytes = 1024 * req.files.len() as u64;
        let card = req.card;
        Ok(UploadResult { key, bytes, card })
    }

    #[compensate(upload_to_s3)]
    async fn delete_upload(&self, uploaded: UploadResult) -> Result<(), StepError> {
        // The legal hold outlasts the compensation's 3 attempts, then lifts.
        if uploaded.key.contains("legal") && self.services.fails("delete", &uploaded.key, 3) {
            return Err(StepError::transient(
                "S3 AccessDenied: bucket policy forbids deletes under legal hold",
            ));
        }
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
                // Waiting for a 3-D Secure approval that never comes.
                tokio::select! {
                    _ = ctx.cancelled() => Err(StepError::permanent("3-D Secure challenge abandoned")),
                    _ = tokio::time::sleep(Duration::from_secs(20)) => Err(StepError::permanent("3-D Secure timed out")),
                }
            }
            _ => Ok(PaymentResult {
                payment_id: format!("pay_{}", &ctx.task_id().to_string()[..8]),
                key: uploaded.key,
            }),
        }
    }

    #[compensate(capture_payment)]
    async fn refund(&self, _paid: PaymentResult) -> Result<(), StepError> {
        Ok(())
    }

    #[saga_step(3)]
    #[retry_policy(max_retries = 2, backoff = exponential, base_delay_ms = 100, on_exhausted = dead_letter)]
    async fn notify_webhook(&self, paid: PaymentResult) -> Result<String, StepError> {
        // Down for the 3 attempts of the first delivery, up after a requeue.
        if paid.key.contains("webhook-down") && self.services.fails("webhook", &paid.key, 3) {
            return Err(StepError::transient("webhook: connection refused"));
        }
        Ok(format!("https://exports.example/{}", paid.key))
    }
}

/// Published for every tenth export: a follow-up 10 s later.
#[derive(Debug, Message, Serialize, Deserialize)]
pub struct ExportStarted {
    #[correlation_id]
    pub export: String,
    pub task: String,
}

/// The follow-up, as a timeout.
#[derive(Debug, Message, Serialize, Deserialize)]
pub struct FollowUp;

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct FollowUpState {
    pub task: String,
    pub followed_up: bool,
}

pub struct ExportFollowUp;

#[process_manager(name = "export-follow-up", state = FollowUpState)]
impl ExportFollowUp {
    #[starts]
    async fn started(
        &self,
        msg: ExportStarted,
        state: &mut FollowUpState,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.task = msg.task;
        ctx.request_timeout(Duration::from_secs(10), FollowUp);
        Ok(())
    }

    #[timeout]
    async fn follow_up(
        &self,
        _t: FollowUp,
        state: &mut FollowUpState,
        ctx: &mut ProcessContext,
    ) -> Result<(), ProcessError> {
        state.followed_up = true;
        ctx.mark_complete();
        Ok(())
    }
}

/// The request of the `n`th task: mostly fine, with every fate in the mix.
fn request(n: u64, run: &str) -> CreateZipRequest {
    let (label, card, flaky_uploads) = match n % 20 {
        0 => ("legal-contracts", "declined", 0),
        1 => ("webhook-down", "ok", 0),
        3 | 11 => ("holiday-photos", "declined", 0),
        5 | 9 | 15 => ("report", "ok", 2),
        17 if n % 40 == 17 => ("big-archive", "3ds", 0),
        _ => ("report", "ok", 0),
    };
    CreateZipRequest {
        name: format!("{label}-{run}{n}"),
        files: vec!["a.pdf".into(), "b.pdf".into()],
        card: card.into(),
        flaky_uploads,
    }
}

/// Starts a task every 300 ms, forever.
async fn traffic(engine: Engine, run: String) {
    let n = AtomicU64::new(0);
    loop {
        let i = n.fetch_add(1, Ordering::Relaxed);
        match engine.start::<CreateZip>(request(i, &run)).await {
            Ok(id) if i % 10 == 2 => {
                let msg = ExportStarted {
                    export: format!("export-{run}{i}"),
                    task: id.to_string(),
                };
                if let Err(e) = engine.publish(msg).await {
                    eprintln!("publish failed: {e}");
                }
            }
            Ok(_) => {}
            Err(e) => eprintln!("start failed: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

struct Args {
    redis: Option<String>,
    port: u16,
    token: Option<String>,
    read_only: bool,
    public_reads: bool,
}

fn args() -> Result<Args, String> {
    let mut args = Args {
        redis: std::env::var("REDIS_URL").ok(),
        port: 8080,
        token: None,
        read_only: false,
        public_reads: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--redis" | "--url" => args.redis = Some(it.next().ok_or("--redis needs a URL")?),
            "--token" => args.token = Some(it.next().ok_or("--token needs a value")?),
            "--read-only" => args.read_only = true,
            "--public-reads" => args.public_reads = true,
            "--port" => {
                let port = it.next().ok_or("--port needs a number")?;
                args.port = port
                    .parse()
                    .map_err(|_| format!("--port: `{port}` is not a port"))?;
            }
            other => {
                return Err(format!(
                    "unknown argument `{other}`; expected --port N, --token T, --read-only, --public-reads, --url URL (or --redis URL)"
                ))
            }
        }
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("console: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = args()?;
    let mut builder = Engine::builder()
        .saga(CreateZip {
            services: Arc::new(FakeServices::default()),
        })
        .process_manager(ExportFollowUp)
        .workers(4);
    if let Some(url) = &args.redis {
        let backend = saga_runtime::backend::connect(url).await.map_err(|e| {
            format!(
                "cannot use the store at {}: {e}",
                saga_runtime::backend::redacted(url)
            )
        })?;
        builder = builder.backend_arc(backend);
    }
    // Before the engine, so that its first figures are recorded.
    let metrics = saga_runtime::metrics::install()?;
    let engine = builder.build().await?;
    // Names unique to this run, so that runs sharing a Redis never meet.
    let run = format!("{}-", &TaskId::new().to_string()[..4]);
    let traffic = tokio::spawn(traffic(engine.clone(), run));

    // Bound before anything is printed: a port in use is told as such.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port))
        .await
        .map_err(|e| {
            format!(
                "cannot listen on 127.0.0.1:{}: {e} (pass --port 0 for any free port)",
                args.port
            )
        })?;
    let mut api = Api::new(engine.clone()).metrics(metrics);
    if args.read_only {
        println!("read-only: no token, so the API refuses every change");
    } else {
        let token = args
            .token
            .unwrap_or_else(|| TaskId::new().0.simple().to_string());
        println!("token: {token}");
        api = api.token(token).public_reads(args.public_reads);
    }
    let addr = listener.local_addr()?;
    println!("console listening on http://{addr}/console");
    match args.read_only || args.public_reads {
        true => println!("metrics at http://{addr}/metrics"),
        false => println!("metrics at http://{addr}/metrics (send Authorization: Bearer <token>)"),
    }
    let app = api.router();
    axum::serve(listener, app)
        .with_graceful_shutdown(saga_runtime::shutdown_signal())
        .await?;
    // No new tasks while the running steps finish.
    traffic.abort();
    println!("shutting down: letting the running steps finish");
    engine.shutdown().await;
    Ok(())
}
