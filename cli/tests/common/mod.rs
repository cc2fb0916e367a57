//! What the process tests share: finding the launcher's children and signalling them, keyed
//! events produced into Kafka with the counts a job must find, free ports, and the Python that
//! runs Beam.
#![allow(dead_code)]

/// The live child processes of `parent`: (pid, role), the role being `coordinator` or a
/// worker's `--name`.
pub fn children_of(parent: u32) -> Vec<(i32, String)> {
    let mut out = vec![];
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // After the parenthesised command name: state, then the parent's pid.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() < 2 || fields[0] == "Z" || fields[1].parse::<u32>() != Ok(parent) {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let role = if args.get(1).is_some_and(|a| a == "coordinator") {
            "coordinator".to_string()
        } else if let Some(i) = args.iter().position(|a| a == "--name") {
            args.get(i + 1).cloned().unwrap_or_default()
        } else {
            continue;
        };
        out.push((pid, role));
    }
    out.sort();
    out
}

pub fn signal(pid: i32, sig: libc::c_int) {
    // SAFETY: kill(2) on a pid this test found among its own children; no memory involved.
    unsafe { libc::kill(pid, sig) };
}

/// (key, window start) → a number.
pub type PerWindow = std::collections::BTreeMap<(String, String), u64>;

/// A keyed count per 10-s window of the first `count` elements of the synthetic stream `opts`,
/// computed from the generator directly; elements behind the source's promise (its skew) are
/// late, and left out unless `keep_late`. Also: how many are late.
pub fn generator_counts(
    opts: riverbank_datagen::synthetic::SyntheticOptions,
    count: u64,
    keep_late: bool,
) -> (PerWindow, u64) {
    const WINDOW_US: i64 = 10_000_000;
    let skew = opts.event_time_skew_us;
    let s = riverbank_datagen::synthetic::SyntheticStream::new(opts);
    let b = s.batch(0, count as usize);
    let keys = b
        .column(0)
        .as_any()
        .downcast_ref::<arrow::array::StringArray>()
        .unwrap();
    let times = b
        .column(3)
        .as_any()
        .downcast_ref::<arrow::array::TimestampMicrosecondArray>()
        .unwrap();
    let mut out = PerWindow::new();
    let mut late = 0;
    for i in 0..b.num_rows() {
        if s.nominal_us(i as u64) - times.value(i) > skew {
            late += 1;
            if !keep_late {
                continue;
            }
        }
        let ws = times.value(i).div_euclid(WINDOW_US) * WINDOW_US;
        let start = chrono::DateTime::from_timestamp_micros(ws)
            .unwrap()
            .format("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        *out.entry((keys.value(i).to_string(), start)).or_default() += 1;
    }
    (out, late)
}

/// `n` JSON events `{"key": "k0".."k6", value_field: i % 10}` round-robin over `partitions`
/// partitions of the Kafka topic `topic` (created), 10 ms of event time apart from
/// `start_ms`; gives the expected count per (key, 10-s window start in ms).
pub fn produce_keyed_events(
    broker: &str,
    topic: &str,
    partitions: u32,
    value_field: &str,
    start_ms: i64,
    n: u64,
) -> std::collections::BTreeMap<(String, i64), u64> {
    use riverbank_io::connectors::{LogRecord, kafka};
    let mut expected = std::collections::BTreeMap::new();
    let mut per_partition: Vec<Vec<LogRecord>> = vec![vec![]; partitions as usize];
    for i in 0..n {
        let key = format!("k{}", (i * 7 + i / 3) % 7);
        let ts = start_ms + i as i64 * 10;
        *expected.entry((key.clone(), ts - ts % 10_000)).or_default() += 1;
        per_partition[(i % u64::from(partitions)) as usize].push(LogRecord {
            offset: 0,
            timestamp_ms: ts,
            key: Some(key.clone().into_bytes()),
            value: Some(
                serde_json::json!({"key": key, value_field: i % 10})
                    .to_string()
                    .into_bytes(),
            ),
            headers: vec![],
        });
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        kafka::create_topic(broker, topic, partitions)
            .await
            .unwrap();
        for (p, records) in per_partition.into_iter().enumerate() {
            for chunk in records.chunks(500) {
                kafka::produce_raw(broker, topic, p as u32, chunk.to_vec())
                    .await
                    .unwrap();
            }
        }
    });
    expected
}

