//! A worker process for the transport fault tests: runs the shop's
//! fulfillment process manager (`sagas_tests::shop`) against the store at
//! `BACKEND_URL`, fed by the broker at `BROKER_URL` (`amqp://..` or
//! `nats://..`) under the names of `PREFIX`, relaying its `shipping`
//! endpoint, until killed (or stopped by Ctrl-C or SIGTERM).
//!
//! Environment: `BACKEND_URL`, `BROKER_URL`, `PREFIX` (required);
//! `SCHEMA` (PostgreSQL, default `saga`), `MAX_DELIVERIES` (10),
//! `VISIBILITY_MS` (1000), `WORKERS` (2).

use std::sync::Arc;
use std::time::Duration;

use saga_runtime::backend::postgres::{PostgresBackend, PostgresConfig};
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::backend::Backend;
use saga_runtime::transport::nats::{Nats, NatsConfig};
use saga_runtime::transport::rabbitmq::{RabbitMq, RabbitMqConfig};
use saga_runtime::Engine;
use sagas_tests::shop::{Fulfillment, SHIPPING};

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn required(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("{name} is required"))
}

async fn backend(url: &str) -> Result<Arc<dyn Backend>, Box<dyn std::error::Error>> {
    let visibility_timeout = Duration::from_millis(env("VISIBILITY_MS", 1000));
    if url.starts_with("postgres") {
        let config = PostgresConfig {
            schema: env("SCHEMA", "saga".to_owned()),
            visibility_timeout,
            poll_interval: Duration::from_millis(50),
            ..PostgresConfig::default()
        };
        return Ok(Arc::new(PostgresBackend::connect_url(url, config).await?));
    }
    let config = RedisConfig {
        prefix: env("PREFIX", "saga".to_owned()),
        visibility_timeout,
        block: Duration::from_millis(200),
        ..RedisConfig::default()
    };
    Ok(Arc::new(RedisBackend::connect_with(url, config).await?))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let backend = backend(&required("BACKEND_URL")?).await?;
    let broker = required("BROKER_URL")?;
    let prefix = required("PREFIX")?;
    let builder = Engine::builder()
        .backend_arc(backend)
        .process_manager(Fulfillment)
        .max_deliveries(env("MAX_DELIVERIES", 10))
        .lock_retry_delay(Duration::from_millis(50))
        .timeout_poll_interval(Duration::from_millis(20))
        .workers(0);
    let timeout = Duration::from_secs(3);
    let builder = match broker.starts_with("nats") {
        true => builder.transport(
            Nats::with_config(
                &broker,
                NatsConfig {
                    stream: prefix.to_uppercase(),
                    prefix,
                    timeout,
                    ack_wait: Duration::from_secs(5),
                    ..NatsConfig::default()
                },
            )
            .relay(SHIPPING),
        ),
        false => builder.transport(
            RabbitMq::with_config(
                &broker,
                RabbitMqConfig {
                    prefix,
                    timeout,
                    ..RabbitMqConfig::default()
                },
            )
            .relay(SHIPPING),
        ),
    };
    let engine = builder.build().await?;
    engine
        .run_workers_until(env("WORKERS", 2), saga_runtime::shutdown_signal())
        .await?;
    Ok(())
}
