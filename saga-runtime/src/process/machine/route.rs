//! Before the handler runs: which handler, how its instance is found, and
//! whether it runs on what was found.

use serde_json::Value;

use super::{
    audit, dead_letter, decided, due, fail, ignored, Commit, Decision, Dispatched, Given, Held,
    Note, Otherwise, Settlement, Verdict, HOLD_CAP,
};
use crate::model::envelope::Envelope;
use crate::model::process::{InstanceStatus, ProcessAuditAction, ProcessInstance};
use crate::model::task::Timestamp;
use crate::process::{
    AfterHold, Correlation, FailureKind, HandlerDefinition, HandlerKind, ProcessDefinition,
    ProcessError,
};

/// How the worker reads the instance a message is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// The instance with this id: a timeout's (or a tally's message's), or
    /// one correlated by id.
    Id(String),
    /// The owner of `value` of the state field `field`.
    Field {
        /// The state field.
        field: &'static str,
        /// Its value.
        value: String,
    },
    /// One of the instances that share `value` of `field`: the worker
    /// reads who they are, and [`Handling::among`] picks.
    Shared {
        /// The shared state field.
        field: &'static str,
        /// Its value.
        value: String,
        /// `#[handles(many)]`: several mean a copy for each.
        many: bool,
    },
    /// One instance's copy of a fanned-out message: the instance `id`,
    /// for which it is meant only while it still holds `value`.
    Copy {
        /// The instance.
        id: String,
        /// The shared state field.
        field: &'static str,
        /// Its value.
        value: String,
    },
}

impl Lookup {
    /// The message's correlation value (a timeout's: its instance's id).
    pub(crate) fn key(&self) -> &str {
        match self {
            Lookup::Id(key) => key,
            Lookup::Field { value, .. }
            | Lookup::Shared { value, .. }
            | Lookup::Copy { value, .. } => value,
        }
    }
}

/// What [`Handling::admit`] lets run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Admitted {
    /// The handler creates the instance: with this id, or (`None`) one the
    /// store picks near the correlation value (so that a store that keeps
    /// partitions apart places it where that value's entry lives). Then
    /// [`Handling::start`].
    Start {
        /// Its id, when it is the correlation id.
        id: Option<String>,
    },
    /// The handler runs on this instance.
    Run(Box<ProcessInstance>),
}

/// One message on its way through one process manager's handler.
#[derive(Debug, Clone)]
pub(crate) struct Handling<'a> {
    /// The process manager.
    pub def: &'static ProcessDefinition,
    /// The handler of the message's type.
    pub handler: &'static HandlerDefinition,
    /// The message.
    pub envelope: &'a Envelope,
    /// How its instance is found.
    pub lookup: Lookup,
}

impl<'a> Handling<'a> {
    /// Routes `envelope` to its handler in `def`; `message_key` is the
    /// process manager's correlation value of the message (asked only for
    /// a handler that finds its instance by one). A message without a
    /// handler or without a way to its instance is parked: no retry could
    /// change that.
    pub(crate) fn new(
        def: &'static ProcessDefinition,
        envelope: &'a Envelope,
        message_key: impl FnOnce() -> Result<Option<String>, ProcessError>,
    ) -> Result<Self, Box<Decision>> {
        let parked = |reason: String| Box::new(dead_letter(reason));
        let Some(handler) = def.handler(&envelope.message_type) else {
            return Err(parked(format!(
                "process manager `{}` has no handler for message type `{}`",
                def.name, envelope.message_type
            )));
        };
        let key = match handler.correlation {
            Correlation::Instance => {
                let Some(id) = &envelope.instance_id else {
                    return Err(parked(format!(
                        "timeout `{}` names no instance",
                        envelope.message_type
                    )));
                };
                id.clone()
            }
            Correlation::Id | Correlation::Field { .. } => match message_key() {
                Ok(Some(key)) => key,
                Ok(None) => {
                    return Err(parked(format!(
                        "`{}` has no correlation id; mark a field `#[correlation_id]` or correlate with `#[correlate]`",
                        envelope.message_type
                    )))
                }
                Err(e) => return Err(parked(e.to_string())),
            },
        };
        let lookup = match handler.correlation {
            Correlation::Field { state_field, .. } if def.is_shared(state_field) => {
                let many = matches!(handler.kind, HandlerKind::Handles { many: true, .. });
                match (many, &envelope.instance_id) {
                    (true, Some(id)) => Lookup::Copy {
                        id: id.clone(),
                        field: state_field,
                        value: key,
                    },
                    _ => Lookup::Shared {
                        field: state_field,
                        value: key,
                        many,
                    },
                }
            }
            Correlation::Field { state_field, .. } => Lookup::Field {
                field: state_field,
                value: key,
            },
            Correlation::Id | Correlation::Instance => Lookup::Id(key),
        };
        Ok(Handling {
            def,
            handler,
            envelope,
            lookup,
        })
    }

