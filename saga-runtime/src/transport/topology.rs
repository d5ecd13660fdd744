//! What an engine asks of a broker: a route per process manager (the
//! message types its handlers take) and per saga it starts from commands,
//! and the endpoints it relays.

/// What one route receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteKind {
    /// A process manager's messages: those of the types its handlers take
    /// (`Message::TYPE`).
    Process {
        /// The process manager.
        process: &'static str,
        /// The message types it handles.
        message_types: Vec<&'static str>,
    },
    /// Commands that start a task of a saga (its newest version), keyed by
    /// the message id.
    Start {
        /// The saga.
        saga: &'static str,
    },
}

/// One route: a queue (RabbitMQ) or durable consumer (NATS) the engine
/// reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// What it receives.
    pub kind: RouteKind,
}

impl Route {
    /// A name for it in logs, metrics and lease names:
    /// `process.<name>` or `start.<saga>`.
    pub fn name(&self) -> String {
        match &self.kind {
            RouteKind::Process { process, .. } => format!("process.{process}"),
            RouteKind::Start { saga } => format!("start.{saga}"),
        }
    }
}

/// Everything an engine asks of one transport.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    /// What it receives.
    pub routes: Vec<Route>,
    /// What it relays: endpoints (`Destination::Endpoint`) and, if asked,
    /// the published messages.
    pub relays: Vec<super::Destination>,
}
