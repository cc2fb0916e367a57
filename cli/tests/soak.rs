//! Soak: streaming jobs that checkpoint to a real S3 server (s3s-fs) while their workers behave
//! as pods do on a cluster that is just starting: they join one at a time, other workers
//! cannot reach them for a while after they start (their DNS names do not resolve yet), they
//! restart at random (same name, same disk, unreachable meanwhile), and one leaves and comes
//! back, so state shards move between them while checkpoints are taken. Every count must be
//! exact. Each worker is reached by the others through a TCP proxy this test controls (it
//! drops connections while the worker counts as unreachable).
//!
//! The schedule comes from a seed, printed; `RIVERBANK_SOAK_SEED=<seed>` replays it. Needs
//! s3s-fs (`cargo install s3s-fs --version 0.14.1 --features binary --locked`) and, for the
//! Kafka case, tansu (`cargo install tansu --version 0.6.0 --no-default-features --features
//! dynostore --locked`); `dev/setup.sh` installs both. A missing server fails the test.
use common::{PerWindow, S3, free_port};
use riverbank_datagen::synthetic::{KeyDistribution, SyntheticOptions};
use riverbank_io::connectors::testing::Broker;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_riverbank");
/// 2024-01-01T00:00:00Z.
const START_US: i64 = 1_704_067_200_000_000;
const WORKERS: usize = 3;

/// The seed of this run's schedule: `RIVERBANK_SOAK_SEED`, else the clock.
fn seed(test: &str) -> u64 {
    let seed = std::env::var("RIVERBANK_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos() as u64
        });
    eprintln!("{test}: schedule seed {seed} (RIVERBANK_SOAK_SEED={seed} replays it)");
    seed
}

/// xorshift: the schedule's only source of randomness.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }

    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

/// Offsets read so far by the recorded checkpoints of the job at `s3://soak/ck`.
fn read_so_far(s3: &S3) -> u64 {
    {
        let dir = s3.root().join("soak/ck/checkpoints");
        let Some(last) = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".done.json"))
            .max()
        else {
            return 0;
        };
        let text = std::fs::read_to_string(dir.join(last)).unwrap_or_default();
        let v: Value = serde_json::from_str(&text).unwrap_or_default();
        v["offsets"]
            .as_array()
            .map_or(0, |a| a.iter().map(|o| o[2].as_u64().unwrap_or(0)).sum())
    }
}

/// A TCP forwarder in front of a worker's shuffle port: how the other workers reach it. While
/// it is "down" it takes connections and drops them at once, as a name that does not resolve
/// yet or a pod that is not there.
struct Proxy {
    port: u16,
    up: Arc<AtomicBool>,
}

impl Proxy {
    fn start(target: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let up = Arc::new(AtomicBool::new(false));
        let flag = up.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(client) = conn else { continue };
                if !flag.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue; // the worker is restarting: the client sees the drop
                };
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || pipe(client, server));
                std::thread::spawn(move || pipe(s2, c2));
            }
        });
        Proxy { port, up }
    }

    fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::SeqCst);
    }
}

/// A plain HTTP/1.1 GET of the coordinator's JSON (None while it is unreachable).
fn get_status(port: u16, path: &str) -> Option<Value> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200")
        .then(|| serde_json::from_str(body).ok())
        .flatten()
}

