//! What `sagactl` prints: plain text for a person, or `--json` for a
//! script (the same JSON the HTTP API returns).

use saga_runtime::{
    Bulk, CancelResult, DeadLetterPage, TaskId, TaskInstance, TaskPage, TaskStatus,
};
use serde_json::{json, Value};

/// How much of a step's output `show` prints: enough to read an S3 key or
/// a charge id, not a page of JSON per step.
const OUTPUT_SHOWN: usize = 200;

/// `println!` that ends the program quietly when whoever reads the output
/// went away (`sagactl show ID | head`): a closed pipe is not an error of
/// sagactl's.
macro_rules! println {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(error) = writeln!(std::io::stdout(), $($arg)*) {
            if error.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
            panic!("writing to stdout: {error}");
        }
    }};
}

pub struct Out {
    pub json: bool,
}

impl Out {
    pub fn line(&self, text: &str) {
        match self.json {
            true => println!("{}", json!({ "result": text })),
            false => println!("{text}"),
        }
    }

    pub fn tasks(&self, page: &TaskPage) {
        if self.json {
            println!("{}", json!({ "tasks": page.tasks, "next": page.next }));
            return;
        }
        for task in &page.tasks {
            let step = task.current_step().map_or("-", |s| s.name.as_str());
            println!(
                "{}  {:<18}  {:<12}  {}  {}",
                task.id,
                task.status.to_string(),
                step,
                task.created_at,
                task.error.as_deref().unwrap_or("")
            );
        }
        if let Some(next) = &page.next {
            println!("more: --cursor {next}");
        }
    }

    pub fn task(&self, task: &TaskInstance) {
        if self.json {
            println!("{}", serde_json::to_string(task).unwrap_or_default());
            return;
        }
        println!("task     {}", task.id);
        println!("saga     {} (version {})", task.saga, task.saga_version);
        println!("status   {}", task.status);
        println!("created  {}", task.created_at);
        if let Some(at) = task.finished_at {
            println!("finished {at}");
        }
        println!("trace    {}", task.trace_id);
        if let Some(error) = &task.error {
            println!("error    {error}");
        }
        println!("\nsteps");
        for step in &task.steps {
            println!(
                "  {:>2} {:<16} {:<18} attempts {}{}",
                step.order,
                step.name,
                step.status.to_string(),
                step.attempt_count,
                match step.compensation_attempts {
                    0 => String::new(),
                    n => format!(", compensation attempts {n}"),
                }
            );
            if let Some(output) = &step.output {
                println!("       output: {}", capped(output));
            }
            if let Some(error) = &step.error {
                println!("       error: {error}");
            }
            if let Some(error) = &step.compensation_error {
                println!("       compensation error: {error}");
            }
        }
        println!("\ntimeline");
        for entry in &task.audit_log {
            let action = serde_json::to_value(&entry.action).unwrap_or_default();
            let kind = action["kind"].as_str().unwrap_or("?");
            let mut line = format!("  {}  {kind}", entry.at);
            if let (Some(from), Some(to)) = (action["from"].as_str(), action["to"].as_str()) {
                line.push_str(&format!(" {from} -> {to}"));
            }
            if let Some(step) = &entry.step {
                line.push_str(&format!("  step {step}"));
            }
            if let Some(attempt) = entry.attempt {
                line.push_str(&format!(" #{attempt}"));
            }
            if let Some(ms) = action["retry_in_ms"].as_u64() {
                line.push_str(&format!("  retry in {ms} ms"));
            }
            if let Some(error) = &entry.error {
                line.push_str(&format!("  error: {error}"));
            }
            if let Some(details) = &entry.details {
                line.push_str(&format!("  {details}"));
            }
            println!("{line}");
        }
    }

    /// A cancellation's answer: its machine value first (what a script
    /// matches), in text as in JSON.
    pub fn cancelled(&self, task: TaskId, result: CancelResult) {
        let (value, status) = match result {
            CancelResult::Cancelled => ("Cancelled", None),
            CancelResult::NotFound => ("NotFound", None),
            CancelResult::AlreadyCompleted => ("AlreadyCompleted", None),
            CancelResult::AlreadyCancelled => ("AlreadyCancelled", None),
            CancelResult::NotCancellable(status) => ("NotCancellable", Some(status)),
        };
        if self.json {
            let mut answer = json!({ "task": task, "result": value });
            if let Some(status) = status {
                answer["status"] = json!(status);
            }
            println!("{answer}");
            return;
        }
        match result {
            CancelResult::Cancelled => println!(
                "{value}: the deployment's worker stops the running step and compensates \
                 the completed ones"
            ),
            CancelResult::NotFound => println!("{value}: no task {task}"),
            CancelResult::NotCancellable(status @ (TaskStatus::Pending | TaskStatus::Running)) => {
                println!("{value}: the task is `{status}`, and its saga is not `#[cancellable]`")
            }
            CancelResult::NotCancellable(status) => {
                println!("{value}: the task is `{status}`: cancelling it has no meaning")
            }
            _ => println!("{value}"),
        }
    }

    pub fn letters(&self, page: &DeadLetterPage) {
        if self.json {
            println!("{}", json!({ "letters": page.letters, "next": page.next }));
            return;
        }
        for letter in &page.letters {
            let task = letter.task_id.map(|t| t.to_string()).unwrap_or_default();
            println!(
                "{}  {}  {:<36}  {}",
                letter.id, letter.at, task, letter.reason
            );
        }
        if let Some(next) = &page.next {
            println!("more: --cursor {next}");
        }
    }

    pub fn bulk(&self, did: &str, bulk: &Bulk) {
        if self.json {
            println!("{}", serde_json::to_string(bulk).unwrap_or_default());
            return;
        }
        println!("{did} {} of {} looked at", bulk.done.len(), bulk.scanned);
        for (id, why) in &bulk.failed {
            println!("  not {did}: {id}: {why}");
        }
    }
}

/// `output` as compact JSON, cut after [`OUTPUT_SHOWN`] characters with a
/// note of its whole size and where to find it all.
fn capped(output: &Value) -> String {
    let text = output.to_string();
    match text.char_indices().nth(OUTPUT_SHOWN) {
        Some((cut, _)) => format!("{}… ({} bytes; --json for all)", &text[..cut], text.len()),
        None => text,
    }
}
