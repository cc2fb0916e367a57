//! A streaming job controlled through its coordinator's API, the way the operator controls a
//! `DataflowJob` (and `riverbank snapshot --coordinator`, `riverbank update` do): a named
//! snapshot of the running job, an update refused with its reason while the job runs on, an
//! update accepted (stop after a checkpoint, snapshot), and the new pipeline started from that
//! snapshot by a new coordinator on the same worker disks. The two runs' output together counts
//! every element once, exactly, per key and window.
use common::{PerWindow, free_port};
use riverbank_datagen::synthetic::{KeyDistribution, SyntheticOptions};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_riverbank");
const COUNT: u64 = 24_000;
/// 2024-01-01T00:00:00Z.
const START_US: i64 = 1_704_067_200_000_000;

mod common;

fn pipeline(dir: &Path, file: &str, combine: &str, combine_fn: &str, out: &str) -> PathBuf {
    let yaml = format!(
        r#"pipeline:
  type: chain
  transforms:
    - type: ReadFromSynthetic
      name: Events
      config:
        rate: 1000
        keys: 5
        distribution: zipf
        event_time_skew: 3s
        partitions: 3
        count: {COUNT}
        start: "2024-01-01T00:00:00Z"
    - type: WindowInto
      windowing:
        type: fixed
        size: 10s
    - type: Combine
      name: {combine}
      config:
        group_by: key
        combine:
          events:
            {combine_fn}
    - type: ExtractWindowingInfo
      config:
        fields: [window_start]
    - type: WriteToJson
      config:
        path: {out}/counts.jsonl
options:
  streaming: true
  checkpointIntervalSec: 0.2
"#,
        out = dir.join(out).display()
    );
    let path = dir.join(file);
    std::fs::write(&path, yaml).unwrap();
    path
}

/// One HTTP/1.1 request with a JSON body; (status code, JSON answer or the text).
fn http(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, Value)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    let value = serde_json::from_str(body).unwrap_or(Value::String(body.to_string()));
    Some((code, value))
}

/// A coordinator and two workers, as the operator's pods run them.
struct Job {
    port: u16,
    coordinator: Child,
    workers: Vec<Child>,
}

