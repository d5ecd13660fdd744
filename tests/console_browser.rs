//! The web console in a real browser: `examples/console.rs` (live traffic
//! behind a token) driven by headless Chromium over the DevTools protocol.
//!
//! It checks what an operator sees and does: the overview's counts, a task
//! page's steps and timeline, a live task cancelled from its page, that an
//! action without the token shows the API's error, resolving a
//! `CompensationFailed` task and requeueing a dead letter through the page
//! (each confirmed through the JSON API), and a process manager's
//! instances. Screenshots of each page go to
//! `<target>/console-screenshots/`.
//!
//! Without `/usr/bin/chromium` (or `chromium` on the `PATH`) the test
//! prints why and passes, unless `CI` is set: then it fails.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod common;

use common::http_client::Client;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

const TOKEN: &str = "console-test-token";
const OPERATOR: &str = "browser-test";
/// How long any one thing may take to show up.
const WAIT: Duration = Duration::from_secs(20);

/// Kills the process when dropped, so that a failing test leaves none behind.
struct Killed(Child);

impl Killed {
    /// Gives the process `grace` to exit by itself (and reap its own
    /// children), then kills it.
    fn stop(mut self, grace: Duration) {
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn chromium() -> Option<PathBuf> {
    let default = PathBuf::from("/usr/bin/chromium");
    if default.exists() {
        return Some(default);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("chromium"))
        .find(|p| p.exists())
}

/// Builds the example and returns its executable.
fn build_example() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args(["build", "--example", "console", "--message-format=json"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stderr(Stdio::inherit())
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "cargo build --example console failed"
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "console")
        .and_then(|m| m["executable"].as_str().map(PathBuf::from))
        .expect("cargo reports the example's executable")
}

/// Sends each line `read` yields to a channel, from a thread that keeps
/// draining it (so that the child never blocks on a full pipe).
fn lines(read: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(read).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    rx
}

/// The first line of `rx` containing `marker`, from `marker` on.
fn line_with(rx: &mpsc::Receiver<String>, marker: &str, what: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                if let Some(at) = line.find(marker) {
                    return line[at..].trim().to_owned();
                }
            }
            Err(e) => panic!("{what} never printed `{marker}`: {e}"),
        }
    }
}

