//! A private Redis Cluster on loopback: three primaries and three replicas
//! (`redis-cli --cluster create ... --cluster-replicas 1`), on free ports,
//! torn down on drop. Never the shared instance on 6379.
//!
//! Fault injection: SIGKILL a node (its replica takes over after the node
//! timeout, 1 s here), start it again, move slots between primaries
//! (`redis-cli --cluster reshard`).

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::redis_server::free_port;

/// How long a node may be unreachable before the cluster fails it over.
pub const NODE_TIMEOUT_MS: u64 = 1000;

pub struct TestCluster {
    dir: tempfile::TempDir,
    /// Every node by port; `None` once killed.
    nodes: BTreeMap<u16, Option<Child>>,
    /// One cluster at a time per test binary: six servers and their
    /// engines per test, several tests at once, would starve two cores
    /// (and their free ports could collide).
    _turn: std::sync::MutexGuard<'static, ()>,
}

static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A node as `CLUSTER NODES` lists it.
#[derive(Debug, Clone)]
pub struct Node {
    pub id: String,
    pub port: u16,
    pub primary: bool,
    pub failed: bool,
    /// The primary it replicates (replicas only).
    pub of: Option<String>,
    /// How many slots it serves (primaries only).
    pub slots: usize,
}

fn conn(port: u16) -> Option<redis::Connection> {
    redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .ok()?
        .get_connection_with_timeout(Duration::from_secs(1))
        .ok()
}

fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A port whose cluster bus port (`port + 10000`) is free too.
fn cluster_port() -> u16 {
    loop {
        let port = free_port();
        if port < 55000 && std::net::TcpListener::bind(("127.0.0.1", port + 10000)).is_ok() {
            return port;
        }
    }
}

/// `redis-cli` with `args`, killed if it has not finished within `limit`.
/// Its output is drained while it runs: a reshard prints more than a pipe
/// holds, and a full pipe would stop it until the limit.
fn redis_cli_within(args: &[String], limit: Duration) -> Result<String, String> {
    let mut child = Command::new("redis-cli")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("redis-cli must be on PATH (it comes with redis-server)");
    fn drain(mut pipe: impl std::io::Read + Send + 'static) -> std::thread::JoinHandle<String> {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            let _ = pipe.read_to_end(&mut text);
            String::from_utf8_lossy(&text).into_owned()
        })
    }
    let stdout = drain(child.stdout.take().expect("piped"));
    let stderr = drain(child.stderr.take().expect("piped"));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = format!(
        "{}{}",
        stdout.join().unwrap_or_default(),
        stderr.join().unwrap_or_default()
    );
    match status {
        Some(status) if status.success() => Ok(text),
        Some(_) => Err(text),
        None => Err(format!(
            "redis-cli {args:?} did not finish within {limit:?}:\n{text}"
        )),
    }
}

fn redis_cli(args: &[String]) -> String {
    redis_cli_within(args, Duration::from_secs(300))
        .unwrap_or_else(|why| panic!("redis-cli {args:?} failed:\n{why}"))
}

impl TestCluster {
    /// Starts six nodes and joins them into a cluster of three shards,
    /// each a primary with one replica; returns once every node sees every
    /// slot served and every replica in sync.
    pub fn start() -> Self {
        TestCluster::start_with(3, 1)
    }

    /// `primaries` shards with `replicas` replicas each. A node that could
    /// not start (its bus port, `port + 10000`, taken meanwhile) would
    /// leave `redis-cli --cluster create` waiting for ever: the joining is
    /// bounded, and tried again on new ports.
    pub fn start_with(primaries: usize, replicas: usize) -> Self {
        let turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
        let mut cluster = TestCluster {
            dir: tempfile::tempdir().expect("tempdir"),
            nodes: BTreeMap::new(),
            _turn: turn,
        };
        for attempt in 1..=3 {
            let ports: Vec<u16> = (0..primaries * (1 + replicas))
                .map(|_| cluster_port())
                .collect();
            if !ports.iter().all(|&port| cluster.try_spawn(port)) {
                eprintln!("cluster attempt {attempt}: a node did not start");
                for child in cluster.nodes.values_mut().flatten() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                cluster.nodes.clear();
                continue;
            }
            let mut args: Vec<String> = vec!["--cluster".into(), "create".into()];
            args.extend(ports.iter().map(|p| format!("127.0.0.1:{p}")));
            args.extend([
                "--cluster-replicas".into(),
                replicas.to_string(),
                "--cluster-yes".into(),
            ]);
            match redis_cli_within(&args, Duration::from_secs(30)) {
                Ok(_) => {
                    cluster.wait_healthy();
                    return cluster;
                }
                Err(why) => {
                    eprintln!("cluster create attempt {attempt} failed: {why}");
                    for child in cluster.nodes.values_mut().flatten() {
                        let _ = child.kill();
                        let _ = child.wait();
                    }
                    cluster.nodes.clear();
                }
            }
        }
        panic!("could not create a test cluster in 3 attempts");
    }

