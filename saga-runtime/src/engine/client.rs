//! Starting, waiting for, listing and cancelling tasks.
//!
//! Every call here rides out a backend that is briefly unreachable (a
//! dropped connection, a restarting Redis): it retries under the engine's
//! client retry policy, then gives up with [`Error::Unavailable`]. Retrying
//! is safe because each call is idempotent: a task's id is chosen before it
//! is created, so a start whose reply was lost finds its own task on the
//! retry instead of creating a second one.

use std::time::Duration;

use super::{CancelResult, Engine};
use crate::backend::{Created, QueueMessage, TaskCursor, TaskQuery};
use crate::error::Error;
use crate::model::task::{TaskId, TaskInstance, TaskStatus, Timestamp};
use crate::saga::{BoxFuture, Saga, SagaDefinition};

/// Which tasks [`Engine::tasks`] lists, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskFilter {
    /// Only this saga's tasks (default: every registered saga).
    pub saga: Option<String>,
    /// Only tasks in this status.
    pub status: Option<TaskStatus>,
    /// Only tasks created at or after this time.
    pub created_from: Option<Timestamp>,
    /// Only tasks created before this time.
    pub created_to: Option<Timestamp>,
    /// Only tasks at or stopped at this step ([`TaskInstance::at_step`]).
    pub step: Option<String>,
    /// Only tasks with this text in an error
    /// ([`TaskInstance::mentions_error`]).
    pub error_contains: Option<String>,
    /// Where the page starts: a [`TaskPage::next`] from the previous page.
    pub cursor: Option<String>,
    /// Page size (default 50, at most 1000).
    pub limit: usize,
    /// The most tasks one call reads from the store to fill a page
    /// filtered by step or error text (default 5,000).
    pub scan_limit: Option<usize>,
}

impl TaskFilter {
    /// Every task, 50 per page.
    pub fn new() -> Self {
        TaskFilter::default()
    }

    /// Only the tasks of `saga`.
    pub fn saga(mut self, saga: impl Into<String>) -> Self {
        self.saga = Some(saga.into());
        self
    }

    /// Only the tasks in `status`.
    pub fn status(mut self, status: TaskStatus) -> Self {
        self.status = Some(status);
        self
    }

    /// Only the tasks created in `[from, to)`.
    pub fn created_between(mut self, from: Timestamp, to: Timestamp) -> Self {
        self.created_from = Some(from);
        self.created_to = Some(to);
        self
    }

    /// Only the tasks at (or stopped at) step `name`.
    pub fn step(mut self, name: impl Into<String>) -> Self {
        self.step = Some(name.into());
        self
    }

    /// Only the tasks with `text` in an error.
    pub fn error_contains(mut self, text: impl Into<String>) -> Self {
        self.error_contains = Some(text.into());
        self
    }

    /// The page after the one that returned `cursor` as its `next`.
    pub fn after(mut self, cursor: impl Into<String>) -> Self {
        self.cursor = Some(cursor.into());
        self
    }

    /// At most `n` tasks per page.
    pub fn limit(mut self, n: usize) -> Self {
        self.limit = n;
        self
    }

    /// Reads at most `n` tasks from the store per call when filtering by
    /// step or error text (at least one page of the store's index is read
    /// per saga): a short page with a `next` cursor says to go on. An
    /// HTTP API caps what one anonymous request can make the store send.
    pub fn scan_limit(mut self, n: usize) -> Self {
        self.scan_limit = Some(n);
        self
    }

    fn page_size(&self) -> usize {
        super::page_size(self.limit)
    }

    /// Whether the filters the store does not index (step, error text)
    /// keep `task`.
    fn keeps(&self, task: &TaskInstance) -> bool {
        self.step.as_deref().is_none_or(|step| task.at_step(step))
            && self
                .error_contains
                .as_deref()
                .is_none_or(|text| task.mentions_error(text))
    }

