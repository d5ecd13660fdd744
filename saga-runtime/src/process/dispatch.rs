//! Stub (being written).
/// Clock.
pub trait Clock: Send + Sync { /// now
 fn now_ms(&self) -> u64; }
/// Dispatched.
#[derive(Debug)]
pub struct Dispatched;
pub(crate) fn dispatch() {}
