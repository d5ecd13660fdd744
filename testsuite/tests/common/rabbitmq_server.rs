//! A private RabbitMQ node per test binary (it takes seconds to boot):
//! its own node name, ports, data and logs in a temp dir, controlled with
//! `rabbitmqctl -n`; never the machine's node on 5672. Run as root
//! through `/usr/lib/rabbitmq/bin` (the `/usr/sbin` wrappers switch to
//! the `rabbitmq` user and the system node's cookie).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::redis_server::free_port;

pub struct TestRabbit {
    dir: tempfile::TempDir,
    node: String,
    port: u16,
    dist_port: u16,
    child: Option<Child>,
}

/// Where Debian puts the real scripts (the `/usr/sbin` ones are
/// wrappers); elsewhere, whatever is on the `PATH`.
fn bin(name: &str) -> PathBuf {
    let debian = Path::new("/usr/lib/rabbitmq/bin").join(name);
    match debian.exists() {
        true => debian,
        false => PathBuf::from(name),
    }
}

impl TestRabbit {
    /// Boots a node and waits until it takes connections.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        for sub in ["mnesia", "log", "home"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        let port = free_port();
        let mut rabbit = TestRabbit {
            node: format!("sagatest{port}@localhost"),
            dist_port: free_port(),
            port,
            dir,
            child: None,
        };
        std::fs::write(
            rabbit.dir.path().join("rabbitmq.conf"),
            format!("listeners.tcp.default = 127.0.0.1:{port}\nloopback_users = none\n"),
        )
        .unwrap();
        std::fs::write(rabbit.dir.path().join("enabled_plugins"), "[].\n").unwrap();
        std::fs::write(
            rabbit.dir.path().join("rabbitmq-env.conf"),
            "ERL_EPMD_ADDRESS=127.0.0.1\n",
        )
        .unwrap();
        rabbit.boot();
        rabbit
    }

    fn command(&self, program: &str) -> Command {
        let d = self.dir.path();
        let mut cmd = Command::new(bin(program));
        cmd.current_dir(d)
            .env("HOME", d.join("home"))
            .env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", d.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", d.join("log"))
            .env("RABBITMQ_CONFIG_FILE", d.join("rabbitmq.conf"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", d.join("enabled_plugins"))
            .env("RABBITMQ_CONF_ENV_FILE", d.join("rabbitmq-env.conf"))
            .env("RABBITMQ_PID_FILE", d.join("node.pid"))
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .env("ERL_CRASH_DUMP", d.join("erl_crash.dump"))
            .env(
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS",
                "-kernel inet_dist_use_interface {127,0,0,1}",
            );
        cmd
    }

    fn boot(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("stdout.log")).unwrap();
        let child = self
            .command("rabbitmq-server")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("rabbitmq-server (install it: apt-get install rabbitmq-server)");
        self.child = Some(child);
        self.watchdog();
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let ok = self.ctl(&["await_startup", "--timeout", "60"]).is_ok();
            if ok && std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the private RabbitMQ node did not start: see {}",
                self.dir.path().join("log").display()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// Stops the node should this test process die without dropping it
    /// (SIGKILLed, a timeout): a process that waits for ours to go.
    fn watchdog(&self) {
        let script = format!(
            "while kill -0 {} 2>/dev/null; do sleep 1; done; {} -q -n {} shutdown",
            std::process::id(),
            bin("rabbitmqctl").display(),
            self.node
        );
        let _ = self
            .command("sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
    }

    /// Runs `rabbitmqctl -n <node> args..`; its output, or why it failed.
    pub fn ctl(&self, args: &[&str]) -> Result<String, String> {
        let out = self
            .command("rabbitmqctl")
            .arg("-q")
            .arg("-n")
            .arg(&self.node)
            .args(args)
            .output()
            .map_err(|e| e.to_string())?;
        match out.status.success() {
            true => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
            false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
        }
    }

    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// Closes every client connection (`close_all_connections`).
    pub fn close_all_connections(&self) {
        self.ctl(&["close_all_connections", "test"])
            .expect("close_all_connections");
    }

    /// Stops the node (its data stays), then boots it again on the same
    /// ports and data.
    pub fn restart(&mut self) {
        self.stop();
        self.boot();
    }

    /// Stops the node, waiting for its process.
    pub fn stop(&mut self) {
        let _ = self.ctl(&["shutdown"]);
        if let Some(mut child) = self.child.take() {
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// How many messages queue `name` holds (ready and unacknowledged).
    pub fn queue_depth(&self, name: &str) -> Option<u64> {
        let out = self
            .ctl(&["list_queues", "name", "messages", "--no-table-headers"])
            .ok()?;
        out.lines().find_map(|line| {
            let mut parts = line.split_whitespace();
            (parts.next()? == name).then(|| parts.next()?.parse().ok())?
        })
    }
}

impl Drop for TestRabbit {
    fn drop(&mut self) {
        self.stop();
    }
}
