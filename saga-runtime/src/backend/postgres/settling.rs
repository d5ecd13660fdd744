//! How a write settles the message it handles, as the schema's functions
//! take it: acknowledged, dead-lettered (with the payload cut to the
//! configured size), a dead letter resolved, or nothing.

use uuid::Uuid;

use super::failure::corrupt;
use crate::backend::{truncate_payload, BackendError, Delivery, Settle};

/// A delivery's queue row and claim, from its id (`<row>:<claim>`).
pub(super) fn located(delivery: &Delivery) -> Result<(i64, Uuid), BackendError> {
    let bad = || {
        corrupt(format!(
            "`{}` is not a delivery of this backend",
            delivery.id
        ))
    };
    let (row, claim) = delivery.id.split_once(':').ok_or_else(bad)?;
    Ok((
        row.parse().map_err(|_| bad())?,
        claim.parse().map_err(|_| bad())?,
    ))
}

/// How a write settles its message, as the schema's `settle` function
/// takes it (task commits and process commits alike).
#[derive(Default)]
pub(super) struct SettleArgs<'a> {
    pub(super) how: &'static str,
    pub(super) row: Option<i64>,
    pub(super) claim: Option<Uuid>,
    pub(super) payload: Option<&'a str>,
    pub(super) reason: Option<&'a str>,
    pub(super) size: Option<i64>,
    pub(super) dead_letter: Option<i64>,
}

impl<'a> SettleArgs<'a> {
    pub(super) fn of(settle: Settle<'a>, limit: usize) -> Result<Self, BackendError> {
        Ok(match settle {
            Settle::Nothing => SettleArgs {
                how: "none",
                ..SettleArgs::default()
            },
            Settle::Ack(d) => {
                let (row, claim) = located(d)?;
                SettleArgs {
                    how: "ack",
                    row: Some(row),
                    claim: Some(claim),
                    ..SettleArgs::default()
                }
            }
            Settle::DeadLetter(d, reason) => {
                let (row, claim) = located(d)?;
                let (payload, size) = truncate_payload(&d.raw, limit);
                SettleArgs {
                    how: "dead",
                    row: Some(row),
                    claim: Some(claim),
                    payload: Some(payload),
                    reason: Some(reason),
                    size: size.map(|s| i64::try_from(s).unwrap_or(i64::MAX)),
                    ..SettleArgs::default()
                }
            }
            Settle::ResolveDeadLetter(id) => SettleArgs {
                how: "resolve",
                dead_letter: Some(
                    id.parse()
                        .map_err(|_| corrupt(format!("bad dead letter id {id}")))?,
                ),
                ..SettleArgs::default()
            },
        })
    }
}