/// A child's stderr, read as it comes on a thread: a pipe left unread fills (64 KiB) and then
/// blocks the child on its next log line.
pub struct Stderr {
    text: std::sync::Arc<std::sync::Mutex<String>>,
    reader: std::thread::JoinHandle<()>,
}

impl Stderr {
    /// The last `n` bytes or so read so far (on a character boundary), for a failure message.
    pub fn tail(&self, n: usize) -> String {
        let text = self.text.lock().unwrap();
        let mut start = text.len().saturating_sub(n);
        while !text.is_char_boundary(start) {
            start += 1;
        }
        text[start..].to_string()
    }

    /// All of it, once the child has exited.
    pub fn join(self) -> String {
        self.reader.join().unwrap();
        std::mem::take(&mut *self.text.lock().unwrap())
    }
}

pub fn drain_stderr(child: &mut std::process::Child) -> Stderr {
    let mut stderr = child.stderr.take().expect("stderr piped");
    let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let text = text.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = std::io::Read::read(&mut stderr, &mut buf) {
                if n == 0 {
                    break;
                }
                text.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        })
    };
    Stderr { text, reader }
}

/// The Python of `dev/setup.sh`'s Beam venv (`RIVERBANK_BEAM_VENV`, else
/// `~/.cache/riverbank/beam-venv`): apache-beam 2.77.
pub fn beam_python() -> std::path::PathBuf {
    let venv = std::env::var_os("RIVERBANK_BEAM_VENV")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(std::env::var_os("HOME").expect("HOME"))
                .join(".cache/riverbank/beam-venv")
        });
    let python = venv.join("bin/python");
    assert!(
        python.exists(),
        "no Python with apache-beam at {}: run dev/setup.sh",
        python.display()
    );
    python
}

/// `riverbank run JOB --no-progress`, checkpointing into `checkpoints` and spilling into
/// `spill`: a streaming test job's command, to which a test adds its own flags.
pub fn streaming_run(
    job: &str,
    checkpoints: &std::path::Path,
    spill: &std::path::Path,
) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_riverbank"));
    c.args(["run", job, "--no-progress", "--checkpoint-dir"])
        .arg(checkpoints)
        .arg("--spill-dir")
        .arg(spill);
    c
}