/// The console example `exe` on a free port, with `args`: its process
/// and address.
fn start_console(exe: &Path, args: &[&str]) -> (Killed, SocketAddr) {
    let mut child = Command::new(exe)
        .args(["--port", "0"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the console example starts");
    let stdout = lines(child.stdout.take().unwrap());
    let child = Killed(child);
    let url = line_with(&stdout, "http://", "the console example");
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches("/console")
        .parse()
        .unwrap_or_else(|_| panic!("`{url}` is not the console's address"));
    (child, addr)
}

/// Headless Chromium with a throw-away profile: its process, profile
/// directory and the browser's DevTools WebSocket.
fn start_chromium(exe: &Path) -> (Killed, tempfile::TempDir, String) {
    let profile = tempfile::tempdir().unwrap();
    let mut child = Command::new(exe)
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--hide-scrollbars",
            "--remote-debugging-port=0",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("about:blank")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("chromium starts");
    let stderr = lines(child.stderr.take().unwrap());
    let child = Killed(child);
    let ws = line_with(&stderr, "ws://", "chromium");
    (child, profile, ws)
}

// ------------------------------------------------------------- DevTools client

/// A minimal Chrome DevTools protocol client: one page, one command at a
/// time, events ignored.
struct Page {
    ws: WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>,
    session: Option<String>,
    next_id: u64,
    screenshots: PathBuf,
}

impl Page {
    /// Opens a new page in the browser at `browser_ws`.
    async fn open(browser_ws: &str) -> Page {
        let (ws, _) = tokio_tungstenite::connect_async(browser_ws)
            .await
            .expect("DevTools connection");
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
        let screenshots = target.join("console-screenshots");
        std::fs::create_dir_all(&screenshots).unwrap();
        let mut page = Page {
            ws,
            session: None,
            next_id: 0,
            screenshots,
        };
        let target = page
            .call("Target.createTarget", json!({ "url": "about:blank" }))
            .await
            .expect("a new page");
        let attached = page
            .call(
                "Target.attachToTarget",
                json!({ "targetId": target["targetId"], "flatten": true }),
            )
            .await
            .expect("attached to the page");
        page.session = attached["sessionId"].as_str().map(str::to_owned);
        page.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": 1400, "height": 900, "deviceScaleFactor": 1, "mobile": false }),
        )
        .await
        .expect("viewport set");
        page
    }

    /// Sends `method` and returns its result, or the protocol's error.
    async fn call(&mut self, method: &str, params: Value) -> Result<Value, String> {
        self.next_id += 1;
        let id = self.next_id;
        let mut command = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = &self.session {
            command["sessionId"] = json!(session);
        }
        self.ws
            .send(Message::text(command.to_string()))
            .await
            .map_err(|e| e.to_string())?;
        let reply = tokio::time::timeout(WAIT, async {
            while let Some(message) = self.ws.next().await {
                let message = message.map_err(|e| e.to_string())?;
                let Ok(text) = message.to_text() else {
                    continue;
                };
                let value: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
                if value["id"] == id {
                    return Ok(value);
                }
            }
            Err("DevTools connection closed".to_owned())
        })
        .await
        .map_err(|_| format!("{method}: no answer within {WAIT:?}"))??;
        match reply.get("error") {
            Some(error) => Err(format!("{method}: {error}")),
            None => Ok(reply["result"].clone()),
        }
    }

    async fn navigate(&mut self, url: &str) {
        self.call("Page.navigate", json!({ "url": url }))
            .await
            .expect("navigation");
    }

    /// The value of `js` (awaited if a promise), or why it threw.
    async fn eval(&mut self, js: &str) -> Result<Value, String> {
        let params = json!({ "expression": js, "awaitPromise": true, "returnByValue": true });
        let result = self.call("Runtime.evaluate", params).await?;
        if let Some(exception) = result.get("exceptionDetails") {
            return Err(format!("`{js}` threw: {exception}"));
        }
        Ok(result["result"]["value"].clone())
    }

    /// Runs `js`, which must not throw.
    async fn run(&mut self, js: &str) -> Value {
        self.eval(js).await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// Waits until `js` is truthy and returns its value; on a timeout,
    /// saves a screenshot and fails.
    async fn wait_for(&mut self, js: &str, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let last = self.eval(js).await;
            match &last {
                Ok(v)
                    if !v.is_null() && v != &json!(false) && v != &json!(0) && v != &json!("") =>
                {
                    return v.clone()
                }
                _ if Instant::now() > deadline => {
                    self.screenshot("timeout").await;
                    panic!("waited {timeout:?} for `{js}`; last: {last:?}");
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// Saves the whole page as `<name>.png`.
    async fn screenshot(&mut self, name: &str) {
        let metrics = self
            .call("Page.getLayoutMetrics", json!({}))
            .await
            .unwrap_or_default();
        let height = metrics["cssContentSize"]["height"]
            .as_f64()
            .unwrap_or(900.0)
            .clamp(900.0, 4000.0);
        let params = json!({
            "format": "png",
            "captureBeyondViewport": true,
            "clip": { "x": 0, "y": 0, "width": 1400, "height": height, "scale": 1 },
        });
        match self.call("Page.captureScreenshot", params).await {
            Ok(shot) => {
                let png = base64_decode(shot["data"].as_str().unwrap_or(""));
                let path = self.screenshots.join(format!("{name}.png"));
                std::fs::write(&path, png).unwrap();
                eprintln!("screenshot: {}", path.display());
            }
            Err(e) => eprintln!("no screenshot {name}: {e}"),
        }
    }

    /// Sets the input `selector` to `value` as typing would.
    async fn type_into(&mut self, selector: &str, value: &str) {
        let js = format!(
            "(() => {{ const el = document.querySelector({sel}); el.value = {value}; \
             el.dispatchEvent(new Event('input', {{ bubbles: true }})); return true; }})()",
            sel = json!(selector),
            value = json!(value),
        );
        self.run(&js).await;
    }

    /// Clicks the element `selector`, once it is there and enabled.
    async fn click(&mut self, selector: &str) {
        let sel = json!(selector);
        self.wait_for(
            &format!("(() => {{ const el = document.querySelector({sel}); return !!el && !el.disabled; }})()"),
            WAIT,
        )
        .await;
        self.run(&format!("document.querySelector({sel}).click(), true"))
            .await;
    }

    async fn close(mut self) {
        self.session = None;
        let _ = self.call("Browser.close", json!({})).await;
    }
}

fn base64_decode(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => continue,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

// ------------------------------------------------------------- the JSON API

/// One request to the console's API, with the token: (status, JSON body).
async fn http(addr: SocketAddr, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    Client {
        addr,
        headers: Vec::new(),
    }
    .with("Authorization", &format!("Bearer {TOKEN}"))
    .with("X-Operator", OPERATOR)
    .send(method, path, body)
    .await
}

async fn get(addr: SocketAddr, path: &str) -> Value {
    let (status, body) = http(addr, "GET", path, None).await;
    assert_eq!(status, 200, "GET {path}: {body}");
    body
}

async fn task_status(addr: SocketAddr, id: &str) -> String {
    let task = get(addr, &format!("/api/tasks/{id}")).await;
    task["status"].as_str().unwrap().to_owned()
}

/// Waits until task `id` has `status`, by the API.
async fn wait_status(addr: SocketAddr, id: &str, status: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        let now = task_status(addr, id).await;
        if now == status {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "task {id} is {now}, not {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ------------------------------------------------------------- the test

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_uses_the_console_in_a_browser() {
    let Some(chromium) = chromium() else {
        if std::env::var_os("CI").is_some() {
            panic!("chromium is not installed: .ci/run installs it");
        }
        eprintln!("skipped: chromium is not installed (apt-get install chromium)");
        return;
    };
    let example = build_example();
    let (_console, addr) = start_console(&example, &["--token", TOKEN]);
    let (browser, _profile, browser_ws) = start_chromium(&chromium);
    let mut page = Page::open(&browser_ws).await;
    let base = format!("http://{addr}/console");

    overview(&mut page, &base).await;
    metrics(addr).await;
    task_page(&mut page, addr).await;
    live_task_cancelled(&mut page, addr).await;
    unauthorized_without_token(&mut page).await;

    page.type_into("#operator", OPERATOR).await;
    page.type_into("#token", TOKEN).await;
    page.wait_for(
        "document.querySelector('#mode').textContent === 'token set'",
        WAIT,
    )
    .await;

    resolve_from_attention(&mut page, addr).await;
    requeue_dead_letter(&mut page, addr).await;
    process_manager(&mut page).await;
    read_only(&mut page, &example).await;
    page.close().await;
    browser.stop(Duration::from_secs(5));
}

/// `GET /metrics` serves the Prometheus figures of the traffic.
async fn metrics(addr: SocketAddr) {
    let client = Client {
        addr,
        headers: Vec::new(),
    };
    let text = client.raw("GET", "/metrics", None).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        text.contains("saga_steps_started_total{saga=\"create-zip\""),
        "{text}"
    );
}

/// The overview counts create-zip's tasks, live, and flags the ones that
/// need an operator.
async fn overview(page: &mut Page, base: &str) {
    page.navigate(&format!("{base}#/")).await;
    let row = "#overview-table tr[data-saga='create-zip']";
    let total = page
        .wait_for(
            &format!(
                "Number(document.querySelector(\"{row} td[data-status=total]\")?.textContent)"
            ),
            WAIT,
        )
        .await;
    assert!(total.as_u64().unwrap() > 0);
    // The seeded failures show up, highlighted, within a few seconds.
    for status in ["Completed", "CompensationFailed", "DeadLettered"] {
        page.wait_for(
            &format!("Number(document.querySelector(\"{row} td[data-status={status}]\")?.dataset.count) > 0"),
            WAIT,
        )
        .await;
    }
    let highlighted = page
        .run(&format!(
            "document.querySelector(\"{row} td[data-status=CompensationFailed]\").classList.contains('attn')"
        ))
        .await;
    assert_eq!(highlighted, json!(true));
    // It refreshes by itself: the total grows as traffic goes on.
    page.wait_for(
        &format!(
            "Number(document.querySelector(\"{row} td[data-status=total]\")?.textContent) > {total}"
        ),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(
        page.run("document.querySelector('#mode').textContent")
            .await,
        json!("no token")
    );
    page.screenshot("overview").await;
}

/// A finished task's page shows its three steps and its timeline.
async fn task_page(page: &mut Page, addr: SocketAddr) {
    page.run("location.hash = '#/tasks?saga=create-zip&status=Completed'; true")
        .await;
    let id = page
        .wait_for(
            "document.querySelector('#task-list tr[data-task-id]')?.dataset.taskId",
            WAIT,
        )
        .await;
    let id = id.as_str().unwrap().to_owned();
    page.screenshot("tasks").await;
    page.run(&format!("location.hash = '#/task/{id}'; true"))
        .await;
    page.wait_for(
        "document.querySelectorAll('#steps tr[data-step]').length === 3",
        WAIT,
    )
    .await;
    page.wait_for(
        "document.querySelectorAll('#timeline tr[data-kind=StepCompleted]').length === 3",
        WAIT,
    )
    .await;
    page.wait_for(
        "document.querySelector('#live').textContent === 'finished'",
        WAIT,
    )
    .await;
    let trace = page
        .run("document.querySelector('#trace-id').textContent")
        .await;
    let task = get(addr, &format!("/api/tasks/{id}")).await;
    assert_eq!(trace, task["trace_id"]);
    page.screenshot("task").await;
}

/// A task waiting on its step is shown live; cancelling it from its page
/// compensates it, and the page follows to the end.
async fn live_task_cancelled(page: &mut Page, addr: SocketAddr) {
    let input =
        json!({ "name": "live-3ds", "files": ["a.pdf"], "card": "3ds", "flaky_uploads": 1 });
    let (status, body) = http(
        addr,
        "POST",
        "/api/sagas/create-zip/tasks",
        Some(json!({ "input": input })),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let id = body["id"].as_str().unwrap().to_owned();
    page.run(&format!("location.hash = '#/task/{id}'; true"))
        .await;
    page.wait_for(
        "document.querySelector('#live.on')?.textContent === 'live'",
        WAIT,
    )
    .await;
    // The failed first upload and then the payment step's wait arrive
    // through the event stream.
    page.wait_for(
        "document.querySelector('#timeline tr[data-kind=AttemptFailed]') && \
         document.querySelector('#steps tr[data-step=capture_payment] [data-status=Running]')",
        WAIT,
    )
    .await;
    page.screenshot("task-live").await;
    // The browser has no token yet: set it only for this click.
    page.run(&format!(
        "localStorage.setItem('saga-console.token', '{TOKEN}'); true"
    ))
    .await;
    page.click("#task-actions [data-test=cancel]").await;
    page.wait_for("!document.querySelector('#modal').hidden", WAIT)
        .await;
    page.click("[data-test=confirm]").await;
    page.wait_for(
        "document.querySelector('#live').textContent === 'finished' && \
         document.querySelector('#task [data-status=Cancelled]')",
        WAIT,
    )
    .await;
    page.run("localStorage.removeItem('saga-console.token'); true")
        .await;
    assert_eq!(task_status(addr, &id).await, "Cancelled");
    page.screenshot("task-cancelled").await;
}

/// Without the token, an action shows the API's error in the banner and
/// changes nothing.
async fn unauthorized_without_token(page: &mut Page) {
    page.run("location.hash = '#/dead-letters'; true").await;
    let letter = page
        .wait_for(
            "document.querySelector('#dead-letters tr[data-letter-id]')?.dataset.letterId",
            WAIT,
        )
        .await;
    page.click("#dead-letters tr[data-letter-id] [data-test=requeue]")
        .await;
    page.wait_for(
        "!document.querySelector('#error').hidden && \
         document.querySelector('#error').dataset.code === 'unauthorized'",
        WAIT,
    )
    .await;
    let shown = page
        .run(&format!(
            "!!document.querySelector('#dead-letters tr[data-letter-id=\"{}\"]')",
            letter.as_str().unwrap()
        ))
        .await;
    assert_eq!(shown, json!(true), "the letter stays");
    page.screenshot("unauthorized").await;
}

/// Resolving a CompensationFailed task from the attention page, with a
/// note that ends up in its audit log.
async fn resolve_from_attention(page: &mut Page, addr: SocketAddr) {
    page.run("location.hash = '#/attention'; true").await;
    let id = page
        .wait_for(
            "document.querySelector('#attention tr[data-task-id]')?.dataset.taskId",
            WAIT,
        )
        .await;
    let id = id.as_str().unwrap().to_owned();
    page.screenshot("attention").await;
    page.click(&format!(
        "#attention tr[data-task-id='{id}'] [data-test=resolve]"
    ))
    .await;
    page.wait_for("!document.querySelector('#modal').hidden", WAIT)
        .await;
    let note = "legal hold lifted; deleted the upload by hand (browser test)";
    page.type_into("#note", note).await;
    page.screenshot("resolve-dialog").await;
    page.click("[data-test=confirm]").await;
    page.wait_for(
        &format!(
            "!document.querySelector('#notice').hidden && \
             !document.querySelector(\"#attention tr[data-task-id='{id}']\")"
        ),
        WAIT,
    )
    .await;
    assert!(page.run("document.querySelector('#error').hidden").await == json!(true));

    let task = get(addr, &format!("/api/tasks/{id}")).await;
    assert_eq!(task["status"], "Resolved");
    let resolved = task["audit_log"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "Resolved")
        .expect("a Resolved audit entry");
    let details = resolved["details"].as_str().unwrap();
    assert!(details.contains(note), "{details}");
    assert!(details.contains(OPERATOR), "{details}");

    // The task's page shows who resolved it and why.
    page.run(&format!("location.hash = '#/task/{id}'; true"))
        .await;
    page.wait_for(
        &format!(
            "document.querySelector('#timeline tr[data-kind=Resolved]')?.textContent.includes({})",
            json!(note)
        ),
        WAIT,
    )
    .await;
    page.screenshot("task-resolved").await;
}

/// Requeueing a dead letter from its page takes it off the queue, and its
/// task (whose webhook is back) completes.
async fn requeue_dead_letter(page: &mut Page, addr: SocketAddr) {
    page.run("location.hash = '#/dead-letters'; true").await;
    let row = "#dead-letters tr[data-letter-id]:has([data-status=DeadLettered])";
    let letter = page
        .wait_for(
            &format!("document.querySelector('{row}')?.dataset.letterId"),
            WAIT,
        )
        .await;
    let letter = letter.as_str().unwrap().to_owned();
    let task = page
        .run(&format!("document.querySelector('{row}').dataset.taskId"))
        .await;
    let task = task.as_str().unwrap().to_owned();
    page.screenshot("dead-letters").await;
    page.click(&format!(
        "#dead-letters tr[data-letter-id='{letter}'] [data-test=requeue]"
    ))
    .await;
    page.wait_for(
        &format!("!document.querySelector(\"#dead-letters tr[data-letter-id='{letter}']\")"),
        WAIT,
    )
    .await;
    let letters = get(addr, "/api/dead-letters?limit=200").await;
    let ids: Vec<&str> = letters["letters"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l["id"].as_str())
        .collect();
    assert!(
        !ids.contains(&letter.as_str()),
        "{letter} is still in {ids:?}"
    );
    wait_status(addr, &task, "Completed").await;
}

/// A process manager's instances and one instance's page.
async fn process_manager(page: &mut Page) {
    page.run("location.hash = '#/process/export-follow-up'; true")
        .await;
    let id = page
        .wait_for(
            "document.querySelector('#instances tr[data-instance-id]')?.dataset.instanceId",
            WAIT,
        )
        .await;
    page.screenshot("process").await;
    let id = id.as_str().unwrap();
    page.run(&format!(
        "location.hash = '#/process/export-follow-up/' + encodeURIComponent('{id}'); true"
    ))
    .await;
    page.wait_for(
        "document.querySelector('#instance-state')?.textContent.includes('task')",
        WAIT,
    )
    .await;
    page.screenshot("process-instance").await;
}

/// Against an API without a token configured, the page says "read-only",
/// disables every action, and shows the API's refusal.
async fn read_only(page: &mut Page, example: &Path) {
    let (_console, addr) = start_console(example, &["--read-only"]);
    page.navigate(&format!("http://{addr}/console#/dead-letters"))
        .await;
    page.wait_for(
        "document.querySelector('#mode').textContent === 'read-only'",
        WAIT,
    )
    .await;
    page.wait_for(
        "document.querySelector('#dead-letters [data-test=requeue]')",
        WAIT,
    )
    .await;
    let enabled = page
        .run("[...document.querySelectorAll('button.action')].filter(b => !b.disabled).length")
        .await;
    assert_eq!(enabled, json!(0), "every action button is disabled");
    // A change asked for anyway (the page's own request helper) is refused.
    page.run("api('/api/dead-letters/m-1/requeue', 'POST').catch(showError), true")
        .await;
    page.wait_for(
        "document.querySelector('#error').dataset.code === 'read_only'",
        WAIT,
    )
    .await;
    page.screenshot("read-only").await;
}
