//! Process-manager instances, their correlation index, outbox and
//! timeouts, written in one atomic commit.

use std::time::Duration;

use async_trait::async_trait;

use super::{BackendError, Delivery, Page, ProcessInstance, Settle, TallyOpen};
use crate::model::envelope::Envelope;
use crate::model::tally::TallyRef;

/// Why a process-manager write was refused: what the protocol expects to
/// happen when writers race or messages come late, not a failure of the
/// store. Nothing was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProcessRefusal {
    /// Another write to the instance (or to a correlation entry it claims)
    /// came first: run the handler again on the fresh state.
    #[error("a concurrent write came first")]
    Conflict,
    /// A deleted instance with this id (or one that owned a correlation
    /// entry being claimed) handled this message: a late duplicate.
    #[error("instance `{instance}` was deleted after handling this message")]
    Tombstoned {
        /// The instance.
        instance: String,
    },
    /// A tally the handler opens was opened by its instance before.
    #[error("{0} is already open: give each tally of an instance its own name")]
    TallyExists(TallyRef),
    /// The message the write settles is in another partition than the
    /// instance it writes (a backend that keeps partitions apart, like
    /// Redis Cluster, cannot write both at once): the worker hands it back,
    /// and forwards it to the instance's partition on its next delivery.
    #[error("the message is in another partition than instance `{instance}`")]
    Elsewhere {
        /// The instance.
        instance: String,
    },
    /// A [`Hold`] found as many messages held for its value as its cap
    /// allows: the message is not held (the engine applies its policy for
    /// a message without an instance at once).
    #[error("{held} messages are held for this value already")]
    HoldFull {
        /// How many are held.
        held: usize,
    },
    /// An endpoint the write sends to holds as many messages as its cap,
    /// and a consumer group reads it: a message not settled by the group
    /// is never trimmed away, so the write waits until the consumers catch
    /// up (the engine hands its message back and says so).
    #[error("endpoint `{endpoint}` is full: its consumers are behind (or gone)")]
    EndpointFull {
        /// The endpoint.
        endpoint: String,
    },
}

/// A continuing message that found no instance, kept by a
/// [`ProcessCommit`] until one exists ([`ProcessCommit::hold`]).
///
/// The store checks, before it writes anything, that no instance owns
/// what the message looks for (an instance with id `value` when `field`
/// is `None`, else the correlation entry `(field, value)`): if one does,
/// the write is refused as a [`ProcessRefusal::Conflict`] (the engine
/// reads again and handles the message). A tombstone of that id or entry
/// that remembers the message refuses it as
/// [`ProcessRefusal::Tombstoned`]; `cap` messages held for the value
/// already, as [`ProcessRefusal::HoldFull`]. A message held for the value
/// already (the same message id) is not held twice: the write then only
/// settles the delivery.
///
/// A held message is kept as a scheduled envelope due at its
/// [`hold_until`](Envelope::hold_until), so that one whose instance
/// never comes is delivered again when its hold is over (and the engine
/// applies its policy); until then, the write that creates the instance
/// `value` (field `None`) or claims the entry `(field, value)` (in its
/// [`add_keys`](ProcessCommit::add_keys)) releases it: moves it from the
/// schedule onto the queue, with the others held for the value, in the
/// order they were held.
#[derive(Debug, Clone, Copy)]
pub struct Hold<'a> {
    /// The state field the message correlates by; `None`: by instance id.
    pub field: Option<&'a str>,
    /// The value (or id) it looks for.
    pub value: &'a str,
    /// The message as it is kept, [`hold_until`](Envelope::hold_until) set.
    pub envelope: &'a Envelope,
    /// At most this many messages held per value.
    pub cap: usize,
}

/// A process-manager write's answer: the instance's new version (`Ok`), or
/// why it was refused (`Err`).
pub type ProcessWrite = Result<u64, ProcessRefusal>;

/// One atomic write of the process-manager protocol: the instance (created,
/// updated or deleted), its correlation entries, the messages its handler
/// sent, published and scheduled, and the settlement of the message.
#[derive(Debug, Clone)]
pub struct ProcessCommit<'a> {
    /// The instance to write (`version` is the one it was loaded with; 0 to
    /// create), unless `None`.
    pub instance: Option<&'a ProcessInstance>,
    /// The id of the message this write handles. The write is refused with
    /// [`ProcessRefusal::Tombstoned`] if a deleted instance with this
    /// id, or one that owned a correlation entry being claimed, handled
    /// that message: a late duplicate must neither start the process again
    /// nor reach the instance created after it.
    pub handling: Option<&'a str>,
    /// When deleting: how long the tombstone remembers the message ids the
    /// instance handled (its `processed` list).
    pub tombstone_ttl: Duration,
    /// Delete the instance (and its correlation entries) instead of writing it.
    pub delete: bool,
    /// Correlation entries to claim for the instance: a value already owned
    /// by another instance is a conflict. The instance lists every entry
    /// it holds in its [`keys`](ProcessInstance::keys) (the engine keeps
    /// them so): a store whose entries and instances live apart finds an
    /// instance by an entry only if the instance lists it.
    pub add_keys: Vec<(String, String)>,
    /// Correlation entries to release.
    pub remove_keys: Vec<(String, String)>,
    /// Shared correlation entries (fields `#[handles(many)]` correlates
    /// by: a set of instances per value) to join...
    pub add_shared: Vec<(String, String)>,
    /// ... and to leave.
    pub remove_shared: Vec<(String, String)>,
    /// Process-manager envelopes to enqueue.
    pub enqueue: Vec<Envelope>,
    /// Messages for endpoints: `(endpoint, payload)`. An endpoint is an
    /// outbox while a consumer group reads it: a store keeps every message
    /// a group has not settled, and refuses a write to one that holds its
    /// cap ([`ProcessRefusal::EndpointFull`]), checked with the others
    /// before anything is written; an endpoint no group reads keeps its
    /// newest messages up to the cap.
    pub endpoints: Vec<(String, String)>,
    /// Envelopes to deliver later: `(due, wall-clock ms; envelope)`.
    pub schedule: Vec<(u64, Envelope)>,
    /// Tallies the handler opened. One that exists already refuses the
    /// whole write ([`ProcessRefusal::TallyExists`]).
    pub tallies: Vec<TallyOpen>,
    /// Keep the message being handled until its instance exists (written
    /// with no [`instance`](Self::instance), and nothing else but the
    /// settlement): see [`Hold`]. Every write of an instance releases the
    /// messages held for it (see [`Hold`]): a store must do so in the same
    /// atomic write that creates the instance or claims the entry.
    pub hold: Option<Hold<'a>>,
    /// What to do with the message being handled.
    pub settle: Settle<'a>,
    /// Further messages of the instance this write applies after the one
    /// it handles (messages that waited for it in this process): each is
    /// checked against tombstones like [`handling`](Self::handling) and
    /// acknowledged with the write.
    pub batched: Vec<Batched<'a>>,
}

