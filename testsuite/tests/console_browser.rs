//! The web console in a real browser: `examples/console.rs` (live traffic
//! behind a token) driven by headless Chromium over the DevTools protocol.
//!
//! It checks what an operator sees and does: that the page asks for the
//! token before it shows anything (issue 39: reads need it once one is
//! set), the overview's counts, a task page's steps and timeline, a live
//! task cancelled from its page (its events read with the token), that an
//! action without the token shows the API's error (reads opened with
//! `--public-reads`), resolving a
//! `CompensationFailed` task and requeueing a dead letter through the page
//! (each confirmed through the JSON API), and a process manager's
//! instances. And what issue 24 asked of it: each completed step's output
//! on the task page (collapsed, size-capped), a distinct badge for a task
//! that waits for an operator, errors a later attempt made good shown as
//! history, a dialog's validation message in front of its overlay, prose
//! in the timeline, full ids to copy behind the short ones, the token in
//! `sessionStorage`, the page working under its Content-Security-Policy
//! (and that policy refusing an inline handler), and process managers'
//! instance counts and status filter. Screenshots of each page go to
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
/// Where the page keeps the token (`sessionStorage`) and the operator's name.
const TOKEN_KEY: &str = "saga-console.token";
/// `--bad`, the console's red, as `getComputedStyle` reports it.
const RED: &str = "rgb(179, 38, 30)";
/// Records the Content-Security-Policy violations of each document in
/// `window.__csp`, from before the page's own script runs.
const CSP_RECORDER: &str = "window.__csp = []; document.addEventListener('securitypolicyviolation', \
    (e) => window.__csp.push(`${e.violatedDirective} blocked ${e.blockedURI} at ${e.sourceFile}:${e.lineNumber}`));";
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

/// Builds the example and returns its executable. With `--workspace` the
/// features are those of the test build (every one), so nothing is built
/// again with fewer.
fn build_example() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args([
            "build",
            "--workspace",
            "--example",
            "console",
            "--message-format=json",
        ])
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
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
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
        page.call("Page.enable", json!({}))
            .await
            .expect("page events");
        page.call(
            "Page.addScriptToEvaluateOnNewDocument",
            json!({ "source": CSP_RECORDER }),
        )
        .await
        .expect("the violation recorder installed");
        // Clipboard calls need a focused page, which headless has not.
        page.call(
            "Emulation.setFocusEmulationEnabled",
            json!({ "enabled": true }),
        )
        .await
        .expect("focus emulated");
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

    /// A browser-wide command (not the page's session).
    async fn browser_call(&mut self, method: &str, params: Value) -> Result<Value, String> {
        let session = self.session.take();
        let result = self.call(method, params).await;
        self.session = session;
        result
    }

    /// Fails if the current document met a Content-Security-Policy
    /// violation; the page's own script and style must pass its policy.
    async fn assert_no_csp_violation(&mut self) {
        let violations = self.run("window.__csp").await;
        assert_eq!(violations, json!([]), "CSP violations");
    }

    /// Reloads the page and waits for its script to have set the mode.
    async fn reload(&mut self) {
        self.run("window.__before_reload = true").await;
        self.call("Page.reload", json!({})).await.expect("reload");
        self.wait_for(
            "!window.__before_reload && document.querySelector('#mode')?.textContent",
            WAIT,
        )
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

    asks_for_the_token_first(&mut page, &base).await;
    overview(&mut page, &base).await;
    security_headers(addr).await;
    metrics(addr).await;
    task_page(&mut page, addr).await;
    token_kept_for_the_session(&mut page).await;
    live_task_cancelled(&mut page, addr).await;
    large_output_capped(&mut page, addr).await;
    resolve_from_attention(&mut page, addr).await;
    compensation_failed_then_retried(&mut page, addr).await;
    requeue_dead_letter(&mut page, addr).await;
    process_manager(&mut page, addr).await;
    policy_enforced(&mut page).await;
    public_reads(&mut page, &example).await;
    read_only(&mut page, &example).await;
    page.close().await;
    browser.stop(Duration::from_secs(5));
}

