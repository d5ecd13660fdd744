//! `sagactl`: the operator's actions against a deployment's store, from a
//! shell: list and show tasks, resolve them, retry a failed compensation,
//! cancel, and work the dead-letter queue (requeue, discard, purge). It
//! does every action the console does.
//!
//! It needs no saga types: it attaches a client-only engine (no workers)
//! to the deployment under a prefix on a Redis (or a schema on
//! PostgreSQL), writing nothing until an action does, and acts by name. A
//! requeued task is run by the deployment's workers. A cancellation is
//! recorded in the store (with who asked and why) and the deployment's
//! worker running the task honours it; whether the task may be cancelled
//! is what its saga recorded in the task when it started.
//!
//! The store is `--url URL` (alias `--redis`), else `SAGA_URL`; there is
//! no default, and without either sagactl stops with a usage error that
//! shows the URL forms. A default (a Redis on localhost) made a command
//! typed without the URL act on whatever store happened to listen there,
//! silently. A command that changes something says on stderr which
//! deployment it acts on (and when the URL came from `SAGA_URL`) before
//! it does. No message prints the URL's password.
//!
//! Every action that changes a task (resolve, retry-compensation, cancel,
//! requeue, discard, purge) takes `--by` (or `SAGACTL_OPERATOR`) and
//! `--note`, kept in the task's audit log: the next operator reads who
//! acted and why.
//!
//! ```text
//! export SAGA_URL=redis://redis.internal:6379   # or --url postgres://ana@db:5432/shop
//! sagactl list --saga create-zip --status CompensationFailed
//! sagactl show 4b6c1a2e-…                 # the steps, their outputs, the timeline
//! sagactl resolve 4b6c1a2e-… --by ana --note "refunded by hand"
//! sagactl cancel 4b6c1a2e-… --by ana --note "customer withdrew"
//! sagactl dead-letters
//! sagactl requeue 3:1732518000000-0 --by ana --note "warehouse API back"   # one letter
//! sagactl requeue --saga create-zip --error "timed out" --by ana --note "timeout raised"
//! sagactl purge --saga create-zip --by ana --note "orders withdrawn" --yes
//! ```

mod connect;
mod print;

use std::process::ExitCode;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use saga_runtime::policy::{BackoffKind, RetryPolicy};
use saga_runtime::{
    CancelResult, DeadLetterFilter, DeadLetterSelection, Engine, Intervention, TaskFilter, TaskId,
};

use connect::Store;