    /// For a [`Lookup::Shared`]: which of the instances `ids` holding the
    /// value the message is for. `Ok(None)`: none holds it (as if no
    /// instance were found). Several: a `#[handles(many)]` message is
    /// copied to each, addressed by id (each copy is then handled like a
    /// message of one instance: its own save, duplicate check and
    /// errors); any other cannot pick one, which `#[on_error]` hears of.
    pub(crate) fn among(&self, ids: Vec<String>) -> Result<Option<String>, Verdict> {
        let (field, many) = match &self.lookup {
            Lookup::Shared { field, many, .. } => (*field, *many),
            _ => ("", false),
        };
        let envelope = self.envelope;
        match ids.as_slice() {
            [] => Ok(None),
            [id] => Ok(Some(id.clone())),
            _ if many => {
                let instances = ids.len();
                let mut commit = Commit::settle(Settlement::Ack);
                commit.effects.enqueue = ids
                    .into_iter()
                    .map(|id| Envelope {
                        instance_id: Some(id.clone()),
                        key: Some(id),
                        key_field: None,
                        ..envelope.clone()
                    })
                    .collect();
                Err(decided(Decision::new(
                    commit,
                    Dispatched::FannedOut { instances },
                )))
            }
            _ => {
                let error = format!(
                    "`{}` matched {} instances of `{}` by \
                     `{field}` = `{}`, and one cannot be picked: \
                     mark its handler `#[handles(many)]` to deliver it to each",
                    envelope.message_type,
                    ids.len(),
                    self.def.name,
                    self.lookup.key(),
                );
                Err(fail(None, FailureKind::Ambiguous, error))
            }
        }
    }

    /// Whether the handler runs on `found`, the instance as read
    /// (`first_look`: taken from what came with the message or what this
    /// process last saved, rather than read now).
    ///
    /// A first look may be stale (another process wrote since): a decision
    /// that settles the message without a versioned write (ignore, drop as
    /// unmatched or duplicate) is made on a fresh read instead. One that
    /// runs the handler need not be: the save's version check catches it.
    pub(crate) fn admit(
        &self,
        found: Option<ProcessInstance>,
        first_look: bool,
        given: &Given<'_>,
    ) -> Result<Admitted, Verdict> {
        let envelope = self.envelope;
        let process = self.def.name;
        let key = self.lookup.key();
        if let Lookup::Copy { id, field, value } = &self.lookup {
            let holds = found
                .as_ref()
                .is_some_and(|i| i.keys.iter().any(|(f, v)| f == field && v == value));
            if !holds {
                return Err(decided(ignored(format!(
                    "instance `{id}` no longer holds `{field}` = `{value}` \
                     (gone or changed since the message was handed to it)"
                ))));
            }
        }
        // A timeout or a tally's message is for the generation that asked
        // for it. A record without a generation was written by a worker
        // that predates them (a rolling deploy): unknown, so the message
        // is delivered rather than lost.
        if let (Some(instance), Some(generation)) = (&found, &envelope.generation) {
            if !instance.generation.is_empty() && instance.generation != *generation {
                if first_look {
                    return Err(Verdict::Reread);
                }
                let reason = format!(
                    "`{}` is for an earlier instance `{}` (deleted, then created again)",
                    envelope.message_type, instance.id
                );
                let note = Note::EarlierGeneration {
                    instance: instance.id.clone(),
                };
                return Err(decided(ignored(reason).noted(note)));
            }
        }
        match (found, self.handler.kind) {
            (None, HandlerKind::Timeout | HandlerKind::Handles { .. }) if first_look => {
                Err(Verdict::Reread)
            }
            (Some(instance), _)
                if first_look && instance.processed.contains(&envelope.message_id) =>
            {
                Err(Verdict::Reread)
            }
            (None, HandlerKind::Timeout) => {
                let note = Note::InstanceGone {
                    instance: key.to_owned(),
                };
                let reason = format!("instance `{key}` does not exist");
                Err(decided(ignored(reason).noted(note)))
            }
            (None, HandlerKind::Handles { strict: false, .. }) => {
                Err(decided(self.not_found(given)))
            }
            (None, HandlerKind::Handles { strict: true, .. }) => {
                let error =
                    format!("no instance of `{process}` for `{key}` (`#[handles(strict)]`)");
                Err(fail(None, FailureKind::NotStarted, error))
            }
            (None, HandlerKind::Starts { .. }) => Ok(Admitted::Start {
                id: (self.handler.correlation == Correlation::Id).then(|| key.to_owned()),
            }),
            (Some(instance), _) if instance.processed.contains(&envelope.message_id) => {
                Err(decided(Decision::new(
                    Commit::settle(Settlement::Ack),
                    Dispatched::Duplicate {
                        instance: instance.id,
                    },
                )))
            }
            (Some(instance), _) if instance.status != InstanceStatus::Active => {
                Err(decided(self.inactive(instance, given.at)))
            }
            (Some(instance), HandlerKind::Starts { strict: true }) => {
                let error = format!(
                    "instance `{}` of `{process}` already exists (`#[starts(strict)]`)",
                    instance.id
                );
                Err(fail(Some(instance), FailureKind::AlreadyStarted, error))
            }
            (Some(instance), _) => Ok(Admitted::Run(Box::new(instance))),
        }
    }

