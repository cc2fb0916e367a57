//! The chart's Grafana dashboard and PrometheusRule read only series that exist: every
//! `riverbank_*` metric they name is exported by a real coordinator and worker (the binary,
//! scraped on their metrics ports while they run the taxi job, and a streaming job) or by the
//! operator's registry.
use riverbank_operator::crd::{DataflowJobStatus, JobState};
use riverbank_operator::metrics::{Metrics, Outcome};
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_riverbank");

fn chart_file(path: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../charts/riverbank")
        .join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every `riverbank_…` identifier in a text (PromQL expressions, a dashboard, a template).
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("riverbank_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

/// The series names of a Prometheus text exposition (histograms' and counters' suffixes
/// included, as queries use them).
fn exported(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap().to_string())
        .collect()
}

fn scrape(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_string())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A small taxi job's plan with its variables filled in.
fn taxi(dir: &Path) -> PathBuf {
    let data = dir.join("data");
    let o = Command::new(BIN)
        .args(["generate", "taxi", "--days", "1", "--rows-per-day", "5000"])
        .args(["--format", "parquet", "--out"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let yaml = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/taxi/taxi.yaml");
    let text = std::fs::read_to_string(yaml)
        .unwrap()
        .replace("{{ input }}", &format!("{}/*.parquet", data.display()))
        .replace("{{ output }}", &dir.join("out").display().to_string())
        .replace("{{ zone_shards | default(1) }}", "1");
    let plan = dir.join("taxi.yaml");
    std::fs::write(&plan, text).unwrap();
    plan
}

/// A keyed windowed count over an unbounded synthetic stream (a streaming job).
fn stream(dir: &Path) -> PathBuf {
    let yaml = format!(
        r#"pipeline:
  type: chain
  transforms:
    - type: ReadFromSynthetic
      config: {{rate: 500, keys: 5, partitions: 2}}
    - type: WindowInto
      windowing: {{type: fixed, size: 10s}}
    - type: Combine
      config: {{group_by: key, combine: {{events: {{fn: count}}}}}}
    - type: WriteToJson
      config: {{path: {out}/counts.jsonl}}
options:
  streaming: true
"#,
        out = dir.join("out").display()
    );
    let plan = dir.join("stream.yaml");
    std::fs::write(&plan, yaml).unwrap();
    plan
}

/// What a coordinator and a worker export while they run `plan`: a batch job until it is done,
/// a streaming job until its watermark is known (once it has checkpointed).
fn job_pod_metrics(plan: fn(&Path) -> PathBuf, streaming: bool) -> BTreeSet<String> {
    let dir = tempfile::tempdir().unwrap();
    let plan = plan(dir.path());
    let (port, cmetrics, wmetrics) = (free_port(), free_port(), free_port());
    let _coordinator = Killed(
        Command::new(BIN)
            .arg("coordinator")
            .arg("--plan")
            .arg(&plan)
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--metrics-port", &cmetrics.to_string()])
            .arg("--state-dir")
            .arg(dir.path().join("coordinator"))
            .env("RIVERBANK_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let _worker = Killed(
        Command::new(BIN)
            .arg("worker")
            .args(["--coordinator", &format!("127.0.0.1:{port}")])
            .arg("--plan")
            .arg(&plan)
            .args(["--bind", "127.0.0.1", "--port", "0"])
            .args(["--metrics-port", &wmetrics.to_string()])
            .arg("--data-dir")
            .arg(dir.path().join("worker-0"))
            .args(["--name", "worker-0", "--slots", "1"])
            .env("RIVERBANK_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Until the job is done (every stage has run, every worker reported) and both answer.
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut seen = BTreeSet::new();
    loop {
        if let (Some(c), Some(w)) = (scrape(cmetrics), scrape(wmetrics)) {
            seen.extend(exported(&c).union(&exported(&w)).cloned());
            let over = if streaming {
                seen.contains("riverbank_watermark_lag_seconds")
            } else {
                c.contains("riverbank_job_phase{phase=\"Done\"} 1")
            };
            if over {
                return seen;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{} did not get there: {seen:?}",
            plan.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What the operator exports once it has reconciled, failed and rescaled a job.
fn operator_metrics() -> BTreeSet<String> {
    let m = Metrics::default();
    m.reconciled(Outcome::Applied, Duration::from_millis(5));
    m.error("kube");
    m.set_leader(true);
    m.job(
        "ns",
        "taxi",
        &DataflowJobStatus {
            state: Some(JobState::Running),
            ..Default::default()
        },
    );
    m.rescaled("ns", "taxi", true);
    exported(&m.encode())
}

#[test]
fn the_dashboard_and_the_alerts_read_only_metrics_that_are_exported() {
    let dashboard = chart_file("dashboards/riverbank.json");
    let rules = chart_file("templates/prometheusrule.yaml");
    let used: BTreeSet<String> = metric_names(&dashboard)
        .union(&metric_names(&rules))
        .cloned()
        .collect();
    // The panels the console also draws, and both alerts, are there to be checked.
    for name in [
        "riverbank_operator_job_current_workers",
        "riverbank_operator_job_target_workers",
        "riverbank_throughput_bytes_per_second",
        "riverbank_backlog_seconds",
        "riverbank_worker_cpu",
        "riverbank_worker_memory_bytes",
        "riverbank_operator_job_state",
        "riverbank_watermark_lag_seconds",
    ] {
        assert!(used.contains(name), "{name} is not used: {used:?}");
    }
    let exported: BTreeSet<String> = job_pod_metrics(taxi, false)
        .union(&job_pod_metrics(stream, true))
        .chain(operator_metrics().iter())
        .cloned()
        .collect();
    let missing: Vec<&String> = used.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "the chart reads metrics nothing exports: {missing:?}\nexported: {exported:?}"
    );
    // And the check can fail: a name nothing exports is not found.
    assert!(!exported.contains("riverbank_watermark_lag"));
}