    fn scans(&self) -> bool {
        self.step.is_some() || self.error_contains.is_some()
    }
}

/// How many tasks one [`Engine::tasks`] call reads at most to fill a page
/// filtered by step or error text, which the store does not index: past
/// it the page comes back short, with a cursor to go on from.
pub const TASK_SCAN_LIMIT: usize = 5_000;

/// One page of [`Engine::tasks`].
#[derive(Debug, Clone, PartialEq)]
pub struct TaskPage {
    /// The tasks, newest first.
    pub tasks: Vec<TaskInstance>,
    /// The cursor of the next page (`TaskFilter::after`); `None` on the last.
    pub next: Option<String>,
}

/// A new task of `def` with its stored input.
fn task_of(def: &SagaDefinition, id: TaskId, input: serde_json::Value) -> TaskInstance {
    let steps = def.steps.iter().map(|s| (s.name.to_owned(), s.order));
    let mut task = TaskInstance::new(def.name, input, steps);
    task.id = id;
    task.saga_version = def.version;
    task.fingerprint = Some(def.fingerprint_hex());
    // For an engine that does not run the saga (`sagactl`) to tell.
    task.cancellable = Some(def.cancellable);
    crate::otel::begin_task(&mut task);
    task
}

/// A deterministic task id for an idempotent start: the same saga and key
/// always name the same task.
pub(super) fn keyed_id(saga: &str, key: &str) -> TaskId {
    const NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x6f1c_9a2e_5b7d_4c3a_9e8f_1a2b_3c4d_5e6f);
    TaskId(uuid::Uuid::new_v5(
        &NAMESPACE,
        format!("{saga}\u{0}{key}").as_bytes(),
    ))
}

