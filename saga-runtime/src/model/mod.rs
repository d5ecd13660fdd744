//! The records everything else passes around, with no I/O and no
//! behaviour beyond their own encoding: the floor every other module
//! stands on, which imports nothing from above it.
//!
//! - [`task`]: a saga task as stored (steps, statuses, audit log);
//! - [`wire`]: what one work-queue entry carries;
//! - [`envelope`]: one message for one process manager;
//! - [`message`]: the traits of what process managers handle and send;
//! - [`endpoint`]: what a process manager sends to an endpoint;
//! - [`process`]: a process-manager instance as stored;
//! - [`tally`]: tallies, what a check did, and their messages;
//! - `decode`: JSON decoded into a type, with an error that says where and
//!   what kind, never the value.

pub(crate) mod decode;
pub mod endpoint;
pub mod envelope;
pub mod message;
pub mod process;
pub mod tally;
pub mod task;
pub mod wire;