/// A message a [`ProcessCommit`] applies besides the one it handles.
#[derive(Debug, Clone, Copy)]
pub struct Batched<'a> {
    /// Its message id.
    pub message_id: &'a str,
    /// Its delivery, acknowledged by the write.
    pub delivery: &'a Delivery,
}

impl ProcessCommit<'_> {
    /// The ids of the messages the write handles: the tombstones must
    /// remember none of them.
    pub fn handled_ids(&self) -> impl Iterator<Item = &str> {
        self.handling
            .into_iter()
            .chain(self.batched.iter().map(|b| b.message_id))
    }
}

impl<'a> ProcessCommit<'a> {
    /// A write of `instance` (or of nothing but effects, with `None`) that
    /// settles the message as `settle`, with nothing else: fill in the rest.
    pub fn new(instance: Option<&'a ProcessInstance>, settle: Settle<'a>) -> Self {
        ProcessCommit {
            instance,
            handling: None,
            tombstone_ttl: Duration::ZERO,
            delete: false,
            add_keys: Vec::new(),
            remove_keys: Vec::new(),
            add_shared: Vec::new(),
            remove_shared: Vec::new(),
            enqueue: Vec::new(),
            endpoints: Vec::new(),
            schedule: Vec::new(),
            tallies: Vec::new(),
            hold: None,
            settle,
            batched: Vec::new(),
        }
    }
}

/// Process-manager instances, their correlation index and timeouts.
#[async_trait]
pub trait ProcessStore: Send + Sync + 'static {
    /// The instance `id` of process manager `process`.
    async fn process_load(
        &self,
        process: &str,
        id: &str,
    ) -> Result<Option<ProcessInstance>, BackendError>;

    /// The instance owning the correlation entry `(field, value)`.
    async fn process_find(
        &self,
        process: &str,
        field: &str,
        value: &str,
    ) -> Result<Option<ProcessInstance>, BackendError>;

    /// The ids of the instances that share the value `value` of the state
    /// field `field` (one `#[handles(many)]` correlates by).
    async fn process_find_shared(
        &self,
        process: &str,
        field: &str,
        value: &str,
    ) -> Result<Vec<String>, BackendError>;

    /// Every instance of a process manager (for operators and tests).
    async fn process_list(&self, process: &str) -> Result<Vec<ProcessInstance>, BackendError>;

    /// About `limit` instances of a process manager from where `after` (a
    /// [`Page::next`] of this call) left off, in no promised order. The
    /// default sorts [`process_list`](Self::process_list) by id; a backend
    /// with a cursor over its set (Redis `SSCAN`) reads only one page.
    async fn process_page(
        &self,
        process: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page<ProcessInstance>, BackendError> {
        let mut all = self.process_list(process).await?;
        all.sort_by(|a, b| a.id.cmp(&b.id));
        let rest: Vec<_> = all
            .into_iter()
            .filter(|i| after.is_none_or(|after| i.id.as_str() > after))
            .collect();
        let more = rest.len() > limit;
        let items: Vec<_> = rest.into_iter().take(limit).collect();
        let next = more.then(|| items.last().map(|i| i.id.clone())).flatten();
        Ok(Page { items, next })
    }

    /// How many instances of a process manager are stored (any status):
    /// what an operator's overview shows. The default reads them all;
    /// the built-in backends count without reading a record (Redis: the
    /// size of the instance sets; PostgreSQL: an index-only count).
    async fn process_count(&self, process: &str) -> Result<usize, BackendError> {
        Ok(self.process_list(process).await?.len())
    }

    /// Writes a [`ProcessCommit`] atomically; returns the instance's new
    /// version (0 when deleted or not written). A version mismatch, an
    /// existing instance when creating, or a correlation entry owned by
    /// another instance is refused ([`ProcessRefusal::Conflict`]), and so
    /// are a late duplicate and a tally opened twice.
    async fn process_commit(
        &self,
        process: &str,
        commit: ProcessCommit<'_>,
    ) -> Result<ProcessWrite, BackendError>;

    /// Moves scheduled envelopes due at `now_ms` onto the queue, at most
    /// `limit`, each exactly once (even with several pollers); returns how
    /// many moved.
    async fn process_release_due(&self, now_ms: u64, limit: usize) -> Result<usize, BackendError>;

    /// The scheduled envelopes: `(due ms, envelope)`, soonest first.
    async fn process_scheduled(&self) -> Result<Vec<(u64, Envelope)>, BackendError>;
}
