//! A private Redis Sentinel deployment on loopback: one primary, two
//! replicas and three sentinels (quorum 2), on free ports, torn down on
//! drop. Never the shared instance on 6379.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::redis_server::free_port;

/// The name the sentinels monitor the primary under.
pub const SERVICE: &str = "sagas";

pub struct TestSentinel {
    dir: tempfile::TempDir,
    /// The data servers by port; `None` once killed.
    servers: Vec<(u16, Option<Child>)>,
    sentinels: Vec<(u16, Child)>,
}

fn spawn(args: &[&str]) -> Child {
    Command::new("redis-server")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server must be on PATH (apt-get install redis-server)")
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

impl TestSentinel {
    /// Starts the servers and sentinels and waits until every sentinel
    /// knows the replica and the other sentinels (else a failover could
    /// not be agreed on).
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut deployment = TestSentinel {
            dir,
            servers: Vec::new(),
            sentinels: Vec::new(),
        };
        let primary = free_port();
        deployment.start_server(primary, None);
        for _ in 0..2 {
            let replica = free_port();
            deployment.start_server(replica, Some(primary));
            wait_for("the replica to sync", Duration::from_secs(20), || {
                info(replica, "replication").contains("master_link_status:up")
            });
        }
        for _ in 0..3 {
            let port = free_port();
            let conf = deployment.dir.path().join(format!("sentinel-{port}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                     sentinel monitor {SERVICE} 127.0.0.1 {primary} 2\n\
                     sentinel down-after-milliseconds {SERVICE} 500\n\
                     sentinel failover-timeout {SERVICE} 3000\n\
                     sentinel parallel-syncs {SERVICE} 1\n",
                    dir = deployment.dir.path().display()
                ),
            )
            .unwrap();
            let child = spawn(&[conf.to_str().unwrap(), "--sentinel"]);
            deployment.sentinels.push((port, child));
        }
        for &(port, _) in &deployment.sentinels {
            wait_for(
                "the sentinels to find the replica and each other",
                Duration::from_secs(30),
                || {
                    let Some(mut c) = conn(port) else {
                        return false;
                    };
                    let mut known = |what: &str| {
                        redis::cmd("SENTINEL")
                            .arg(what)
                            .arg(SERVICE)
                            .query::<Vec<redis::Value>>(&mut c)
                            .map(|v| v.len())
                            .unwrap_or(0)
                    };
                    known("replicas") >= 2 && known("sentinels") >= 2
                },
            );
        }
        deployment
    }

    fn start_server(&mut self, port: u16, replica_of: Option<u16>) {
        let port_text = port.to_string();
        let dir = self.dir.path().join(format!("data-{port}"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut args = vec![
            "--port",
            &port_text,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            dir.to_str().unwrap(),
            // A primary that lost its replicas refuses writes: an old
            // primary restarted after a failover cannot take writes meant
            // for the new one (as Redis advises for Sentinel).
            "--min-replicas-to-write",
            "1",
            "--min-replicas-max-lag",
            "10",
        ];
        let primary = replica_of.map(|p| p.to_string());
        if let Some(primary) = &primary {
            args.extend(["--replicaof", "127.0.0.1", primary]);
        }
        let child = spawn(&args);
        self.servers.retain(|(p, _)| *p != port);
        self.servers.push((port, Some(child)));
        wait_for("redis-server to start", Duration::from_secs(10), || {
            conn(port).is_some()
        });
    }

    /// The sentinels' addresses, for `RedisBackend::connect_sentinel`.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|(port, _)| format!("redis://127.0.0.1:{port}/"))
            .collect()
    }

    /// The port of the server the sentinels name the primary.
    pub fn primary(&self) -> u16 {
        for &(port, _) in &self.sentinels {
            let Some(mut c) = conn(port) else { continue };
            let addr: Option<Vec<String>> = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(SERVICE)
                .query(&mut c)
                .ok();
            if let Some(port) = addr.and_then(|a| a.get(1).and_then(|p| p.parse().ok())) {
                return port;
            }
        }
        panic!("no sentinel answers");
    }

    /// Waits until `port`'s replication offset reaches the primary's:
    /// everything written so far is on the replica too.
    pub fn wait_replicated(&self) {
        let primary = self.primary();
        let offset = |port: u16, field: &str| -> u64 {
            info(port, "replication")
                .lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        let target = offset(primary, "master_repl_offset:");
        for &(port, _) in &self.servers {
            if port == primary {
                continue;
            }
            wait_for("the replica to catch up", Duration::from_secs(10), || {
                offset(port, "slave_repl_offset:") >= target
            });
        }
    }

    /// SIGKILLs the primary; returns its port.
    pub fn kill_primary(&mut self) -> u16 {
        let primary = self.primary();
        for (port, child) in &mut self.servers {
            if *port == primary {
                if let Some(mut child) = child.take() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
        }
        primary
    }

    /// Waits until the sentinels name another primary than `old`; returns
    /// its port.
    pub fn wait_failover(&self, old: u16) -> u16 {
        let mut new = old;
        wait_for("the failover", Duration::from_secs(60), || {
            new = self.primary();
            new != old && info(new, "replication").contains("role:master")
        });
        new
    }

    /// Starts the killed server again on its port, as a new primary would
    /// find it: the sentinels turn it into a replica.
    pub fn restart(&mut self, port: u16) {
        self.start_server(port, None);
    }
}

fn info(port: u16, section: &str) -> String {
    conn(port)
        .and_then(|mut c| redis::cmd("INFO").arg(section).query(&mut c).ok())
        .unwrap_or_default()
}

impl Drop for TestSentinel {
    fn drop(&mut self) {
        for (_, child) in &mut self.sentinels {
            let _ = child.kill();
            let _ = child.wait();
        }
        for (_, child) in &mut self.servers {
            if let Some(child) = child {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
