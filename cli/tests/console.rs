//! The web console in a real browser: `riverbank run --workers 2 --ui` on the taxi example
//! (slowed down so it is seen running), headless Chromium driven by chromedriver over the W3C
//! WebDriver HTTP API; the page's DOM must show the fused stages with their transforms and
//! charts with points. Screenshots go to the target dir (`console-screenshots/`).
//!
//! Needs Debian's `chromium` and `chromium-driver` (`dev/setup.sh` installs them); fails,
//! saying so, where they are not installed.
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_riverbank");

fn find(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}

/// Kills (and reaps) a child when the test ends, passing or not.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A WebDriver session on chromedriver.
struct Browser {
    http: reqwest::Client,
    base: String,
    session: String,
}

impl Browser {
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let mut req = self.http.request(method, &url);
        if let Some(b) = body {
            req = req
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        let text = req.send().await.unwrap().text().await.unwrap();
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(
            v["value"].get("error").is_none(),
            "WebDriver {path}: {}",
            v["value"]
        );
        v["value"].clone()
    }

    async fn start(base: String, user_data: &Path) -> Browser {
        let http = reqwest::Client::new();
        // chromedriver answers /status once it listens.
        let deadline = Instant::now() + Duration::from_secs(30);
        while http.get(format!("{base}/status")).send().await.is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--window-size=1400,1800",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([format!("--user-data-dir={}", user_data.display())])
        .collect::<Vec<_>>();
        let caps = json!({"capabilities": {"alwaysMatch": {"browserName": "chrome",
            "goog:chromeOptions": {"binary": find("chromium").unwrap(), "args": args}}}});
        let text = http
            .post(format!("{base}/session"))
            .header("content-type", "application/json")
            .body(caps.to_string())
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        let session = v["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {text}"))
            .to_string();
        Browser {
            http,
            base,
            session,
        }
    }

    async fn go(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", Some(json!({"url": url})))
            .await;
    }

    /// Runs `script` (a function body returning JSON-able data) in the page.
    async fn eval(&self, script: &str) -> Value {
        self.call(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
        .await
    }

    /// Evaluates `script` until `ok` holds of its result (the page polls every second).
    async fn wait_for(&self, what: &str, script: &str, ok: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let v = self.eval(script).await;
            if ok(&v) {
                return v;
            }
            assert!(Instant::now() < deadline, "{what}: the page shows {v}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn screenshot(&self, file: &Path) {
        let b64 = self.call(reqwest::Method::GET, "/screenshot", None).await;
        let png = decode_base64(b64.as_str().unwrap());
        assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
        std::fs::write(file, png).unwrap();
    }

    async fn quit(&self) {
        let _ = self
            .http
            .delete(format!("{}/session/{}", self.base, self.session))
            .send()
            .await;
    }
}

fn decode_base64(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let bytes: Vec<u8> = s.bytes().filter(|c| *c != b'=' && *c != b'\n').collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let v: Vec<u32> = chunk.iter().map(|c| val(*c) as u32).collect();
        let n = v
            .iter()
            .enumerate()
            .fold(0u32, |a, (i, x)| a | x << (18 - 6 * i));
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

/// Stage boxes (id, state, the transforms listed) and the charts' point counts of the job page.
/// JavaScript that builds `out`: the stage boxes (id, state, the transforms listed), the
/// charts' lines (their point counts, and the vertices actually drawn) and the page's state.
macro_rules! page_script_body {
    () => {
        r#"
const stages = [...document.querySelectorAll('#graph g.stage')].map(g => ({
  id: g.dataset.stage, state: g.dataset.state,
  components: [...g.querySelectorAll('text.component')].map(t => t.textContent)}));
const charts = {};
document.querySelectorAll('svg.chart').forEach(svg => {
  charts[svg.dataset.chart] = [...svg.querySelectorAll('polyline')].map(l => ({
    series: l.dataset.series, points: Number(l.dataset.points),
    drawn: l.getAttribute('points').trim().split(/\s+/).filter(p => p.includes(',')).length}));
});
const out = {stages, charts, edges: document.querySelectorAll('#graph g.shuffle').length,
  state: (document.querySelector('h1 .state') || {}).textContent};
"#
    };
}

const PAGE_SCRIPT_BODY: &str = page_script_body!();
const PAGE_SCRIPT: &str = concat!(page_script_body!(), "return out;");

/// `riverbank run … --ui --ui-port 0` started, its stderr read on a thread; its console's URL.
struct Run {
    child: Killed,
    url: String,
    stderr: std::thread::JoinHandle<String>,
}

impl Run {
    fn start(args: &[&str]) -> Run {
        let mut child = Killed(
            Command::new(BIN)
                .arg("run")
                .args(args)
                .args(["--ui", "--ui-port", "0", "--no-progress"])
                .env("RIVERBANK_LOG", "warn")
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let (tx, rx) = mpsc::channel();
        let stderr = child.0.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut all = String::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line.clone());
                all.push_str(&line);
                all.push('\n');
            }
            all
        });
        let url = loop {
            let line = rx
                .recv_timeout(Duration::from_secs(60))
                .expect("the run prints its console address");
            if let Some(u) = line.strip_prefix("console: ") {
                break u.to_string();
            }
        };
        assert!(
            url.starts_with("http://127.0.0.1:"),
            "bound to loopback: {url}"
        );
        Run { child, url, stderr }
    }

    /// Waits for the run to end by itself; its stderr.
    fn finish(mut self) -> String {
        let status = self.child.0.wait().unwrap();
        let stderr = self.stderr.join().unwrap();
        assert!(status.success(), "{stderr}");
        stderr
    }
}

