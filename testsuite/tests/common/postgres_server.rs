//! A private PostgreSQL server per test: `initdb` into a temporary
//! directory, `pg_ctl` on a free loopback port, stopped (immediately, as a
//! crash) and started again by the tests that inject faults, removed when
//! dropped. Never the machine's own server on 5432.
//!
//! `initdb` and `postgres` refuse to run as root: as root, both run as the
//! `postgres` user (`runuser`), which owns the data directory.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub struct TestPostgres {
    port: u16,
    dir: tempfile::TempDir,
    running: bool,
    /// Server settings (`-c name=value`) besides the defaults.
    settings: Vec<(String, String)>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind a free port")
        .local_addr()
        .expect("its address")
        .port()
}

/// A server binary: from `PGBIN`, else `pg_config --bindir`, else
/// Debian's `/usr/lib/postgresql/<newest>/bin` (not on `PATH`), else
/// whatever `PATH` finds.
fn bin(name: &str) -> PathBuf {
    if let Ok(dir) = std::env::var("PGBIN") {
        return Path::new(&dir).join(name);
    }
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let debian = std::fs::read_dir("/usr/lib/postgresql")
        .ok()
        .and_then(|dirs| {
            dirs.filter_map(Result::ok)
                .filter_map(|d| d.file_name().to_str()?.parse::<u32>().ok())
                .max()
                .map(|v| PathBuf::from(format!("/usr/lib/postgresql/{v}/bin")))
        });
    [from_pg_config, debian]
        .into_iter()
        .flatten()
        .map(|dir| dir.join(name))
        .find(|path| path.exists())
        .unwrap_or_else(|| PathBuf::from(name))
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// `program args`, as the `postgres` user when we are root.
fn as_postgres(program: &Path, args: &[&str]) -> Command {
    if is_root() {
        let mut cmd = Command::new("runuser");
        cmd.arg("-u")
            .arg("postgres")
            .arg("--")
            .arg(program)
            .args(args);
        cmd
    } else {
        let mut cmd = Command::new(program);
        cmd.args(args);
        cmd
    }
}

fn run(mut cmd: Command, what: &str) {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e} (are the PostgreSQL server binaries installed?)"));
    assert!(
        out.status.success(),
        "{what} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl TestPostgres {
    /// Initializes and starts a server. Commits are synchronous (a commit
    /// reaches the write-ahead log before it is acknowledged, so a crash
    /// of the server loses none), but not fsynced: the operating system
    /// keeps what a killed server wrote; only a machine's crash would lose
    /// it, and tests do not crash machines.
    pub fn start() -> Self {
        TestPostgres::start_with(&[])
    }

    /// Starts a server with `settings` (`name`, `value`) on top of the
    /// defaults (a benchmark turns `fsync` back on, say).
    pub fn start_with(settings: &[(&str, &str)]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("saga-pg-")
            .tempdir()
            .expect("tempdir");
        if is_root() {
            run(
                {
                    let mut c = Command::new("chown");
                    c.arg("-R").arg("postgres:postgres").arg(dir.path());
                    c
                },
                "chown the data directory",
            );
        }
        let data = dir.path().join("data");
        run(
            as_postgres(
                &bin("initdb"),
                &[
                    "-D",
                    data.to_str().expect("utf-8 path"),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "--no-sync",
                    "-E",
                    "UTF8",
                ],
            ),
            "initdb",
        );
        let mut pg = TestPostgres {
            port: free_port(),
            dir,
            running: false,
            settings: settings
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        };
        pg.restart();
        pg
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of the `postgres` database as the `postgres` user.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Starts the server (again), on the same port and data.
    pub fn restart(&mut self) {
        let mut options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories='{}' -c fsync=off \
             -c full_page_writes=off -c max_connections=200",
            self.port,
            self.dir.path().display()
        );
        for (name, value) in &self.settings {
            options.push_str(&format!(" -c {name}={value}"));
        }
        let log = self.dir.path().join("server.log");
        run(
            as_postgres(
                &bin("pg_ctl"),
                &[
                    "-D",
                    self.data().to_str().expect("utf-8 path"),
                    "-o",
                    &options,
                    "-l",
                    log.to_str().expect("utf-8 path"),
                    "-w",
                    "-t",
                    "60",
                    "start",
                ],
            ),
            "pg_ctl start",
        );
        self.running = true;
        self.wait_ready();
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "postgres did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the server at once, as a crash would (`pg_ctl stop -m
    /// immediate`: no checkpoint, connections cut).
    pub fn crash(&mut self) {
        self.stop("immediate");
    }

    fn stop(&mut self, mode: &str) {
        if !self.running {
            return;
        }
        let _ = as_postgres(
            &bin("pg_ctl"),
            &[
                "-D",
                self.data().to_str().expect("utf-8 path"),
                "-m",
                mode,
                "-w",
                "stop",
            ],
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
        self.running = false;
    }

    /// Runs `sql` with psql on the server (for fault injection:
    /// `pg_terminate_backend`, locks).
    pub fn psql(&self, sql: &str) -> String {
        self.try_psql(sql)
            .unwrap_or_else(|error| panic!("psql {sql}: {error}"))
    }

    /// Runs `sql` with psql, or says why it failed (the server may be
    /// down: fault injection goes on without it).
    pub fn try_psql(&self, sql: &str) -> Result<String, String> {
        let out = Command::new("psql")
            .arg(self.url())
            .arg("-At")
            .arg("-c")
            .arg(sql)
            .stdin(Stdio::null())
            .output()
            .expect("psql must be on PATH");
        match out.status.success() {
            true => Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned()),
            false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
        }
    }
}

impl Drop for TestPostgres {
    fn drop(&mut self) {
        self.stop("immediate");
    }
}
