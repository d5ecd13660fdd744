//! A private redis-server per test, with AOF on, that the test can kill and
//! restart on the same port (fault injection). Never the shared instance on
//! 6379.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use redis_test::server::RedisServer;

pub struct TestRedis {
    server: Option<RedisServer>,
    port: u16,
    dir: tempfile::TempDir,
    aof: bool,
}

/// A port nothing listens on now (the OS picks it).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl TestRedis {
    /// Starts a server with the append-only file on (fsync always), so a
    /// restart keeps every acknowledged write.
    pub fn start() -> Self {
        TestRedis::start_with_aof(true)
    }

    /// Starts a server with or without the append-only file (benchmarks
    /// compare against `redis-benchmark`, which does not need it).
    pub fn start_with_aof(aof: bool) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut redis = TestRedis {
            server: None,
            port: free_port(),
            dir,
            aof,
        };
        redis.spawn();
        redis
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    fn spawn(&mut self) {
        let dir: PathBuf = self.dir.path().to_owned();
        let aof = if self.aof { "yes" } else { "no" };
        let addr = RedisServer::get_addr(self.port);
        let server = RedisServer::new_with_addr_tls_modules_and_spawner(
            addr,
            None,
            None,
            false,
            None,
            &[],
            |cmd| {
                cmd.arg("--appendonly")
                    .arg(aof)
                    .arg("--appendfsync")
                    .arg("always")
                    .arg("--dir")
                    .arg(&dir)
                    .spawn()
                    .expect("redis-server must be on PATH (apt-get install redis-server)")
            },
        );
        self.server = Some(server);
        self.wait_ready();
    }

    fn wait_ready(&self) {
        let client = redis::Client::open(self.url()).unwrap();
        for _ in 0..200 {
            if let Ok(mut conn) = client.get_connection() {
                if redis::cmd("PING").query::<String>(&mut conn).is_ok() {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("redis-server on port {} did not start", self.port);
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A backend on this server with test-sized timeouts: messages of a
    /// stopped worker come back after 800 ms, idle reads block 100 ms.
    pub async fn backend(&self) -> saga_runtime::backend::redis::RedisBackend {
        let config = saga_runtime::backend::redis::RedisConfig {
            visibility_timeout: Duration::from_millis(800),
            block: Duration::from_millis(100),
            ..Default::default()
        };
        saga_runtime::backend::redis::RedisBackend::connect_with(&self.url(), config)
            .await
            .expect("connect to the test redis-server")
    }

    /// SIGKILLs the server.
    pub fn kill(&mut self) {
        if let Some(mut server) = self.server.take() {
            server.stop();
        }
    }

    /// Starts it again on the same port and data directory.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Removes every key: the next scenario starts on an empty store.
    pub fn flush(&self) {
        let _: () = redis::cmd("FLUSHALL").query(&mut self.conn()).unwrap();
    }

    /// Every key, sorted (for retention checks).
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut self.conn()).unwrap();
        keys.sort();
        keys
    }

    /// Bytes the server uses (`INFO memory`'s `used_memory`).
    pub fn used_memory(&self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query(&mut self.conn())
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Starts recording every command clients send (MONITOR), from the
    /// moment the monitor is attached until [`Monitor::stop`].
    pub fn monitor(&self) -> Monitor {
        let mut child = Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "monitor"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("redis-cli must be on PATH (it comes with redis-server)");
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut seen = Vec::new();
            let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
            // Counting starts after the marker sent once the monitor is
            // attached (what came before is the attaching itself).
            for line in &mut lines {
                if line.contains("\"monitor-go\"") {
                    break;
                }
            }
            for line in lines {
                if line.contains("\"monitor-stop\"") {
                    break;
                }
                // Commands a script runs inside Redis are not round trips.
                if line.contains(" lua]") || !line.contains('"') {
                    continue;
                }
                let cmd = line.split('"').nth(1).unwrap_or("").to_uppercase();
                seen.push((cmd, line.len()));
            }
            seen
        });
        let mut conn = self.conn();
        // MONITOR attaches asynchronously: mark the start once it has.
        for _ in 0..500 {
            let clients: String = redis::cmd("CLIENT").arg("LIST").query(&mut conn).unwrap();
            if clients.contains("cmd=monitor") {
                let _: String = redis::cmd("ECHO")
                    .arg("monitor-go")
                    .query(&mut conn)
                    .unwrap();
                return Monitor {
                    child,
                    reader,
                    conn,
                };
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("MONITOR never attached");
    }

    /// How many times the server ran `cmd` (`INFO commandstats`; commands
    /// scripts run included), since it started or `CONFIG RESETSTAT`.
    pub fn command_calls(&self, cmd: &str) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.conn())
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// Who holds each process-manager partition's owner lease (default
    /// prefix `saga`, 16 partitions).
    #[allow(dead_code)]
    pub fn partition_owners(&self) -> Vec<Option<String>> {
        let mut conn = self.conn();
        (0..16)
            .map(|k| {
                redis::cmd("GET")
                    .arg(format!("saga:{{saga:pm}}:owner:{k}"))
                    .query(&mut conn)
                    .unwrap()
            })
            .collect()
    }

    /// The distinct partition owners, if every partition has one.
    #[allow(dead_code)]
    pub fn partition_owner_set(&self) -> Option<std::collections::BTreeSet<String>> {
        self.partition_owners().into_iter().collect()
    }

    /// A synchronous connection for assertions.
    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }
}

/// A running MONITOR (see [`TestRedis::monitor`]).
pub struct Monitor {
    child: Child,
    reader: std::thread::JoinHandle<Vec<(String, usize)>>,
    conn: redis::Connection,
}

impl Monitor {
    /// Every command clients sent since the start, by name (upper case),
    /// with the length of its MONITOR line (about the bytes it sent).
    pub fn stop(mut self) -> Vec<(String, usize)> {
        let _: String = redis::cmd("ECHO")
            .arg("monitor-stop")
            .query(&mut self.conn)
            .unwrap();
        let seen = self.reader.join().unwrap();
        let _ = self.child.kill();
        let _ = self.child.wait();
        seen
    }
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        self.kill();
    }
}
