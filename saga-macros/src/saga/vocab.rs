//! The words of the attributes' settings, shared by what parses them and
//! the IR that carries them.

/// `backoff = ..` of a retry policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backoff {
    Exponential,
    Linear,
    Constant,
}

/// `on_exhausted = ..` of a retry policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnExhausted {
    Compensate,
    Fail,
    DeadLetter,
}

/// `scope = ..` of a circuit breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerScope {
    Process,
    Shared,
}

/// `when_open = ..` of a circuit breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenOpen {
    Fail,
    Wait,
}