impl Engine {
    /// Starts a task of saga `S`; returns at once with its id.
    // Returns a boxed future whose type does not mention `S` (as `cancel`
    // does): the `Saga` bound is then checked once, at the call, and a type
    // that is not a saga (a process manager) is one error instead of three
    // (the call, the future's bounds, its `.await`).
    pub fn start<S: Saga>(&self, input: S::Input) -> BoxFuture<'_, Result<TaskId, Error>> {
        Box::pin(async move {
            let task = self.new_task::<S>(TaskId::new(), &input)?;
            self.create_once(&task, None).await
        })
    }

    /// Starts a task of saga `S` at most once per `key`: calling it again
    /// with the same key (a retried request, a redelivered command) returns
    /// the same task's id without starting another, for as long as the
    /// task is retained. A reused key with a different input is an error.
    // Boxed for the reason `start` is.
    pub fn start_with_key<'a, S: Saga>(
        &'a self,
        key: &'a str,
        input: S::Input,
    ) -> BoxFuture<'a, Result<TaskId, Error>> {
        Box::pin(async move {
            let task = self.new_task::<S>(keyed_id(S::NAME, key), &input)?;
            self.create_once(&task, Some(key)).await
        })
    }

    /// Creates `task` unless it exists: with no `key` an existing task is
    /// this call's own, retried after a lost reply; with one it is the
    /// key's first start, which must have had the same input.
    async fn create_once(&self, task: &TaskInstance, key: Option<&str>) -> Result<TaskId, Error> {
        match (self.create(task).await?, key) {
            (Created::New, _) | (Created::Existing(_), None) => Ok(task.id),
            (Created::Existing(existing), Some(_)) if existing.input == task.input => Ok(task.id),
            (Created::Existing(_), Some(key)) => Err(Error::KeyReused {
                key: key.to_owned(),
                task: task.id,
            }),
        }
    }

    pub(super) fn new_task<S: Saga>(
        &self,
        id: TaskId,
        input: &S::Input,
    ) -> Result<TaskInstance, Error> {
        let def = S::definition();
        if self.rt.sagas.get(def.name, def.version).is_none() {
            return Err(match self.rt.sagas.versions(def.name) {
                Some(versions) => Error::UnknownSagaVersion {
                    saga: def.name,
                    version: def.version,
                    registered: versions,
                },
                None => Error::UnknownSaga(def.name.to_owned()),
            });
        }
        let input = S::encode_input(input).map_err(|e| Error::InvalidInput {
            saga: def.name,
            reason: e.to_string(),
        })?;
        Ok(task_of(def, id, input))
    }

    /// Starts a task of the saga named `saga` (its newest registered
    /// version) from JSON, for callers that only know the name: the HTTP
    /// API, a CLI. The input must decode as the saga's input type
    /// ([`Error::InvalidInput`] says why not); `key` makes the start
    /// idempotent as [`start_with_key`](Self::start_with_key) does.
    pub async fn start_json(
        &self,
        saga: &str,
        input: serde_json::Value,
        key: Option<&str>,
    ) -> Result<TaskId, Error> {
        let newest = self
            .rt
            .sagas
            .versions(saga)
            .and_then(|v| v.last().copied())
            .and_then(|v| self.rt.sagas.get(saga, v))
            .ok_or_else(|| Error::UnknownSaga(saga.to_owned()))?;
        let def = newest.definition();
        let input = newest.check_input(input).map_err(|e| Error::InvalidInput {
            saga: def.name,
            reason: e.to_string(),
        })?;
        let id = key.map_or_else(TaskId::new, |key| keyed_id(def.name, key));
        self.create_once(&task_of(def, id, input), key).await
    }

    async fn create(&self, task: &TaskInstance) -> Result<Created, Error> {
        let first = QueueMessage {
            task_id: task.id,
            saga: task.saga.clone(),
            seq: 0,
        };
        let created = self
            .retrying("start", || self.rt.backend.create_task(task, &first))
            .await?;
        if let Created::Existing(existing) = &created {
            if existing.saga != task.saga {
                return Err(Error::WrongSaga {
                    task: task.id,
                    expected: task.saga.clone(),
                    actual: existing.saga.clone(),
                });
            }
        } else {
            tracing::info!(task_id = %task.id, saga = %task.saga, trace_id = %task.trace_id, "task started");
            if let Some(saga) = self.registered_name(&task.saga) {
                crate::metrics::task_started(saga);
            }
        }
        Ok(created)
    }

    /// A fresh copy of the task, if it exists.
    pub async fn task(&self, id: TaskId) -> Result<Option<TaskInstance>, Error> {
        self.retrying("task", || self.rt.backend.load_task(id))
            .await
    }

    /// One page of tasks, newest first; pass [`TaskPage::next`] to
    /// [`TaskFilter::after`] for the next one.
    ///
    /// Saga, status and creation time are indexed. Step and error text
    /// are checked on the tasks read: such a page reads at most
    /// [`TaskFilter::scan_limit`] tasks (5,000, `TASK_SCAN_LIMIT`, by
    /// default) and may come back with fewer than the limit and a `next`
    /// cursor to continue the search from.
    pub async fn tasks(&self, filter: TaskFilter) -> Result<TaskPage, Error> {
        let limit = filter.page_size();
        if !filter.scans() {
            let (page, _) = self
                .indexed_tasks(&filter, filter.cursor.as_deref(), limit)
                .await?;
            return Ok(page);
        }
        let budget = filter.scan_limit.unwrap_or(TASK_SCAN_LIMIT).max(1);
        let sagas = match filter.saga {
            Some(_) => 1,
            None => self.sagas().len().max(1),
        };
        let mut found = Vec::new();
        let mut cursor = filter.cursor.clone();
        let mut scanned = 0;
        loop {
            // Each saga's index gives up to `chunk + 1` tasks: the budget
            // counts every task read, kept or not.
            let chunk = (budget.saturating_sub(scanned) / sagas).clamp(1, 200);
            let (page, read) = self
                .indexed_tasks(&filter, cursor.as_deref(), chunk)
                .await?;
            scanned += read;
            for task in page.tasks {
                cursor = Some(TaskCursor::after(&task).to_string());
                if filter.keeps(&task) {
                    found.push(task);
                    if found.len() == limit {
                        return Ok(TaskPage {
                            tasks: found,
                            next: cursor,
                        });
                    }
                }
            }
            if page.next.is_none() {
                return Ok(TaskPage {
                    tasks: found,
                    next: None,
                });
            }
            if scanned >= budget {
                return Ok(TaskPage {
                    tasks: found,
                    next: cursor,
                });
            }
        }
    }

    /// A page of the tasks the store's indexes select, and how many tasks
    /// were read from the store to make it.
    async fn indexed_tasks(
        &self,
        filter: &TaskFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<(TaskPage, usize), Error> {
        let after = cursor
            .map(|c| c.parse::<TaskCursor>().map_err(Error::InvalidCursor))
            .transpose()?;
        let sagas: Vec<String> = match &filter.saga {
            Some(saga) => vec![saga.clone()],
            None => self.sagas().iter().map(|d| d.name.to_owned()).collect(),
        };
        let mut tasks = Vec::new();
        for saga in sagas {
            let query = TaskQuery {
                saga,
                status: filter.status,
                created_from: filter.created_from,
                created_to: filter.created_to,
                after,
                limit: limit + 1,
            };
            let page = self
                .retrying("tasks", || self.rt.backend.list_tasks(&query))
                .await?;
            tasks.extend(page);
        }
        let read = tasks.len();
        tasks.sort_by_key(|t| std::cmp::Reverse((t.created_at, t.id)));
        let more = tasks.len() > limit;
        tasks.truncate(limit);
        let next = more
            .then(|| tasks.last().map(|t| TaskCursor::after(t).to_string()))
            .flatten();
        Ok((TaskPage { tasks, next }, read))
    }

    /// Every retained task of the saga named `saga`, oldest first (read in
    /// pages; for large sets prefer [`tasks`](Self::tasks)).
    pub async fn tasks_of(&self, saga: &str) -> Result<Vec<TaskInstance>, Error> {
        let mut all = Vec::new();
        let mut filter = TaskFilter::new().saga(saga).limit(1000);
        loop {
            let page = self.tasks(filter.clone()).await?;
            all.extend(page.tasks);
            match page.next {
                Some(next) => filter = filter.after(next),
                None => break,
            }
        }
        all.reverse();
        Ok(all)
    }

    /// Waits until the task reaches a terminal status and returns it.
    pub async fn wait(&self, id: TaskId) -> Result<TaskInstance, Error> {
        loop {
            let task = self
                .retrying("wait", || self.rt.backend.load_task(id))
                .await?;
            match task {
                None => return Err(Error::TaskNotFound(id)),
                Some(task) if task.status.is_terminal() => return Ok(task),
                Some(_) => {
                    self.rt
                        .backend
                        .wait_for_change(id, Duration::from_millis(50))
                        .await
                }
            }
        }
    }

    /// Waits like [`wait`](Self::wait), then hands back the saga's output
    /// as its own type, so that callers do not restate the type and
    /// unwrap twice. A task that ended any other way than `Completed` is
    /// [`Error::TaskDidNotComplete`], carrying why; a task of another saga
    /// is [`Error::WrongSaga`], reported at once rather than after it ends.
    pub async fn wait_output<S: Saga>(&self, id: TaskId) -> Result<S::Output, Error> {
        let task = self.task(id).await?.ok_or(Error::TaskNotFound(id))?;
        check_saga::<S>(&task)?;
        let task = if task.status.is_terminal() {
            task
        } else {
            self.wait(id).await?
        };
        finished_output::<S>(task)
    }

    /// The saga's output as its own type, without waiting: `None` while the
    /// task has not finished; otherwise as [`wait_output`](Self::wait_output).
    pub async fn output<S: Saga>(&self, id: TaskId) -> Result<Option<S::Output>, Error> {
        let task = self.task(id).await?.ok_or(Error::TaskNotFound(id))?;
        check_saga::<S>(&task)?;
        if !task.status.is_terminal() {
            return Ok(None);
        }
        finished_output::<S>(task).map(Some)
    }

    /// [`cancel`](Self::cancel) for callers that know only the task's id
    /// (an operator's console): a task whose saga version is not
    /// `#[cancellable]` answers [`CancelResult::NotCancellable`]. An
    /// engine that does not run the task's saga (`sagactl`, a console's
    /// own process) goes by what the task recorded when it started;
    /// a task started before that was recorded answers
    /// [`Error::UnknownSaga`] (it cannot tell whether it may be
    /// cancelled). [`cancel_by_operator`](Self::cancel_by_operator) also
    /// records who asked, and why.
    pub async fn cancel_by_id(&self, id: TaskId) -> Result<CancelResult, Error> {
        match self.task(id).await? {
            Some(task) => self.cancel_loaded(task, None).await,
            None => Ok(CancelResult::NotFound),
        }
    }

    /// [`cancel`](Self::cancel) by saga name, for callers that only have the
    /// name (the HTTP routes). Fails with [`Error::WrongSaga`] when the task
    /// belongs to another saga.
    pub(crate) async fn cancel_by_name(
        &self,
        saga: &str,
        id: TaskId,
    ) -> Result<CancelResult, Error> {
        self.cancel_named(saga, id, None).await
    }

    /// [`cancel_by_name`](Self::cancel_by_name), with `by` (who asked) for
    /// the audit log.
    pub(super) async fn cancel_named(
        &self,
        saga: &str,
        id: TaskId,
        by: Option<&crate::model::task::AuditEntry>,
    ) -> Result<CancelResult, Error> {
        let Some(task) = self.task(id).await? else {
            return Ok(CancelResult::NotFound);
        };
        if task.saga != saga {
            return Err(Error::WrongSaga {
                task: id,
                expected: saga.to_owned(),
                actual: task.saga,
            });
        }
        self.cancel_loaded(task, by).await
    }

    /// Whether `task` may be cancelled: its own version's to say (a typed
    /// `cancel::<S>` has checked `S` at compile time), as registered here,
    /// else as recorded in the task when it started.
    fn cancellable(&self, task: &TaskInstance) -> Result<bool, Error> {
        if let Some(saga) = self.rt.sagas.get(&task.saga, task.saga_version) {
            return Ok(saga.definition().cancellable);
        }
        match task.cancellable {
            Some(cancellable) => Ok(cancellable),
            // Another version of a saga this engine runs: as before
            // versions recorded it, the deployment's worker decides.
            None if self.rt.sagas.contains(&task.saga) => Ok(true),
            None => Err(Error::UnknownSaga(task.saga.clone())),
        }
    }

    /// Cancels `task`, as just read; `by` (an operator's cancellation)
    /// goes into its audit log with the request.
    pub(super) async fn cancel_loaded(
        &self,
        task: TaskInstance,
        by: Option<&crate::model::task::AuditEntry>,
    ) -> Result<CancelResult, Error> {
        let id = task.id;
        if !self.cancellable(&task)? {
            return Ok(CancelResult::NotCancellable(task.status));
        }
        match task.status {
            TaskStatus::Completed => return Ok(CancelResult::AlreadyCompleted),
            TaskStatus::Cancelled => return Ok(CancelResult::AlreadyCancelled),
            _ if task.cancelled_at.is_some() => return Ok(CancelResult::AlreadyCancelled),
            TaskStatus::Pending | TaskStatus::Running => {}
            other => return Ok(CancelResult::NotCancellable(other)),
        }
        // One token per request: a retry whose first try's reply was lost
        // is recognised as the same request.
        let token = uuid::Uuid::new_v4().simple().to_string();
        let wake = QueueMessage {
            task_id: id,
            saga: task.saga.clone(),
            seq: task.seq,
        };
        let earlier = self
            .retrying("cancel", || async {
                match by {
                    Some(entry) => {
                        let backend = &self.rt.backend;
                        backend
                            .request_cancel_audited(id, &token, &wake, entry)
                            .await
                    }
                    None => self.rt.backend.request_cancel(id, &token, &wake).await,
                }
            })
            .await?;
        if earlier.is_some() {
            return Ok(CancelResult::AlreadyCancelled);
        }
        // The task may have ended between the status check and the request.
        // From here on a worker cannot complete or fail it (its commit is
        // refused while the flag is set), so what the store says now decides.
        let now = self.task(id).await?;
        match now.as_ref().map(|t| (t.status, t.cancelled_at.is_some())) {
            Some((TaskStatus::Completed, _)) => return Ok(CancelResult::AlreadyCompleted),
            // Compensating after a failure that committed just before the
            // flag was set (a refused commit would have applied the
            // cancellation instead, setting `cancelled_at`).
            Some((TaskStatus::Compensating, false)) => {
                return Ok(CancelResult::NotCancellable(TaskStatus::Compensating))
            }
            Some((
                status @ (TaskStatus::Failed
                | TaskStatus::DeadLettered
                | TaskStatus::Compensated
                | TaskStatus::CompensationFailed
                | TaskStatus::Resolved),
                _,
            )) => return Ok(CancelResult::NotCancellable(status)),
            // It expired meanwhile; nothing was recorded.
            None => return Ok(CancelResult::NotFound),
            _ => {}
        }
        self.rt.signal_cancel(id);
        tracing::info!(task_id = %id, saga = %task.saga, "cancellation requested");
        Ok(CancelResult::Cancelled)
    }
}

