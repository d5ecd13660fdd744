//! Where commands go: one server (at a fixed address, or the primary that
//! Redis Sentinel names) or a Redis Cluster.
//!
//! The rest of the backend sees one connection type, [`Conn`], whatever the
//! deployment, and asks this module for the three kinds of connection it
//! needs: the shared one for ordinary commands, a connection of its own for
//! each blocking read (a blocked command holds its connection up), and a
//! subscription.
//!
//! On a cluster the `redis` crate routes each command by its key, follows
//! `MOVED`/`ASK` redirects (resharding) and refreshes its slot map after a
//! failover; what it cannot do is run a command or script whose keys sit
//! in several slots. The key layout (`keys.rs`) and the readers
//! (`queue.rs`, `watch.rs`) make sure none does.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection, PubSub};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Client, Cmd, ConnectionInfo, IntoConnectionInfo};
use redis::{Pipeline, RedisError, RedisFuture, RedisResult, Value};

use super::primary::{self, Primary};
use crate::util::Unpoisoned;

/// A single server or a cluster. Cheap to clone.
#[derive(Clone)]
pub(super) enum Server {
    Single(Arc<Primary>),
    Cluster(Arc<Cluster>),
}

/// A Redis Cluster: the shared routed connection, a client for blocking
/// connections (a response timeout longer than a blocking read), and the
/// nodes the user named, for subscriptions.
pub(super) struct Cluster {
    conn: ClusterConnection,
    blocking: ClusterClient,
    seeds: Vec<ConnectionInfo>,
    /// Which node the next subscription tries first: after a node dies,
    /// the next attempt goes elsewhere.
    next_node: AtomicUsize,
    /// The primaries serving each slot range, as `CLUSTER SLOTS` last
    /// told: where a watcher's plain connection goes (a cluster client
    /// per watcher would open a connection to every node).
    slots: Mutex<Vec<(u16, u16, ConnectionInfo)>>,
}

impl Cluster {
    /// Connects to the cluster that `nodes` (some of its nodes) belong to.
    pub(super) async fn connect(
        nodes: &[&str],
        response_timeout: Duration,
        blocking_timeout: Duration,
    ) -> RedisResult<Arc<Self>> {
        let seeds = nodes
            .iter()
            .map(|n| n.into_connection_info())
            .collect::<RedisResult<Vec<_>>>()?;
        let builder = |timeout: Duration| {
            ClusterClient::builder(seeds.clone())
                .connection_timeout(Duration::from_secs(5))
                .response_timeout(timeout)
                // A request rides out a failover or a slot migration
                // (`CLUSTERDOWN`, `TRYAGAIN`, a refused connection) for up
                // to this long in all; the engine retries after that.
                .overall_response_timeout(Some(timeout * 2))
                .retries(6)
                .build()
        };
        let client = builder(response_timeout)?;
        let blocking = builder(blocking_timeout)?;
        let conn = client.get_async_connection().await?;
        Ok(Arc::new(Cluster {
            conn,
            blocking,
            seeds,
            next_node: AtomicUsize::new(0),
            slots: Mutex::new(Vec::new()),
        }))
    }

    /// The primary serving `slot`, from the slot map (asked again first if
    /// `refresh`, or if it has none yet).
    async fn primary_of(&self, slot: u16, refresh: bool) -> RedisResult<ConnectionInfo> {
        let known = |slots: &[(u16, u16, ConnectionInfo)]| {
            slots
                .iter()
                .find(|(start, end, _)| (*start..=*end).contains(&slot))
                .map(|(_, _, node)| node.clone())
        };
        if !refresh {
            let slots = self.slots.locked();
            if let Some(node) = known(&slots) {
                return Ok(node);
            }
        }
        let reply: Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut self.conn.clone())
            .await?;
        let template = self.seeds[0].clone();
        let mut map = Vec::new();
        for range in super::entry::items(&reply) {
            let fields = super::entry::items(range);
            let (Some(start), Some(end), Some(node)) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                continue;
            };
            let node = super::entry::items(node);
            let (Some(host), Some(port)) = (node.first(), node.get(1)) else {
                continue;
            };
            let host = super::entry::text(host);
            let host = match host.as_str() {
                // The node did not say: the one asked is it.
                "" | "?" => match template.addr() {
                    redis::ConnectionAddr::Tcp(h, _)
                    | redis::ConnectionAddr::TcpTls { host: h, .. } => h.clone(),
                    _ => continue,
                },
                _ => host,
            };
            let (Ok(start), Ok(end), Ok(port)) = (
                super::entry::text(start).parse(),
                super::entry::text(end).parse(),
                super::entry::text(port).parse(),
            ) else {
                continue;
            };
            let addr = redis::ConnectionAddr::Tcp(host, port);
            map.push((start, end, template.clone().set_addr(addr)));
        }
        let node = known(&map);
        *self.slots.locked() = map;
        node.ok_or_else(|| {
            RedisError::from((redis::ErrorKind::Client, "no primary serves the slot"))
        })
    }

    /// The nodes to subscribe on, in the order to try them: those the user
    /// named, then those the cluster knows now (a named one may be gone).
    async fn nodes(&self) -> Vec<ConnectionInfo> {
        let mut nodes = self.seeds.clone();
        let listed: RedisResult<String> = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut self.conn.clone())
            .await;
        if let (Ok(listed), Some(template)) = (listed, self.seeds.first()) {
            for line in listed.lines() {
                let mut fields = line.split_whitespace();
                let (Some(_id), Some(addr), Some(flags)) =
                    (fields.next(), fields.next(), fields.next())
                else {
                    continue;
                };
                if flags.contains("fail") || flags.contains("handshake") {
                    continue;
                }
                let addr = addr.split('@').next().unwrap_or(addr);
                let Some((host, port)) = addr.rsplit_once(':') else {
                    continue;
                };
                let Ok(port) = port.parse() else { continue };
                nodes.push(
                    template
                        .clone()
                        .set_addr(redis::ConnectionAddr::Tcp(host.to_owned(), port)),
                );
            }
        }
        nodes
    }
}

