//! A private nats-server with JetStream per test binary, on a free
//! loopback port, its store in a temp dir: never the machine's server on
//! 4222. It can be SIGKILLed and started again on the same store.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::redis_server::free_port;

pub struct TestNats {
    dir: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
}

impl TestNats {
    pub fn start() -> Self {
        let mut nats = TestNats {
            dir: tempfile::tempdir().expect("tempdir"),
            port: free_port(),
            child: None,
        };
        nats.spawn();
        nats
    }

    fn spawn(&mut self) {
        let child = Command::new("nats-server")
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(self.dir.path().join("store"))
            .arg("-l")
            .arg(self.dir.path().join("nats.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server (install it: apt-get install nats-server)");
        // Gone with this test process, however it ends.
        let _ = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "while kill -0 {} 2>/dev/null && kill -0 {} 2>/dev/null; do sleep 1; done; kill -9 {} 2>/dev/null",
                std::process::id(),
                child.id(),
                child.id()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "nats-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// SIGKILLs the server.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGKILLs it and starts it again on the same port and store.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for TestNats {
    fn drop(&mut self) {
        self.kill();
    }
}
