//! Real brokers for tests: a Kafka-protocol broker (tansu, in-memory storage) and NATS with
//! JetStream (`nats-server -js`), each on a free loopback port with its files in a temp dir,
//! stopped on drop. `dev/setup.sh` installs both. Behind the `test-brokers` feature so that other
//! crates' tests (the streaming runtime's) can start them too.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running broker process.
pub struct Broker {
    child: Child,
    /// `127.0.0.1:port`: Kafka's bootstrap server, or NATS's server address.
    pub addr: String,
    dir: tempfile::TempDir,
}

impl Broker {
    /// tansu with its in-memory storage engine (topics live as long as the process).
    pub fn kafka() -> Result<Broker, String> {
        let bin = find("tansu", "RIVERBANK_TANSU")?;
        let port = free_port()?;
        let url = format!("tcp://127.0.0.1:{port}");
        Broker::start(port, |dir| {
            let mut c = Command::new(&bin);
            c.args(["broker", "--listener-url", &url])
                .args(["--advertised-listener-url", &url])
                .args(["--storage-engine", "memory://tansu/"])
                // tansu reads a `.env` in its working directory and these variables: keep
                // them from the test's environment.
                .current_dir(dir)
                .env_remove("STORAGE_ENGINE")
                .env_remove("LISTENER_URL")
                .env_remove("ADVERTISED_LISTENER_URL")
                .env("RUST_LOG", "warn");
            c
        })
    }

    /// nats-server with JetStream, storing in the temp dir.
    pub fn nats() -> Result<Broker, String> {
        let bin = find("nats-server", "RIVERBANK_NATS_SERVER")?;
        let port = free_port()?;
        Broker::start(port, |dir| {
            let mut c = Command::new(&bin);
            c.args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
                .arg(dir)
                .current_dir(dir);
            c
        })
    }

    /// `nats://127.0.0.1:port`.
    pub fn nats_url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    fn start(port: u16, cmd: impl FnOnce(&std::path::Path) -> Command) -> Result<Broker, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let log =
            std::fs::File::create(dir.path().join("broker.log")).map_err(|e| e.to_string())?;
        let err = log.try_clone().map_err(|e| e.to_string())?;
        let mut command = cmd(dir.path());
        let child = command
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start {command:?}: {e}"))?;
        let mut b = Broker {
            child,
            addr: format!("127.0.0.1:{port}"),
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(&b.addr).is_err() {
            if let Ok(Some(status)) = b.child.try_wait() {
                return Err(format!("broker exited ({status}): {}", b.log()));
            }
            if Instant::now() > deadline {
                return Err(format!("broker not listening after 30 s: {}", b.log()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(b)
    }

    /// What the broker printed so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("broker.log")).unwrap_or_default()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A binary: `$var`, then `PATH`, `~/.cargo/bin` and `/usr/sbin`.
fn find(name: &str, var: &str) -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(var) {
        return Ok(PathBuf::from(p));
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join(".cargo/bin"));
    }
    dirs.push("/usr/sbin".into());
    dirs.into_iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("{name} not found (set {var}, or run dev/setup.sh to install it)"))
}

fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}
