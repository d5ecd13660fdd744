//! The calls of flow-control limits (`limit_*.lua` on
//! `lib/limit_state.lua`) and of waking a parked message (`wake.lua`).
//! Times go to the limit scripts in microseconds: a rate's interval is
//! `per / count`, which milliseconds would round.

use std::time::Duration;

use redis::{Script, Value};

use super::{or_empty, typed, Call, Invocation};
use super::{LIMIT_ACQUIRE, LIMIT_LEAVE, LIMIT_RELEASE, LIMIT_RENEW, LIMIT_USAGE, WAKE};
use crate::backend::limits::{BOOKING_GRACE, LATE};
use crate::backend::redis::corrupt;
use crate::backend::redis::keys::Keys;
use crate::backend::{Acquired, BackendError, LimitCause, LimitDecision, LimitUsage, Released};
use crate::limit::LimitConfig;

/// How long a limit's keys outlive the last thing they hold (a slot, a
/// waiter's deadline, a booking's grace, the rate's next start): a key
/// value used once is forgotten soon after, and a call that comes just as
/// the last one lapses finds the state it expects. An expiry is moved only
/// when it falls short, and then to two margins past (so most calls set
/// none): a key lives between one and two margins past what it holds.
pub(crate) const LIMIT_KEEP_MARGIN: Duration = Duration::from_secs(10);

/// A duration in microseconds for the limit scripts, rounded up (a rate's
/// interval rounded down would start more than declared): at least 1, and
/// at most about 31 years (the expiry Redis accepts, as `ms` does).
pub(crate) fn us(d: Duration) -> u64 {
    d.as_nanos().div_ceil(1000).clamp(1, 1_000_000_000_000_000) as u64
}

/// The keys of one `(limit, key)`, in the order every limit script takes
/// them.
pub(crate) struct LimitKeys([String; 6]);

impl LimitKeys {
    pub fn new(keys: &Keys, limit: &str, key: Option<&str>) -> Self {
        LimitKeys(
            ["holders", "line", "waiting", "waiters", "bookings", "state"]
                .map(|part| keys.limit(limit, key, part)),
        )
    }

    /// The keys, then the two arguments every limit script starts with.
    fn fill(&self, call: &mut Invocation) {
        for key in &self.0 {
            call.key(key);
        }
        call.arg(us(BOOKING_GRACE)).arg(us(LIMIT_KEEP_MARGIN));
    }
}

/// A reply of numbers then wake strings: the first `n` numbers, and the
/// rest.
fn numbers_then_wakes(reply: Value, n: usize) -> Result<(Vec<u64>, Vec<String>), BackendError> {
    let mut items = typed::<Vec<Value>>(reply)?;
    if items.len() < n {
        return Err(corrupt("a limit script answered too few values"));
    }
    let wakes = items.split_off(n);
    let numbers = items.into_iter().map(typed).collect::<Result<_, _>>()?;
    let wakes = wakes.into_iter().map(typed).collect::<Result<_, _>>()?;
    Ok((numbers, wakes))
}

/// `limit_acquire.lua`: one attempt's start asked under one limit.
pub(crate) struct LimitAcquire<'a> {
    pub keys: LimitKeys,
    pub config: LimitConfig,
    pub holder: &'a str,
    pub waiter: &'a str,
    pub hold_for: Duration,
    pub wake: Option<&'a str>,
}

impl Call for LimitAcquire<'_> {
    type Reply = Acquired;

    fn script() -> &'static Script {
        &LIMIT_ACQUIRE
    }

    fn fill(&self, call: &mut Invocation) {
        self.keys.fill(call);
        let rate = self.config.rate;
        call.arg(or_empty(self.config.concurrency))
            .arg(or_empty(rate.map(|r| us(r.interval()))))
            .arg(rate.map_or(1, |r| r.burst.max(1)))
            .arg(us(LATE))
            .arg(self.holder)
            .arg(self.waiter)
            .arg(us(self.hold_for));
        if let Some(wake) = self.wake {
            call.arg(wake);
        }
    }

    fn decode(reply: Value) -> Result<Acquired, BackendError> {
        let (numbers, wake) = numbers_then_wakes(reply, 3)?;
        let wait = |cause| LimitDecision::Wait {
            retry_after: Duration::from_micros(numbers[1]),
            ahead: numbers[2],
            cause,
        };
        let decision = match numbers[0] {
            0 => LimitDecision::Granted,
            1 => wait(LimitCause::Concurrency),
            2 => wait(LimitCause::Rate),
            _ => return Err(corrupt("unexpected reply from limit_acquire.lua")),
        };
        Ok(Acquired { decision, wake })
    }
}

