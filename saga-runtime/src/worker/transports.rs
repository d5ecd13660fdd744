//! The brokers an engine talks to, and the duties they take: a bridge per
//! route, a relay per relayed endpoint (see [`crate::transport`]).

use std::sync::Arc;

use tokio::sync::OnceCell;

use super::bridge::{Bridge, Starter};
use super::relay::Relay;
use super::runtime::Runtime;
use crate::transport::{Route, RouteKind, Topology, Transport, TransportError};

/// One broker, with everything this engine asks of it.
pub(crate) struct Carried {
    pub transport: Arc<dyn Transport>,
    pub topology: Topology,
    /// Set once the topology was declared (at build, or by the first duty
    /// that needed it, should the broker have been away then).
    declared: OnceCell<()>,
}

impl Carried {
    /// `transport` with what the user asked of it and a route for each
    /// process manager in `processes` (name, the message types it
    /// handles).
    pub(crate) fn new(
        transport: Arc<dyn Transport>,
        processes: Vec<(&'static str, Vec<&'static str>)>,
    ) -> Self {
        let mut topology = transport.asked();
        for (process, message_types) in processes {
            topology.routes.push(Route {
                kind: RouteKind::Process {
                    process,
                    message_types,
                },
            });
        }
        Carried {
            transport,
            topology,
            declared: OnceCell::new(),
        }
    }

    /// Declares the topology, once per engine.
    pub(crate) async fn declared(&self) -> Result<(), TransportError> {
        self.declared
            .get_or_try_init(|| self.transport.declare(&self.topology))
            .await
            .map(|_| ())
    }
}

/// Every duty the engine's transports take, to spawn beside its workers.
pub(crate) fn duties(
    rt: &Arc<Runtime>,
    start: &Starter,
) -> Vec<futures::future::BoxFuture<'static, ()>> {
    let mut duties: Vec<futures::future::BoxFuture<'static, ()>> = Vec::new();
    for carried in &rt.transports {
        for route in &carried.topology.routes {
            let bridge = Bridge {
                rt: rt.clone(),
                carried: carried.clone(),
                route: route.clone(),
                start: start.clone(),
            };
            duties.push(Box::pin(bridge.run()));
        }
        for to in &carried.topology.relays {
            let relay = Relay {
                rt: rt.clone(),
                carried: carried.clone(),
                to: to.clone(),
            };
            duties.push(Box::pin(relay.run()));
        }
    }
    duties
}