/// `GET /metrics` serves the Prometheus figures of the traffic, to the
/// token's holders like every read.
async fn metrics(addr: SocketAddr) {
    let client = Client {
        addr,
        headers: Vec::new(),
    };
    let text = client.raw("GET", "/metrics", None).await;
    assert!(text.starts_with("HTTP/1.1 401"), "{text}");
    let text = client
        .with("Authorization", &format!("Bearer {TOKEN}"))
        .raw("GET", "/metrics", None)
        .await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        text.contains("saga_steps_started_total{saga=\"create-zip\""),
        "{text}"
    );
}

/// Gives the page's token prompt the token and the operator's name.
async fn give_token(page: &mut Page) {
    page.wait_for("document.querySelector('#token-form')", WAIT)
        .await;
    page.type_into("#token-prompt", TOKEN).await;
    page.type_into("#operator-prompt", OPERATOR).await;
    page.click("#token-form [data-test=open]").await;
    page.wait_for("!document.querySelector('#token-form')", WAIT)
        .await;
}

/// With a token set, the page asks for it before it shows anything (the
/// API answers no read without it): no count, task or saga name on the
/// page. A wrong token is refused in the prompt; the right one shows the
/// page that was asked for, and stays in the tab's session.
async fn asks_for_the_token_first(page: &mut Page, base: &str) {
    page.navigate(&format!("{base}#/tasks")).await;
    page.wait_for("document.querySelector('#token-form')", WAIT)
        .await;
    let shown = page
        .run(
            "[document.body.innerText.includes('create-zip'), !!document.querySelector('main table'), \
             document.querySelector('#error').hidden, document.querySelector('#token-message').hidden, \
             document.activeElement?.id]",
        )
        .await;
    assert_eq!(
        shown,
        json!([false, false, true, true, "token-prompt"]),
        "the page before the token"
    );
    page.screenshot("token-prompt").await;
    page.type_into("#token-prompt", "not-the-token").await;
    page.click("#token-form [data-test=open]").await;
    page.wait_for(
        "document.querySelector('#token-form') && !document.querySelector('#token-message').hidden",
        WAIT,
    )
    .await;
    let shown = page
        .run("[document.body.innerText.includes('create-zip'), document.querySelector('#token-message').textContent]")
        .await;
    assert_eq!(shown[0], json!(false), "data shown for a wrong token");
    assert!(shown[1].as_str().unwrap().contains("refused"), "{shown}");
    page.screenshot("token-refused").await;
    give_token(page).await;
    page.wait_for(
        "document.querySelector('#task-list tr[data-task-id]')",
        WAIT,
    )
    .await;
    let stored = page
        .run(&format!(
            "[sessionStorage.getItem('{TOKEN_KEY}'), localStorage.getItem('{TOKEN_KEY}'), \
             document.querySelector('#token').value, document.querySelector('#mode').textContent]"
        ))
        .await;
    assert_eq!(
        stored,
        json!([TOKEN, null, TOKEN, "token set"]),
        "the token stays in the session"
    );
    page.assert_no_csp_violation().await;
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
        json!("token set")
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
    // The list shows an 8-character prefix; hovering shows the whole id.
    let link = page
        .run(&format!(
            "(a => [a.textContent, a.title])(document.querySelector(\"#task-list tr[data-task-id='{id}'] a\"))"
        ))
        .await;
    assert_eq!(link[0], json!(&id[..8]), "{link}");
    assert!(link[1].as_str().unwrap().contains(&id), "{link}");
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
    // The header has the full id, says the short form is a prefix of it,
    // and copies the full id.
    let shown = page
        .run("[document.querySelector('#task-id').textContent, document.querySelector('#id-note').textContent]")
        .await;
    assert_eq!(shown[0], json!(id));
    assert!(shown[1].as_str().unwrap().contains("prefix"), "{shown}");
    let origin = page.run("location.origin").await;
    page.browser_call(
        "Browser.grantPermissions",
        json!({ "origin": origin, "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"] }),
    )
    .await
    .expect("clipboard permission");
    page.click("[data-test=copy-id]").await;
    let copied = page.wait_for("navigator.clipboard.readText()", WAIT).await;
    assert_eq!(copied, json!(id), "the copy button copies the full id");
    // Each completed step's output is there, collapsed.
    let outputs = page
        .run("[...document.querySelectorAll('#steps [data-test=output] details.value')].map(d => [d.open, d.querySelector('pre').textContent])")
        .await;
    let outputs = outputs.as_array().unwrap();
    assert_eq!(outputs.len(), 3, "{outputs:?}");
    for (shown, step) in outputs.iter().zip(task["steps"].as_array().unwrap()) {
        assert_eq!(shown[0], json!(false), "collapsed");
        let value: Value = serde_json::from_str(shown[1].as_str().unwrap()).unwrap();
        assert_eq!(value, step["output"]);
    }
    assert_timeline_in_prose(page).await;
    page.screenshot("task").await;
}