impl Server {
    pub(super) fn single(primary: Arc<Primary>) -> Self {
        Server::Single(primary)
    }

    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, Server::Cluster(_))
    }

    /// The shared connection for ordinary commands and scripts.
    pub(super) fn conn(&self) -> Conn {
        match self {
            Server::Single(primary) => Conn::Single(primary.conn()),
            Server::Cluster(cluster) => Conn::Cluster(cluster.conn.clone()),
        }
    }

    /// A connection of its own for blocking reads of up to `block`.
    pub(super) async fn blocking(&self, block: Duration) -> RedisResult<Conn> {
        match self {
            Server::Single(primary) => {
                let config = AsyncConnectionConfig::new()
                    .set_response_timeout(Some(block + Duration::from_secs(5)))
                    .set_connection_timeout(Some(Duration::from_secs(5)));
                let conn = primary
                    .client()
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                Ok(Conn::Plain(conn))
            }
            Server::Cluster(cluster) => Ok(Conn::Cluster(
                cluster.blocking.get_async_connection().await?,
            )),
        }
    }

    /// A connection of its own for blocking reads of up to `block` on
    /// `key` alone: on a cluster, a plain connection to the primary that
    /// serves the key's slot (found again if `refresh`: after an error,
    /// the slot may have moved).
    pub(super) async fn blocking_for(
        &self,
        key: &str,
        block: Duration,
        refresh: bool,
    ) -> RedisResult<Conn> {
        match self {
            Server::Single(_) => self.blocking(block).await,
            Server::Cluster(cluster) => {
                let node = cluster.primary_of(super::keys::slot(key), refresh).await?;
                let config = AsyncConnectionConfig::new()
                    .set_response_timeout(Some(block + Duration::from_secs(5)))
                    .set_connection_timeout(Some(Duration::from_secs(5)));
                let conn = Client::open(node)?
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                Ok(Conn::Plain(conn))
            }
        }
    }

    /// A subscription connection. On a cluster, a plain connection to any
    /// node will do: a `PUBLISH` reaches every node of the cluster.
    pub(super) async fn pubsub(&self) -> RedisResult<PubSub> {
        match self {
            Server::Single(primary) => primary.client().get_async_pubsub().await,
            Server::Cluster(cluster) => {
                let nodes = cluster.nodes().await;
                let first = cluster.next_node.fetch_add(1, Ordering::Relaxed);
                let mut last = None;
                for i in 0..nodes.len() {
                    let node = &nodes[(first + i) % nodes.len()];
                    match Client::open(node.clone()) {
                        Ok(client) => match client.get_async_pubsub().await {
                            Ok(pubsub) => return Ok(pubsub),
                            Err(e) => last = Some(e),
                        },
                        Err(e) => last = Some(e),
                    }
                }
                Err(last.unwrap_or_else(|| {
                    RedisError::from((redis::ErrorKind::Client, "no cluster node to subscribe on"))
                }))
            }
        }
    }

    /// A connection of its own for commands answered within
    /// `response_timeout`: the durable writes' (`durability.rs`), whose
    /// `WAIT` blocks the connection it is sent on. On a cluster, a routed
    /// connection of its own (a pipeline goes to its keys' primary).
    pub(super) async fn dedicated(&self, response_timeout: Duration) -> RedisResult<Conn> {
        match self {
            Server::Single(primary) => {
                let config = AsyncConnectionConfig::new()
                    .set_response_timeout(Some(response_timeout))
                    .set_connection_timeout(Some(Duration::from_secs(5)));
                let conn = primary
                    .client()
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                Ok(Conn::Plain(conn))
            }
            Server::Cluster(cluster) => {
                let client = ClusterClient::builder(cluster.seeds.clone())
                    .connection_timeout(Duration::from_secs(5))
                    .response_timeout(response_timeout)
                    .overall_response_timeout(Some(response_timeout * 2))
                    .retries(6)
                    .build()?;
                Ok(Conn::Cluster(client.get_async_connection().await?))
            }
        }
    }

    /// Runs `cmd` on every primary (one on a single server or Sentinel,
    /// each shard's on a cluster): the settings checked at connect. The
    /// answers, by node address.
    pub(super) async fn on_primaries(&self, cmd: Cmd) -> RedisResult<Vec<(String, Value)>> {
        match self {
            Server::Single(primary) => {
                let address = primary.client().get_connection_info().addr().to_string();
                let reply: Value = cmd.query_async(&mut self.conn()).await?;
                Ok(vec![(address, reply)])
            }
            Server::Cluster(cluster) => {
                use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
                let reply = cluster
                    .conn
                    .clone()
                    .route_command(
                        cmd,
                        RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
                    )
                    .await?;
                Ok(match reply {
                    Value::Map(answers) => answers
                        .into_iter()
                        .map(|(node, answer)| (super::entry::text(&node), answer))
                        .collect(),
                    other => vec![("cluster".to_owned(), other)],
                })
            }
        }
    }

    /// Tells the deployment that a command failed with `error` (Sentinel:
    /// the primary may have moved).
    pub(super) fn failed(&self, error: &RedisError) {
        if let Server::Single(primary) = self {
            primary.failed(error);
        }
    }
}

/// A connection of any kind: the backend's commands run on it alike.
#[derive(Clone)]
pub(super) enum Conn {
    Single(primary::Conn),
    Plain(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Plain(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Plain(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Plain(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}
