//! Tallies (`migrations/0002_process.sql`): a head row that counts the
//! items left, and a row per item. A check is one call of `tally_check`,
//! one statement: it marks its item's row (a duplicate waits for the first
//! check's row and finds it checked), counts down on the head row (whose
//! lock orders the checks of the last items: exactly one takes the count
//! to 0), and that one enqueues the completion in the same transaction.
//! So no completion is ever left for housekeeping to send, unlike Redis,
//! whose checks are plain commands.

use async_trait::async_trait;
use sqlx::Row;

use super::tasks::ms;
use super::{corrupt, failure, PostgresBackend};
use crate::backend::{BackendError, Tallies};
use crate::model::tally::{TallyCheck, TallyProgress, TallyRef, COMPLETED_TALLY_KEEP};

/// A count as the functions answer it.
fn count(n: Option<i32>) -> u64 {
    n.and_then(|n| u64::try_from(n).ok()).unwrap_or(0)
}

#[async_trait]
impl Tallies for PostgresBackend {
    async fn tally_check(&self, tally: &TallyRef, item: &str) -> Result<TallyCheck, BackendError> {
        let row = run!(
            self,
            sqlx::query(sql!(
                "SELECT code, remaining, late FROM {}($1, $2, $3, $4, $5, $6)",
                self.q("tally_check")
            ))
            .bind(&tally.process)
            .bind(&tally.instance)
            .bind(&tally.generation)
            .bind(&tally.name)
            .bind(item)
            .bind(ms(COMPLETED_TALLY_KEEP)),
            fetch_one
        );
        // A completing check enqueued the completion, notifying nobody; a
        // failed statement may have committed all the same.
        if !matches!(&row, Ok(r) if r.try_get::<i32, _>(0).is_ok_and(|code| code != 2)) {
            self.shared.waker.work();
        }
        let row = row.map_err(failure)?;
        let code: i32 = row.try_get(0).map_err(corrupt)?;
        let remaining: Option<i32> = row.try_get(1).map_err(corrupt)?;
        let late = row.try_get::<Option<bool>, _>(2).map_err(corrupt)? == Some(true);
        Ok(match code {
            0 => TallyCheck::NoTally,
            1 => TallyCheck::Counted {
                remaining: count(remaining),
                late,
            },
            2 => TallyCheck::Completed { late },
            3 => TallyCheck::AlreadyChecked,
            4 => TallyCheck::UnknownItem,
            other => {
                return Err(corrupt(format!(
                    "unexpected answer {other} to a tally check"
                )))
            }
        })
    }

    async fn tally_progress(
        &self,
        tally: &TallyRef,
        missing: usize,
        mark_deadline: bool,
    ) -> Result<Option<TallyProgress>, BackendError> {
        let row = run!(
            self,
            sqlx::query(sql!(
                "SELECT exists_, total, remaining, late, missing FROM {}($1, $2, $3, $4, $5, $6)",
                self.q("tally_progress")
            ))
            .bind(&tally.process)
            .bind(&tally.instance)
            .bind(&tally.generation)
            .bind(&tally.name)
            .bind(i32::try_from(missing).unwrap_or(i32::MAX))
            .bind(mark_deadline),
            fetch_one
        )
        .map_err(failure)?;
        let exists: bool = row.try_get(0).map_err(corrupt)?;
        if !exists {
            return Ok(None);
        }
        let total = count(row.try_get(1).map_err(corrupt)?);
        let remaining = count(row.try_get(2).map_err(corrupt)?);
        let late: Option<bool> = row.try_get(3).map_err(corrupt)?;
        let missing: Option<Vec<String>> = row.try_get(4).map_err(corrupt)?;
        Ok(Some(TallyProgress {
            total,
            checked: total.saturating_sub(remaining),
            missing: missing.unwrap_or_default(),
            complete: remaining == 0,
            deadline_passed: late == Some(true),
        }))
    }
}
