//! The calls that coordinate engines: named leases, process-manager
//! partitions, runner announcements, saga readers, shared circuit
//! breakers.

use std::time::Duration;

use redis::{Script, Value};

use super::{flag, or_empty, typed, Call, Invocation};
use super::{ANNOUNCE, BALANCE, BREAKER_ACQUIRE, BREAKER_REPORT, NAMED_LEASE, READERS, RUNNERS};
use crate::backend::redis::corrupt;
use crate::backend::{BackendError, BreakerChange, BreakerDecision};

/// `named_lease.lua`: a named lease taken or renewed.
pub(crate) struct NamedLease<'a> {
    pub lease: String,
    pub token: &'a str,
    pub ttl_ms: u64,
}

impl Call for NamedLease<'_> {
    /// Whether the token holds it now.
    type Reply = bool;

    fn script() -> &'static Script {
        &NAMED_LEASE
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.lease).arg(self.token).arg(self.ttl_ms);
    }

    fn decode(reply: Value) -> Result<bool, BackendError> {
        typed::<i64>(reply).map(|n| n == 1)
    }
}

/// `balance.lua`: the process-manager partitions balanced over the live
/// members.
pub(crate) struct Balance<'a> {
    pub members: String,
    pub owner_prefix: String,
    pub member: &'a str,
    pub ttl_ms: u64,
    pub partitions: u16,
    pub leaving: bool,
    /// The process-manager key prefix, whose partitions' due hand-backs
    /// the owner moves (`None` in the spread layout).
    pub pm_prefix: Option<String>,
    /// The partitions the member has messages of in flight: kept, not
    /// read, while balanced to another member.
    pub busy: Vec<u16>,
}

impl Call for Balance<'_> {
    /// The partitions the member holds now.
    type Reply = Vec<u16>;

    fn script() -> &'static Script {
        &BALANCE
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.members)
            .arg(&self.owner_prefix)
            .arg(self.member)
            .arg(self.ttl_ms)
            .arg(self.partitions)
            .arg(flag(self.leaving))
            .arg(self.pm_prefix.as_deref().unwrap_or_default())
            .arg(join(&self.busy));
    }

    fn decode(reply: Value) -> Result<Vec<u16>, BackendError> {
        typed(reply)
    }
}

/// `3,17`: numbers as `balance.lua` reads them.
fn join(numbers: &[u16]) -> String {
    let parts: Vec<String> = numbers.iter().map(u16::to_string).collect();
    parts.join(",")
}

/// `announce.lua`: an engine recorded among the runners of each process
/// manager it runs (or removed).
pub(crate) struct Announce<'a> {
    pub runner_sets: Vec<String>,
    pub member: &'a str,
    /// How long the announcement holds (`None`: leaving).
    pub ttl_ms: Option<u64>,
}

impl Call for Announce<'_> {
    type Reply = ();

    fn script() -> &'static Script {
        &ANNOUNCE
    }

    fn fill(&self, call: &mut Invocation) {
        for set in &self.runner_sets {
            call.key(set);
        }
        call.arg(self.member).arg(or_empty(self.ttl_ms));
    }

    fn decode(reply: Value) -> Result<(), BackendError> {
        typed::<i64>(reply).map(drop)
    }
}

/// `runners.lua`: how many engines that run a process manager announced
/// themselves within their TTL.
pub(crate) struct Runners {
    pub runners: String,
}

impl Call for Runners {
    type Reply = i64;

    fn script() -> &'static Script {
        &RUNNERS
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.runners);
    }

    fn decode(reply: Value) -> Result<i64, BackendError> {
        typed(reply)
    }
}

/// `readers.lua`: a backend renewed (or removed) among the saga readers.
pub(crate) struct Readers<'a> {
    pub readers: String,
    pub member: &'a str,
    /// How long the membership holds (`None`: leaving).
    pub ttl_ms: Option<u64>,
}

impl Call for Readers<'_> {
    /// Its rank by name and how many readers there are, when the reply
    /// has both.
    type Reply = Option<(u16, u16)>;

    fn script() -> &'static Script {
        &READERS
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.readers)
            .arg(self.member)
            .arg(or_empty(self.ttl_ms));
    }

    fn decode(reply: Value) -> Result<Option<(u16, u16)>, BackendError> {
        Ok(match typed::<Vec<u16>>(reply)?.as_slice() {
            &[rank, size] => Some((rank, size)),
            _ => None,
        })
    }
}

/// `breaker_acquire.lua`: a shared circuit breaker's decision before a
/// call.
pub(crate) struct BreakerAcquire<'a> {
    pub breaker: String,
    pub probe_ttl_ms: u64,
    pub token: &'a str,
}

impl Call for BreakerAcquire<'_> {
    type Reply = BreakerDecision;

    fn script() -> &'static Script {
        &BREAKER_ACQUIRE
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.breaker)
            .arg(self.probe_ttl_ms)
            .arg(self.token);
    }

    fn decode(reply: Value) -> Result<BreakerDecision, BackendError> {
        Ok(match typed::<Vec<u64>>(reply)?.as_slice() {
            [1, probe, counting] => BreakerDecision::Call {
                probe: *probe == 1,
                counting: *counting == 1,
            },
            [0, ms] => BreakerDecision::Open {
                retry_after: Duration::from_millis(*ms),
            },
            _ => return Err(corrupt("unexpected reply from the breaker script")),
        })
    }
}

/// `breaker_report.lua`: a call's outcome recorded on a shared breaker.
pub(crate) struct BreakerReport<'a> {
    pub breaker: String,
    /// The probe's token, if the call was the probe.
    pub probe: Option<&'a str>,
    /// Whether the call failed (`None`: it did not happen).
    pub failed: Option<bool>,
    pub threshold: u32,
    pub open_ms: u64,
    pub keep_ms: u64,
}

impl Call for BreakerReport<'_> {
    /// The change this report made.
    type Reply = Option<BreakerChange>;

    fn script() -> &'static Script {
        &BREAKER_REPORT
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.breaker)
            .arg(self.probe.unwrap_or_default())
            .arg(match self.failed {
                None => "-",
                Some(failed) => flag(failed),
            })
            .arg(self.threshold)
            .arg(self.open_ms)
            .arg(self.keep_ms);
    }

    fn decode(reply: Value) -> Result<Option<BreakerChange>, BackendError> {
        Ok(match typed::<i64>(reply)? {
            1 => Some(BreakerChange::Opened),
            2 => Some(BreakerChange::Closed),
            _ => None,
        })
    }
}
