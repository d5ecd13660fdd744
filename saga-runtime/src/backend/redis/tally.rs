//! Tallies. A check is one round trip of three plain commands (`SMOVE`
//! from the unchecked set to the checked one, `SCARD`, `HMGET`), not a
//! transaction nor a script: the least server time per check, which is
//! what lets checking keep up with plain `INCR`s. A check that finds no
//! item left then sends the completion (`TALLY_FINISH`, guarded by the
//! tally's `done` flag, so it is sent once, and answered `Completed` to
//! the one check that sent it); should that checker die in between, the
//! next check of any item, or housekeeping, sends it.

use async_trait::async_trait;

use super::scripts::{self as s, TallyFinished};
use super::{corrupt, ms, unavailable, RedisBackend};
use crate::backend::{BackendError, Tallies};
use crate::model::tally::{TallyCheck, TallyProgress, TallyRef, COMPLETED_TALLY_KEEP};

/// Open tallies looked at per round trip by housekeeping.
const SWEEP_BATCH: usize = 200;

/// A tally's member of the open tallies.
pub(super) fn member(tally: &TallyRef) -> Result<String, BackendError> {
    serde_json::to_string(tally).map_err(corrupt)
}

impl RedisBackend {
    /// Sends `tally`'s completion if it is due and unsent; `true` if sent
    /// by this call.
    async fn finish(&self, tally: &TallyRef, mover: bool) -> Result<bool, BackendError> {
        let k = self.keys();
        let finished = self
            .call(&s::TallyFinish {
                tally: k.tally(tally, ""),
                pending: k.tally(tally, ":pending"),
                checked: k.tally(tally, ":checked"),
                queue: k.queue(k.process_route(&tally.process, &tally.instance)),
                open_tallies: k.open_tallies(k.pm_k(&tally.process, &tally.instance)),
                members: (!k.spread()).then(|| k.partition_members()),
                keep_ms: ms(COMPLETED_TALLY_KEEP),
                member: member(tally)?,
                mover,
            })
            .await?;
        Ok(finished == TallyFinished::Sent)
    }

    /// Sends the completions whose checker died before sending them, and
    /// forgets tallies that expired; returns how many were sent.
    pub(super) async fn finish_open_tallies(&self) -> Result<usize, BackendError> {
        let mut sent = 0;
        for part in self.keys().pm_parts() {
            sent += self.finish_open_tallies_of(part).await?;
        }
        if sent > 0 {
            tracing::warn!(
                sent,
                "sent tally completions whose checker stopped before sending them"
            );
        }
        Ok(sent)
    }

    /// [`finish_open_tallies`](Self::finish_open_tallies) of one
    /// process-manager partition.
    async fn finish_open_tallies_of(&self, part: u16) -> Result<usize, BackendError> {
        let k = self.keys();
        let open = k.open_tallies(part);
        let mut conn = self.conn();
        let members: Vec<String> = redis::cmd("ZRANGE")
            .arg(&open)
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        let mut sent = 0;
        for chunk in members.chunks(SWEEP_BATCH) {
            let tallies: Vec<Option<TallyRef>> =
                chunk.iter().map(|m| serde_json::from_str(m).ok()).collect();
            let cmds = tallies
                .iter()
                .map(|tally| match tally {
                    Some(t) => redis::cmd("SCARD").arg(k.tally(t, ":pending")).clone(),
                    None => redis::cmd("ECHO").arg(0).clone(),
                })
                .collect();
            let left: Vec<i64> = self
                .query_each(cmds)
                .await?
                .iter()
                .map(|v| redis::from_redis_value_ref(v).map_err(corrupt))
                .collect::<Result<_, _>>()?;
            for ((tally, left), raw) in tallies.iter().zip(left).zip(chunk) {
                match tally {
                    Some(t) if left == 0 => sent += usize::from(self.finish(t, false).await?),
                    Some(_) => {}
                    None => {
                        tracing::warn!(member = %raw, "unreadable open tally forgotten");
                        let _: () = redis::cmd("ZREM")
                            .arg(&open)
                            .arg(raw)
                            .query_async(&mut conn)
                            .await
                            .map_err(unavailable)?;
                    }
                }
            }
        }
        Ok(sent)
    }
}

#[async_trait]
impl Tallies for RedisBackend {
    async fn tally_check(&self, tally: &TallyRef, item: &str) -> Result<TallyCheck, BackendError> {
        let k = self.keys();
        let (pending, checked) = (k.tally(tally, ":pending"), k.tally(tally, ":checked"));
        let (moved, left, (late, done)): (i64, u64, (Option<String>, Option<String>)) =
            redis::pipe()
                .cmd("SMOVE")
                .arg(&pending)
                .arg(&checked)
                .arg(item)
                .cmd("SCARD")
                .arg(&pending)
                .cmd("HMGET")
                .arg(k.tally(tally, ""))
                .arg("late")
                .arg("done")
                .query_async(&mut self.conn())
                .await
                .map_err(unavailable)?;
        let late = late.as_deref() == Some("1");
        let Some(done) = done.map(|d| d == "1") else {
            return Ok(TallyCheck::NoTally);
        };
        if moved == 1 {
            if left > 0 {
                return Ok(TallyCheck::Counted {
                    remaining: left,
                    late,
                });
            }
            // The check that sends the completion is the one that
            // completed the tally (two may see none left: the count is
            // not read in the same breath as the move).
            return Ok(match self.finish(tally, true).await? {
                true => TallyCheck::Completed { late },
                false => TallyCheck::Counted { remaining: 0, late },
            });
        }
        if left == 0 && !done {
            // Everything is checked, and the completion is not sent: the
            // checker of the last item stopped in between.
            self.finish(tally, false).await?;
        }
        let known: bool = redis::cmd("SISMEMBER")
            .arg(&checked)
            .arg(item)
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(match known && !item.is_empty() {
            true => TallyCheck::AlreadyChecked,
            false => TallyCheck::UnknownItem,
        })
    }

    async fn tally_progress(
        &self,
        tally: &TallyRef,
        missing: usize,
        mark_deadline: bool,
    ) -> Result<Option<TallyProgress>, BackendError> {
        let k = self.keys();
        self.call(&s::TallyProgress {
            tally: k.tally(tally, ""),
            pending: k.tally(tally, ":pending"),
            missing,
            mark_deadline,
        })
        .await
    }
}
