//! The distributed runtime as it runs on pods: a coordinator and worker processes of the real
//! binary, talking over real loopback sockets. Workers and the coordinator are killed with
//! SIGKILL mid-run; the results must not change by a byte.
use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{children_of, free_port, signal};

const BIN: &str = env!("CARGO_BIN_EXE_riverbank");

fn taxi_yaml() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/taxi/taxi.yaml")
}

fn vars(input: &Path, output: &Path) -> String {
    serde_json::json!({"input": format!("{}/*.parquet", input.display()), "output": output.display().to_string()})
        .to_string()
}

fn riverbank(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("RIVERBANK_LOG", "warn")
        .output()
        .expect("the riverbank binary runs")
}

/// Small taxi data: `days` files of `rows` trips, one Parquet row group each.
fn taxi_data(dir: &Path, days: u32, rows: u64) -> PathBuf {
    let data = dir.join("data");
    let out = riverbank(&[
        "generate",
        "taxi",
        "--days",
        &days.to_string(),
        "--rows-per-day",
        &rows.to_string(),
        "--format",
        "parquet",
        "--out",
        data.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    data
}

/// Every output file's bytes, by file name.
fn outputs(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().to_string(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no output in {}", dir.display());
    files
}

fn run_local(data: &Path, out: &Path) -> Vec<(String, Vec<u8>)> {
    run_local_with(data, out, &[])
}

fn run_local_with(data: &Path, out: &Path, extra: &[&str]) -> Vec<(String, Vec<u8>)> {
    let v = vars(data, out);
    let yaml = taxi_yaml();
    let mut args = vec!["run", yaml.to_str().unwrap(), "--jinja-variables", &v];
    args.extend_from_slice(extra);
    let o = riverbank(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    outputs(out)
}

#[test]
fn taxi_on_1_2_and_4_worker_processes_is_byte_identical_to_the_local_run() {
    let dir = tempfile::tempdir().unwrap();
    let data = taxi_data(dir.path(), 5, 4000);
    let local = run_local(&data, &dir.path().join("local"));
    for n in [1, 2, 4] {
        let out = dir.path().join(format!("w{n}"));
        let v = vars(&data, &out);
        let o = riverbank(&[
            "run",
            taxi_yaml().to_str().unwrap(),
            "--workers",
            &n.to_string(),
            "--jinja-variables",
            &v,
        ]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{n} workers: {err}");
        assert!(outputs(&out) == local, "{n} workers gave different bytes");
        // The items were spread over the workers. Not necessarily all of them: on a loaded
        // machine the last worker to start can find the few items of this small job taken.
        let line = err
            .lines()
            .find(|l| l.starts_with("work items per worker"))
            .unwrap_or_else(|| panic!("{err}"));
        let took_part = line.matches("worker-").count();
        assert!(took_part <= n && took_part >= n.min(2), "{line}");
    }
}

/// Small shuffle partitions run coalesced, several to an item (the default), yet every file
/// is the bytes one item per partition gives: with runner-chosen sharding too (one file per
/// partition's part), in process and on worker processes; and there are fewer items.
#[test]
fn coalesced_shuffle_partitions_give_the_files_of_one_item_each() {
    let dir = tempfile::tempdir().unwrap();
    let data = taxi_data(dir.path(), 3, 3000);
    // The zones without num_shards: runner-chosen sharding, one file per non-empty part.
    let yaml = dir.path().join("taxi.yaml");
    let text = std::fs::read_to_string(taxi_yaml()).unwrap();
    let zones = "        num_shards: {{ zone_shards | default(1) }}\n";
    assert!(text.contains(zones));
    std::fs::write(&yaml, text.replace(zones, "")).unwrap();
    let run = |name: &str, extra: &[&str]| {
        let out = dir.path().join(name);
        let v = vars(&data, &out);
        let mut args = vec!["run", yaml.to_str().unwrap(), "--jinja-variables", &v];
        args.extend_from_slice(extra);
        let o = riverbank(&args);
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(o.status.success(), "{name}: {err}");
        (outputs(&out), err)
    };
    // Items run, less those dynamic splitting made: "work items per worker: worker-0: 20,
    // worker-1: 17; 3 dynamic splits; ..."
    let items = |err: &str| -> i64 {
        let line = err
            .lines()
            .find_map(|l| l.strip_prefix("work items per worker: "))
            .unwrap_or_else(|| panic!("{err}"));
        let mut fields = line.split("; ");
        let per_worker: i64 = fields
            .next()
            .unwrap()
            .split(", ")
            .map(|w| w.rsplit(": ").next().unwrap().parse::<i64>().unwrap())
            .sum();
        let splits: i64 = fields
            .next()
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        per_worker - splits
    };
    let off = ["--coalesce-partitions-mb", "0"];
    let (separate, _) = run("local-off", &off);
    let zone_files = separate
        .iter()
        .filter(|(n, _)| n.starts_with("zones"))
        .count();
    assert!(
        zone_files > 1,
        "{zone_files} zone files: the test needs several"
    );
    let (coalesced, _) = run("local-on", &[]);
    assert!(
        coalesced == separate,
        "in process: coalescing changed the files"
    );
    let (w_off, err_off) = run(
        "w2-off",
        &["--workers", "2", "--coalesce-partitions-mb", "0"],
    );
    let (w_on, err_on) = run("w2-on", &["--workers", "2"]);
    assert!(
        w_off == separate && w_on == separate,
        "on workers: the files changed"
    );
    // Two final stages of 8 partitions each, coalesced to one item each.
    assert_eq!(items(&err_off) - items(&err_on), 14, "{err_off}\n{err_on}");
}

/// A coordinator and workers started one by one, as pods are.
struct Cluster {
    dir: PathBuf,
    plan: PathBuf,
    port: u16,
    coordinator: Option<Child>,
    workers: Vec<Child>,
    extra: Vec<String>,
}

impl Cluster {
    fn start(dir: &Path, plan: PathBuf, workers: usize, extra: &[&str]) -> Cluster {
        let port = free_port();
        let mut c = Cluster {
            dir: dir.to_path_buf(),
            plan,
            port,
            coordinator: None,
            workers: vec![],
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        c.start_coordinator();
        for i in 0..workers {
            let w = c.spawn_worker(i);
            c.workers.push(w);
        }
        c
    }

    fn start_coordinator(&mut self) {
        let child = Command::new(BIN)
            .arg("coordinator")
            .arg("--plan")
            .arg(&self.plan)
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .arg("--state-dir")
            .arg(self.dir.join("coordinator"))
            .args(["--lease-timeout-ms", "1500"])
            .args(&self.extra)
            .env("RIVERBANK_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        self.coordinator = Some(child);
    }

    fn spawn_worker(&self, i: usize) -> Child {
        Command::new(BIN)
            .arg("worker")
            .args(["--coordinator", &format!("127.0.0.1:{}", self.port)])
            .arg("--plan")
            .arg(&self.plan)
            .args(["--bind", "127.0.0.1", "--port", "0"])
            .arg("--data-dir")
            .arg(self.dir.join(format!("worker-{i}")))
            .args(["--name", &format!("worker-{i}"), "--threads", "1"])
            .args(["--exit-when-done", "--patience-secs", "60"])
            .env("RIVERBANK_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .unwrap()
    }

    fn get(&self, path: &str) -> Option<Value> {
        http_get(self.port, path)
    }

    /// Polls the status until `pred` holds (or the job ends); returns the last status.
    fn wait_for(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if let Some(s) = self.get("/v1/status") {
                if pred(&s) {
                    return s;
                }
                let phase = s["phase"].as_str().unwrap_or("");
                if ["Done", "Failed", "Cancelled"].contains(&phase) {
                    panic!("the job ended ({phase}) before {what}: {s}");
                }
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_done(&self) -> Value {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            // A long poll: the coordinator answers when the job changes (or after a second).
            if let Some(s) = self.get("/v1/status?wait_ms=1000")
                && ["Done", "Failed", "Cancelled"].contains(&s["phase"].as_str().unwrap_or(""))
            {
                return s;
            }
            assert!(Instant::now() < deadline, "the job did not finish");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn kill_coordinator(&mut self) {
        let mut c = self.coordinator.take().unwrap();
        c.kill().unwrap(); // SIGKILL
        c.wait().unwrap();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in self.coordinator.iter_mut().chain(self.workers.iter_mut()) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A plain HTTP/1.1 GET of a JSON document (None while the server is unreachable).
fn http_get(port: u16, path: &str) -> Option<Value> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.1 200") {
        return None;
    }
    serde_json::from_str(body).ok()
}

fn stage_done(s: &Value, i: usize) -> u64 {
    s["stages"][i]["itemsDone"].as_u64().unwrap_or(0)
}

/// Writes the taxi plan with its Jinja variables filled in, as the operator's ConfigMap holds it.
fn taxi_plan(dir: &Path, data: &Path, out: &Path) -> PathBuf {
    let rendered = dir.join("taxi-rendered.yaml");
    let text = std::fs::read_to_string(taxi_yaml()).unwrap();
    let text = text
        .replace("{{ input }}", &format!("{}/*.parquet", data.display()))
        .replace("{{ output }}", &out.display().to_string())
        .replace("{{ zone_shards | default(1) }}", "1");
    std::fs::write(&rendered, text).unwrap();
    rendered
}

#[test]
fn workers_killed_with_sigkill_mid_run_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = taxi_data(dir.path(), 6, 3000);
    let local = run_local(&data, &dir.path().join("local"));
    // Kill points: while reading, and while the final combines write (their inputs, the
    // shuffle files of the killed worker, are then lost too and must be recomputed).
    for (case, point) in [("read", 0usize), ("write", 1usize)] {
        let run = dir.path().join(case);
        let out = run.join("out");
        std::fs::create_dir_all(&run).unwrap();
        let plan = taxi_plan(&run, &data, &out);
        // One item per partition: the final stages last long enough to be killed in.
        let extra = ["--bundle-delay-ms", "150", "--coalesce-partitions-mb", "0"];
        let mut c = Cluster::start(&run, plan, 2, &extra);
        let s = c.wait_for("a worker to be busy in the stage", |s| {
            let busy = s["workers"]
                .as_array()
                .is_some_and(|ws| ws.iter().any(|w| w["itemsRunning"].as_u64() > Some(0)));
            busy && match point {
                0 => stage_done(s, 0) == 0,
                _ => stage_done(s, 1) + stage_done(s, 2) >= 1,
            }
        });
        let victim = s["workers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["itemsRunning"].as_u64() > Some(0))
            .unwrap()["name"]
            .as_str()
            .unwrap()
            .to_string();
        let i: usize = victim.trim_start_matches("worker-").parse().unwrap();
        c.workers[i].kill().unwrap(); // SIGKILL
        c.workers[i].wait().unwrap();
        let end = c.wait_done();
        assert_eq!(end["phase"], "Done", "{case}: {end}");
        let dead = end["workers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["name"] == victim.as_str())
            .unwrap();
        assert_eq!(
            dead["alive"], false,
            "{case}: the coordinator noticed: {end}"
        );
        assert!(
            outputs(&out) == local,
            "{case}: results changed after a kill"
        );
    }
}

#[test]
fn a_coordinator_killed_and_restarted_resumes_from_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let data = taxi_data(dir.path(), 6, 3000);
    let local = run_local(&data, &dir.path().join("local"));
    let out = dir.path().join("out");
    let plan = taxi_plan(dir.path(), &data, &out);
    let mut c = Cluster::start(dir.path(), plan, 2, &["--bundle-delay-ms", "150"]);
    let before = c.wait_for("some items to finish", |s| {
        s["workItemsDone"].as_u64() >= Some(3)
    });
    c.kill_coordinator();
    std::thread::sleep(Duration::from_millis(300));
    c.start_coordinator();
    // The restarted coordinator knows what was done before it died.
    let after = c.wait_for("the coordinator to answer", |_| true);
    assert!(
        after["workItemsDone"].as_u64() >= before["workItemsDone"].as_u64(),
        "progress lost: {before} then {after}"
    );
    let end = c.wait_done();
    assert_eq!(end["phase"], "Done", "{end}");
    assert!(
        outputs(&out) == local,
        "results changed after a coordinator restart"
    );
    let log = std::fs::read_to_string(dir.path().join("coordinator/coordinator.wal")).unwrap();
    assert!(log.contains("{\"Started\":{\"epoch\":2}}"), "{log}");
    assert_eq!(
        log.matches("\"Committed\"").count(),
        1,
        "sinks committed once"
    );
}

#[test]
fn a_poison_record_fails_the_job_after_four_attempts_unless_error_handling_takes_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let pipeline = |error_handling: bool| {
        format!(
            r#"
pipeline:
  transforms:
    - {{type: Create, name: Numbers, config: {{elements: [{{n: 1}}, {{n: 0}}, {{n: 4}}]}}}}
    - type: MapToFields
      name: Invert
      input: Numbers
      config:
        language: sql
        fields: {{inv: "10 / n"}}
        {eh}
    - {{type: WriteToJson, name: Out, input: Invert, config: {{path: "{out}/inv.jsonl"}}}}
    {errors}
"#,
            out = out.display(),
            eh = if error_handling {
                "error_handling: {output: bad}"
            } else {
                ""
            },
            errors = if error_handling {
                format!(
                    "- {{type: WriteToJson, name: Errors, input: Invert.bad, config: {{path: \"{}/bad.jsonl\"}}}}",
                    out.display()
                )
            } else {
                String::new()
            }
        )
    };
    let f = dir.path().join("poison.yaml");
    std::fs::write(&f, pipeline(false)).unwrap();
    let o = riverbank(&["run", f.to_str().unwrap(), "--workers", "2"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("job failed"), "{err}");
    assert!(err.contains("failed 4 times"), "{err}");
    assert!(err.contains("Invert"), "{err}");
    assert!(
        !out.exists() || std::fs::read_dir(&out).unwrap().next().is_none(),
        "no output"
    );

    std::fs::write(&f, pipeline(true)).unwrap();
    let o = riverbank(&["run", f.to_str().unwrap(), "--workers", "2"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let bad = std::fs::read_to_string(out.join("bad.jsonl-00000-of-00001")).unwrap();
    assert_eq!(bad.lines().count(), 1, "{bad}");
    assert!(bad.contains("\"n\":0"), "{bad}");
    let good = std::fs::read_to_string(out.join("inv.jsonl-00000-of-00001")).unwrap();
    assert_eq!(good.lines().count(), 2, "{good}");
}

#[test]
fn a_file_ten_times_larger_is_rebalanced_across_idle_workers() {
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let opts = riverbank_datagen::TaxiOptions::new(4, Some(2000), 7);
    for day in 0..4u32 {
        let batch = riverbank_datagen::taxi_day(&opts, day).unwrap();
        let copies = if day == 0 { 10 } else { 1 };
        let file = std::fs::File::create(data.join(format!("day-{day}.parquet"))).unwrap();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(2000))
            .build();
        let mut w = ArrowWriter::try_new(file, batch.schema(), Some(props)).unwrap();
        for _ in 0..copies {
            w.write(&batch).unwrap();
        }
        w.close().unwrap();
    }
    let local = run_local(&data, &dir.path().join("local"));
    let out = dir.path().join("out");
    let plan = taxi_plan(dir.path(), &data, &out);
    // One item per final partition, so each worker's count of items shows its share.
    let extra = ["--bundle-delay-ms", "100", "--coalesce-partitions-mb", "0"];
    let c = Cluster::start(dir.path(), plan, 2, &extra);
    let end = c.wait_done();
    assert_eq!(end["phase"], "Done", "{end}");
    let summary = c.get("/v1/summary").unwrap();
    assert!(
        summary["dynamic_splits"].as_u64().unwrap_or(0) >= 1,
        "the big file was never split: {summary}"
    );
    let per_worker = summary["items_per_worker"].as_object().unwrap();
    assert_eq!(per_worker.len(), 2, "{summary}");
    for (w, n) in per_worker {
        assert!(n.as_u64().unwrap() >= 3, "{w} did little: {summary}");
    }
    assert!(outputs(&out) == local, "rebalancing changed the results");
}

#[test]
fn local_autoscaling_adds_workers_while_work_remains() {
    let dir = tempfile::tempdir().unwrap();
    let data = taxi_data(dir.path(), 4, 40_000);
    // 96 files: enough work that one worker is still busy when the engine looks.
    for copy in 1..24 {
        for day in 1..=4 {
            let f = data.join(format!("yellow_tripdata_2024-01-0{day}.parquet"));
            std::fs::copy(&f, data.join(format!("copy{copy}-{day}.parquet"))).unwrap();
        }
    }
    let local = run_local(&data, &dir.path().join("local"));
    let out = dir.path().join("out");
    // Every bundle keeps a core busy for 100 ms: the job outlasts several of the engine's
    // decisions (and shows the CPU it needs to scale up) however fast or loaded the machine is.
    let err = run_autoscaled(
        &taxi_yaml(),
        &vars(&data, &out),
        &["--bundle-busy-ms", "100"],
    );
    let up = err
        .lines()
        .find(|l| l.starts_with("autoscale: 1 -> "))
        .unwrap_or_else(|| panic!("no scale-up decision: {err}"));
    assert!(up.contains("ScaleToRemainingWork"), "{up}");
    assert_added_worker_took_work(&err);
    assert!(outputs(&out) == local, "autoscaling changed the results");
}

/// `run --workers 1 --autoscale --max-workers 3` with the engine's clock ×120 (a decision every
/// 30 engine seconds is one every quarter second; a second of work left is two worker-minutes);
/// returns stderr, with the decisions and the summary.
fn run_autoscaled(pipeline: &Path, vars: &str, extra: &[&str]) -> String {
    let mut args = vec![
        "run",
        pipeline.to_str().unwrap(),
        "--workers",
        "1",
        "--autoscale",
        "--max-workers",
        "3",
        "--autoscale-time-scale",
        "120",
        "--jinja-variables",
        vars,
    ];
    args.extend_from_slice(extra);
    let o = riverbank(&args);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "{err}");
    err
}

fn assert_added_worker_took_work(stderr: &str) {
    let per_worker = stderr
        .lines()
        .find(|l| l.starts_with("work items per worker"))
        .unwrap();
    assert!(
        per_worker.contains("worker-1"),
        "the added worker took work: {per_worker}"
    );
}

/// A shuffle-free job whose backlog rises, then shrinks to one item: the worker count follows it
/// up, then falls back. 24 one-bundle files, then one file of four bundles that cannot be split
/// (a single text range) and is leased last; every bundle keeps a core busy for 600 ms (the
/// tail then lasts 2.4 s: long enough for the engine to see it on a loaded machine).
#[test]
fn local_autoscaling_scales_up_with_the_backlog_then_falls_back() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let rows = |from: u64, n: u64| -> String {
        let mut text = String::from("id,value\n");
        for i in from..from + n {
            text += &format!("{i},{}\n", i % 97);
        }
        text
    };
    for f in 0..24 {
        std::fs::write(data.join(format!("a{f:02}.csv")), rows(f * 100, 100)).unwrap();
    }
    // 4 × 65536 rows (the bundle size) in 2.5 MiB: one 4 MiB text range.
    std::fs::write(data.join("z_tail.csv"), rows(10_000, 4 * 65_536)).unwrap();
    let pipeline = dir.path().join("etl.yaml");
    std::fs::write(
        &pipeline,
        r#"pipeline:
  type: chain
  transforms:
    - type: ReadFromCsv
      config: {path: "{{ input }}"}
    - type: Filter
      config: {language: sql, keep: "value < 90"}
    - type: MapToFields
      config: {language: sql, fields: {id: id, double: "value * 2"}}
    - type: WriteToJson
      config: {path: "{{ output }}/rows"}
"#,
    )
    .unwrap();
    let vars = |out: &Path| {
        serde_json::json!({"input": format!("{}/*.csv", data.display()), "output": out.display().to_string()})
            .to_string()
    };
    let local_out = dir.path().join("local");
    let o = riverbank(&[
        "run",
        pipeline.to_str().unwrap(),
        "--jinja-variables",
        &vars(&local_out),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = dir.path().join("out");
    let err = run_autoscaled(&pipeline, &vars(&out), &["--bundle-busy-ms", "300"]);
    // "autoscale: 1 -> 3 workers (ScaleToRemainingWork): …"
    let decisions: Vec<(u32, u32, &str)> = err
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("autoscale: ")?;
            let (from, rest) = rest.split_once(" -> ")?;
            let (to, _) = rest.split_once(' ')?;
            Some((from.parse().ok()?, to.parse().ok()?, l))
        })
        .collect();
    let up = decisions
        .iter()
        .position(|d| d.1 > d.0)
        .unwrap_or_else(|| panic!("no scale-up: {err}"));
    assert!(decisions[up].2.contains("ScaleToRemainingWork"), "{err}");
    let down = decisions[up..]
        .iter()
        .find(|d| d.1 < d.0)
        .unwrap_or_else(|| panic!("never fell back: {err}"));
    // Sized by what is left to run; nothing on the departing workers' disks is needed.
    assert!(
        down.2.contains("ScaleToRemainingWork") && down.2.contains("no shuffle data to keep"),
        "{}",
        down.2
    );
    assert_added_worker_took_work(&err);
    assert!(
        outputs(&out) == outputs(&local_out),
        "autoscaling changed the results"
    );
}

/// Waits until `parent` has a child in `role` other than `old` (the launcher restarted it).
fn replacement(parent: u32, role: &str, old: i32, within: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < within {
        if children_of(parent)
            .iter()
            .any(|(pid, r)| r == role && *pid != old)
        {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

/// The coordinator's port of a `run --workers` whose work directory is under `base`.
fn launcher_port(base: &Path, within: Duration) -> u16 {
    let start = Instant::now();
    loop {
        let found = std::fs::read_dir(base).ok().and_then(|d| {
            d.flatten()
                .map(|e| e.path().join("coordinator.addr"))
                .find_map(|f| std::fs::read_to_string(f).ok())
        });
        if let Some(addr) = found {
            return addr.rsplit(':').next().unwrap().trim().parse().unwrap();
        }
        assert!(start.elapsed() < within, "the coordinator never listened");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// xorshift64*: a replayable sequence from the printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// One Parquet file of 40 row groups (a large file in miniature: split into work items and
/// rebalanced dynamically while workers die).
fn one_file_many_row_groups(dir: &Path) -> PathBuf {
    let data = dir.join("data");
    let out = riverbank(&[
        "generate",
        "taxi",
        "--days",
        "4",
        "--rows-per-day",
        "25000",
        "--row-group-rows",
        "2500",
        "--format",
        "parquet",
        "--out",
        data.join("trips.parquet").to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    data
}

/// `riverbank run --workers N` as a child, its work directory under `work`, stderr to a file.
fn launch(pipeline_vars: &str, workers: usize, work: &Path, extra: &[&str]) -> Child {
    std::fs::create_dir_all(work).unwrap();
    let log = std::fs::File::create(work.join("stderr.log")).unwrap();
    Command::new(BIN)
        .args(["run", taxi_yaml().to_str().unwrap(), "--workers"])
        .arg(workers.to_string())
        .args([
            "--jinja-variables",
            pipeline_vars,
            "--no-progress",
            "--spill-dir",
        ])
        .arg(work)
        .args(extra)
        .env("RIVERBANK_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// Waits for a launched run to end, at most `within`; its exit status and stderr.
fn finish(mut run: Child, work: &Path, within: Duration) -> (std::process::ExitStatus, String) {
    let start = Instant::now();
    let status = loop {
        if let Some(s) = run.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > within {
            let _ = run.kill();
            let _ = run.wait();
            let log = std::fs::read_to_string(work.join("stderr.log")).unwrap_or_default();
            panic!("the run did not end within {within:?}: {log}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let log = std::fs::read_to_string(work.join("stderr.log")).unwrap_or_default();
    (status, log)
}

/// Twenty SIGKILLs of random workers at random moments (read, shuffle and final stages), each
/// restarted under its own name by the launcher as a StatefulSet would, then a SIGKILL of the
/// coordinator: the output is byte-identical to the in-process run and the job ends within a
/// bound proportional to its normal time. The seed is printed; `RIVERBANK_SOAK_SEED` replays.
#[test]
fn kill_soak_twenty_worker_kills_and_a_coordinator_kill_change_nothing() {
    let seed = std::env::var("RIVERBANK_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("kill soak: seed {seed} (replay with RIVERBANK_SOAK_SEED={seed})");
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().unwrap();
    let data = one_file_many_row_groups(dir.path());
    // 48 partitions in the final stages, which last long enough to be killed in (coalesced
    // into few items, each running its partitions one after another).
    let partitions = ["--shuffle-partitions", "24"];
    let local = run_local_with(&data, &dir.path().join("local"), &partitions);
    // Long enough for twenty kills and their restarts while the job runs.
    let slow = ["--bundle-delay-ms", "400", "--shuffle-partitions", "24"];

    // The normal time of the same run, undisturbed.
    let calm_out = dir.path().join("calm-out");
    let began = Instant::now();
    let calm = launch(&vars(&data, &calm_out), 3, &dir.path().join("calm"), &slow);
    let (status, log) = finish(calm, &dir.path().join("calm"), Duration::from_secs(120));
    assert!(status.success(), "{log}");
    let normal = began.elapsed();
    assert!(outputs(&calm_out) == local);

    let out = dir.path().join("out");
    let work = dir.path().join("soak");
    let began = Instant::now();
    let mut run = launch(&vars(&data, &out), 3, &work, &slow);
    let port = launcher_port(&work, Duration::from_secs(60));
    let mut kills: Vec<(String, String, Duration)> = vec![];
    // Ten deaths of the worker running one item is the tracker's sign of a crash loop on that
    // item (MAX_WORKER_LOSSES: the job fails, as it should); a restarted worker usually takes
    // its own item back, so the same worker is never killed twice in a row.
    let soak_deadline = Instant::now() + normal * 4 + Duration::from_secs(60);
    while kills.len() < 20 {
        if let Some(ended) = run.try_wait().unwrap() {
            let log = std::fs::read_to_string(work.join("stderr.log")).unwrap_or_default();
            panic!(
                "the run ended after {} kills (seed {seed}): {ended:?}: {log}",
                kills.len()
            );
        }
        assert!(
            Instant::now() < soak_deadline,
            "only {} kills before the deadline (seed {seed})",
            kills.len()
        );
        // Twelve kills while the source stage reads, eight in the shuffle and final stages.
        let reading = kills.len() < 12;
        let pause = if reading {
            100 + rng.below(250)
        } else {
            60 + rng.below(150)
        };
        std::thread::sleep(Duration::from_millis(pause));
        let Some(status) = http_get(port, "/v1/status") else {
            continue;
        };
        let states: Vec<&str> = status["stages"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|st| st["state"].as_str().unwrap_or("?"))
            .collect();
        assert!(
            states.iter().any(|s| *s != "Done"),
            "the job ended after only {} kills: make it longer",
            kills.len()
        );
        if !reading && states[0] != "Done" {
            continue;
        }
        let last = kills.last().map(|k| k.0.as_str());
        let workers: Vec<(i32, String)> = children_of(run.id())
            .into_iter()
            .filter(|(_, r)| r != "coordinator" && Some(r.as_str()) != last)
            .collect();
        if workers.is_empty() {
            continue; // all being restarted
        }
        let (pid, name) = workers[rng.below(workers.len() as u64) as usize].clone();
        let stage = states.join("/");
        signal(pid, libc::SIGKILL);
        let back = replacement(run.id(), &name, pid, Duration::from_secs(10));
        let Some(back) = back else {
            let ended = run.try_wait().unwrap();
            let log = std::fs::read_to_string(work.join("stderr.log")).unwrap_or_default();
            panic!(
                "{name} was not restarted after kill {} (seed {seed}; run ended: {ended:?}): {log}",
                kills.len() + 1
            );
        };
        kills.push((name, stage, back));
    }
    let (coordinator, _) = children_of(run.id())
        .into_iter()
        .find(|(_, r)| r == "coordinator")
        .expect("the coordinator runs");
    signal(coordinator, libc::SIGKILL);
    let coordinator_back = replacement(
        run.id(),
        "coordinator",
        coordinator,
        Duration::from_secs(10),
    )
    .unwrap_or_else(|| panic!("the coordinator was not restarted (seed {seed})"));
    let bound = normal * 4 + Duration::from_secs(30);
    let (status, log) = finish(run, &work, bound);
    let total = began.elapsed();
    assert!(status.success(), "seed {seed}: {log}");
    assert!(
        outputs(&out) == local,
        "seed {seed}: results changed after the kills"
    );
    let restarts: Vec<f64> = kills.iter().map(|k| k.2.as_secs_f64() * 1e3).collect();
    eprintln!(
        "kill soak: {} worker kills (stages at each kill: {}), restart latency {:.0}-{:.0} ms (mean {:.0} ms); coordinator back in {:.0} ms; total {:.1} s against {:.1} s undisturbed",
        kills.len(),
        kills
            .iter()
            .map(|k| k.1.as_str())
            .collect::<Vec<_>>()
            .join(" "),
        restarts.iter().cloned().fold(f64::MAX, f64::min),
        restarts.iter().cloned().fold(0.0, f64::max),
        restarts.iter().sum::<f64>() / restarts.len() as f64,
        coordinator_back.as_secs_f64() * 1e3,
        total.as_secs_f64(),
        normal.as_secs_f64(),
    );
}

/// A worker stopped (SIGSTOP) for longer than its lease, then resumed: the coordinator re-ran
/// its work elsewhere, its late reports are rejected, and nothing is doubled.
#[test]
fn a_worker_stopped_past_its_lease_then_resumed_doubles_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = one_file_many_row_groups(dir.path());
    let local = run_local(&data, &dir.path().join("local"));
    let out = dir.path().join("out");
    let work = dir.path().join("run");
    let run = launch(&vars(&data, &out), 2, &work, &["--bundle-delay-ms", "200"]);
    let port = launcher_port(&work, Duration::from_secs(60));
    let busy = Instant::now();
    let victim = loop {
        let s = http_get(port, "/v1/status");
        let name = s.as_ref().and_then(|s| {
            s["workers"].as_array()?.iter().find_map(|w| {
                (w["itemsRunning"].as_u64() > Some(0))
                    .then(|| w["name"].as_str().unwrap().to_string())
            })
        });
        if let Some(n) = name {
            break n;
        }
        assert!(
            busy.elapsed() < Duration::from_secs(60),
            "no worker got busy"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let (pid, _) = children_of(run.id())
        .into_iter()
        .find(|(_, r)| *r == victim)
        .unwrap();
    signal(pid, libc::SIGSTOP);
    // The launcher's lease timeout is 3 s: past it, the coordinator re-runs the work elsewhere.
    std::thread::sleep(Duration::from_millis(4500));
    signal(pid, libc::SIGCONT);
    let (status, log) = finish(run, &work, Duration::from_secs(120));
    assert!(status.success(), "{log}");
    assert!(
        log.contains("missed its lease"),
        "the coordinator noticed the stopped worker: {log}"
    );
    assert!(
        outputs(&out) == local,
        "a resumed worker's late results changed the output"
    );
}

/// Waits for `child` to exit, at most `within`; how long it took.
fn exits_within(child: &mut Child, within: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < within {
        if child.try_wait().unwrap().is_some() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// Pods are stopped with SIGTERM and killed after their grace period: a worker or coordinator
/// must go at once in every phase (as PID 1 a signal without a handler is ignored). Here: a
/// worker whose coordinator is not there yet, a worker and a coordinator idling after the job
/// is Done (the operator scales the StatefulSets to zero then).
#[test]
fn coordinator_and_workers_exit_promptly_on_sigterm_in_every_phase() {
    let dir = tempfile::tempdir().unwrap();
    let data = taxi_data(dir.path(), 2, 2000);
    let out = dir.path().join("out");
    let plan = taxi_plan(dir.path(), &data, &out);
    let grace = Duration::from_secs(5);

    // A worker waiting for a coordinator that does not answer.
    let mut lonely = Command::new(BIN)
        .arg("worker")
        .args(["--coordinator", &format!("127.0.0.1:{}", free_port())])
        .arg("--plan")
        .arg(&plan)
        .args(["--bind", "127.0.0.1", "--port", "0", "--name", "lonely"])
        .arg("--data-dir")
        .arg(dir.path().join("lonely"))
        .env("RIVERBANK_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    signal(lonely.id() as i32, libc::SIGTERM);
    assert!(
        exits_within(&mut lonely, grace).is_some(),
        "a worker waiting for its coordinator ignored SIGTERM"
    );

    // Pod mode: neither process exits by itself when the job is over.
    let mut c = Cluster::start(dir.path(), plan, 0, &[]);
    let mut worker = Command::new(BIN)
        .arg("worker")
        .args(["--coordinator", &format!("127.0.0.1:{}", c.port)])
        .arg("--plan")
        .arg(&c.plan)
        .args(["--bind", "127.0.0.1", "--port", "0", "--name", "pod-0"])
        .arg("--data-dir")
        .arg(dir.path().join("pod-0"))
        .env("RIVERBANK_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let end = c.wait_done();
    assert_eq!(end["phase"], "Done", "{end}");
    std::thread::sleep(Duration::from_millis(700));
    assert!(
        worker.try_wait().unwrap().is_none(),
        "a pod's worker stays up after the job"
    );
    signal(worker.id() as i32, libc::SIGTERM);
    let took = exits_within(&mut worker, grace);
    assert!(took.is_some(), "the idle worker ignored SIGTERM after Done");
    assert!(worker.wait().unwrap().success());
    let coordinator = c.coordinator.as_mut().unwrap();
    signal(coordinator.id() as i32, libc::SIGTERM);
    assert!(
        exits_within(coordinator, grace).is_some(),
        "the coordinator ignored SIGTERM after Done"
    );
    // Restarted (the pod rescheduled), it replays the finished job and still goes at once.
    c.start_coordinator();
    let again = c.wait_for("the restarted coordinator to answer", |_| true);
    assert_eq!(again["phase"], "Done", "{again}");
    let coordinator = c.coordinator.as_mut().unwrap();
    signal(coordinator.id() as i32, libc::SIGTERM);
    assert!(
        exits_within(coordinator, grace).is_some(),
        "a coordinator restarted after Done ignored SIGTERM"
    );
    assert!(outputs(&out).len() == 2);
}

/// Dataflow's insights from a real run on worker processes, as the coordinator's /v1/status
/// reports the signals: a fused Explode emitting 20 elements per order (HIGH_FAN_OUT, naming the
/// stage and transform), and one CSV file of eight bundles in a single text range that cannot
/// be split, among one-bundle files (LONG_WORK_ITEM, against the stage's median item). Every
/// bundle sleeps 600 ms, so the long item runs about eight times the typical one.
#[test]
fn insights_of_a_local_run_name_the_fan_out_and_the_long_work_item() {
    let dir = tempfile::tempdir().unwrap();
    let orders = dir.path().join("orders");
    let rows = dir.path().join("rows");
    std::fs::create_dir_all(&orders).unwrap();
    std::fs::create_dir_all(&rows).unwrap();
    let items: Vec<u32> = (1..=20).collect();
    for f in 0..8 {
        let mut text = String::new();
        for i in 0..200 {
            text += &serde_json::json!({"id": f * 1000 + i, "items": items}).to_string();
            text += "\n";
        }
        std::fs::write(orders.join(format!("o{f}.jsonl")), text).unwrap();
    }
    let csv = |from: u64, n: u64| {
        let mut text = String::from("id\n");
        for i in from..from + n {
            text += &format!("{i}\n");
        }
        text
    };
    for f in 0..12 {
        std::fs::write(rows.join(format!("a{f:02}.csv")), csv(f * 100, 100)).unwrap();
    }
    // 8 × 65536 rows (the bundle size) in 3.6 MB: one 4 MiB text range.
    let big = csv(0, 8 * 65_536);
    assert!(big.len() < 4 << 20);
    std::fs::write(rows.join("z_big.csv"), big).unwrap();
    let out = dir.path().join("out");
    let pipeline = dir.path().join("insights.yaml");
    std::fs::write(
        &pipeline,
        format!(
            r#"pipeline:
  transforms:
    - {{type: ReadFromJson, name: Orders, config: {{path: "{orders}/*.jsonl"}}}}
    - {{type: Explode, name: Lines, input: Orders, config: {{fields: items}}}}
    - type: MapToFields
      name: Priced
      input: Lines
      config: {{language: sql, fields: {{id: id, item: items, price: "items * 2"}}}}
    - {{type: WriteToJson, name: LinesOut, input: Priced, config: {{path: "{out}/lines"}}}}
    - {{type: ReadFromCsv, name: Rows, config: {{path: "{rows}/*.csv"}}}}
    - {{type: Filter, name: Kept, input: Rows, config: {{language: sql, keep: "id >= 0"}}}}
    - {{type: WriteToJson, name: RowsOut, input: Kept, config: {{path: "{out}/rows"}}}}
"#,
            orders = orders.display(),
            rows = rows.display(),
            out = out.display()
        ),
    )
    .unwrap();
    let o = riverbank(&[
        "run",
        pipeline.to_str().unwrap(),
        "--workers",
        "2",
        "--slots",
        "1",
        "--bundle-delay-ms",
        "600",
        "--long-work-item-secs",
        "1.5",
    ]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "{err}");
    let line = |code: &str| {
        err.lines()
            .find(|l| l.starts_with(&format!("insight {code} at ")))
            .unwrap_or_else(|| panic!("no {code} insight: {err}"))
            .to_string()
    };
    let fan_out = line("HIGH_FAN_OUT");
    // Raised as soon as enough orders were read (at least 10 000 elements out).
    assert!(
        fan_out.contains("High fan-out detected: in stage S00 (Orders … LinesOut), Lines emitted ")
            && fan_out.contains(" received (20×) and is fused with Priced"),
        "{fan_out}"
    );
    let long = line("LONG_WORK_ITEM");
    assert!(
        long.contains("Stage spending too long on work: work item")
            && long.contains("of stage S01 (Rows … RowsOut) on worker-")
            && long.contains("the stage's median item"),
        "{long}"
    );
    // The final summary repeats them with their recommendations.
    let summary = err
        .split("\ninsights:\n")
        .nth(1)
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        summary.contains("recommendation: Insert a Reshuffle after Lines (a `type: Reshuffle` transform with `input: Lines`, read by Priced)"),
        "{summary}"
    );
    assert!(summary.contains("LONG_WORK_ITEM (from "), "{summary}");
    let lines: usize = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("lines")
        })
        .map(|p| std::fs::read_to_string(p).unwrap().lines().count())
        .sum();
    assert_eq!(lines, 32_000);
}

/// `run --workers 2 --memory-mb 32 --max-memory-mb 1024`: each worker process may use 32 MiB,
/// which the binary alone exceeds, so a worker is killed as the kernel's OOM killer kills a pod
/// over its limit; the workers' memory grows by the operator's step (32 -> 128 MiB, whole
/// 128 MiB grains), the killed worker starts again at that size and its items run again there,
/// the WORKER_OUT_OF_MEMORY insight says so, and the results are the in-process run's.
#[test]
fn a_worker_over_its_memory_limit_is_killed_and_the_job_finishes_on_bigger_workers() {
    let dir = tempfile::tempdir().unwrap();
    let data = taxi_data(dir.path(), 4, 20_000);
    let local = run_local(&data, &dir.path().join("local"));
    let out = dir.path().join("out");
    let v = vars(&data, &out);
    let yaml = taxi_yaml();
    let o = riverbank(&[
        "run",
        yaml.to_str().unwrap(),
        "--jinja-variables",
        &v,
        "--workers",
        "2",
        "--bundle-delay-ms",
        "100",
        "--memory-mb",
        "32",
        "--max-memory-mb",
        "1024",
    ]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "{err}");
    let kill = err
        .lines()
        .find(|l| l.starts_with("memory: worker-"))
        .unwrap_or_else(|| panic!("no worker was killed for memory: {err}"));
    assert!(
        kill.contains("over its 32 MiB memory limit (OOMKilled); workers' memory 32 -> 128 MiB (maximum 1024 MiB)"),
        "{kill}"
    );
    assert!(
        err.contains("WORKER_OUT_OF_MEMORY (from ")
            && err.contains("recommendation: The workers' memory was raised to "),
        "{err}"
    );
    assert!(outputs(&out) == local, "the kills changed the results");
}

/// Without `--max-memory-mb` the workers' memory cannot grow: a worker over its limit is
/// killed and started again at the same size, each kill says so, and after ten the run gives up
/// rather than loop for ever (as the tracker fails a job whose item was lost ten times).
#[test]
fn workers_out_of_memory_at_their_maximum_make_the_run_give_up() {
    let dir = tempfile::tempdir().unwrap();
    let data = taxi_data(dir.path(), 2, 5_000);
    let v = vars(&data, &dir.path().join("out"));
    let yaml = taxi_yaml();
    let o = riverbank(&[
        "run",
        yaml.to_str().unwrap(),
        "--jinja-variables",
        &v,
        "--workers",
        "2",
        "--memory-mb",
        "16",
        // Many small items, so the job cannot finish in the lives of its killed workers.
        "--shuffle-partitions",
        "32",
        "--coalesce-partitions-mb",
        "0",
    ]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(!o.status.success(), "{err}");
    let kills = err
        .lines()
        .filter(|l| {
            l.starts_with("memory: worker-")
                && l.ends_with(
                    "workers' memory is at its maximum (16 MiB): restarted at the same size",
                )
        })
        .count();
    assert_eq!(kills, 10, "{err}");
    assert!(
        err.contains("error: workers keep running out of memory at their maximum of 16 MiB"),
        "{err}"
    );
}

/// STUCK from a real run: one work item (a CSV file of eight bundles in one text range, which
/// cannot be split; every bundle sleeps 400 ms) on one worker, whose process is killed with
/// SIGKILL whenever it has been running that item for a moment. Each kill loses the item's
/// attempt; at the fourth the run reports the item stuck, naming it, its stage and how often it
/// failed; left alone, the item then finishes and the job succeeds.
#[test]
fn a_work_item_lost_again_and_again_is_reported_stuck() {
    let dir = tempfile::tempdir().unwrap();
    let rows = dir.path().join("rows");
    std::fs::create_dir_all(&rows).unwrap();
    let mut text = String::from("id\n");
    for i in 0..8 * 65_536 {
        text += &format!("{i}\n");
    }
    std::fs::write(rows.join("big.csv"), text).unwrap();
    let pipeline = dir.path().join("stuck.yaml");
    std::fs::write(
        &pipeline,
        format!(
            "pipeline:\n  transforms:\n    - {{type: ReadFromCsv, name: Rows, config: {{path: \"{}/*.csv\"}}}}\n    - {{type: WriteToJson, name: Out, input: Rows, config: {{path: \"{}/rows\"}}}}\n",
            rows.display(),
            dir.path().join("out").display()
        ),
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args([
            "run",
            pipeline.to_str().unwrap(),
            "--workers",
            "1",
            "--slots",
            "1",
        ])
        .args(["--bundle-delay-ms", "400", "--no-progress"])
        .env("RIVERBANK_LOG", "warn")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = common::drain_stderr(&mut child);
    let launcher = child.id();
    // Kill the worker four times, each time once it has run the item for a second.
    let mut killed = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last: Option<i32> = None;
    while killed < 4 {
        assert!(Instant::now() < deadline, "the worker did not come back");
        let worker = children_of(launcher)
            .into_iter()
            .find(|(pid, role)| role == "worker-0" && Some(*pid) != last);
        if let Some((pid, _)) = worker {
            std::thread::sleep(Duration::from_millis(1200));
            signal(pid, libc::SIGKILL);
            last = Some(pid);
            killed += 1;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = child.wait().unwrap();
    let err = log.join();
    assert!(status.success(), "{err}");
    let stuck = err
        .lines()
        .find(|l| l.starts_with("insight STUCK at "))
        .unwrap_or_else(|| panic!("no STUCK insight: {err}"));
    assert!(
        stuck.contains("Job is stuck due to failed and retried work item: work item ")
            && stuck.contains(" of stage S00 (Rows … Out) failed 4 times and is retried"),
        "{stuck}"
    );
    assert!(
        err.contains("STUCK (from "),
        "the summary repeats it: {err}"
    );
}

/// HOT_KEY from a real run: twenty files hold only the key `hot`, one file fifteen other keys;
/// the combine's partial states are flushed per file, so the hot key's shuffle partition gets
/// most of the shuffled bytes. While the final combine runs (every bundle sleeps 500 ms), the
/// run names the stage and the hot key's share.
#[test]
fn a_key_carrying_most_of_a_combines_input_is_reported_hot() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    std::fs::create_dir_all(&input).unwrap();
    for f in 0..20 {
        let text: String = (0..50)
            .map(|v| format!("{}\n", serde_json::json!({"key": "hot", "v": v})))
            .collect();
        std::fs::write(input.join(format!("h{f:02}.jsonl")), text).unwrap();
    }
    let text: String = (0..15)
        .map(|k| format!("{}\n", serde_json::json!({"key": format!("k{k}"), "v": k})))
        .collect();
    std::fs::write(input.join("others.jsonl"), text).unwrap();
    let pipeline = dir.path().join("hot.yaml");
    std::fs::write(
        &pipeline,
        format!(
            r#"pipeline:
  transforms:
    - {{type: ReadFromJson, name: Events, config: {{path: "{}/*.jsonl"}}}}
    - type: Combine
      name: PerKey
      input: Events
      config: {{group_by: [key], combine: {{total: {{fn: sum, value: v}}}}}}
    - {{type: WriteToJson, name: Out, input: PerKey, config: {{path: "{}/keys"}}}}
"#,
            input.display(),
            dir.path().join("out").display()
        ),
    )
    .unwrap();
    let o = riverbank(&[
        "run",
        pipeline.to_str().unwrap(),
        "--workers",
        "2",
        "--slots",
        "1",
        "--bundle-delay-ms",
        "500",
        // HOT_KEY is judged while the stage runs, from its finished partitions: this small
        // input's partitions would otherwise run coalesced as one item, done only at the end.
        "--coalesce-partitions-mb",
        "0",
    ]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "{err}");
    let hot = err
        .lines()
        .find(|l| l.starts_with("insight HOT_KEY at "))
        .unwrap_or_else(|| panic!("no HOT_KEY insight: {err}"));
    assert!(
        hot.contains(
            "Hot key detected: in stage S01 (PerKey/FinalCombine … Out), one key carries at least "
        ),
        "{hot}"
    );
    assert!(err.contains("recommendation: Spread the hot key"), "{err}");
}