/// Once Running, a streaming job stays Running until it ends: the operator decides updates
/// only for a running job, and applied a new pipeline in place to one that flickered to
/// Pending between two checkpoints.
fn assert_running_throughout(phases: &Mutex<Vec<String>>, history: &str) {
    let phases = phases.lock().unwrap();
    let first = phases.iter().position(|p| p == "Running");
    assert!(
        first.is_some_and(|i| phases[i..].iter().all(|p| p != "Pending")),
        "phases seen: {phases:?}\nwhat happened:\n{history}"
    );
}

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// A coordinator and its workers, started by hand as pods are.
struct Cluster {
    dir: PathBuf,
    plan: String,
    port: u16,
    coordinator: Child,
    /// Per worker: its process (none before it joined or while it restarts), its fixed shuffle
    /// port, and the proxy the others reach it through.
    workers: Vec<(Option<Child>, u16, Proxy)>,
    /// What happened, for the failure messages.
    log: Arc<Mutex<Vec<String>>>,
    s3: Arc<S3>,
    started: Instant,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.coordinator.kill();
        let _ = self.coordinator.wait();
        for c in self.workers.iter_mut().filter_map(|w| w.0.as_mut()) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Cluster {
    fn start(dir: &Path, plan: String, s3: Arc<S3>, extra: &[&str]) -> Cluster {
        let port = free_port();
        let mut c = Command::new(BIN);
        c.arg("coordinator")
            .arg("--plan")
            .arg(&plan)
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .arg("--state-dir")
            .arg(dir.join("coordinator"))
            .args([
                "--checkpoint-dir",
                "s3://soak/ck",
                "--shuffle-partitions",
                "4",
            ])
            .args(["--lease-timeout-ms", "3000", "--exit-when-done"])
            .args(extra)
            .env("RIVERBANK_LOG", "warn")
            .stdin(Stdio::null());
        s3.env(&mut c);
        let coordinator = c.spawn().unwrap();
        let workers = (0..WORKERS)
            .map(|_| {
                let p = free_port();
                (None, p, Proxy::start(p))
            })
            .collect();
        Cluster {
            dir: dir.to_path_buf(),
            plan,
            port,
            coordinator,
            workers,
            log: Default::default(),
            s3,
            started: Instant::now(),
        }
    }

    fn note(&self, what: String) {
        let line = format!("{:6.2}s {what}", self.started.elapsed().as_secs_f64());
        self.log.lock().unwrap().push(line);
    }

    /// Starts worker `i` (again: same name, same port, same disk).
    fn spawn(&mut self, i: usize) {
        let (_, port, proxy) = &self.workers[i];
        let mut c = Command::new(BIN);
        c.arg("worker")
            .args(["--coordinator", &format!("127.0.0.1:{}", self.port)])
            .arg("--plan")
            .arg(&self.plan)
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--advertise", &format!("127.0.0.1:{}", proxy.port)])
            .arg("--data-dir")
            .arg(self.dir.join(format!("worker-{i}")))
            .args(["--name", &format!("worker-{i}"), "--slots", "2"])
            // Short, so that some outages outlast a fetch's retries and the producer is
            // recomputed; others are ridden out by the retries.
            .args(["--exit-when-done", "--fetch-patience-secs", "1"])
            .env("RIVERBANK_LOG", "warn")
            .stdin(Stdio::null());
        self.s3.env(&mut c);
        self.workers[i].0 = Some(c.spawn().unwrap());
        self.note(format!("worker-{i} started"));
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.workers[i].0.take() {
            let _ = c.kill();
            let _ = c.wait();
            self.note(format!("worker-{i} killed"));
        }
    }

    /// Asks worker `i` to leave (SIGTERM: it finishes what it runs, takes no more, exits).
    fn retire(&mut self, i: usize) {
        if let Some(c) = &self.workers[i].0 {
            common::signal(c.id() as i32, libc::SIGTERM);
            self.note(format!("worker-{i} asked to leave"));
        }
    }

    fn reap(&mut self, i: usize) {
        if let Some(c) = &mut self.workers[i].0
            && c.try_wait().ok().flatten().is_some()
        {
            self.workers[i].0 = None;
            self.note(format!("worker-{i} exited"));
        }
    }

    fn reachable(&self, i: usize, up: bool) {
        self.workers[i].2.set_up(up);
        self.note(format!(
            "worker-{i} {}",
            if up { "reachable" } else { "unreachable" }
        ));
    }

    fn status(&self) -> Option<Value> {
        get_status(self.port, "/v1/status")
    }

    /// Follows the job's phase by long poll, as the operator does (it answers as soon as the
    /// job changes, a new checkpoint included): the phases seen, in order, without repeats.
    fn watch_phases(&self) -> Arc<Mutex<Vec<String>>> {
        let seen: Arc<Mutex<Vec<String>>> = Default::default();
        let (out, port) = (seen.clone(), self.port);
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(320);
            while Instant::now() < deadline {
                let Some(s) = get_status(port, "/v1/status?wait_ms=2000") else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                let phase = s["phase"].as_str().unwrap_or("").to_string();
                let mut seen = out.lock().unwrap();
                if seen.last() != Some(&phase) {
                    seen.push(phase.clone());
                }
                if ["Done", "Failed", "Cancelled"].contains(&phase.as_str()) {
                    return;
                }
            }
        });
        seen
    }

    fn drain(&self) {
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) {
            let _ = write!(
                s,
                "POST /v1/job/drain HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            let _ = s.read_to_string(&mut String::new());
        }
        self.note("drain asked".into());
    }

    fn history(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Runs the schedule until `done` says the job may end (it then waits for the end): workers
    /// join one at a time, each unreachable for a while after it starts; then, until the end,
    /// random restarts, outages, and one worker that leaves and comes back. Returns the
    /// coordinator's last status.
    fn soak(&mut self, rng: &mut Rng, mut done: impl FnMut(&Cluster) -> bool) -> Value {
        // A calm machine ends the job in about 20 s; a loaded one (CI, builds beside it) took
        // more than 100: the limit only catches a job that never ends.
        let deadline = Instant::now() + Duration::from_secs(300);
        // When each worker's "DNS name" starts to resolve, or its restart ends.
        let mut back_at: Vec<Option<Instant>> = vec![None; WORKERS];
        let mut restart_at: Vec<Option<Instant>> = vec![None; WORKERS];
        let joins_after: Vec<Duration> = (0..WORKERS).map(|_| rng.ms(1200, 2500)).collect();
        let mut joins: Vec<Instant> = (0..WORKERS)
            .map(|i| self.started + joins_after[..i].iter().sum::<Duration>())
            .collect();
        let mut next_trouble = self.started + rng.ms(2500, 4000);
        let mut retired: Option<(usize, Instant)> = None;
        let mut troubles = 0;
        let mut ending = false;
        loop {
            let now = Instant::now();
            assert!(
                now < deadline,
                "the job did not end in time; what happened:\n{}",
                self.history()
            );
            if let Some(s) = self.status() {
                let phase = s["phase"].as_str().unwrap_or("").to_string();
                if ["Done", "Failed", "Cancelled"].contains(&phase.as_str()) {
                    return s;
                }
            }
            if let Ok(Some(status)) = self.coordinator.try_wait() {
                // It lingers after the end; one that exits 0 ended the job well (a failed
                // job exits 1).
                assert!(
                    status.success(),
                    "the coordinator exited ({status}); what happened:\n{}",
                    self.history()
                );
                return json!({"phase": "Done"});
            }
            for i in 0..WORKERS {
                self.reap(i);
                if self.workers[i].0.is_none()
                    && back_at[i].is_none()
                    && restart_at[i].is_none()
                    && now >= joins[i]
                    && retired.is_none_or(|(r, _)| r != i)
                {
                    // Joins (first time): reachable to the others only a while later.
                    self.reachable(i, false);
                    self.spawn(i);
                    back_at[i] = Some(now + rng.ms(500, 2500));
                    joins[i] = deadline + Duration::from_secs(3600);
                }
                if restart_at[i].is_some_and(|t| now >= t) {
                    restart_at[i] = None;
                    self.spawn(i);
                    back_at[i] = Some(now + rng.ms(0, 1200));
                }
                if back_at[i].is_some_and(|t| now >= t) {
                    back_at[i] = None;
                    self.reachable(i, true);
                }
            }
            if let Some((r, at)) = retired
                && now >= at
            {
                retired = None;
                if self.workers[r].0.is_none() {
                    self.reachable(r, false);
                    self.spawn(r);
                    back_at[r] = Some(now + rng.ms(300, 1500));
                }
            }
            if !ending && done(self) {
                ending = true;
                self.note("everything read".into());
            }
            if !ending && now >= next_trouble && joins.iter().all(|j| now >= *j) {
                let i = rng.below(WORKERS as u64) as usize;
                let busy = back_at[i].is_some() || restart_at[i].is_some() || retired.is_some();
                if self.workers[i].0.is_some() && !busy {
                    troubles += 1;
                    match (troubles, rng.below(3)) {
                        // Once: a worker leaves (its shards move) and comes back later.
                        (3, _) => {
                            self.retire(i);
                            retired = Some((i, now + rng.ms(2000, 4000)));
                        }
                        (_, 0) => {
                            self.reachable(i, false);
                            back_at[i] = Some(now + rng.ms(300, 2500));
                        }
                        _ => {
                            self.reachable(i, false);
                            self.kill(i);
                            restart_at[i] = Some(now + rng.ms(200, 1500));
                        }
                    }
                }
                next_trouble = now + rng.ms(800, 2000);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A keyed count per 10-s window of `count` synthetic elements over 3 partitions.
fn synthetic_pipeline(dir: &Path, count: u64) -> String {
    let yaml = format!(
        r#"pipeline:
  type: chain
  transforms:
    - type: ReadFromSynthetic
      name: Events
      config:
        rate: 1000
        keys: 7
        distribution: zipf
        event_time_skew: 3s
        partitions: 3
        count: {count}
        start: "2024-01-01T00:00:00Z"
    - type: WindowInto
      windowing:
        type: fixed
        size: 10s
    - type: Combine
      name: CountPerKey
      config:
        group_by: key
        combine:
          events:
            fn: count
    - type: ExtractWindowingInfo
      config:
        fields: [window_start]
    - type: WriteToJson
      config:
        path: {out}/counts.jsonl
options:
  streaming: true
"#,
        out = dir.join("out").display()
    );
    let file = dir.join("job.yaml");
    std::fs::write(&file, yaml).unwrap();
    file.display().to_string()
}

/// Every committed row: ((key, window start), events) summed over panes, and panes per window.
fn committed(dir: &Path) -> (PerWindow, PerWindow) {
    let (mut sums, mut panes) = (BTreeMap::new(), BTreeMap::new());
    for e in std::fs::read_dir(dir.join("out")).into_iter().flatten() {
        let p = e.unwrap().path();
        if !p.is_file() {
            continue;
        }
        for line in std::fs::read_to_string(&p).unwrap().lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            let k = (
                v["key"].as_str().unwrap().to_string(),
                v["window_start"].as_str().unwrap().to_string(),
            );
            *sums.entry(k.clone()).or_default() += v["events"].as_u64().unwrap();
            *panes.entry(k).or_default() += 1;
        }
    }
    (sums, panes)
}

#[test]
fn soak_synthetic_stream_exact_while_workers_join_late_restart_and_are_unreachable() {
    let mut rng = Rng(seed("synthetic") | 1);
    let s3 = Arc::new(S3::start(&["soak"]));
    let dir = tempfile::tempdir().unwrap();
    const COUNT: u64 = 120_000;
    let plan = synthetic_pipeline(dir.path(), COUNT);
    let mut cluster = Cluster::start(
        dir.path(),
        plan,
        s3,
        &["--max-per-checkpoint", "1000", "--bundle-delay-ms", "40"],
    );
    let phases = cluster.watch_phases();
    let status = cluster.soak(&mut rng, |_| false);
    let history = cluster.history();
    assert_running_throughout(&phases, &history);
    assert_eq!(
        status["phase"], "Done",
        "{status}\nwhat happened:\n{history}"
    );
    let (sums, panes) = committed(dir.path());
    let want = common::generator_counts(
        SyntheticOptions {
            rate: 1000.0,
            keys: 7,
            distribution: KeyDistribution::Zipf { exponent: 1.0 },
            event_time_skew_us: 3_000_000,
            start_us: START_US,
            seed: 42,
            late_fraction: 0.0,
            late_by_us: 20_000_000,
        },
        COUNT,
        false,
    )
    .0;
    assert_eq!(sums, want, "what happened:\n{history}");
    assert!(
        panes.values().all(|n| *n == 1),
        "a window fired twice; what happened:\n{history}"
    );
    eprintln!("{history}");
}

/// `n` JSON events over 2 partitions (the cluster run's topic), keyed `k0`..`k6`, 10 ms of
/// event time apart; the expected count per (key, window start in ms).
fn produce(broker: &str, n: u64) -> BTreeMap<(String, i64), u64> {
    common::produce_keyed_events(broker, "events", 2, "value", START_US / 1000, n)
}

#[test]
fn soak_kafka_stream_exact_while_workers_join_late_restart_and_are_unreachable() {
    let broker = Broker::kafka().unwrap_or_else(|e| {
        panic!(
            "tansu is needed for this test ({e}): `cargo install tansu --version 0.6.0 --no-default-features --features dynostore --locked` (dev/setup.sh does it)"
        )
    });
    let mut rng = Rng(seed("kafka") | 1);
    let s3 = Arc::new(S3::start(&["soak"]));
    let dir = tempfile::tempdir().unwrap();
    const COUNT: u64 = 20_000;
    let expected = produce(&broker.addr, COUNT);
    let yaml = format!(
        r#"pipeline:
  type: chain
  transforms:
    - type: ReadFromKafka
      name: Events
      config:
        topic: events
        bootstrap_servers: {broker}
        format: JSON
        schema: '{{"type": "object", "properties": {{"key": {{"type": "string"}}, "value": {{"type": "integer"}}}}, "required": ["key", "value"]}}'
        consumer_config:
          auto.offset.reset: earliest
    - type: WindowInto
      windowing:
        type: fixed
        size: 10s
        allowed_lateness: 1h
    - type: Combine
      name: Count
      config:
        group_by: key
        combine:
          events:
            fn: count
    - type: ExtractWindowingInfo
      config:
        fields: [window_start]
    - type: WriteToJson
      config:
        path: {out}/counts.jsonl
options:
  streaming: true
  checkpointIntervalSec: 0.5
"#,
        broker = broker.addr,
        out = dir.path().join("out").display()
    );
    let plan = dir.path().join("job.yaml");
    std::fs::write(&plan, yaml).unwrap();
    let mut cluster = Cluster::start(
        dir.path(),
        plan.display().to_string(),
        s3.clone(),
        &["--max-per-checkpoint", "300", "--bundle-delay-ms", "40"],
    );
    let phases = cluster.watch_phases();
    let status = cluster.soak(&mut rng, |c| {
        let read = read_so_far(&c.s3) >= COUNT;
        if read {
            c.drain();
        }
        read
    });
    let history = cluster.history();
    assert_running_throughout(&phases, &history);
    assert_eq!(
        status["phase"], "Done",
        "{status}\nwhat happened:\n{history}"
    );
    let (sums, panes) = committed(dir.path());
    let got: BTreeMap<(String, i64), u64> = sums
        .into_iter()
        .map(|((k, ws), n)| {
            let t =
                chrono::DateTime::parse_from_rfc3339(&ws).unwrap_or_else(|e| panic!("{ws}: {e}"));
            ((k, t.timestamp_millis()), n)
        })
        .collect();
    assert_eq!(got, expected, "what happened:\n{history}");
    assert!(
        panes.values().all(|n| *n == 1),
        "a window fired twice; what happened:\n{history}"
    );
    eprintln!("{history}");
}