/// Waits until something listens on loopback `port` (`what`, a server just started), failing
/// after `limit`.
pub fn wait_for_listener(port: u16, what: &str, limit: std::time::Duration) {
    let deadline = std::time::Instant::now() + limit;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what} did not listen on {port}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A port nobody listens on now (the OS's pick, released at once).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs `launcher` (a `riverbank run` with workers), and 1.5 s in SIGKILLs, a second apart,
/// the first child whose role starts with each of `roles` (`worker-`, `coordinator`): the
/// launcher restarts each. The run must end within 120 s, succeed, and have outlived every
/// kill. Its log.
pub fn run_killing(launcher: &mut std::process::Command, roles: &[&str]) -> String {
    run_killing_then_drain(launcher, roles, || false)
}

/// `run_killing`, and once `drain_when` holds (asked every 100 ms after the kills), a Ctrl-C
/// to the launcher, which drains the job: a stream stopped at what a test waited for, not
/// at a wall-clock guess that a loaded machine can miss.
pub fn run_killing_then_drain(
    launcher: &mut std::process::Command,
    roles: &[&str],
    mut drain_when: impl FnMut() -> bool,
) -> String {
    use std::time::Duration;
    let mut child = launcher
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let log = drain_stderr(&mut child);
    std::thread::sleep(Duration::from_millis(1500));
    let mut kills = vec![];
    for role in roles {
        let procs = children_of(child.id());
        if let Some((victim, name)) = procs.iter().find(|p| p.1.starts_with(role)) {
            signal(*victim, libc::SIGKILL);
            kills.push(name.clone());
        }
        std::thread::sleep(Duration::from_millis(1000));
    }
    let started = std::time::Instant::now();
    let mut drained = false;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if !drained && drain_when() {
            signal(child.id() as i32, libc::SIGINT);
            drained = true;
        }
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("the job hung after {kills:?}:\n{}", log.tail(4000));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let log = log.join();
    assert!(status.success(), "{log}");
    assert_eq!(
        kills.len(),
        roles.len(),
        "the job ended before the kills: {kills:?}"
    );
    log
}

/// Runs `job` (a streaming `riverbank run` checkpointing to `checkpoints`), kills it after
/// `after`, and keeps its last completed checkpoint as snapshot `v1`: the snapshot's folder
/// and the checkpoint it is of.
pub fn snapshot_of_killed_run(
    job: &mut std::process::Command,
    checkpoints: &std::path::Path,
    after: std::time::Duration,
) -> (std::path::PathBuf, u64) {
    let mut child = job.stderr(std::process::Stdio::null()).spawn().unwrap();
    std::thread::sleep(after);
    child.kill().unwrap();
    child.wait().unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_riverbank"))
        .args(["snapshot", "--checkpoint-dir"])
        .arg(checkpoints)
        .args(["--name", "v1"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let snap = checkpoints.join("snapshots/v1");
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(snap.join("record.json")).unwrap()).unwrap();
    let at = record["id"].as_u64().unwrap();
    (snap, at)
}

/// The rows a global-window file sink under `dir` committed at checkpoints up to `at` (files
/// `NAME-c<checkpoint, 8 digits>-<shard>-of-<shards>`; a killed job's temporary files, named
/// with a dot, are skipped; no folder: none).
pub fn rows_committed_by(dir: &std::path::Path, at: u64) -> Vec<serde_json::Value> {
    let mut rows = vec![];
    for e in std::fs::read_dir(dir).into_iter().flatten() {
        let name = e.unwrap().file_name().to_string_lossy().to_string();
        if name.starts_with('.') {
            continue;
        }
        let id = name
            .rsplit_once("-c")
            .and_then(|(_, r)| r.get(..8)?.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("an output file not of a checkpoint: {name}"));
        if id <= at {
            for l in std::fs::read_to_string(dir.join(&name)).unwrap().lines() {
                rows.push(serde_json::from_str(l).unwrap());
            }
        }
    }
    rows
}

/// s3s-fs, a file-backed S3 server on loopback, killed when dropped: `s3://BUCKET/key` is
/// `root/BUCKET/key` on disk. Fails saying how to install it when it is not.
pub struct S3 {
    child: std::process::Child,
    pub port: u16,
    root: tempfile::TempDir,
}

impl Drop for S3 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl S3 {
    /// A server holding `buckets`, once it takes connections.
    pub fn start(buckets: &[&str]) -> S3 {
        use std::path::PathBuf;
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_default();
        let bin = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .chain([home.join(".cargo/bin")])
            .map(|d| d.join("s3s-fs"))
            .find(|p| p.is_file())
            .unwrap_or_else(|| {
                panic!(
                    "s3s-fs is not installed: `cargo install s3s-fs --version 0.14.1 --features binary --locked` (dev/setup.sh does it)"
                )
            });
        let root = tempfile::tempdir().unwrap();
        for bucket in buckets {
            std::fs::create_dir(root.path().join(bucket)).unwrap();
        }
        let port = free_port();
        let child = std::process::Command::new(bin)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--access-key",
                "riverbank",
                "--secret-key",
                "riverbank-secret",
            ])
            .arg(root.path())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("start s3s-fs");
        wait_for_listener(port, "s3s-fs", std::time::Duration::from_secs(20));
        S3 { child, port, root }
    }

    /// Where the buckets are on disk.
    pub fn root(&self) -> &std::path::Path {
        self.root.path()
    }

    /// The S3 client settings every Riverbank process reads (keys, endpoint, path style).
    pub fn env(&self, c: &mut std::process::Command) {
        c.env("AWS_ACCESS_KEY_ID", "riverbank")
            .env("AWS_SECRET_ACCESS_KEY", "riverbank-secret")
            .env("AWS_REGION", "us-east-1")
            .env(
                "AWS_ENDPOINT_URL",
                format!("http://127.0.0.1:{}", self.port),
            )
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "false");
    }
}
