//! Tallies: one script per check, one per progress read, on the
//! process-manager slot (the check of the last item enqueues the
//! completion in the same script).

use async_trait::async_trait;
use redis::Value;

use super::{corrupt, entry, ms, scripts as s, RedisBackend};
use crate::backend::{BackendError, Tallies};
use crate::process::tally::{TallyProgress, COMPLETED_TALLY_KEEP};
use crate::process::{TallyCheck, TallyRef};

fn int(value: Option<&Value>) -> Result<i64, BackendError> {
    match value {
        Some(Value::Int(n)) => Ok(*n),
        other => Err(corrupt(format!("a tally script answered {other:?}"))),
    }
}

#[async_trait]
impl Tallies for RedisBackend {
    async fn tally_check(&self, tally: &TallyRef, item: &str) -> Result<TallyCheck, BackendError> {
        let k = self.keys();
        let reply: Vec<Value> = self
            .run(
                s::TALLY_CHECK
                    .key(k.tally(tally, ""))
                    .key(k.tally(tally, ":pending"))
                    .key(k.tally(tally, ":checked"))
                    .key(k.queue(k.process_stream()))
                    .arg(item)
                    .arg(ms(COMPLETED_TALLY_KEEP)),
            )
            .await?;
        let late = |i: usize| int(reply.get(i)).map(|n| n == 1);
        Ok(match int(reply.first())? {
            -1 => TallyCheck::NoTally,
            -2 => TallyCheck::UnknownItem,
            0 => TallyCheck::AlreadyChecked,
            1 => TallyCheck::Counted {
                remaining: int(reply.get(1))? as u64,
                late: late(2)?,
            },
            _ => TallyCheck::Completed { late: late(1)? },
        })
    }

    async fn tally_progress(
        &self,
        tally: &TallyRef,
        missing: usize,
        mark_deadline: bool,
    ) -> Result<Option<TallyProgress>, BackendError> {
        let k = self.keys();
        let reply: Vec<Value> = self
            .run(
                s::TALLY_PROGRESS
                    .key(k.tally(tally, ""))
                    .key(k.tally(tally, ":pending"))
                    .arg(missing)
                    .arg(if mark_deadline { "1" } else { "0" }),
            )
            .await?;
        let total = int(reply.first())?;
        if total < 0 {
            return Ok(None);
        }
        Ok(Some(TallyProgress {
            total: total as u64,
            checked: int(reply.get(1))?.max(0) as u64,
            complete: int(reply.get(2))? == 1,
            deadline_passed: int(reply.get(3))? == 1,
            missing: reply
                .get(4)
                .map(|m| entry::items(m).into_iter().map(entry::text).collect())
                .unwrap_or_default(),
        }))
    }
}
