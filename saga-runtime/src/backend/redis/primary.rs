//! Where the primary is: a fixed address, or the one Redis Sentinel names.
//!
//! Every command goes to the primary. With Sentinel, a failover moves the
//! primary to another address; the old one is gone or comes back as a
//! replica that refuses writes (`READONLY`). A connection manager keeps
//! reconnecting to the address it was built with, so the backend asks the
//! sentinels again whenever a command fails the way a moved primary makes
//! it fail, and swaps in a connection to the new primary. Every connection
//! the backend opens later (blocking reads, subscriptions) takes the
//! current address.

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use crate::util::{Unpoisoned, UnpoisonedRw};
use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::sentinel::SentinelClient;
use redis::{Client, Cmd, Pipeline, RedisError, RedisFuture, Value};
use tokio::time::Instant;

/// How often the sentinels are asked at most: a failover makes every
/// command in flight fail at once.
const ASK_EVERY: Duration = Duration::from_millis(250);

/// How often the sentinels are asked anyway. A failover that no command
/// noticed (an idle engine, or one waiting out a backoff) must still be
/// followed before the old primary comes back: restarted, it is a primary
/// again until the sentinels demote it, and a connection that went back
/// to it would read and write a stale copy.
const LOOK_EVERY: Duration = Duration::from_millis(500);

/// The primary's current client and connection, and how to find it again.
pub(super) struct Primary {
    current: RwLock<Endpoint>,
    sentinel: Option<Sentinel>,
    manager_config: ConnectionManagerConfig,
}

struct Endpoint {
    client: Client,
    conn: ConnectionManager,
}

struct Sentinel {
    client: tokio::sync::Mutex<SentinelClient>,
    /// When the sentinels were last asked.
    asked: Mutex<Option<Instant>>,
    /// The service's name, and a client and kept connection per sentinel,
    /// for the periodic look: one `SENTINEL get-master-addr-by-name` on a
    /// connection kept open (the full lookup opens a connection to the
    /// primary each time to check its role).
    service: String,
    look: tokio::sync::Mutex<Vec<(Client, Option<MultiplexedConnection>)>>,
}

impl Primary {
    /// The primary at `client`'s address, for good.
    pub(super) async fn fixed(
        client: Client,
        manager_config: ConnectionManagerConfig,
    ) -> Result<Arc<Self>, RedisError> {
        Primary::new(client, None, manager_config).await
    }

    /// The primary the sentinels name, asked again after a failover.
    pub(super) async fn sentinel(
        mut sentinel: SentinelClient,
        sentinels: Vec<Client>,
        service: String,
        manager_config: ConnectionManagerConfig,
    ) -> Result<Arc<Self>, RedisError> {
        let client = sentinel.async_get_client().await?;
        let sentinel = Sentinel {
            client: tokio::sync::Mutex::new(sentinel),
            asked: Mutex::new(Some(Instant::now())),
            service,
            look: tokio::sync::Mutex::new(sentinels.into_iter().map(|c| (c, None)).collect()),
        };
        let primary = Primary::new(client, Some(sentinel), manager_config).await?;
        let weak = Arc::downgrade(&primary);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(LOOK_EVERY).await;
                let Some(primary) = weak.upgrade() else {
                    return;
                };
                if primary.named_elsewhere().await {
                    if let Err(error) = primary.relocate().await {
                        tracing::debug!(%error, "asking the sentinels for the primary failed");
                    }
                }
            }
        });
        Ok(primary)
    }

    async fn new(
        client: Client,
        sentinel: Option<Sentinel>,
        manager_config: ConnectionManagerConfig,
    ) -> Result<Arc<Self>, RedisError> {
        let conn = client
            .get_connection_manager_with_config(manager_config.clone())
            .await?;
        Ok(Arc::new(Primary {
            current: RwLock::new(Endpoint { client, conn }),
            sentinel,
            manager_config,
        }))
    }

    fn read<T>(&self, f: impl FnOnce(&Endpoint) -> T) -> T {
        f(&self.current.read_locked())
    }

    /// A client for the current primary, for connections of their own
    /// (blocking reads, subscriptions).
    pub(super) fn client(&self) -> Client {
        self.read(|e| e.client.clone())
    }

    /// The shared connection to the current primary.
    pub(super) fn conn(self: &Arc<Self>) -> Conn {
        Conn {
            inner: self.read(|e| e.conn.clone()),
            primary: self.clone(),
        }
    }

    /// Looks for the primary again if `error` says it may have moved (and
    /// the sentinels were not asked a moment ago); in the background: the
    /// caller retries as it does after any transient error.
    pub(super) fn failed(self: &Arc<Self>, error: &RedisError) {
        let Some(sentinel) = &self.sentinel else {
            return;
        };
        let moved = error.is_io_error()
            || error.is_connection_dropped()
            || error.is_connection_refusal()
            || error.is_timeout()
            || matches!(
                error.code(),
                Some("READONLY" | "MASTERDOWN" | "LOADING" | "NOREPLICAS")
            );
        if !moved {
            return;
        }
        {
            let mut asked = sentinel.asked.locked();
            if asked.is_some_and(|at| at.elapsed() < ASK_EVERY) {
                return;
            }
            *asked = Some(Instant::now());
        }
        let primary = self.clone();
        tokio::spawn(async move {
            if let Err(error) = primary.relocate().await {
                tracing::warn!(%error, "asking the sentinels for the primary failed; asking again on the next failure");
            }
        });
    }

    /// Whether the first sentinel that answers names another primary than
    /// the current one (or none answers): only then is the full lookup
    /// worth its connections.
    async fn named_elsewhere(&self) -> bool {
        let Some(sentinel) = &self.sentinel else {
            return false;
        };
        let current = self.read(|e| e.client.get_connection_info().addr().to_string());
        let mut look = sentinel.look.lock().await;
        for (client, conn) in look.iter_mut() {
            if conn.is_none() {
                *conn = client.get_multiplexed_async_connection().await.ok();
            }
            let Some(c) = conn.as_mut() else { continue };
            let named: Result<Option<(String, u16)>, RedisError> = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&sentinel.service)
                .query_async(c)
                .await;
            match named {
                Ok(Some((host, port))) => return format!("{host}:{port}") != current,
                Ok(None) => return true,
                Err(_) => *conn = None,
            }
        }
        true
    }

    async fn relocate(&self) -> Result<(), RedisError> {
        let Some(sentinel) = &self.sentinel else {
            return Ok(());
        };
        let client = sentinel.client.lock().await.async_get_client().await?;
        let address = client.get_connection_info().addr().to_string();
        if self.read(|e| e.client.get_connection_info().addr().to_string()) == address {
            return Ok(());
        }
        let conn = client
            .get_connection_manager_with_config(self.manager_config.clone())
            .await?;
        tracing::warn!(primary = %address, "the primary moved (failover); following it");
        *self.current.write_locked() = Endpoint { client, conn };
        Ok(())
    }
}

/// The shared connection: a connection manager that reports its failures
/// to [`Primary::failed`].
#[derive(Clone)]
pub(super) struct Conn {
    inner: ConnectionManager,
    primary: Arc<Primary>,
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let reply = self.inner.req_packed_command(cmd).await;
            if let Err(error) = &reply {
                self.primary.failed(error);
            }
            reply
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let reply = self.inner.req_packed_commands(cmd, offset, count).await;
            if let Err(error) = &reply {
                self.primary.failed(error);
            }
            reply
        })
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}
