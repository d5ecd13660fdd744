//! A private redis-server for the script tests: one per test, on a free
//! loopback port, without persistence, killed when dropped. Never the
//! shared instance on 6379.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

pub(crate) struct TestServer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

/// A port nothing listens on now (the OS picks it).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl TestServer {
    /// Starts a server; tries another port if the one picked was taken in
    /// between.
    pub(crate) fn start() -> Self {
        for _ in 0..5 {
            if let Some(server) = TestServer::try_start(free_port()) {
                return server;
            }
        }
        panic!("redis-server did not start on any of five ports");
    }

    fn try_start(port: u16) -> Option<Self> {
        let dir = std::env::temp_dir().join(format!("saga-scripts-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be on PATH (apt-get install redis-server)");
        let mut server = TestServer { child, port, dir };
        let url = server.url();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = server.child.try_wait() {
                return None;
            }
            let ping = redis::Client::open(url.as_str())
                .and_then(|c| c.get_connection())
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
            if ping.is_ok() {
                return Some(server);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        server.stop();
        None
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub(crate) async fn conn(&self) -> MultiplexedConnection {
        redis::Client::open(self.url())
            .expect("a client")
            .get_multiplexed_async_connection()
            .await
            .expect("a connection to the test server")
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop();
    }
}
