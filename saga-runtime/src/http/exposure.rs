//! A warning, once, when an API with no access configured is reached
//! from beyond loopback. Such an API is read-only and its reads are open
//! (nothing to check a request against): fine on a developer's machine,
//! but served on a network it hands every task's input, outputs and errors
//! to whoever reaches the port. The router cannot see the address it is
//! bound to, so the first request says it: its peer's address (known when
//! the server runs with `into_make_service_with_connect_info`) or the
//! `Host` it was sent to names something other than loopback. A warning,
//! not a refusal: both can be what a local proxy or a test sends.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::ConnectInfo;
use axum::http::request::Parts;

/// Whether the warning is still to be given.
pub(crate) struct Exposure {
    /// No access configured and reads not opened on purpose.
    applies: bool,
    warned: AtomicBool,
}

impl Exposure {
    pub(crate) fn new(applies: bool) -> Self {
        Exposure {
            applies,
            warned: AtomicBool::new(false),
        }
    }

    /// Warns if `request` is the first to come from beyond loopback.
    pub(crate) fn note(&self, request: &Parts) {
        if !self.applies || self.warned.load(Ordering::Relaxed) {
            return;
        }
        let peer = request
            .extensions
            .get::<ConnectInfo<std::net::SocketAddr>>()
            .map(|info| info.0.ip());
        let host = request
            .headers
            .get(axum::http::header::HOST)
            .and_then(|v| v.to_str().ok());
        if beyond_loopback(peer, host) && !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                peer = ?peer,
                host = host.unwrap_or_default(),
                "saga HTTP API reached from beyond loopback with no credential: anyone who \
                 reaches it reads every task's input, outputs and errors; configure `Api::token` \
                 or `Api::authorize` (reads then need it too), or `Api::public_reads(true)` if \
                 open reads are meant"
            );
        }
    }
}

/// Whether a request from `peer` to `host` comes from (or was sent to a
/// name) beyond this machine's loopback.
fn beyond_loopback(peer: Option<IpAddr>, host: Option<&str>) -> bool {
    peer.is_some_and(|ip| !ip.is_loopback()) || host.is_some_and(|h| !loopback_host(h))
}

/// `localhost`, `*.localhost`, `127.x.y.z` or `[::1]`, with or without a
/// port.
fn loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(v6),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_told_by_peer_and_host() {
        let local = Some(IpAddr::from([127, 0, 0, 1]));
        for host in [
            "localhost",
            "localhost:8080",
            "LOCALHOST.",
            "console.localhost:1",
            "127.0.0.1:8080",
            "127.9.9.9",
            "[::1]:8080",
            "[::1]",
        ] {
            assert!(!beyond_loopback(local, Some(host)), "{host}");
        }
        assert!(!beyond_loopback(None, None));
        for host in [
            "ops.example.com",
            "10.1.2.3:8080",
            "[fe80::1]:80",
            "0.0.0.0",
        ] {
            assert!(beyond_loopback(local, Some(host)), "{host}");
        }
        let remote = Some(IpAddr::from([192, 0, 2, 7]));
        assert!(beyond_loopback(remote, Some("localhost")));
        assert!(beyond_loopback(remote, None));
    }
}
