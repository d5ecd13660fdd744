//! The HTTP routes (feature `http`), over a real socket.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use saga_runtime::prelude::*;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;

struct Export {
    started: Arc<Notify>,
}

#[saga]
#[cancellable]
impl Export {
    #[saga_step(1)]
    async fn export(&self, hold: bool, ctx: &StepContext) -> Result<String, StepError> {
        if hold {
            self.started.notify_one();
            ctx.cancelled().await;
            return Err(StepError::permanent("stopped"));
        }
        Ok("done".into())
    }
}

struct Report;

#[saga]
impl Report {
    #[saga_step(1)]
    async fn render(&self, n: u32) -> Result<u32, StepError> {
        Ok(n)
    }
}

/// A minimal HTTP/1.1 client: method, path -> (status, JSON body).
async fn request(addr: SocketAddr, method: &str, path: &str) -> (u16, Value) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\
         Authorization: Bearer t0ken\r\nContent-Length: 0\r\n\r\n"
    );
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let status = raw.split(' ').nth(1).unwrap().parse().unwrap();
    let body = raw.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

#[tokio::test]
async fn cancel_and_inspect_routes() {
    let started = Arc::new(Notify::new());
    let engine = Engine::builder()
        .saga(Export {
            started: started.clone(),
        })
        .saga(Report)
        .build()
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = saga_runtime::http::Api::new(engine.clone())
        .token("t0ken")
        .router();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    // Cancel a running task, then again.
    let running = engine.start::<Export>(true).await.unwrap();
    started.notified().await;
    let (status, body) = request(addr, "DELETE", &format!("/sagas/export/{running}")).await;
    assert_eq!(
        (status, body),
        (200, serde_json::json!({"status": "Cancelled"}))
    );
    let (status, body) = request(addr, "DELETE", &format!("/sagas/export/{running}")).await;
    assert_eq!(
        (status, body),
        (200, serde_json::json!({"status": "Already cancelled"}))
    );
    engine.wait(running).await.unwrap();

    // A completed task cannot be cancelled.
    let done = engine.start::<Export>(false).await.unwrap();
    engine.wait(done).await.unwrap();
    let (status, body) = request(addr, "DELETE", &format!("/sagas/export/{done}")).await;
    assert_eq!(
        (status, body),
        (
            409,
            serde_json::json!({"error": "Task already completed, cannot cancel", "code": "conflict"})
        )
    );

    // Unknown ids, malformed ids, and ids of another saga.
    let (status, _) = request(addr, "DELETE", &format!("/sagas/export/{}", TaskId::new())).await;
    assert_eq!(status, 404);
    let (status, body) = request(addr, "GET", "/sagas/export/not-a-uuid").await;
    assert_eq!(status, 400, "{body}");
    let report = engine.start::<Report>(3).await.unwrap();
    engine.wait(report).await.unwrap();
    let (status, _) = request(addr, "GET", &format!("/sagas/export/{report}")).await;
    assert_eq!(status, 404);

    // GET returns the task with its steps and audit log.
    let (status, body) = request(addr, "GET", &format!("/sagas/export/{running}")).await;
    assert_eq!(status, 200);
    assert_eq!(body["status"], "Cancelled");
    assert_eq!(body["steps"][0]["name"], "export");
    assert!(body["audit_log"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["kind"] == "CancellationRequested"));
    // Who asked is recorded, once (the second DELETE changed nothing).
    let asked: Vec<&Value> = body["audit_log"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["details"].as_str().map(|_| &e["details"]))
        .filter(|d| d.as_str().unwrap().contains("\"by\""))
        .collect();
    assert_eq!(
        asked,
        [&Value::from(r#"{"by":"token","note":""}"#)],
        "{body}"
    );

    // A saga that is not cancellable has no DELETE route.
    let (status, _) = request(addr, "DELETE", &format!("/sagas/report/{report}")).await;
    assert_eq!(status, 405);
    let (status, body) = request(addr, "GET", &format!("/sagas/report/{report}")).await;
    assert_eq!(
        (status, body["output"].clone()),
        (200, serde_json::json!(3))
    );
    tokio::time::sleep(Duration::from_millis(10)).await;
}