    fn spawn(&mut self, port: u16) {
        assert!(self.try_spawn(port), "redis-server on {port} did not start");
    }

    /// Starts a node on `port`; `false` if it did not come up (it exits at
    /// once when its cluster bus port is taken).
    fn try_spawn(&mut self, port: u16) -> bool {
        let data = self.dir.path().join(format!("node-{port}"));
        std::fs::create_dir_all(&data).unwrap();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                &NODE_TIMEOUT_MS.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                data.to_str().unwrap(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be on PATH (apt-get install redis-server)");
        self.nodes.insert(port, Some(child));
        let deadline = Instant::now() + Duration::from_secs(10);
        while conn(port).is_none() {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    }

    /// Waits until every live node reports the cluster healthy, with every
    /// slot served by a live primary, and every live replica in sync.
    pub fn wait_healthy(&self) {
        wait_for("the cluster to be healthy", Duration::from_secs(60), || {
            self.live().iter().all(|&port| {
                let info = cluster_info(port);
                info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
            }) && self.live().iter().all(|&port| {
                let replication = info(port, "replication");
                !replication.contains("role:slave") || replication.contains("master_link_status:up")
            }) && self
                .nodes()
                .iter()
                .filter(|n| n.primary && !n.failed)
                .map(|n| n.slots)
                .sum::<usize>()
                == 16384
        });
    }

    fn live(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|(_, c)| c.is_some())
            .map(|(p, _)| *p)
            .collect()
    }

    /// The nodes' addresses (`redis://127.0.0.1:<port>/`), for
    /// `RedisBackend::connect_cluster`.
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .keys()
            .map(|p| format!("redis://127.0.0.1:{p}/"))
            .collect()
    }

    /// A backend on this cluster with `config`.
    pub async fn backend(
        &self,
        config: saga_runtime::backend::redis::RedisConfig,
    ) -> saga_runtime::backend::redis::RedisBackend {
        let urls = self.urls();
        let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
        saga_runtime::backend::redis::RedisBackend::connect_cluster(&nodes, config)
            .await
            .expect("connect to the test cluster")
    }

    /// The cluster as one URL (`redis+cluster://...`).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .keys()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// The nodes as a live node lists them.
    pub fn nodes(&self) -> Vec<Node> {
        for port in self.live() {
            let Some(mut c) = conn(port) else { continue };
            let Ok(listed) = redis::cmd("CLUSTER").arg("NODES").query::<String>(&mut c) else {
                continue;
            };
            return listed.lines().filter_map(parse_node).collect();
        }
        panic!("no cluster node answers");
    }

    /// The ports of the live primaries that serve slots.
    pub fn primaries(&self) -> Vec<u16> {
        self.nodes()
            .into_iter()
            .filter(|n| n.primary && !n.failed && n.slots > 0)
            .map(|n| n.port)
            .collect()
    }

    /// The slot ranges served, with the port of the primary serving each.
    fn slot_ranges(&self) -> Vec<(u16, u16, u16)> {
        for port in self.live() {
            let Some(mut c) = conn(port) else { continue };
            let Ok(shards) = redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query::<Vec<redis::Value>>(&mut c)
            else {
                continue;
            };
            let num = |v: &redis::Value| match v {
                redis::Value::Int(n) => *n as u16,
                _ => 0,
            };
            return shards
                .iter()
                .filter_map(|shard| match shard {
                    redis::Value::Array(f) => match &f[2] {
                        redis::Value::Array(node) => Some((num(&f[0]), num(&f[1]), num(&node[1]))),
                        _ => None,
                    },
                    _ => None,
                })
                .collect();
        }
        panic!("no cluster node answers");
    }

    /// The port of the primary serving `slot`.
    pub fn primary_of_slot(&self, slot: u16) -> u16 {
        self.slot_ranges()
            .into_iter()
            .find(|(start, end, _)| (*start..=*end).contains(&slot))
            .map(|(_, _, port)| port)
            .unwrap_or_else(|| panic!("no primary serves slot {slot}"))
    }

