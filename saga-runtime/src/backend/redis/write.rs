//! The Redis interpreter of the write vocabulary (`backend/write.rs`): a
//! [`Write`] becomes one call of `apply.lua`, each effect its keys and
//! arguments (`scripts::Op`), in the write's order. Nothing here decides
//! what a write does; it names the keys each effect touches.

use super::keys::Keys;
use super::scripts::{self as s, Op, SettleArgv};
use super::{corrupt, ms, RedisBackend};
use crate::backend::write::{Answer, Applied, Effect, Guard, Write};
use crate::backend::{truncate_payload, BackendError, Settle, WorkItem};
use crate::model::task::AUDIT_LOG_CAP;

use super::tasks::{audit_entries, write_refused};

impl RedisBackend {
    /// Checks `write`'s guards and applies its effects, in one script call.
    pub(super) async fn interpret(&self, write: &Write<'_>) -> Result<Answer, BackendError> {
        let task = write.task;
        if !write.in_order() {
            return Err(corrupt(
                "a task write is fenced, then versioned, and carries each effect at most once, \
                 in order",
            ));
        }
        let mut effects = Vec::with_capacity(write.effects.len());
        for effect in &write.effects {
            if let Some(op) = self.op(write, effect)? {
                effects.push(op);
            }
        }
        let written = self
            .call(&s::Apply {
                tk: self.keys().of_task(task.id),
                lease_fence: write.lease.fence,
                version: task.version,
                apart: task.steps_apart(),
                unless_cancelled: write.guarded_by(Guard::NotCancelled),
                effects,
            })
            .await?;
        Ok(match written {
            Ok(written) => Ok(Applied {
                version: written.version,
                claimed: written.claimed,
            }),
            Err(refused) => Err(write_refused(refused, task, write.lease)?),
        })
    }

    /// What `effect` of `write` takes in `apply.lua` (`None`: nothing to
    /// do, a message with nothing to settle).
    fn op<'a>(
        &'a self,
        write: &Write<'a>,
        effect: &Effect<'a>,
    ) -> Result<Option<Op<'a>>, BackendError> {
        let k = self.keys();
        let task = write.task;
        let p = k.partition_of(task.id);
        Ok(Some(match *effect {
            Effect::Put {
                task,
                stored_status,
            } => {
                let (doc, fields) = self.written(task)?;
                Op::Put {
                    index_from: k.index(p, &task.saga, Some(stored_status)),
                    index_to: k.index(p, &task.saga, Some(task.status)),
                    doc,
                    status: task.status,
                    created_ms: task.created_at.0,
                    audit_cap: AUDIT_LOG_CAP,
                    fields,
                    audit_entries: audit_entries(task)?,
                }
            }
            Effect::Claim(claim) => Op::Claim(claim),
            Effect::Renew { delivery, ttl } => Op::Renew {
                queue: k.queue(p),
                token: &write.lease.token,
                ttl_ms: ms(ttl),
                group: self.group(),
                consumer: &delivery.consumer,
                entry: self.entry_of(delivery, p)?,
            },
            Effect::Enqueue(next) => Op::Enqueue {
                queue: k.queue(p),
                delayed: k.delayed(p),
                payload: WorkItem::Saga(next.message.clone()).encode(),
                delay_ms: next.delay.as_millis().min(1_000_000_000_000) as u64,
            },
            Effect::Settle(Settle::Nothing) => return Ok(None),
            Effect::Settle(settle) => Op::Settle {
                queue: k.queue(p),
                dead: k.dead(p),
                settle: self.settle_argv(settle, p, write)?,
                group: self.group(),
                dead_cap: self.dead_letters_ceiling(),
            },
            Effect::Retain(after) => Op::Retain {
                expiring: k.expiring(p),
                expire_after_ms: after.map(ms),
                // A task leaving a terminal status (a requeue) leaves the
                // expiry set.
                stored_member: write
                    .stored_status()
                    .filter(|stored| stored.is_terminal())
                    .map(|stored| Keys::expiring_member(task.id, stored, &task.saga)),
                new_member: Keys::expiring_member(task.id, task.status, &task.saga),
            },
            Effect::Unlock => Op::Unlock,
            Effect::Announce => Op::Announce {
                channel: k.finished_channel(),
            },
        }))
    }

    /// How `apply.lua` settles the message handled.
    fn settle_argv<'a>(
        &self,
        settle: Settle<'a>,
        p: u16,
        write: &Write<'_>,
    ) -> Result<SettleArgv<'a>, BackendError> {
        let limit = self.shared.config.dead_letter_payload_limit;
        Ok(match settle {
            Settle::Nothing => SettleArgv::Keep,
            Settle::Ack(d) => SettleArgv::Ack {
                entry: self.entry_of(d, p)?,
            },
            Settle::DeadLetter(d, reason) => {
                let (payload, size) = truncate_payload(&d.raw, limit);
                SettleArgv::Dead {
                    entry: self.entry_of(d, p)?,
                    payload,
                    reason,
                    size,
                }
            }
            Settle::ResolveDeadLetter(id) => {
                let (lp, entry) = self
                    .keys()
                    .split_id(id)
                    .ok_or_else(|| corrupt(format!("bad dead letter id {id}")))?;
                if lp != p {
                    return Err(corrupt(format!(
                        "dead letter {id} is not in task {}'s partition",
                        write.task.id
                    )));
                }
                SettleArgv::Resolve {
                    entry: entry.to_owned(),
                }
            }
        })
    }
}