/// `limit_release.lua`: a holder's slot freed, and handed on.
pub(crate) struct LimitRelease<'a> {
    pub keys: LimitKeys,
    pub holder: &'a str,
    pub concurrency: Option<u32>,
}

impl Call for LimitRelease<'_> {
    type Reply = Released;

    fn script() -> &'static Script {
        &LIMIT_RELEASE
    }

    fn fill(&self, call: &mut Invocation) {
        self.keys.fill(call);
        call.arg(self.holder).arg(or_empty(self.concurrency));
    }

    fn decode(reply: Value) -> Result<Released, BackendError> {
        let (numbers, wake) = numbers_then_wakes(reply, 1)?;
        Ok(Released {
            released: numbers[0] == 1,
            wake,
        })
    }
}

/// `limit_leave.lua`: a waiter that stops waiting leaves the line, frees
/// its reservation (handed on) and drops its booking.
pub(crate) struct LimitLeave<'a> {
    pub keys: LimitKeys,
    pub waiter: &'a str,
    pub concurrency: Option<u32>,
}

impl Call for LimitLeave<'_> {
    type Reply = Released;

    fn script() -> &'static Script {
        &LIMIT_LEAVE
    }

    fn fill(&self, call: &mut Invocation) {
        self.keys.fill(call);
        call.arg(self.waiter).arg(or_empty(self.concurrency));
    }

    fn decode(reply: Value) -> Result<Released, BackendError> {
        LimitRelease::decode(reply)
    }
}

/// `limit_renew.lua`: a holder's slot extended.
pub(crate) struct LimitRenew<'a> {
    pub keys: LimitKeys,
    pub holder: &'a str,
    pub hold_for: Duration,
}

impl Call for LimitRenew<'_> {
    /// Whether the holder holds a slot.
    type Reply = bool;

    fn script() -> &'static Script {
        &LIMIT_RENEW
    }

    fn fill(&self, call: &mut Invocation) {
        self.keys.fill(call);
        call.arg(self.holder).arg(us(self.hold_for));
    }

    fn decode(reply: Value) -> Result<bool, BackendError> {
        typed::<i64>(reply).map(|n| n == 1)
    }
}

/// `limit_usage.lua`: a limit's use now.
pub(crate) struct LimitUse {
    pub keys: LimitKeys,
}

impl Call for LimitUse {
    type Reply = LimitUsage;

    fn script() -> &'static Script {
        &LIMIT_USAGE
    }

    fn fill(&self, call: &mut Invocation) {
        self.keys.fill(call);
    }

    fn decode(reply: Value) -> Result<LimitUsage, BackendError> {
        match typed::<Vec<u32>>(reply)?.as_slice() {
            &[in_use, waiting, booked] => Ok(LimitUsage {
                in_use,
                waiting,
                booked,
            }),
            _ => Err(corrupt("unexpected reply from limit_usage.lua")),
        }
    }
}

/// `wake.lua`: a parked saga message made due now.
pub(crate) struct Wake {
    pub delayed: String,
    pub queue: String,
    pub payload: String,
}

impl Call for Wake {
    /// Whether it moved.
    type Reply = bool;

    fn script() -> &'static Script {
        &WAKE
    }

    fn fill(&self, call: &mut Invocation) {
        call.key(&self.delayed).key(&self.queue).arg(&self.payload);
    }

    fn decode(reply: Value) -> Result<bool, BackendError> {
        typed::<i64>(reply).map(|n| n == 1)
    }
}