    /// The first slot the primary on `port` serves.
    pub fn first_slot_of(&self, port: u16) -> u16 {
        self.slot_ranges()
            .into_iter()
            .filter(|(_, _, p)| *p == port)
            .map(|(start, _, _)| start)
            .min()
            .unwrap_or_else(|| panic!("the node on {port} serves no slot"))
    }

    /// Waits until every replica's replication offset reaches its
    /// primary's: what was written so far survives a failover.
    pub fn wait_replicated(&self) {
        let offset = |port: u16, field: &str| -> u64 {
            info(port, "replication")
                .lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        let nodes = self.nodes();
        for replica in nodes.iter().filter(|n| !n.primary && !n.failed) {
            let Some(primary) = nodes.iter().find(|n| Some(&n.id) == replica.of.as_ref()) else {
                continue;
            };
            let target = offset(primary.port, "master_repl_offset:");
            wait_for("a replica to catch up", Duration::from_secs(10), || {
                offset(replica.port, "slave_repl_offset:") >= target
            });
        }
    }

    /// SIGKILLs the node on `port`.
    pub fn kill(&mut self, port: u16) {
        if let Some(Some(mut child)) = self.nodes.insert(port, None) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits until the slots `old` served are served by another node, and
    /// the cluster is healthy again; returns that node's port.
    pub fn wait_failover(&self, old: u16, slot: u16) -> u16 {
        let mut new = old;
        wait_for("the failover", Duration::from_secs(60), || {
            self.live()
                .iter()
                .all(|&p| cluster_info(p).contains("cluster_state:ok"))
                && {
                    new = self.primary_of_slot(slot);
                    new != old
                }
        });
        new
    }

    /// Starts the killed node on `port` again, with its cluster state: it
    /// rejoins as a replica of whoever took its slots over.
    pub fn restart(&mut self, port: u16) {
        self.spawn(port);
    }

    /// Moves `slots` slots from the primary on `from` to the one on `to`
    /// (`redis-cli --cluster reshard`), keys and all.
    pub fn reshard(&self, from: u16, to: u16, slots: usize) {
        let nodes = self.nodes();
        let id = |port: u16| {
            nodes
                .iter()
                .find(|n| n.port == port)
                .map(|n| n.id.clone())
                .expect("a node on that port")
        };
        redis_cli(&[
            "--cluster".into(),
            "reshard".into(),
            format!("127.0.0.1:{from}"),
            "--cluster-from".into(),
            id(from),
            "--cluster-to".into(),
            id(to),
            "--cluster-slots".into(),
            slots.to_string(),
            "--cluster-yes".into(),
            // Keys move a few at a time: the resharding overlaps the work
            // for a while, as it does in production.
            "--cluster-pipeline".into(),
            "10".into(),
        ]);
        self.wait_agreed();
    }

    /// Waits until every live node tells the same slot map (a resharding
    /// spreads its new configuration over the cluster bus a moment later).
    pub fn wait_agreed(&self) {
        wait_for(
            "the nodes to agree on the slots",
            Duration::from_secs(30),
            || {
                let maps: Vec<Vec<String>> = self
                    .live()
                    .into_iter()
                    .map(|port| {
                        let listed: String = conn(port)
                            .and_then(|mut c| redis::cmd("CLUSTER").arg("NODES").query(&mut c).ok())
                            .unwrap_or_default();
                        let mut served: Vec<String> = listed
                            .lines()
                            .filter_map(|l| {
                                let f: Vec<&str> = l.split_whitespace().collect();
                                (f.len() > 8).then(|| format!("{} {}", f[0], f[8..].join(" ")))
                            })
                            .collect();
                        served.sort();
                        served
                    })
                    .collect();
                maps.windows(2).all(|w| w[0] == w[1])
            },
        );
    }

    /// Every key on every live primary, sorted.
    pub fn keys(&self) -> Vec<String> {
        let mut keys = Vec::new();
        for port in self.primaries() {
            let mut c = conn(port).expect("a live primary");
            let found: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
            keys.extend(found);
        }
        keys.sort();
        keys
    }

    /// The slots that hold keys, with the port of the primary serving
    /// each.
    pub fn used_slots(&self) -> BTreeMap<u16, u16> {
        let mut used = BTreeMap::new();
        for port in self.primaries() {
            let Some(mut c) = conn(port) else { continue };
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg("*")
                .query(&mut c)
                .unwrap_or_default();
            for key in keys {
                let slot: u16 = redis::cmd("CLUSTER")
                    .arg("KEYSLOT")
                    .arg(&key)
                    .query(&mut c)
                    .unwrap();
                used.insert(slot, port);
            }
        }
        used
    }

    /// Commands each live primary ran (`INFO commandstats`; commands
    /// scripts run included), by port.
    pub fn command_calls(&self) -> BTreeMap<u16, u64> {
        self.primaries()
            .into_iter()
            .map(|port| {
                let calls = info(port, "commandstats")
                    .lines()
                    .filter_map(|l| l.split("calls=").nth(1))
                    .filter_map(|rest| rest.split(',').next())
                    .filter_map(|n| n.parse::<u64>().ok())
                    .sum();
                (port, calls)
            })
            .collect()
    }

    /// Forgets the command counts of every primary.
    pub fn reset_stats(&self) {
        for port in self.primaries() {
            if let Some(mut c) = conn(port) {
                let _: Result<(), _> = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut c);
            }
        }
    }

    /// A synchronous cluster connection for assertions.
    pub fn conn(&self) -> redis::cluster::ClusterConnection {
        redis::cluster::ClusterClient::new(self.urls())
            .unwrap()
            .get_connection()
            .unwrap()
    }
}

/// `MONITOR` on every primary: counts the commands clients send (not those
/// scripts run inside Redis), by name.
pub struct Monitors {
    monitors: Vec<(std::process::Child, std::thread::JoinHandle<Vec<String>>)>,
}

impl TestCluster {
    /// Starts a `MONITOR` on every primary; returns once all are attached.
    pub fn monitor(&self) -> Monitors {
        let mut monitors = Vec::new();
        for port in self.primaries() {
            let mut child = Command::new("redis-cli")
                .args(["-p", &port.to_string(), "monitor"])
                .stdout(Stdio::piped())
                .spawn()
                .expect("redis-cli must be on PATH");
            let stdout = child.stdout.take().unwrap();
            let reader = std::thread::spawn(move || {
                use std::io::BufRead;
                let mut seen = Vec::new();
                let mut lines = std::io::BufReader::new(stdout)
                    .lines()
                    .map_while(Result::ok);
                for line in &mut lines {
                    if line.contains("\"monitor-go\"") {
                        break;
                    }
                }
                for line in lines {
                    if line.contains("\"monitor-stop\"") {
                        break;
                    }
                    if line.contains(" lua]") || !line.contains('"') {
                        continue;
                    }
                    seen.push(line.split('"').nth(1).unwrap_or("").to_uppercase());
                }
                seen
            });
            let mut c = conn(port).expect("a live primary");
            wait_for("MONITOR to attach", Duration::from_secs(10), || {
                let clients: String = redis::cmd("CLIENT").arg("LIST").query(&mut c).unwrap();
                clients.contains("cmd=monitor")
            });
            let _: String = redis::cmd("ECHO").arg("monitor-go").query(&mut c).unwrap();
            monitors.push((child, reader));
        }
        Monitors { monitors }
    }
}

impl Monitors {
    /// Every command clients sent to a primary since the start, by name.
    pub fn stop(self, cluster: &TestCluster) -> Vec<String> {
        for port in cluster.primaries() {
            if let Some(mut c) = conn(port) {
                let _: Result<String, _> = redis::cmd("ECHO").arg("monitor-stop").query(&mut c);
            }
        }
        let mut seen = Vec::new();
        for (mut child, reader) in self.monitors {
            seen.extend(reader.join().unwrap_or_default());
            let _ = child.kill();
            let _ = child.wait();
        }
        seen
    }
}

fn parse_node(line: &str) -> Option<Node> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let addr = fields.get(1)?.split('@').next()?;
    let port = addr.rsplit_once(':')?.1.parse().ok()?;
    let flags = fields.get(2)?;
    let primary = flags.contains("master");
    let slots = fields
        .iter()
        .skip(8)
        .filter(|s| !s.starts_with('['))
        .map(|s| match s.split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap_or(0) + 1 - a.parse::<usize>().unwrap_or(0),
            None => 1,
        })
        .sum();
    Some(Node {
        id: fields[0].to_owned(),
        port,
        primary,
        failed: flags.contains("fail") && !flags.contains("fail?") || flags.contains("noaddr"),
        of: fields
            .get(3)
            .filter(|of| **of != "-")
            .map(|of| (*of).to_owned()),
        slots,
    })
}

fn info(port: u16, section: &str) -> String {
    conn(port)
        .and_then(|mut c| redis::cmd("INFO").arg(section).query(&mut c).ok())
        .unwrap_or_default()
}

fn cluster_info(port: u16) -> String {
    conn(port)
        .and_then(|mut c| redis::cmd("CLUSTER").arg("INFO").query(&mut c).ok())
        .unwrap_or_default()
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        for child in self.nodes.values_mut().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
