//! What an operator looks at: how many tasks each saga has in each
//! status, and the process-manager instances with their pending timeouts,
//! by name (a console or a CLI knows no Rust types).

use serde::Serialize;

use super::Engine;
use crate::backend::{saga_steps_run, saga_version_run, ProcessInstance};
use crate::error::Error;
use crate::model::task::{TaskInstance, TaskStatus, Timestamp};
use crate::process::EnvelopeKind;

/// How many retained tasks of one saga are in each status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SagaCounts {
    /// The saga.
    pub saga: String,
    /// `(status, count)` for each status with at least one task, in the
    /// order of [`TaskStatus::ALL`].
    pub counts: Vec<(TaskStatus, usize)>,
}

/// One page of [`Engine::process_instances_page`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProcessPage {
    /// The instances (in no promised order).
    pub instances: Vec<ProcessInstance>,
    /// Where the next page starts; `None` on the last.
    pub next: Option<String>,
}

/// A timeout (or tally report) an instance is waiting for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PendingTimeout {
    /// The instance.
    pub instance: Option<String>,
    /// The timeout message's type.
    pub message_type: String,
    /// When it is due.
    pub due: Timestamp,
    /// Whether it is a tally's report rather than a timeout.
    pub tally_report: bool,
}

impl Engine {
    /// Why `task` waits, when no engine can take it up: `Some(reason)`
    /// for a task not yet ended whose saga version (with its steps) no
    /// live engine announces that it runs, so that its message is handed
    /// back with growing delays until the delivery cap parks it
    /// `DeadLettered` (about 13 minutes at the defaults); an operator
    /// reading it as plain `Pending` meanwhile would not know. `None`
    /// when an engine runs it, when the task has ended, or when the store
    /// keeps no announcements (the in-memory backend: one process).
    pub async fn stalled(&self, task: &TaskInstance) -> Result<Option<String>, Error> {
        if task.status.is_terminal() {
            return Ok(None);
        }
        let Some(runners) = self.rt.backend.clone().runners() else {
            return Ok(None);
        };
        let run = match &task.fingerprint {
            Some(steps) => saga_steps_run(&task.saga, task.saga_version, steps),
            None => saga_version_run(&task.saga, task.saga_version),
        };
        if runners.saga_runner_alive(&run).await? {
            return Ok(None);
        }
        Ok(Some(format!(
            "no live engine announces that it runs saga `{}` version {}{}: its message is handed \
             back with growing delays, and the task is parked DeadLettered at the delivery cap; \
             start an engine that registers that version (or requeue the task once one runs)",
            task.saga,
            task.saga_version,
            match task.fingerprint {
                Some(_) => " with these steps",
                None => "",
            },
        )))
    }

    /// Task counts by status for every registered saga, by name.
    pub async fn task_counts(&self) -> Result<Vec<SagaCounts>, Error> {
        let mut all = Vec::new();
        for def in self.sagas() {
            let counts = self
                .retrying("task_counts", || self.rt.backend.count_tasks(def.name))
                .await?;
            all.push(SagaCounts {
                saga: def.name.to_owned(),
                counts,
            });
        }
        Ok(all)
    }

    /// The names of the process managers this engine runs, sorted.
    pub fn process_names(&self) -> Vec<&'static str> {
        let mut names: Vec<_> = self.rt.processes.keys().copied().collect();
        names.sort_unstable();
        names
    }

    /// About `limit` (default 50, at most 1000) instances of the process
    /// manager named `process`, from `cursor` (a [`ProcessPage::next`]).
    pub async fn process_instances_page(
        &self,
        process: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<ProcessPage, Error> {
        self.known_process(process)?;
        let limit = super::page_size(limit);
        let processes = self.rt.processes()?;
        let page = self
            .retrying("process_instances", || {
                processes.process_page(process, cursor, limit)
            })
            .await?;
        Ok(ProcessPage {
            instances: page.items,
            next: page.next,
        })
    }

    /// How many instances (any status) the process manager named
    /// `process` has stored, counted without reading them where the
    /// backend can (the built-in ones can).
    pub async fn process_count(&self, process: &str) -> Result<usize, Error> {
        self.known_process(process)?;
        let processes = self.rt.processes()?;
        self.retrying("process_count", || processes.process_count(process))
            .await
    }

    /// The instance `id` of the process manager named `process`.
    pub async fn process_instance_named(
        &self,
        process: &str,
        id: &str,
    ) -> Result<Option<ProcessInstance>, Error> {
        self.known_process(process)?;
        let processes = self.rt.processes()?;
        self.retrying("process_instance", || processes.process_load(process, id))
            .await
    }

    /// The timeouts and tally reports pending for the process manager
    /// named `process` (only instance `instance`'s, if given), soonest
    /// first, at most `limit`. Reads the whole schedule: meant for an
    /// operator's look, not for a loop.
    pub async fn process_timeouts(
        &self,
        process: &str,
        instance: Option<&str>,
        limit: usize,
    ) -> Result<Vec<PendingTimeout>, Error> {
        self.known_process(process)?;
        let processes = self.rt.processes()?;
        let scheduled = self
            .retrying("process_timeouts", || processes.process_scheduled())
            .await?;
        let mut pending: Vec<PendingTimeout> = scheduled
            .into_iter()
            .filter(|(_, e)| e.process == process)
            .filter(|(_, e)| instance.is_none_or(|i| e.instance_id.as_deref() == Some(i)))
            .map(|(due, e)| PendingTimeout {
                instance: e.instance_id,
                message_type: e.message_type,
                due: Timestamp(due),
                tally_report: e.kind == EnvelopeKind::TallyReport,
            })
            .collect();
        pending.sort_by_key(|t| t.due);
        pending.truncate(limit);
        Ok(pending)
    }

    fn known_process(&self, process: &str) -> Result<(), Error> {
        match self.rt.processes.contains_key(process) {
            true => Ok(()),
            false => Err(Error::UnknownProcess(process.to_owned())),
        }
    }
}
