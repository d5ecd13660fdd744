//! `sagactl`: the operator's actions against a deployment's Redis, from a
//! shell: list and show tasks, resolve them, retry a failed compensation,
//! cancel, and work the dead-letter queue (requeue, discard, purge).
//!
//! It needs no saga types: it attaches a client-only engine (no workers)
//! to the deployment under a prefix on a Redis, writing nothing until an
//! action does, and acts by name. A requeued task is run by the
//! deployment's workers. (Cancelling needs to know whether the task's saga
//! is cancellable, which only the deployment knows: use its API.)
//!
//! ```text
//! sagactl --redis redis://127.0.0.1:6379 list --saga create-zip --status CompensationFailed
//! sagactl show 4b6c…                     # the timeline
//! sagactl resolve 4b6c… --by ana --note "refunded by hand"
//! sagactl dead-letters
//! sagactl requeue 3:1732518000000-0      # one letter
//! sagactl requeue --saga create-zip --error "timed out"   # every letter picked
//! sagactl purge --saga create-zip --by ana --note "orders withdrawn" --yes
//! ```

mod print;

use std::process::ExitCode;

use clap::{Args, CommandFactory, Parser, Subcommand};
use std::sync::Arc;

use saga_runtime::backend::postgres::{PostgresBackend, PostgresConfig};
use saga_runtime::backend::redis::{RedisBackend, RedisConfig};
use saga_runtime::backend::Backend;
use saga_runtime::{
    DeadLetterFilter, DeadLetterSelection, Engine, Error, Intervention, TaskFilter,
};

#[derive(Parser)]
#[command(
    name = "sagactl",
    version,
    about = "Operator actions on sagas stored in Redis or PostgreSQL"
)]
struct Cli {
    /// The deployment's store: a Redis (`redis://host:port`, a cluster's
    /// `redis+cluster://host:port,host:port`, or a Sentinel deployment's
    /// `redis+sentinel://host:port,host:port/<service>`) or a PostgreSQL
    /// database (`postgres://user@host:port/database`).
    #[arg(
        long,
        visible_alias = "url",
        env = "REDIS_URL",
        default_value = "redis://127.0.0.1:6379"
    )]
    redis: String,
    /// Its key prefix (`RedisConfig::prefix`; the partition count is read
    /// from what the deployment recorded there), or on PostgreSQL its
    /// schema (`PostgresConfig::schema`).
    #[arg(long, default_value = "saga")]
    prefix: String,
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
    /// One task: its steps and timeline.
    Show { task: saga_runtime::TaskId },
    /// Marks a `CompensationFailed` or `DeadLettered` task resolved.
    Resolve {
        task: saga_runtime::TaskId,
        #[command(flatten)]
        who: Who,
    },
    /// Runs a failed compensation again.
    RetryCompensation {
        task: saga_runtime::TaskId,
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
    Requeue {
        /// The letter's id; without it, the filters pick.
        letter: Option<String>,
        #[command(flatten)]
        pick: Pick,
    },
    /// Discards one dead letter for good.
    Discard {
        letter: String,
        #[command(flatten)]
        who: Who,
    },
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
    let cli = Cli::parse();
    if let Err(message) = cli.command.check() {
        // Before connecting: a usage mistake is told as one, exit code 2.
        Cli::command()
            .error(clap::error::ErrorKind::ArgumentConflict, message)
            .exit();
    }
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("sagactl: {error}");
            ExitCode::FAILURE
        }
    }
}

impl Command {
    /// What clap cannot check: which combinations make sense.
    fn check(&self) -> Result<(), &'static str> {
        match self {
            Command::Requeue {
                letter: Some(_),
                pick,
            } if !pick.is_empty() => Err("give a letter id or filters, not both"),
            Command::Requeue { letter: None, pick } if pick.is_empty() => {
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
}

/// The deployment at `url`, attached without writing anything: a Redis
/// under `prefix`, or a PostgreSQL database's schema `prefix`.
async fn attach(url: &str, prefix: String) -> Result<Arc<dyn Backend>, Error> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let config = PostgresConfig {
            schema: prefix,
            ..PostgresConfig::default()
        };
        return Ok(Arc::new(PostgresBackend::attach(url, config).await?));
    }
    let config = RedisConfig {
        prefix,
        ..RedisConfig::default()
    };
    Ok(Arc::new(RedisBackend::attach(url, config).await?))
}

async fn run(cli: Cli) -> Result<(), Error> {
    let backend = attach(&cli.redis, cli.prefix).await?;
    let engine = Engine::builder()
        .backend_arc(backend.clone())
        .workers(0)
        .build()
        .await?;
    let out = print::Out { json: cli.json };
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
            let page = engine.tasks(filter).await?;
            out.tasks(&page);
            // A misspelt saga looks like one with nothing to show: say so.
            // Best effort: the list itself was answered.
            if page.tasks.is_empty() && page.next.is_none() {
                let counts = backend.count_tasks(&saga).await.unwrap_or_default();
                if !counts.is_empty() && counts.iter().all(|(_, n)| *n == 0) {
                    eprintln!(
                        "sagactl: no task of saga `{saga}` is stored under this prefix (check the name)"
                    );
                }
            }
        }
        Command::Show { task } => match engine.task(task).await? {
            Some(task) => out.task(&task),
            None => return Err(Error::TaskNotFound(task)),
        },
        Command::Resolve { task, who } => {
            out.task(&engine.resolve(task, who.intervention()).await?);
        }
        Command::RetryCompensation { task, who } => {
            out.task(&engine.retry_compensation(task, who.intervention()).await?);
        }
        Command::DeadLetters { limit, cursor } => {
            let mut filter = DeadLetterFilter::new().limit(limit);
            filter.cursor = cursor;
            out.letters(&engine.dead_letters(filter).await?);
        }
        Command::Requeue {
            letter: Some(letter),
            ..
        } => {
            engine.requeue(&letter).await?;
            out.line(&format!("requeued {letter}"));
        }
        Command::Requeue { letter: None, pick } => {
            out.bulk("requeued", &engine.requeue_where(pick.selection()).await?);
        }
        Command::Discard { letter, who } => {
            engine.discard(&letter, who.intervention()).await?;
            out.line(&format!("discarded {letter}"));
        }
        Command::Purge { pick, who, .. } => {
            let bulk = engine
                .discard_where(pick.selection(), who.intervention())
                .await?;
            out.bulk("discarded", &bulk);
        }
    }
    Ok(())
}