/// chromedriver on a free port, and where screenshots go; fails without chromium and
/// chromedriver.
fn driver() -> (Killed, String, PathBuf) {
    let (Some(driver), Some(_)) = (find("chromedriver"), find("chromium")) else {
        panic!(
            "chromium and chromedriver are not installed (apt-get install chromium chromium-driver; dev/setup.sh does)"
        );
    };
    let port = free_port();
    let child = Killed(
        Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    (child, format!("http://127.0.0.1:{port}"), shots)
}

#[test]
fn the_console_shows_the_stage_graph_and_charts_of_a_running_job_in_chromium() {
    let (_driver, driver_url, shots) = driver();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let generated = Command::new(BIN)
        .args(["generate", "taxi", "--days", "4", "--rows-per-day", "20000"])
        .args(["--format", "parquet", "--out"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(
        generated.status.success(),
        "{}",
        String::from_utf8_lossy(&generated.stderr)
    );
    let vars = json!({"input": format!("{}/*.parquet", data.display()),
        "output": dir.path().join("out").display().to_string()})
    .to_string();
    let taxi = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/taxi/taxi.yaml");
    // Two workers, every bundle slowed down: about 10 s of running job to look at. Each has
    // 32 MiB, less than the binary alone: one is killed at once and the workers' memory grows,
    // which the page shows as an insight badge and an Event.
    let run = Run::start(&[
        taxi.to_str().unwrap(),
        "--jinja-variables",
        &vars,
        "--workers",
        "2",
        "--bundle-delay-ms",
        "1000",
        "--memory-mb",
        "32",
        "--max-memory-mb",
        "1024",
    ]);
    let url = run.url.clone();
    let root = url.split("/jobs/").next().unwrap().to_string();

    let profile = dir.path().join("chromium-profile");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let b = Browser::start(driver_url, &profile).await;
        b.go(&url).await;
        let page = b
            .wait_for("a running job with points on its charts", PAGE_SCRIPT, |v| {
                v["state"] == "Running"
                    && v["charts"]["workers"][0]["points"].as_u64() >= Some(3)
                    && v["stages"].as_array().is_some_and(|s| s.len() == 3)
            })
            .await;
        b.screenshot(&shots.join("job.png")).await;
        let shown = b
            .eval(
                "return {badges: [...document.querySelectorAll('h1 .badge')].map(b => b.textContent), \
                 insights: [...document.querySelectorAll('#insights .insight')].map(i => i.dataset.insight), \
                 events: [...document.querySelectorAll('#events tbody tr')].map(r => r.innerText)}",
            )
            .await;
        assert_eq!(shown["badges"], json!(["WORKER_OUT_OF_MEMORY"]), "{shown}");
        assert_eq!(shown["insights"], json!(["WORKER_OUT_OF_MEMORY"]), "{shown}");
        assert!(
            shown["events"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e.as_str().unwrap().contains("OOMKilled")),
            "{shown}"
        );
        let stages = page["stages"].as_array().unwrap();
        let ids: Vec<&str> = stages.iter().map(|s| s["id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["S00", "S01", "S02"], "{page}");
        let components = |i: usize| -> Vec<String> {
            serde_json::from_value(stages[i]["components"].clone()).unwrap()
        };
        for want in ["ReadTrips", "Valid", "SumPerZone/PartialCombine", "CountPerWindow/PartialCombine"] {
            assert!(components(0).iter().any(|c| c == want), "S00 lacks {want}: {page}");
        }
        assert!(
            (1..3).any(|i| components(i).iter().any(|c| c == "SumPerZone/FinalCombine")),
            "{page}"
        );
        assert_eq!(page["edges"], 2, "two shuffles: {page}");
        // Each chart line has as many drawn vertices as it says, and the worker count line
        // has the two workers' samples.
        for chart in ["workers", "throughput", "backlog", "cpu", "memory"] {
            let lines = page["charts"][chart].as_array().unwrap_or_else(|| panic!("no {chart} chart: {page}"));
            assert!(!lines.is_empty(), "{chart}: {page}");
            for l in lines {
                assert_eq!(l["points"], l["drawn"], "{chart}: {page}");
            }
        }
        assert!(page["charts"]["cpu"].as_array().unwrap().len() == 2, "a CPU line per worker: {page}");
        let workers = b
            .eval("return [...document.querySelectorAll('svg[data-chart=workers] polyline[data-series=current]')].map(l => l.getAttribute('points'))")
            .await;
        let ys: Vec<&str> = workers[0].as_str().unwrap().split_whitespace().collect();
        assert!(ys.len() >= 3, "{workers}");

        // The job list, as `kubectl get dfj` would list it.
        b.go(&root).await;
        let row = b
            .wait_for(
                "the job in the list",
                "const r = document.querySelector('tr[data-job=\"local/nyc-taxi\"]'); return r ? r.innerText : null",
                |v| v.is_string(),
            )
            .await;
        b.screenshot(&shots.join("jobs.png")).await;
        assert!(row.as_str().unwrap().contains("nyc-taxi"), "{row}");
        b.quit().await;
    });
    run.finish();
    eprintln!("screenshots in {}", shots.display());
}

/// `run --workers 2 --ui` of a keyed count per 10-s window of a 500/s synthetic stream, with
/// `options` (YAML lines) added to its options.
fn stream_run(dir: &Path, options: &str) -> Run {
    stream_run_with(dir, options, &["--workers", "2"])
}

fn stream_run_with(dir: &Path, options: &str, args: &[&str]) -> Run {
    let pipeline = dir.join("stream.yaml");
    std::fs::write(
        &pipeline,
        format!(
            r#"pipeline:
  type: chain
  transforms:
    - type: ReadFromSynthetic
      config: {{rate: 500, keys: 5, partitions: 2}}
    - type: WindowInto
      windowing: {{type: fixed, size: 10s}}
    - type: Combine
      name: CountPerKey
      config: {{group_by: key, combine: {{events: {{fn: count}}}}}}
    - type: WriteToJson
      config: {{path: {}/counts.jsonl}}
options:
  streaming: true
{options}"#,
            dir.join("out").display()
        ),
    )
    .unwrap();
    let mut all = vec![pipeline.to_str().unwrap()];
    all.extend(args);
    Run::start(&all)
}

/// `run --ui` of a stream without `--workers`: it runs on one worker process beside its
/// coordinator, whose console shows the stream's checkpoints and watermark; Ctrl-C drains it.
#[test]
fn a_stream_run_with_the_console_and_no_workers_runs_on_one_worker() {
    let dir = tempfile::tempdir().unwrap();
    let run = stream_run_with(dir.path(), "  checkpointIntervalSec: 0.5\n", &[]);
    let api = run.url.replace("/jobs/", "/api/jobs/");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let http = reqwest::Client::new();
    let last = rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = http.get(&api).send().await
                && let Ok(v) = serde_json::from_str::<Value>(&r.text().await.unwrap())
                && v["progress"]["streaming"]["checkpoint"].as_u64() >= Some(3)
            {
                return v;
            }
            assert!(Instant::now() < deadline, "no checkpoints on the console");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    assert!(
        last["progress"]["streaming"]["watermark"].is_string(),
        "{last}"
    );
    assert_eq!(
        last["progress"]["workers"].as_array().map(Vec::len),
        Some(1),
        "{last}"
    );
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(run.child.0.id() as libc::pid_t, libc::SIGINT) };
    let stderr = run.finish();
    assert!(
        stderr.contains("streaming with --ui: one worker process beside its coordinator"),
        "{stderr}"
    );
}

/// A streaming job on two workers: its stage boxes show the watermark and the backlog, and the
/// data-freshness chart fills; Ctrl-C then drains it and the run exits 0.
#[test]
fn the_console_shows_a_streaming_jobs_watermark_and_data_freshness_in_chromium() {
    let (_driver, driver_url, shots) = driver();
    let dir = tempfile::tempdir().unwrap();
    let run = stream_run(dir.path(), "");
    let profile = dir.path().join("chromium-profile");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let b = Browser::start(driver_url, &profile).await;
        b.go(&run.url).await;
        let page = b
            .wait_for(
                "a watermark on the stages and points on the freshness chart",
                &format!(
                    "{PAGE_SCRIPT_BODY} out.watermark = [...document.querySelectorAll('#graph text.streaming')].map(t => t.textContent); return out;"
                ),
                |v| {
                    v["charts"]["freshness"][0]["points"].as_u64() >= Some(3)
                        && v["watermark"][0]
                            .as_str()
                            .is_some_and(|w| w.starts_with("watermark ") && w.contains("Z · lag"))
                },
            )
            .await;
        b.screenshot(&shots.join("streaming.png")).await;
        assert_eq!(page["state"], "Running", "{page}");
        let line = page["watermark"][0].as_str().unwrap();
        assert!(line.contains(" · lag ") && line.contains(" · backlog "), "{line}");
        let lines = page["charts"]["freshness"].as_array().unwrap();
        assert_eq!(lines[0]["points"], lines[0]["drawn"], "{page}");
        assert!(page["charts"]["backlog-elements"].is_array(), "{page}");
        b.quit().await;
    });
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(run.child.0.id() as libc::pid_t, libc::SIGINT) };
    run.finish();
}