impl Job {
    fn start(dir: &Path, plan: &Path, extra: &[&str]) -> Job {
        let port = free_port();
        let coordinator = Command::new(BIN)
            .arg("coordinator")
            .arg("--plan")
            .arg(plan)
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .arg("--state-dir")
            .arg(dir.join("coordinator"))
            .args(["--shuffle-partitions", "4", "--max-per-checkpoint", "300"])
            .args(["--bundle-delay-ms", "15"])
            .args(extra)
            .env("RIVERBANK_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let workers = (0..2)
            .map(|i| {
                Command::new(BIN)
                    .arg("worker")
                    .args(["--coordinator", &format!("127.0.0.1:{port}")])
                    .arg("--plan")
                    .arg(plan)
                    .args(["--bind", "127.0.0.1", "--port", "0"])
                    // The same disk for each worker across both runs, as a pod's PVC.
                    .arg("--data-dir")
                    .arg(dir.join(format!("worker-{i}")))
                    .args(["--name", &format!("worker-{i}"), "--threads", "1"])
                    .args(["--exit-when-done", "--patience-secs", "60"])
                    .env("RIVERBANK_LOG", "warn")
                    .stdin(Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect();
        Job {
            port,
            coordinator,
            workers,
        }
    }

    fn status(&self) -> Option<Value> {
        match http(self.port, "GET", "/v1/status", "")? {
            (200, v) => Some(v),
            _ => None,
        }
    }

    fn wait_for(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(s) = self.status()
                && pred(&s)
            {
                return s;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stop(self) {}
}

/// Killed with the test, even when it fails half-way.
impl Drop for Job {
    fn drop(&mut self) {
        let _ = self.coordinator.kill();
        let _ = self.coordinator.wait();
        for w in &mut self.workers {
            let _ = w.kill();
            let _ = w.wait();
        }
    }
}

fn checkpoint(s: &Value) -> u64 {
    s["streaming"]["checkpoint"].as_u64().unwrap_or(0)
}

/// Every committed row under `dir`: (key, window start) → events.
fn committed(dir: &Path) -> PerWindow {
    let mut sums = BTreeMap::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if !p.is_file() {
            continue;
        }
        for line in std::fs::read_to_string(&p).unwrap().lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            let k = (
                v["key"].as_str().unwrap().to_string(),
                v["window_start"].as_str().unwrap().to_string(),
            );
            *sums.entry(k).or_default() += v["events"].as_u64().unwrap();
        }
    }
    sums
}

/// The count computed from the generator directly.
fn expected() -> PerWindow {
    let opts = SyntheticOptions {
        rate: 1000.0,
        keys: 5,
        distribution: KeyDistribution::Zipf { exponent: 1.0 },
        event_time_skew_us: 3_000_000,
        start_us: START_US,
        seed: 42,
        late_fraction: 0.0,
        late_by_us: 0,
    };
    common::generator_counts(opts, COUNT, true).0
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

#[test]
fn snapshot_refused_update_and_update_through_the_coordinator_keep_every_count_exact() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let v1 = pipeline(d, "v1.yaml", "CountPerKey", "fn: count", "out1");
    let ck1 = d.join("ck1");
    let job = Job::start(
        d,
        &v1,
        &["--run-id", "g1", "--checkpoint-dir", ck1.to_str().unwrap()],
    );
    let s = job.wait_for("a few checkpoints", |s| checkpoint(s) >= 3);
    assert_eq!(s["streaming"]["runId"], "g1");
    let address = format!("127.0.0.1:{}", job.port);

    // A named snapshot of the running job.
    let o = Command::new(BIN)
        .args(["snapshot", "--coordinator", &address, "--name", "before-v2"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let location = String::from_utf8(o.stdout).unwrap().trim().to_string();
    assert!(location.ends_with("snapshots/before-v2"), "{location}");
    assert!(Path::new(&location).join("record.json").exists());
    let s = job.status().unwrap();
    assert_eq!(s["streaming"]["snapshots"][0]["name"], "before-v2");
    assert_eq!(s["phase"], "Running", "a snapshot stops nothing");

    // Refused: the renamed Combine sums where the job counted. The job runs on.
    let v3 = pipeline(
        d,
        "v3.yaml",
        "CountByKey",
        "fn: sum\n            value: value",
        "out2",
    );
    let o = Command::new(BIN)
        .args(["update", v3.to_str().unwrap(), "--coordinator", &address])
        .args([
            "--transform-name-mapping",
            r#"{"CountPerKey": "CountByKey"}"#,
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("refused") && err.contains("CountByKey"),
        "{err}"
    );
    let before = checkpoint(&job.status().unwrap());
    job.wait_for("the job to go on", |s| checkpoint(s) > before);

    // A name that is not in the pipeline any more, without a mapping: refused too.
    let v2 = pipeline(d, "v2.yaml", "CountByKey", "fn: count", "out2");
    let (code, verdict) = http(
        job.port,
        "POST",
        "/v1/job/update-check",
        &serde_json::json!({"plan": plan_json(&v2)}).to_string(),
    )
    .unwrap();
    assert_eq!(code, 200);
    assert_eq!(verdict["compatible"], false);
    assert!(
        verdict["reason"].as_str().unwrap().contains("CountPerKey"),
        "{verdict}"
    );

    // Accepted: stopped after a checkpoint, its state kept as a snapshot.
    let o = Command::new(BIN)
        .args(["update", v2.to_str().unwrap(), "--coordinator", &address])
        .args([
            "--transform-name-mapping",
            r#"{"CountPerKey": "CountByKey"}"#,
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let snapshot = String::from_utf8(o.stdout).unwrap().trim().to_string();
    let s = job.status().unwrap();
    assert_eq!(s["phase"], "Cancelled");
    assert_eq!(s["streaming"]["stopped"], true);
    let stopped_at = checkpoint(&s);
    assert!(stopped_at < COUNT / 900, "the stream had not ended yet");
    job.stop();
    let first = committed(&d.join("out1"));
    assert!(!first.is_empty(), "the first run committed output");

    // The new pipeline, from the snapshot, on a new coordinator and the same worker disks.
    let ck2 = d.join("ck2");
    let job = Job::start(
        d,
        &v2,
        &[
            "--run-id",
            "g2",
            "--checkpoint-dir",
            ck2.to_str().unwrap(),
            "--from-snapshot",
            &snapshot,
            "--transform-name-mapping",
            r#"{"CountPerKey": "CountByKey"}"#,
        ],
    );
    let s = job.wait_for("the new run to end", |s| {
        s["phase"] != "Running" && s["phase"] != "Pending"
    });
    assert_eq!(s["phase"], "Done", "{s}");
    assert_eq!(s["streaming"]["runId"], "g2");
    assert!(
        checkpoint(&s) > stopped_at,
        "the checkpoints go on from the snapshot's"
    );
    job.stop();

    let mut total = first;
    for (k, v) in committed(&d.join("out2")) {
        *total.entry(k).or_default() += v;
    }
    assert_eq!(total, expected());
}

/// The serializable plan of a pipeline file, as the operator's ConfigMap holds it.
fn plan_json(file: &Path) -> Value {
    let o = Command::new(BIN)
        .args(["plan", file.to_str().unwrap(), "--format", "plan"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}
