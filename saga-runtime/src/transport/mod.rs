//! Brokers: how process managers hear other services, how step sagas are
//! started by commands on a queue, and how what handlers send reaches
//! other services.
//!
//! The seam, one trait per file:
//!
//! - [`Transport`] (`transport.rs`): one broker connection as the engine
//!   uses it: declare the topology ([`Topology`]) idempotently at start,
//!   open a receiver per route, open a publisher;
//! - [`Inbound`] (`inbound.rs`): the deliveries of one route, acknowledged
//!   once the engine's store holds them;
//! - [`Outbound`] (`outbound.rs`): publishes the broker confirms.
//!
//! What crosses the seam is plain data ([`Incoming`], [`Outgoing`]); what
//! a message says (an envelope v1 body, or CloudEvents binary-mode
//! headers) is read and written in `wire.rs`, once for every broker.
//!
//! How the engine uses it (`worker::bridge` and `worker::relay`):
//!
//! - **In**: a bridge per route, in one engine at a time (a named lease:
//!   one reader keeps a route's order), takes a batch of deliveries, turns
//!   each into what the store takes (the process-manager envelopes of a
//!   message, a saga's start keyed by the message id, or a dead letter
//!   with its reason) and writes them, then acknowledges the batch. From
//!   the store on, a message is handled like one published in-process:
//!   held until its instance starts, in order per instance, deduplicated
//!   by its id, capped in deliveries, dead-lettered with a reason. A
//!   delivery is acknowledged only once its store write committed; a
//!   bridge killed in between has it delivered again, and the copy is
//!   recognised by its id (the instance's handled ids, a hold's ids, the
//!   start's key).
//! - **Out**: a relay per relayed endpoint, in one engine at a time,
//!   reads the endpoint (the outbox the handlers' atomic saves write) in
//!   order, publishes each message and settles it only once the broker
//!   confirmed it; with the broker down, messages wait in the endpoint.
//!
//! With the features `rabbitmq` (`transport::rabbitmq`, on lapin) and
//! `nats` (`transport::nats`, on async-nats with JetStream).

mod inbound;
mod outbound;
mod topology;
#[allow(clippy::module_inception)]
mod transport;
pub(crate) mod wire;

#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub mod nats;
#[cfg(feature = "rabbitmq")]
#[cfg_attr(docsrs, doc(cfg(feature = "rabbitmq")))]
pub mod rabbitmq;

pub use inbound::{Inbound, Incoming};
pub use outbound::{Destination, Outbound, Outgoing};
pub use topology::{Route, RouteKind, Topology};
pub use transport::{Transport, TransportError};