/// No timeline entry reads as a raw enum name (`StepCompleted`,
/// `CompensationRetried`): each says what happened in words.
async fn assert_timeline_in_prose(page: &mut Page) {
    let raw = page
        .run(
            "[...document.querySelectorAll('#timeline td.what')].map(td => td.textContent)\
             .filter(t => /[a-z][A-Z]/.test(t))",
        )
        .await;
    assert_eq!(raw, json!([]), "raw enum names in the timeline");
    let kinds = page
        .run("document.querySelectorAll('#timeline td.what').length")
        .await;
    assert!(kinds.as_u64().unwrap() > 0);
}

/// The console sends its security headers: a policy that allows only the
/// page's own inline script and style (by hash) and requests to its own
/// origin, no framing, no sniffing.
async fn security_headers(addr: SocketAddr) {
    let client = Client {
        addr,
        headers: Vec::new(),
    };
    let raw = client.raw("GET", "/console", None).await;
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let header = |name: &str| {
        head.lines()
            .find_map(|l| {
                let (n, v) = l.split_once(':')?;
                n.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
            })
            .unwrap_or_else(|| panic!("no {name} in {head}"))
    };
    let policy = header("content-security-policy");
    for directive in [
        "default-src 'none'",
        "script-src 'sha256-",
        "style-src 'sha256-",
        "connect-src 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
        "form-action 'none'",
    ] {
        assert!(policy.contains(directive), "{directive} not in {policy}");
    }
    assert!(!policy.contains("unsafe"), "{policy}");
    assert_eq!(header("x-frame-options"), "DENY");
    assert_eq!(header("x-content-type-options"), "nosniff");
    // Handlers are attached by the script: no attribute the policy refuses.
    for attribute in [" onclick=", " onsubmit=", " oninput=", " style="] {
        assert!(!body.contains(attribute), "the page has `{attribute}`");
    }
}

/// The token lives in `sessionStorage`; one an older console left in
/// `localStorage` moves there (off the disk) when the page loads. Without
/// it, the page asks for it again.
async fn token_kept_for_the_session(page: &mut Page) {
    page.assert_no_csp_violation().await;
    page.run(&format!(
        "localStorage.setItem('{TOKEN_KEY}', '{TOKEN}'); sessionStorage.removeItem('{TOKEN_KEY}'); true"
    ))
    .await;
    page.reload().await;
    page.wait_for(
        "document.querySelector('#mode').textContent === 'token set'",
        WAIT,
    )
    .await;
    let stored = page
        .run(&format!(
            "[sessionStorage.getItem('{TOKEN_KEY}'), localStorage.getItem('{TOKEN_KEY}')]"
        ))
        .await;
    assert_eq!(stored, json!([TOKEN, null]), "moved to the session");
    page.run(&format!("sessionStorage.removeItem('{TOKEN_KEY}'); true"))
        .await;
    page.reload().await;
    assert_eq!(
        page.run("document.querySelector('#mode').textContent")
            .await,
        json!("no token")
    );
    page.wait_for("document.querySelector('#token-form')", WAIT)
        .await;
    assert_eq!(
        page.run("!!document.querySelector('main table')").await,
        json!(false),
        "a page shown without the token"
    );
    give_token(page).await;
    page.assert_no_csp_violation().await;
}