/// Whether `task` is one of `S`'s: the id may come from anywhere (a URL, a
/// message), and decoding another saga's output as `S::Output` could
/// succeed by accident.
fn check_saga<S: Saga>(task: &TaskInstance) -> Result<(), Error> {
    let version = S::definition().version;
    if task.saga == S::NAME && task.saga_version == version {
        return Ok(());
    }
    // Another version's output may decode as this one's by accident.
    let named = |saga: &str, version: u32| match version {
        1 => saga.to_owned(),
        n => format!("{saga} v{n}"),
    };
    Err(Error::WrongSaga {
        task: task.id,
        expected: named(S::NAME, version),
        actual: named(&task.saga, task.saga_version),
    })
}

/// The typed result of a finished task of `S`.
fn finished_output<S: Saga>(task: TaskInstance) -> Result<S::Output, Error> {
    if task.status != TaskStatus::Completed {
        // `task.error` says why the task ended; a cancelled task has none
        // of its own, but the step it stopped may.
        let error = task
            .error
            .clone()
            .or_else(|| task.steps.iter().rev().find_map(|s| s.error.clone()));
        return Err(Error::TaskDidNotComplete {
            id: task.id,
            status: task.status,
            error,
        });
    }
    // A unit output may be stored as nothing at all.
    decode_output::<S>(task.output.unwrap_or(serde_json::Value::Null))
}

/// Every typed read of a saga's output goes through here, so that how an
/// output is decoded is decided in one place.
fn decode_output<S: Saga>(value: serde_json::Value) -> Result<S::Output, Error> {
    S::decode_output(value).map_err(|e| Error::InvalidOutput {
        saga: S::NAME,
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_ids_depend_on_saga_and_key_only() {
        assert_eq!(keyed_id("s", "k"), keyed_id("s", "k"));
        assert_ne!(keyed_id("s", "k"), keyed_id("s", "k2"));
        assert_ne!(keyed_id("s", "k"), keyed_id("t", "k"));
        // The separator keeps ("ab", "c") and ("a", "bc") apart.
        assert_ne!(keyed_id("ab", "c"), keyed_id("a", "bc"));
    }
}
