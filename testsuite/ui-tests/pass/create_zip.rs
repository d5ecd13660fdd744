//! The full saga of the design document: every attribute, `#[cancellable]`
//! below `#[saga]`, steps with and without a context, with and without a
//! timeout.
use saga_runtime::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CreateZipRequest {
    pub files: Vec<String>,
}

pub mod storage {
    #[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
    pub struct UploadResult {
        pub key: String,
    }
}
use storage::UploadResult;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PaymentResult {
    pub charge_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Receipt {
    pub sent: bool,
}

pub struct CreateZip {
    bucket: String,
}

#[saga(name = "create-zip")]
#[cancellable]
impl CreateZip {
    #[saga_step(1, timeout_ms = 30_000)]
    #[retry_policy(max_retries = 5, backoff = exponential, base_delay_ms = 200, on_exhausted = compensate)]
    #[compensation_retry_policy(max_retries = 3, backoff = constant, base_delay_ms = 1000)]
    async fn upload_to_s3(
        &self,
        req: CreateZipRequest,
        ctx: &StepContext,
    ) -> Result<UploadResult, StepError> {
        Ok(UploadResult {
            key: format!("{}/{}/{}", self.bucket, ctx.task_id(), req.files.len()),
        })
    }

    #[compensate(upload_to_s3)]
    async fn delete_upload(
        &self,
        uploaded: storage::UploadResult,
        ctx: &StepContext,
    ) -> Result<(), StepError> {
        let _ = (uploaded, ctx.idempotency_key());
        Ok(())
    }

    // The input is written with a path; the previous output without one.
    #[saga_step(2)]
    #[retry_policy(max_retries = 1, backoff = "constant", base_delay_ms = 0, on_exhausted = fail)]
    async fn capture_payment(
        &self,
        uploaded: crate::storage::UploadResult,
        ctx: &StepContext,
    ) -> Result<PaymentResult, StepError> {
        if ctx.is_cancelled() {
            return Err(StepError::permanent("cancelled"));
        }
        Ok(PaymentResult {
            charge_id: uploaded.key,
        })
    }

    #[saga_step(3, timeout_ms = 1)]
    #[retry_policy(
        max_retries = 3,
        backoff = linear,
        base_delay_ms = 500,
        max_delay_ms = 10_000,
        jitter,
        on_exhausted = dead_letter
    )]
    #[circuit_breaker(failure_threshold = 5, duration_secs = 30)]
    async fn notify_webhook(&self, paid: PaymentResult) -> std::result::Result<Receipt, StepError> {
        Ok(Receipt {
            sent: !paid.charge_id.is_empty(),
        })
    }

    /// Not a step: left alone.
    pub fn new(bucket: &str) -> Self {
        CreateZip {
            bucket: bucket.to_owned(),
        }
    }
}

fn assert_cancellable<S: Cancellable>() {}

fn main() {
    assert_cancellable::<CreateZip>();
    assert_eq!(<CreateZip as Saga>::NAME, "create-zip");
    let def = <CreateZip as Saga>::definition();
    assert_eq!(def.name, "create-zip");
    assert_eq!(def.type_name, "CreateZip");
    assert!(def.cancellable);
    assert_eq!(def.steps.len(), 3);

    let s1 = &def.steps[0];
    assert_eq!((s1.name, s1.order), ("upload_to_s3", 1));
    assert_eq!(s1.retry.max_retries, 5);
    assert_eq!(s1.input_type, "CreateZipRequest");
    assert_eq!(s1.output_type, "UploadResult");
    let comp = s1.compensation.as_ref().expect("step 1 has a compensation");
    assert_eq!(comp.name, "delete_upload");
    assert_eq!(comp.retry.max_retries, 3);
    assert!(s1.circuit_breaker.is_none());
    assert_eq!(s1.timeout, Some(std::time::Duration::from_millis(30_000)));

    let s2 = &def.steps[1];
    assert_eq!((s2.name, s2.order), ("capture_payment", 2));
    assert!(s2.compensation.is_none());
    assert_eq!(s2.input_type, "crate::storage::UploadResult");
    assert_eq!(s2.timeout, None);

    let s3 = &def.steps[2];
    assert_eq!(
        s3.retry.max_delay,
        Some(std::time::Duration::from_millis(10_000))
    );
    assert!(s3.retry.jitter);
    assert_eq!(s3.timeout, Some(std::time::Duration::from_millis(1)));
    let breaker = s3.circuit_breaker.expect("step 3 has a breaker");
    assert_eq!(breaker.failure_threshold, 5);
    assert_eq!(breaker.duration, std::time::Duration::from_secs(30));

    let saga = CreateZip::new("bucket");
    assert_eq!(saga.bucket, "bucket");
    let _ = CreateZipStepOutput::CapturePayment(PaymentResult {
        charge_id: String::new(),
    });
}