    /// A new instance for a starting message that found none: unsaved
    /// (version 0) and stateless until its handler runs. `generation` is
    /// unique per creation (see [`ProcessInstance::generation`]).
    pub(crate) fn start(&self, id: String, generation: String, at: Timestamp) -> ProcessInstance {
        ProcessInstance {
            process: self.def.name.to_owned(),
            id,
            generation,
            started_by: Some(self.envelope.message_id.clone()),
            state: Value::Null,
            status: InstanceStatus::Active,
            version: 0,
            keys: Vec::new(),
            processed: Vec::new(),
            audit_log: Vec::new(),
            created_at: at,
            updated_at: at,
        }
    }

    /// A continuing message that matched no instance: held for it, unless
    /// its hold is over (or it is not to be held), then
    /// [`unmatched`](Self::unmatched).
    fn not_found(&self, given: &Given<'_>) -> Decision {
        let policy = self.handler.unmatched;
        let hold = policy.hold.unwrap_or(given.hold);
        // A message for every instance sharing a value has no one
        // instance to wait for.
        let field = match &self.lookup {
            Lookup::Id(_) => None,
            Lookup::Field { field, .. } => Some((*field).to_owned()),
            Lookup::Shared { .. } | Lookup::Copy { .. } => return self.unmatched(given, None),
        };
        let until = match self.envelope.hold_until {
            Some(until) => until,
            None if hold.is_zero() => return self.unmatched(given, None),
            None => due(given.now_ms, hold),
        };
        if given.now_ms >= until {
            let waited = format!("held for {}", humantime::format_duration(hold));
            return self.unmatched(given, Some(waited));
        }
        let key = self.lookup.key().to_owned();
        // Kept under what it looks for, whatever its sender filled in.
        let envelope = Envelope {
            hold_until: Some(until),
            key: Some(key.clone()),
            key_field: field.clone(),
            ..self.envelope.clone()
        };
        let commit = Commit {
            hold: Some(Held {
                field,
                value: key.clone(),
                envelope,
            }),
            ..Commit::settle(Settlement::Ack)
        };
        let full = format!("{HOLD_CAP} messages are held for it already");
        let tombstoned = Decision::new(
            Commit::settle(Settlement::Ack),
            Dispatched::Duplicate {
                instance: key.clone(),
            },
        )
        .noted(Note::DeletedDuplicate {
            instance: key.clone(),
        });
        let otherwise = Otherwise {
            full: self.unmatched(given, Some(full)),
            tombstoned,
        };
        let note = Note::Holding {
            correlation: key.clone(),
        };
        Decision {
            reread_on_conflict: true,
            otherwise: Some(Box::new(otherwise)),
            ..Decision::new(
                commit,
                Dispatched::Held {
                    key,
                    until_ms: until,
                },
            )
        }
        .noted(note)
    }

    /// A continuing message that matched no instance (`why` it was not
    /// held, or no longer is): dropped, or parked, as its handler or the
    /// engine says.
    fn unmatched(&self, given: &Given<'_>, why: Option<String>) -> Decision {
        let key = self.lookup.key().to_owned();
        let mut reason = format!(
            "`{}` for process manager `{}` matched no instance (correlation `{key}`)",
            self.envelope.message_type, self.def.name
        );
        if let Some(why) = why {
            reason = format!("{reason}: {why}");
        }
        let park = match self.handler.unmatched.then {
            Some(then) => then == AfterHold::DeadLetter,
            None => given.dead_letter_unmatched,
        };
        let settle = match park {
            true => Settlement::DeadLetter(reason),
            false => Settlement::Ack,
        };
        let note = Note::Unmatched {
            correlation: key.clone(),
        };
        let outcome = Dispatched::Unmatched {
            key,
            dead_lettered: park,
        };
        Decision::new(Commit::settle(settle), outcome).noted(note)
    }

    /// A message for a completed or stopped instance: ignored, with an
    /// entry in the instance's audit log (so the write is versioned, and a
    /// conflict on it means the message is judged again).
    fn inactive(&self, mut instance: ProcessInstance, at: Timestamp) -> Decision {
        let reason = format!("instance is {:?}", instance.status).to_lowercase();
        let action = ProcessAuditAction::Ignored {
            reason: reason.clone(),
        };
        audit(&mut instance, self.envelope, action, at);
        let commit = Commit {
            instance: Some(instance),
            ..Commit::settle(Settlement::Ack)
        };
        Decision {
            reread_on_conflict: true,
            ..Decision::new(commit, Dispatched::Ignored { reason })
        }
    }
}
