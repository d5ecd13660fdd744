//! A private redis-server per test, with AOF on, that the test can kill and
//! restart on the same port (fault injection). Never the shared instance on
//! 6379.

use std::net::TcpListener;
use std::path::PathBuf;
use std::time::Duration;

use redis_test::server::RedisServer;

pub struct TestRedis {
    server: Option<RedisServer>,
    port: u16,
    dir: tempfile::TempDir,
    aof: bool,
}

fn free_port() -> u16 {
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

    /// A synchronous connection for assertions.
    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        self.kill();
    }
}
