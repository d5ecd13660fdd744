//! The places of task event streams (`GET /api/tasks/{id}/events`). Each
//! open stream reads its task from the store on every change and every
//! poll for as long as its client stays, so their number is capped; and
//! since reading is open to whoever reaches the router, one reader must
//! not be able to take every place: anonymous readers share all but a
//! quarter of the places (kept for those who hold the API's access), and
//! each peer address holds at most a few of them.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;

use super::reply::ApiError;
use crate::util::Unpoisoned;

/// Event streams one peer address may hold open at once, by default
/// ([`Api::max_watchers_per_client`](super::Api::max_watchers_per_client)).
pub const DEFAULT_MAX_WATCHERS_PER_CLIENT: usize = 4;

/// The open streams, counted.
pub(crate) struct Watchers {
    /// Places in all.
    total: usize,
    /// Of which anonymous readers may take at most this many.
    anonymous_max: usize,
    /// Places one peer address may hold (anonymous readers).
    per_client: usize,
    open: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    all: usize,
    anonymous: usize,
    by_client: HashMap<IpAddr, usize>,
}

/// Who opens a stream.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Watcher {
    /// Holds the API's access (a token, or what `Api::authorize` accepts).
    pub(crate) operator: bool,
    /// The peer's address, when the server was started with
    /// `into_make_service_with_connect_info::<SocketAddr>()`.
    pub(crate) client: Option<IpAddr>,
}

/// A place taken; given back when dropped (the stream ended or its client
/// left).
pub(crate) struct Place {
    watchers: Arc<Watchers>,
    watcher: Watcher,
}

impl Watchers {
    /// `total` places; with `reserve`, a quarter of them (at least one, if
    /// there are two) kept for operators.
    pub(crate) fn new(total: usize, per_client: usize, reserve: bool) -> Self {
        let reserved = if reserve && total >= 2 {
            (total / 4).max(1)
        } else {
            0
        };
        Watchers {
            total,
            anonymous_max: total - reserved,
            per_client: per_client.max(1),
            open: Mutex::new(Open::default()),
        }
    }

    /// A place for `watcher`, or the answer that refuses it: 429 for a
    /// peer that holds its share, 503 when the places it may take are all
    /// taken.
    pub(crate) fn open(self: &Arc<Self>, watcher: Watcher) -> Result<Place, ApiError> {
        let mut open = self.open.locked();
        let full = || {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "too_many_watchers",
                "Too many task event streams are open; try again once one has closed",
            )
        };
        if open.all >= self.total {
            return Err(full());
        }
        if !watcher.operator {
            if open.anonymous >= self.anonymous_max {
                return Err(full());
            }
            if let Some(client) = watcher.client {
                let held = open.by_client.entry(client).or_default();
                if *held >= self.per_client {
                    return Err(ApiError::new(
                        StatusCode::TOO_MANY_REQUESTS,
                        "too_many_watchers",
                        format!(
                            "This client already has {} task event streams open; close one first",
                            self.per_client
                        ),
                    ));
                }
                *held += 1;
            }
            open.anonymous += 1;
        }
        open.all += 1;
        Ok(Place {
            watchers: self.clone(),
            watcher,
        })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut open = self.watchers.open.locked();
        open.all -= 1;
        if !self.watcher.operator {
            open.anonymous -= 1;
            if let Some(client) = self.watcher.client {
                if let Some(held) = open.by_client.get_mut(&client) {
                    *held -= 1;
                    if *held == 0 {
                        open.by_client.remove(&client);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(n: u8) -> Watcher {
        Watcher {
            operator: false,
            client: Some(IpAddr::from([10, 0, 0, n])),
        }
    }

    const OPERATOR: Watcher = Watcher {
        operator: true,
        client: None,
    };

    #[test]
    fn readers_hold_a_share_each_and_operators_keep_a_quarter() {
        let watchers = Arc::new(Watchers::new(8, 4, true));
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(watchers.open(reader(1)).unwrap());
        }
        assert!(watchers.open(reader(1)).is_err(), "a fifth for one peer");
        held.push(watchers.open(reader(2)).unwrap());
        held.push(watchers.open(reader(2)).unwrap());
        // Six of eight taken by readers: the rest are the operators'.
        assert!(watchers.open(reader(3)).is_err());
        held.push(watchers.open(OPERATOR).unwrap());
        held.push(watchers.open(OPERATOR).unwrap());
        assert!(watchers.open(OPERATOR).is_err(), "all eight taken");
        held.remove(0);
        assert!(watchers.open(reader(1)).is_ok(), "a place given back");
    }
}