/// A large step output is shown cut to its first 2 kB, with a note that
/// says how large it is and where all of it is.
async fn large_output_capped(page: &mut Page, addr: SocketAddr) {
    let name = "big-".to_owned() + &"x".repeat(10_000);
    let input = json!({ "name": name, "files": ["a.pdf"], "card": "ok", "flaky_uploads": 0 });
    let (status, body) = http(
        addr,
        "POST",
        "/api/sagas/create-zip/tasks",
        Some(json!({ "input": input })),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let id = body["id"].as_str().unwrap().to_owned();
    wait_status(addr, &id, "Completed").await;
    page.run(&format!("location.hash = '#/task/{id}'; true"))
        .await;
    let output = "#steps tr[data-step=upload_to_s3] [data-test=output] details.value";
    page.wait_for(&format!("document.querySelector('{output}')"), WAIT)
        .await;
    let shown = page
        .run(&format!(
            "(d => [d.open, d.querySelector('pre').textContent.length, \
             d.querySelector('[data-test=cap-note]')?.textContent, \
             d.querySelector('[data-test=cap-note] a')?.getAttribute('href'), \
             d.querySelector('summary').textContent.length])(document.querySelector('{output}'))"
        ))
        .await;
    assert_eq!(shown[0], json!(false), "collapsed: {shown}");
    let shown_len = shown[1].as_u64().unwrap();
    assert!((1000..=2100).contains(&shown_len), "{shown}");
    let note = shown[2]
        .as_str()
        .unwrap_or_else(|| panic!("no cap note: {shown}"));
    assert!(note.starts_with("first 2.0 kB of 9."), "{note}");
    assert!(
        note.ends_with(&format!("full value in /api/tasks/{id}")),
        "{note}"
    );
    assert_eq!(shown[3], json!(format!("/api/tasks/{id}")));
    assert!(shown[4].as_u64().unwrap() <= 90, "a short preview: {shown}");
    page.screenshot("task-large-output").await;
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
    page.click("#task-actions [data-test=cancel]").await;
    page.wait_for("!document.querySelector('#modal').hidden", WAIT)
        .await;
    // The dialog shows the full id of what it acts on.
    let shown = page
        .run("document.querySelector('#action-id').textContent")
        .await;
    assert!(shown.as_str().unwrap().contains(&id), "{shown}");
    page.type_into(
        "#note",
        "customer abandoned the 3-D Secure challenge (browser test)",
    )
    .await;
    page.click("[data-test=confirm]").await;
    page.wait_for(
        "document.querySelector('#live').textContent === 'finished' && \
         document.querySelector('#task [data-status=Cancelled]')",
        WAIT,
    )
    .await;
    assert_eq!(task_status(addr, &id).await, "Cancelled");
    // The answer is said in words, whatever shape the API gives it.
    let notice = page
        .run("document.querySelector('#notice').textContent")
        .await;
    let notice = notice.as_str().unwrap();
    assert!(notice.contains(&format!("Task {id}: ")), "{notice}");
    let said = notice.split_once(": ").unwrap().1;
    assert!(said.starts_with("cancel"), "{notice}");
    assert!(!said.chars().any(char::is_uppercase), "{notice}");
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

/// A `CompensationFailed` task's page: it is marked as waiting for an
/// operator (not "finished"), shows what the completed step returned (what
/// to clean up by hand) next to the compensation's error, refuses an empty
/// note in front of the dialog's overlay, and once the compensation is
/// retried and succeeds, shows the earlier error as history, not in red.
async fn compensation_failed_then_retried(page: &mut Page, addr: SocketAddr) {
    page.run("location.hash = '#/attention'; true").await;
    let id = page
        .wait_for(
            "document.querySelector('#attention tr[data-task-id]')?.dataset.taskId",
            WAIT,
        )
        .await;
    let id = id.as_str().unwrap().to_owned();
    page.run(&format!("location.hash = '#/task/{id}'; true"))
        .await;
    page.wait_for(
        "(el => el?.textContent === 'needs an operator' && el.classList.contains('attn'))(document.querySelector('#live'))",
        WAIT,
    )
    .await;
    let task = get(addr, &format!("/api/tasks/{id}")).await;
    let key = task["steps"][0]["output"]["key"]
        .as_str()
        .unwrap()
        .to_owned();
    let row = "#steps tr[data-step=upload_to_s3]";
    let shown = page
        .run(&format!(
            "(r => [r.querySelector('[data-test=output] details.value')?.textContent, \
             r.querySelector('[data-test=compensation-error]').className, \
             getComputedStyle(r.querySelector('[data-test=compensation-error]')).color])\
             (document.querySelector('{row}'))"
        ))
        .await;
    assert!(shown[0].as_str().unwrap().contains(&key), "{shown}");
    assert_eq!(
        shown[1],
        json!("err"),
        "the failing compensation is current: {shown}"
    );
    assert_eq!(shown[2], json!(RED), "{shown}");
    page.screenshot("task-compensation-failed").await;

    // An empty note is refused inside the dialog, in front of its overlay.
    page.click("#task-actions [data-test=retry-compensation]")
        .await;
    page.wait_for("!document.querySelector('#modal').hidden", WAIT)
        .await;
    page.click("[data-test=confirm]").await;
    let on_top = page
        .wait_for(
            "(m => !m.hidden && m.textContent.includes('note') && (r => \
               m.contains(document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2)))\
               (m.getBoundingClientRect()))(document.querySelector('#action-message'))",
            WAIT,
        )
        .await;
    assert_eq!(on_top, json!(true));
    assert_eq!(
        page.run("document.querySelector('#modal').hidden").await,
        json!(false),
        "the dialog stays open"
    );
    page.screenshot("dialog-validation").await;
    page.type_into("#note", "legal hold lifted (browser test)")
        .await;
    page.click("[data-test=confirm]").await;
    wait_status(addr, &id, "Compensated").await;
    page.wait_for(
        "document.querySelector('#live').textContent === 'finished' && \
         document.querySelector('#task [data-status=Compensated]')",
        WAIT,
    )
    .await;

    // The compensation error of the earlier attempts is history now.
    let cell = format!("{row} [data-test=compensation-error]");
    let past = page
        .run(&format!(
            "(c => [c.classList.contains('past'), c.textContent, getComputedStyle(c).color])\
             (document.querySelector('{cell}'))"
        ))
        .await;
    assert_eq!(past[0], json!(true), "{past}");
    assert!(past[1].as_str().unwrap().contains("AccessDenied"), "{past}");
    assert_ne!(past[2], json!(RED), "{past}");
    let timeline = page
        .run(
            "[...document.querySelectorAll('#timeline :is(tr[data-kind=CompensationFailed], tr[data-kind=CompensationAttemptFailed]) [data-test=error]')]\
             .map(c => getComputedStyle(c).color)",
        )
        .await;
    assert!(!timeline.as_array().unwrap().is_empty());
    assert!(
        !timeline.as_array().unwrap().contains(&json!(RED)),
        "{timeline}"
    );
    page.wait_for(
        "document.querySelector('#timeline tr[data-kind=CompensationRetried] td.what')?.textContent === 'compensation retried by hand'",
        WAIT,
    )
    .await;
    assert_timeline_in_prose(page).await;
    page.screenshot("task-compensation-retried").await;
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
    // On its page, the webhook's failures and the dead letter are history
    // now: muted, not red.
    page.run(&format!("location.hash = '#/task/{task}'; true"))
        .await;
    let errors = page
        .wait_for(
            "document.querySelector('#live').textContent === 'finished' && \
             [...document.querySelectorAll('#timeline :is(tr[data-kind=DeadLettered], \
             tr[data-kind=AttemptFailed]) [data-test=error]')].map(c => [c.className, getComputedStyle(c).color])",
            WAIT,
        )
        .await;
    let errors = errors.as_array().unwrap();
    assert!(errors.len() >= 2, "{errors:?}");
    for error in errors {
        assert_eq!(error[0], json!("err past"), "{errors:?}");
        assert_ne!(error[1], json!(RED), "{errors:?}");
    }
    page.screenshot("task-requeued").await;
}

/// The process managers with their instance counts (where the API gives
/// them), one's instances in a stable order, filtered by status, and one
/// instance's page.
async fn process_manager(page: &mut Page, addr: SocketAddr) {
    page.run("location.hash = '#/processes'; true").await;
    let row = "#processes tr[data-process=export-follow-up]";
    page.wait_for(&format!("document.querySelector('{row}')"), WAIT)
        .await;
    // An instance completes 10 s after it starts: wait for one.
    let deadline = Instant::now() + WAIT;
    let counts = loop {
        let listing = get(addr, "/api/processes").await;
        let counts = listing["processes"][0]["counts"].clone();
        if counts["Completed"].as_u64() > Some(0) || Instant::now() > deadline {
            break counts;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // The list counts them by status, as the API does.
    page.run("location.hash = '#/processes?again'; true").await;
    page.wait_for(
        &format!("Number(document.querySelector(\"{row} td[data-status=Completed]\")?.dataset.count) > 0"),
        WAIT,
    )
    .await;
    let shown = page
        .run(&format!(
            "Object.fromEntries([...document.querySelectorAll(\"{row} td[data-count]\")]\
             .filter(td => Number(td.dataset.count) > 0).map(td => [td.dataset.status, Number(td.dataset.count)]))"
        ))
        .await;
    // Counted a moment apart: the page's figures are as many or more.
    for (status, n) in counts.as_object().unwrap() {
        assert!(
            shown[status].as_u64() >= n.as_u64(),
            "{status}: {shown} vs {counts}"
        );
    }
    page.screenshot("processes").await;

    page.run("location.hash = '#/process/export-follow-up'; true")
        .await;
    let id = page
        .wait_for(
            "document.querySelector('#instances tr[data-instance-id]')?.dataset.instanceId",
            WAIT,
        )
        .await;
    // Oldest first, then by id: the order does not move between reads.
    let created = page
        .run("[...document.querySelectorAll('#instances tr[data-instance-id]')].map(r => [Number(r.dataset.created), r.dataset.instanceId])")
        .await;
    let created: Vec<(u64, String)> = serde_json::from_value(created).unwrap();
    let mut sorted = created.clone();
    sorted.sort();
    assert_eq!(created, sorted, "instances in a stable order");
    page.screenshot("process").await;
    // The status filter shows only instances of that status.
    for status in ["Completed", "Active"] {
        page.run(&format!(
            "location.hash = '#/process/export-follow-up?status={status}'; true"
        ))
        .await;
        let statuses = page
            .wait_for(
                &format!(
                    "document.querySelector('#instance-filters select').value === '{status}' && \
                     (s => s.length && s)([...document.querySelectorAll('#instances tr[data-instance-id] [data-status]')]\
                     .map(b => b.dataset.status))"
                ),
                WAIT,
            )
            .await;
        let statuses = statuses.as_array().unwrap();
        assert!(statuses.iter().all(|s| s == status), "{statuses:?}");
    }
    page.screenshot("process-filtered").await;
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

/// The page ran under its policy without a violation, and the policy is
/// enforced: an inline handler (what an injected `onclick=` would be) is
/// refused and reported.
async fn policy_enforced(page: &mut Page) {
    page.assert_no_csp_violation().await;
    let ran = page
        .run(
            "(() => { const b = document.createElement('button'); \
             b.setAttribute('onclick', 'window.__injected = true'); document.body.append(b); \
             b.click(); b.remove(); return window.__injected === true; })()",
        )
        .await;
    assert_eq!(ran, json!(false), "an inline handler ran");
    let violations = page
        .wait_for("window.__csp.length && window.__csp", WAIT)
        .await;
    assert!(
        violations[0].as_str().unwrap().starts_with("script-src"),
        "{violations}"
    );
    page.run("window.__csp = []; true").await;
}

/// With reads opened on purpose (`--public-reads`), the page shows the
/// traffic without a token and says "no token"; an action then shows the
/// API's refusal and changes nothing.
async fn public_reads(page: &mut Page, example: &Path) {
    let (_console, addr) = start_console(example, &["--token", TOKEN, "--public-reads"]);
    // Another port, another origin: this tab holds no token for it.
    page.navigate(&format!("http://{addr}/console#/")).await;
    page.wait_for(
        "Number(document.querySelector(\"#overview-table tr[data-saga='create-zip'] td[data-status=total]\")?.textContent) > 0",
        WAIT,
    )
    .await;
    assert_eq!(
        page.run("[document.querySelector('#mode').textContent, !!document.querySelector('#token-form')]")
            .await,
        json!(["no token", false])
    );
    unauthorized_without_token(page).await;
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
    page.assert_no_csp_violation().await;
}