/// A running stream is shown as a stream: its stages Running (not Done after each
/// checkpoint), their counters over the whole run (never going back when a checkpoint ends),
/// their rates near the source's, and the page's facts are the checkpoint, the watermark and
/// the backlog, not the current checkpoint's work items.
#[test]
fn a_running_streams_stages_run_and_count_over_its_checkpoints() {
    let (_driver, driver_url, shots) = driver();
    let dir = tempfile::tempdir().unwrap();
    let run = stream_run(dir.path(), "  checkpointIntervalSec: 1\n");
    let api = run.url.replace("/jobs/", "/api/jobs/");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let http = reqwest::Client::new();
    let (seen, last) = rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut seen: Vec<Value> = vec![];
        while Instant::now() < deadline {
            if let Ok(r) = http.get(&api).send().await
                && let Ok(v) = serde_json::from_str::<Value>(&r.text().await.unwrap())
                && v["progress"]["streaming"]["checkpoint"].as_u64().is_some()
            {
                let checkpoint = v["progress"]["streaming"]["checkpoint"].as_u64().unwrap();
                seen.push(v);
                if checkpoint >= 6 {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let last = seen.last().cloned().unwrap_or(Value::Null);
        (seen, last)
    });
    assert!(
        last["progress"]["streaming"]["checkpoint"].as_u64() >= Some(6),
        "{last}"
    );
    // Every stage runs, and its counters only grow from one look to the next.
    let stages = last["progress"]["stages"].as_array().unwrap();
    assert!(stages.iter().all(|s| s["state"] == "Running"), "{last}");
    // Each stage shows its own watermark (here every stage's source is the one generator).
    assert!(
        stages.iter().all(
            |s| s["watermark"] == last["progress"]["streaming"]["watermark"]
                && s["watermarkLagSeconds"].is_number()
        ),
        "{last}"
    );
    let source_in = |v: &Value| {
        v["progress"]["stages"][0]["elementsOut"]
            .as_u64()
            .unwrap_or(0)
    };
    for pair in seen.windows(2) {
        assert!(
            source_in(&pair[1]) >= source_in(&pair[0]),
            "{}\n{}",
            pair[0],
            pair[1]
        );
    }
    // The source stage's rate is about the source's 500 elements/s, not a checkpoint's burst.
    let rate = last["stageRates"][0]["elementsPerSec"]
        .as_f64()
        .unwrap_or(0.0);
    assert!((100.0..2500.0).contains(&rate), "{rate} el/s: {last}");
    let profile = dir.path().join("chromium-profile");
    rt.block_on(async {
        let b = Browser::start(driver_url, &profile).await;
        b.go(&run.url).await;
        let page = b
            .wait_for(
                "the stream's facts",
                &format!(
                    "{PAGE_SCRIPT_BODY} out.facts = (document.getElementById('facts') || {{}}).textContent; return out;"
                ),
                |v| v["facts"].as_str().is_some_and(|f| f.starts_with("checkpoint ")),
            )
            .await;
        b.screenshot(&shots.join("stream-stages.png")).await;
        let facts = page["facts"].as_str().unwrap();
        assert!(
            facts.contains("watermark") && facts.contains("backlog") && !facts.contains("work items"),
            "{facts}"
        );
        let states: Vec<&str> = page["stages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["state"].as_str().unwrap())
            .collect();
        assert!(!states.is_empty() && states.iter().all(|s| *s == "Running"), "{page}");
        b.quit().await;
    });
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(run.child.0.id() as libc::pid_t, libc::SIGINT) };
    run.finish();
}

/// The console's JSON (what the page draws) during `run --workers 1 --autoscale`: each
/// rescale is a marker on the worker chart with its reason, the autoscaler's last evaluation is
/// the page's rationale, and the rescale is an Event.
#[test]
fn rescales_of_a_local_autoscaled_run_are_markers_with_their_reason() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let generated = Command::new(BIN)
        .args(["generate", "taxi", "--days", "4", "--rows-per-day", "40000"])
        .args(["--format", "parquet", "--out"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(generated.status.success());
    // 192 files: enough work that one worker is still busy when the engine looks (96 were
    // not always, once the scan got faster).
    for copy in 1..48 {
        for day in 1..=4 {
            let f = data.join(format!("yellow_tripdata_2024-01-0{day}.parquet"));
            std::fs::copy(&f, data.join(format!("copy{copy}-{day}.parquet"))).unwrap();
        }
    }
    let vars = json!({"input": format!("{}/*.parquet", data.display()),
        "output": dir.path().join("out").display().to_string()})
    .to_string();
    let taxi = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/taxi/taxi.yaml");
    let run = Run::start(&[
        taxi.to_str().unwrap(),
        "--jinja-variables",
        &vars,
        "--workers",
        "1",
        "--autoscale",
        "--max-workers",
        "3",
        "--autoscale-time-scale",
        "120",
    ]);
    let api = run.url.replace("/jobs/", "/api/jobs/");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let http = reqwest::Client::new();
    let mut last = Value::Null;
    let page = rt.block_on(async {
        // Until the job's page has a marker, or the run (and its console) is gone.
        loop {
            let Ok(r) = http.get(&api).send().await else {
                return last;
            };
            last = serde_json::from_str(&r.text().await.unwrap()).unwrap();
            if last["markers"].as_array().is_some_and(|m| !m.is_empty()) {
                return last;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let stderr = run.finish();
    let marker = &page["markers"][0];
    assert_eq!(marker["decision"], "ScaleUp", "{page}\n{stderr}");
    assert_eq!(marker["from"], 1, "{page}");
    assert_eq!(marker["reason"], "SCALE_TO_REMAINING_WORK", "{page}");
    assert!(
        marker["message"]
            .as_str()
            .unwrap()
            .contains("worker-s of work left"),
        "{page}"
    );
    // The rationale: the last evaluation (later ones may hold).
    let evaluation = &page["evaluation"];
    assert!(
        ["ScaleUp", "ScaleDown", "Hold"].contains(&evaluation["decision"].as_str().unwrap_or("")),
        "{page}"
    );
    assert!(
        evaluation["reason"].as_str().is_some_and(|r| !r.is_empty()),
        "{page}"
    );
    assert!(
        page["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["reason"] == "Rescaled"),
        "{page}"
    );
}

/// `run --ui` without `--workers`: the in-process run's console has the plan's stages, their
/// progress, and this process as its one worker with its memory.
#[test]
fn an_in_process_run_has_its_console_too() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let generated = Command::new(BIN)
        .args(["generate", "taxi", "--days", "2", "--rows-per-day", "10000"])
        .args(["--format", "parquet", "--out"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(generated.status.success());
    let vars = json!({"input": format!("{}/*.parquet", data.display()),
        "output": dir.path().join("out").display().to_string()})
    .to_string();
    let taxi = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/taxi/taxi.yaml");
    let run = Run::start(&[
        taxi.to_str().unwrap(),
        "--jinja-variables",
        &vars,
        "--bundle-delay-ms",
        "500",
    ]);
    let api = run.url.replace("/jobs/", "/api/jobs/");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let http = reqwest::Client::new();
    let page = rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let r = http.get(&api).send().await.expect("the console answers");
            let page: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
            if page["history"].as_array().is_some_and(|h| h.len() >= 2) {
                return page;
            }
            assert!(Instant::now() < deadline, "{page}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    run.finish();
    assert_eq!(page["summary"]["state"], "Running", "{page}");
    let ids: Vec<&str> = page["graph"]["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["S00", "S01", "S02"], "{page}");
    assert_eq!(page["progress"]["stages"].as_array().unwrap().len(), 3);
    let worker = &page["history"][1]["workerSamples"][0];
    assert_eq!(worker["name"], "local", "{page}");
    assert!(worker["rssBytes"].as_u64().unwrap() > 1 << 20, "{page}");
}
