//! The PostgreSQL interpreter of the write vocabulary (`backend/write.rs`):
//! a [`Write`] becomes one call of `apply_task_write` (migration 7), each
//! effect its arguments, NULL for the effects the write does not carry.
//! Nothing here decides what a write does; it says it in the function's
//! terms, and afterwards wakes whoever the write concerns.

use sqlx::Row;

use super::settling::{located, SettleArgs};
use super::tasks::{audit, head, ms, refused};
use super::{corrupt, failure, PostgresBackend};
use crate::backend::write::{Answer, Applied, Effect, Guard, Write};
use crate::backend::{BackendError, Settle, WorkItem};
use crate::model::task::{TaskInstance, AUDIT_LOG_CAP};

/// A write's arguments, gathered effect by effect.
#[derive(Default)]
struct Args<'a> {
    put: Option<(&'a TaskInstance, String, String)>,
    claim: Option<&'a str>,
    renew: Option<(i64, (i64, uuid::Uuid))>,
    next: Option<(String, i64)>,
    settle: Option<SettleArgs<'a>>,
    retain: Option<Option<i64>>,
    unlock: bool,
    announce: bool,
}

impl PostgresBackend {
    /// Checks `write`'s guards and applies its effects, in one call.
    pub(super) async fn interpret(&self, write: &Write<'_>) -> Result<Answer, BackendError> {
        let (task, lease) = (write.task, write.lease);
        if !write.in_order() {
            return Err(corrupt(
                "a task write is fenced, then versioned, and carries each effect at most once, \
                 in order",
            ));
        }
        let a = self.args(write)?;
        let changed = match a.put {
            Some((task, ..)) => Some(self.shared.steps.changed(task)?),
            None => None,
        };
        let settle = a.settle.unwrap_or_else(|| SettleArgs {
            how: "none",
            ..SettleArgs::default()
        });
        let put = a.put.as_ref();
        let row = run!(
            self,
            sqlx::query(sql!(
                "SELECT code, detail, version, claimed FROM {}($1, $2, $3, $4, $5, $6::jsonb, \
                 $7::jsonb, $8::jsonb, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, \
                 $21, $22, $23, $24, $25, $26, $27)",
                self.q("apply_task_write")
            ))
            .bind(task.id.0)
            .bind(i64::try_from(lease.fence).unwrap_or(i64::MAX))
            .bind(i64::try_from(task.version).unwrap_or(i64::MAX))
            .bind(write.guarded_by(Guard::NotCancelled))
            .bind(put.map(|p| p.0.status.as_str()))
            .bind(put.map(|p| p.1.as_str()))
            .bind(changed.as_ref().map(|c| &c.rows))
            .bind(put.map(|p| p.2.as_str()))
            .bind(i32::try_from(AUDIT_LOG_CAP).unwrap_or(i32::MAX))
            .bind(a.claim)
            .bind(a.renew.map(|r| r.0))
            .bind(&lease.token)
            .bind(a.renew.map(|r| (r.1).0))
            .bind(a.renew.map(|r| (r.1).1))
            .bind(ms(self.shared.config.visibility_timeout))
            .bind(a.next.as_ref().map(|n| n.0.as_str()))
            .bind(a.next.as_ref().map_or(0, |n| n.1))
            .bind(settle.how)
            .bind(settle.row)
            .bind(settle.claim)
            .bind(settle.payload)
            .bind(settle.reason)
            .bind(settle.size)
            .bind(settle.dead_letter)
            .bind(a.retain.is_some())
            .bind(a.retain.flatten())
            .bind(a.unlock),
            fetch_one
        );
        // Wake whoever may care, unless the write was refused (a failed
        // statement may have committed all the same).
        let refused_row = matches!(&row, Ok(r) if r.try_get::<i32, _>(0).is_ok_and(|c| c != 0));
        if !refused_row {
            if a.next.is_some() {
                self.shared.waker.work();
            }
            if a.announce {
                self.shared.waker.finished(task.id);
            }
        }
        let row = row.map_err(failure)?;
        let code: i32 = row.try_get(0).map_err(corrupt)?;
        if code != 0 {
            let detail: Option<String> = row.try_get(1).map_err(corrupt)?;
            return Ok(Err(refused(code, detail, task, lease)?));
        }
        let version: i64 = row.try_get(2).map_err(corrupt)?;
        let version = u64::try_from(version).unwrap_or(0);
        if let (Some((put, ..)), Some(changed)) = (a.put, changed) {
            // What the step cache knows of the stored rows: nothing once
            // the task ended (it is not written again).
            match put.status.is_terminal() {
                true => self.shared.steps.forget(put.id),
                false => self.shared.steps.remember(put.id, version, changed.hashes),
            }
        }
        Ok(Ok(Applied {
            version,
            claimed: row.try_get(3).map_err(corrupt)?,
        }))
    }

    /// `write`'s effects as the function's arguments.
    fn args<'a>(&self, write: &Write<'a>) -> Result<Args<'a>, BackendError> {
        let limit = self.shared.config.dead_letter_payload_limit;
        let mut a = Args::default();
        for effect in &write.effects {
            match *effect {
                Effect::Put { task, .. } => a.put = Some((task, head(task)?, audit(task)?)),
                Effect::Claim(claim) => a.claim = Some(claim),
                Effect::Renew { delivery, ttl } => a.renew = Some((ms(ttl), located(delivery)?)),
                Effect::Enqueue(next) => {
                    a.next = Some((
                        WorkItem::Saga(next.message.clone()).encode(),
                        ms(next.delay),
                    ))
                }
                Effect::Settle(Settle::Nothing) => {}
                Effect::Settle(settle) => a.settle = Some(SettleArgs::of(settle, limit)?),
                Effect::Retain(after) => a.retain = Some(after.map(ms)),
                Effect::Unlock => a.unlock = true,
                Effect::Announce => a.announce = true,
            }
        }
        Ok(a)
    }
}