#[derive(Parser)]
#[command(
    name = "sagactl",
    version,
    about = "Operator actions on sagas stored in Redis, PostgreSQL or a SQLite file"
)]
struct Cli {
    /// The deployment's store (required: there is no default): a Redis
    /// (`redis://host:port`, a cluster's
    /// `redis+cluster://host:port,host:port`, or a Sentinel deployment's
    /// `redis+sentinel://host:port,host:port/<service>`), a PostgreSQL
    /// database (`postgres://user@host:port/database`) or a SQLite file
    /// (`sqlite://path/to/file.db`, while no engine has it open).
    // Optional to clap: a missing URL is told by `no_store`, with the URL
    // forms. The variable's value is not shown in `--help`: it may carry
    // a password.
    #[arg(
        long,
        visible_alias = "redis",
        env = "SAGA_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    url: Option<String>,
    /// Its key prefix (`RedisConfig::prefix`; the partition count is read
    /// from what the deployment recorded there), or on PostgreSQL its
    /// schema (`PostgresConfig::schema`).
    #[arg(long, global = true, default_value = "saga")]
    prefix: String,
    /// Seconds to wait for the store to answer before calling it
    /// unresponsive.
    #[arg(long, global = true, default_value_t = 5.0)]
    timeout: f64,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Tasks of one saga, newest first.
    List {
        /// The saga's name.
        #[arg(long)]
        saga: String,
        /// Only this status (`Running`, `CompensationFailed`, ...).
        #[arg(long)]
        status: Option<saga_runtime::TaskStatus>,
        /// Only tasks at or stopped at this step.
        #[arg(long)]
        step: Option<String>,
        /// Only tasks with this text in an error.
        #[arg(long)]
        error: Option<String>,
        /// Page size.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// The `next` cursor of the previous page.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// One task: its steps (with their outputs) and timeline.
    Show {
        /// The task's id: a full UUID.
        task: String,
    },
    /// Marks a `CompensationFailed` or `DeadLettered` task resolved.
    Resolve {
        /// The task's id: a full UUID.
        task: String,
        #[command(flatten)]
        who: Who,
    },
    /// Runs a failed compensation again.
    RetryCompensation {
        /// The task's id: a full UUID.
        task: String,
        #[command(flatten)]
        who: Who,
    },
    /// Cancels a running task of a `#[cancellable]` saga.
    ///
    /// The deployment's worker tells its running step and compensates the
    /// completed ones. Prints `Cancelled`, `AlreadyCancelled`,
    /// `AlreadyCompleted`, `NotCancellable` or `NotFound` (exit code 1).
    Cancel {
        /// The task's id: a full UUID.
        task: String,
        #[command(flatten)]
        who: Who,
    },
    /// The dead-letter queue, newest first.
    DeadLetters {
        #[arg(long, default_value_t = 50)]
        limit: usize,
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Requeues one dead letter, or every one the filters pick.
    ///
    /// Each requeued task runs again where it stopped, its audit log
    /// recording who sent it back and why.
    Requeue {
        /// The letter's id; without it, the filters pick.
        letter: Option<String>,
        #[command(flatten)]
        pick: Pick,
        #[command(flatten)]
        who: Who,
    },
    /// Discards one dead letter for good.
    Discard {
        letter: String,
        #[command(flatten)]
        who: Who,
    },
    /// Which record layout a Redis deployment writes: prints `1` or `2`.
    ///
    /// Layout 2 writes what a step changed, not the task's whole record.
    /// A deployment that ran before it writes layout 1 until switched:
    /// switch once every engine runs a version that reads layout 2 (an
    /// older one cannot), with `--write-steps-apart`. There is no way
    /// back.
    RecordLayout {
        /// Switches the deployment to layout 2.
        #[arg(long)]
        write_steps_apart: bool,
    },
    /// Creates or upgrades a PostgreSQL deployment's schema (`--prefix`)
    /// to this version's, and prints the version it was at.
    ///
    /// What a deploy job runs, as a role that may migrate (`CREATE` on the
    /// database the first time, the schema's owner after), so that engines
    /// run as a role that only uses the schema. Safe to run again, and
    /// beside engines starting. A Redis deployment has nothing to migrate.
    Migrate,
    /// Discards every dead letter the filters pick.
    Purge {
        #[command(flatten)]
        pick: Pick,
        #[command(flatten)]
        who: Who,
        /// Confirms: without it, nothing is discarded.
        #[arg(long)]
        yes: bool,
    },
}

/// Who acts and why: kept in the task's audit log.
#[derive(Args)]
struct Who {
    /// The operator.
    #[arg(long, env = "SAGACTL_OPERATOR")]
    by: String,
    /// What was found and done.
    #[arg(long)]
    note: String,
}

/// Which dead letters a bulk action picks.
#[derive(Args)]
struct Pick {
    /// Letters of this saga's tasks.
    #[arg(long)]
    saga: Option<String>,
    /// Letters of tasks stopped at this step.
    #[arg(long)]
    step: Option<String>,
    /// Letters whose reason or task errors contain this text.
    #[arg(long)]
    error: Option<String>,
    /// At most this many letters.
    #[arg(long)]
    max: Option<usize>,
}

impl Pick {
    fn selection(self) -> DeadLetterSelection {
        DeadLetterSelection {
            saga: self.saga,
            step: self.step,
            error_contains: self.error,
            max: self.max,
        }
    }

    fn is_empty(&self) -> bool {
        self.saga.is_none() && self.step.is_none() && self.error.is_none()
    }
}

impl Who {
    fn intervention(self) -> Intervention {
        Intervention::new(self.by, self.note)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let matches = matches();
    // A URL from the environment may name a deployment the operator did
    // not mean (a shell left set up for another): worth a word before
    // anything is changed.
    let from_env = matches.value_source("url") == Some(ValueSource::EnvVariable);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let Some(url) = cli.url.clone() else {
        usage_error(clap::error::ErrorKind::MissingRequiredArgument, no_store())
    };
    if let Err(message) = cli.check() {
        let message = connect::scrubbed(&message, Some(&url));
        usage_error(clap::error::ErrorKind::ValueValidation, message);
    }
    let store = Store::new(
        url,
        cli.prefix.clone(),
        Duration::from_secs_f64(cli.timeout),
    );
    if let Some(action) = cli.command.mutation() {
        let origin = match from_env {
            true => " (from SAGA_URL)",
            false => "",
        };
        eprintln!("sagactl: {action} on {}{origin}", store.describe());
    }
    match run(cli, &store).await {
        Ok(code) => code,
        Err(message) => {
            eprintln!("sagactl: {}", store.without_secrets(message));
            ExitCode::FAILURE
        }
    }
}

/// The command line, parsed. A mistake in it is clap's message, with any
/// URL in it masked: clap quotes what was typed (a URL put where an id
/// goes, say), and a URL's password must not reach a terminal or a log.
fn matches() -> clap::ArgMatches {
    match Cli::command().try_get_matches() {
        Ok(matches) => matches,
        // Help and the version go to stdout as they are: they quote
        // nothing typed (the URL variable's value is hidden).
        Err(error) if !error.use_stderr() => error.exit(),
        Err(error) => {
            let text = error.render().to_string();
            let shown = connect::mask_urls(&text);
            if shown == text {
                error.exit()
            }
            eprint!("{shown}");
            std::process::exit(error.exit_code())
        }
    }
}

/// Ends with a usage mistake (exit code 2), told before connecting.
fn usage_error(kind: clap::error::ErrorKind, message: String) -> ! {
    Cli::command().error(kind, message).exit()
}

/// What a command given no store is told: how to name one, with the URL
/// forms. There is no default to fall back on, so that a command typed
/// without the URL never acts on whatever store listens on localhost.
fn no_store() -> String {
    format!(
        "no store given: name the deployment's store with --url <URL> or the \
         SAGA_URL environment variable, for example
  sagactl --url redis://redis.internal:6379 dead-letters
  sagactl --url postgres://ana@db.internal:5432/shop dead-letters
{}",
        connect::FORMS
    )
}

impl Cli {
    /// What clap cannot check: which combinations make sense, and what
    /// the values must look like.
    fn check(&self) -> Result<(), String> {
        if !(self.timeout.is_finite() && self.timeout > 0.0 && self.timeout <= 3600.0) {
            return Err("--timeout is a number of seconds, above 0 and at most 3600".to_owned());
        }
        if let Some(task) = self.command.task() {
            task_id(task)?;
        }
        self.command.check().map_err(str::to_owned)
    }
}

/// A task id as typed: the runtime's message says what one is (a full
/// UUID, not the 8 characters a console shows), and is passed on as is.
fn task_id(text: &str) -> Result<TaskId, String> {
    text.parse::<TaskId>().map_err(|e| e.to_string())
}

impl Command {
    /// What clap cannot check: which combinations make sense.
    fn check(&self) -> Result<(), &'static str> {
        match self {
            Command::Requeue {
                letter: Some(_),
                pick,
                ..
            } if !pick.is_empty() => Err("give a letter id or filters, not both"),
            Command::Requeue {
                letter: None, pick, ..
            } if pick.is_empty() => {
                Err("give a letter id, or --saga/--step/--error to pick letters")
            }
            Command::Purge { pick, .. } if pick.is_empty() => {
                Err("purge needs --saga, --step or --error: it does not empty the whole queue")
            }
            Command::Purge { yes: false, .. } => {
                Err("purge discards letters for good: add --yes to confirm")
            }
            _ => Ok(()),
        }
    }

    /// The task id the command was given, if it takes one.
    fn task(&self) -> Option<&str> {
        match self {
            Command::Show { task }
            | Command::Resolve { task, .. }
            | Command::RetryCompensation { task, .. }
            | Command::Cancel { task, .. } => Some(task),
            _ => None,
        }
    }

    /// The name of a command that changes the deployment.
    fn mutation(&self) -> Option<&'static str> {
        match self {
            Command::Resolve { .. } => Some("resolve"),
            Command::RetryCompensation { .. } => Some("retry-compensation"),
            Command::Cancel { .. } => Some("cancel"),
            Command::Requeue { .. } => Some("requeue"),
            Command::Discard { .. } => Some("discard"),
            Command::Purge { .. } => Some("purge"),
            Command::Migrate => Some("migrate"),
            Command::RecordLayout {
                write_steps_apart: true,
            } => Some("record-layout --write-steps-apart"),
            Command::List { .. }
            | Command::Show { .. }
            | Command::DeadLetters { .. }
            | Command::RecordLayout { .. } => None,
        }
    }
}

/// Runs the command against `store`: the exit code, or what to print.
async fn run(cli: Cli, store: &Store) -> Result<ExitCode, String> {
    // Before attaching: attaching refuses a schema that is not current.
    if let Command::Migrate = cli.command {
        println!("{}", store.migrate().await?);
        return Ok(ExitCode::SUCCESS);
    }
    let backend = store.attach().await?;
    let building = Engine::builder()
        .backend_arc(backend.clone())
        .workers(0)
        // An operator waits seconds, not the 25 s a service rides out.
        .client_retry(RetryPolicy::new(2, BackoffKind::Exponential, 200))
        .build();
    let engine = match tokio::time::timeout(store.timeout, building).await {
        Ok(built) => built.map_err(|e| store.explain(&e))?,
        Err(_) => return Err(store.silent()),
    };
    let out = print::Out { json: cli.json };
    let explain = |e: saga_runtime::Error| store.explain(&e);
    match cli.command {
        Command::List {
            saga,
            status,
            step,
            error,
            limit,
            cursor,
        } => {
            let filter = TaskFilter {
                saga: Some(saga.clone()),
                status,
                step,
                error_contains: error,
                cursor,
                limit,
                ..TaskFilter::default()
            };
            let page = engine.tasks(filter).await.map_err(explain)?;
            if page.tasks.is_empty() && page.next.is_none() {
                unknown_saga(&*backend, &saga, store).await?;
            }
            out.tasks(&page);
        }
        Command::Show { task } => {
            let id = task_id(&task)?;
            match engine.task(id).await.map_err(explain)? {
                Some(task) => {
                    out.task(&task);
                    // What plain `Pending` does not say: nobody runs it.
                    if let Some(why) = engine.stalled(&task).await.map_err(explain)? {
                        out.line(&format!("waiting: {why}"));
                    }
                }
                None => return Err(format!("task {id} does not exist in {}", store.describe())),
            }
        }
        Command::Resolve { task, who } => {
            let id = task_id(&task)?;
            let task = engine
                .resolve(id, who.intervention())
                .await
                .map_err(explain)?;
            out.task(&task);
        }
        Command::RetryCompensation { task, who } => {
            let id = task_id(&task)?;
            let task = engine
                .retry_compensation(id, who.intervention())
                .await
                .map_err(explain)?;
            out.task(&task);
        }
        Command::Cancel { task, who } => {
            let id = task_id(&task)?;
            let result = engine
                .cancel_by_operator(id, who.intervention())
                .await
                .map_err(explain)?;
            out.cancelled(id, result);
            if result == CancelResult::NotFound {
                return Ok(ExitCode::FAILURE);
            }
        }
        Command::DeadLetters { limit, cursor } => {
            let mut filter = DeadLetterFilter::new().limit(limit);
            filter.cursor = cursor;
            out.letters(&engine.dead_letters(filter).await.map_err(explain)?);
        }
        Command::Requeue {
            letter: Some(letter),
            who,
            ..
        } => {
            engine
                .requeue_by(&letter, who.intervention())
                .await
                .map_err(explain)?;
            out.line(&format!("requeued {letter}"));
        }
        Command::Requeue {
            letter: None,
            pick,
            who,
        } => {
            let bulk = engine
                .requeue_where_by(pick.selection(), who.intervention())
                .await
                .map_err(explain)?;
            out.bulk("requeued", &bulk);
        }
        Command::Discard { letter, who } => {
            engine
                .discard(&letter, who.intervention())
                .await
                .map_err(explain)?;
            out.line(&format!("discarded {letter}"));
        }
        Command::Purge { pick, who, .. } => {
            let bulk = engine
                .discard_where(pick.selection(), who.intervention())
                .await
                .map_err(explain)?;
            out.bulk("discarded", &bulk);
        }
        Command::Migrate => unreachable!("handled before attaching"),
        Command::RecordLayout { write_steps_apart } => {
            println!("{}", store.record_layout(write_steps_apart).await?);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A `list` that found nothing: when the store holds no task of `saga` at
/// all, the name is likely misspelt, and an empty list would look like a
/// saga with nothing to show. Says so, with the names the store holds.
async fn unknown_saga(
    backend: &dyn saga_runtime::backend::Backend,
    saga: &str,
    store: &Store,
) -> Result<(), String> {
    // Best effort: the list itself was answered.
    match backend.saga_names().await {
        Ok(Some(names)) if names.iter().any(|n| n == saga) => Ok(()),
        Ok(Some(names)) if names.is_empty() => Err(format!(
            "no saga `{saga}` in {}: it holds no task of any saga",
            store.describe()
        )),
        Ok(Some(names)) => Err(format!(
            "no saga `{saga}` in {}: the sagas with tasks there are {}",
            store.describe(),
            names
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )),
        Ok(None) | Err(_) => {
            let counts = backend.count_tasks(saga).await.unwrap_or_default();
            if counts.iter().all(|(_, n)| *n == 0) {
                eprintln!(
                    "sagactl: no task of saga `{saga}` is stored in {} (check the name)",
                    store.describe()
                );
            }
            Ok(())
        }
    }
}
