//! A Beam Python SDK pipeline file through `riverbank run` and `riverbank plan`: the tutorial's
//! pipeline (`examples/taxi/trips_pipeline.py`) with apache-beam 2.77 from `dev/setup.sh`'s venv,
//! submitted to a job server inside the riverbank process.
use std::path::Path;
use std::process::{Command, Output};

mod common;
use common::beam_python;

fn riverbank(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_riverbank"))
        .args(args)
        .env("RIVERBANK_BEAM_PYTHON", beam_python())
        .current_dir(std::env::temp_dir())
        .output()
        .expect("run riverbank")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn tutorial() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/taxi/trips_pipeline.py")
        .display()
        .to_string()
}

/// 2,000 generated trips of one day, as Parquet; returns their glob.
fn trips(dir: &Path) -> String {
    let data = dir.join("taxi");
    let opts = riverbank_datagen::TaxiOptions::new(1, Some(2_000), 7);
    riverbank_datagen::write_taxi(&opts, riverbank_datagen::OutputFormat::Parquet, &data).unwrap();
    data.join("*.parquet").display().to_string()
}

#[test]
fn a_python_pipeline_runs_on_process_harnesses_with_its_own_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let input = trips(dir.path());
    let out_dir = dir.path().join("out");
    let out = out_dir.display().to_string();
    let run = riverbank(&[
        "run",
        &tutorial(),
        "--slots",
        "2",
        "--",
        "--input",
        &input,
        "--output",
        &out,
    ]);
    let printed = format!("{}{}", text(&run.stdout), text(&run.stderr));
    assert!(run.status.success(), "{printed}");
    assert!(printed.contains("trips in all windows: 2,000"), "{printed}");
    // Two PROCESS harnesses, the same Python as the submission.
    assert!(
        printed.contains("sdk_worker_parallelism': '2'"),
        "{printed}"
    );
    let zones = std::fs::read_to_string(out_dir.join("zones")).unwrap();
    assert!(zones.lines().count() > 20, "{zones}");
}

/// The plan of a streaming Python pipeline says it streams (text and Dataflow's job type).
#[test]
fn planning_a_streaming_python_pipeline_says_it_runs_in_rounds() {
    let dir = tempfile::tempdir().unwrap();
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/streaming/periodic_counts.py");
    let out = dir.path().join("out").display().to_string();
    let plan = |format: &str| {
        riverbank(&[
            "plan",
            &script.display().to_string(),
            "--format",
            format,
            "--",
            "--output",
            &out,
        ])
    };
    let text_plan = plan("text");
    let stdout = text(&text_plan.stdout);
    assert!(
        text_plan.status.success(),
        "{stdout}{}",
        text(&text_plan.stderr)
    );
    assert!(
        stdout.contains(":\nstreaming (an unbounded PCollection)"),
        "{stdout}"
    );
    let json = plan("json");
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(json["type"], "JOB_TYPE_STREAMING");
}

/// A streaming Python pipeline (`examples/streaming/periodic_counts.py`, a 10-minute
/// PeriodicImpulse counted per key in 2-s windows) run by `riverbank run`, interrupted once
/// windows have fired: Ctrl-C drains it, so the run ends at once and well, every element read
/// counted once in its window (each full window holds 10 elements of each key).
#[test]
fn ctrl_c_drains_a_streaming_python_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/streaming/periodic_counts.py");
    let child = Command::new(env!("CARGO_BIN_EXE_riverbank"))
        .args(["run", &script.display().to_string(), "--slots", "1", "--"])
        .args(["--output", &out.display().to_string(), "--seconds", "600"])
        .env("RIVERBANK_BEAM_PYTHON", beam_python())
        .current_dir(std::env::temp_dir())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run riverbank");
    let windows = || std::fs::read_dir(&out).map(|d| d.count()).unwrap_or(0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while windows() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "no 3 windows fired within 2 minutes"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let interrupted = std::time::Instant::now();
    let sigint = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sigint.success());
    let run = child.wait_with_output().unwrap();
    let printed = format!("{}{}", text(&run.stdout), text(&run.stderr));
    assert!(run.status.success(), "{printed}");
    assert!(printed.contains("1 streaming job(s) draining"), "{printed}");
    assert!(
        interrupted.elapsed() < std::time::Duration::from_secs(30),
        "the drain took {:?}: {printed}",
        interrupted.elapsed()
    );
    let mut files: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 3, "{files:?}");
    for (i, file) in files.iter().enumerate() {
        let text = std::fs::read_to_string(file).unwrap();
        let mut counts: Vec<(String, u32)> = text
            .lines()
            .map(|l| {
                let (key, count) = l.split_once(',').unwrap();
                (key.to_string(), count.parse().unwrap())
            })
            .collect();
        counts.sort();
        // The source starts on a window's start, so every window but the last is full; the
        // last, cut by the drain, holds what was read of it.
        if i + 1 < files.len() {
            assert_eq!(
                counts,
                vec![("even".to_string(), 10), ("odd".to_string(), 10)],
                "{}",
                file.display()
            );
        } else {
            assert!(counts.iter().all(|(_, n)| *n <= 10), "{counts:?}");
        }
    }
}

#[test]
fn planning_a_python_pipeline_shows_its_fused_stages_and_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let input = trips(dir.path());
    let out_dir = dir.path().join("out");
    let out = out_dir.display().to_string();
    let plan = riverbank(&[
        "plan",
        &tutorial(),
        "--",
        "--input",
        &input,
        "--output",
        &out,
    ]);
    let stdout = text(&plan.stdout);
    assert!(plan.status.success(), "{stdout}{}", text(&plan.stderr));
    assert!(
        stdout.contains("stage 0: Impulse") && stdout.contains("GroupByKey SumPerZone/"),
        "{stdout}"
    );
    assert!(!out_dir.join("zones").exists(), "the plan ran the job");

    let with_args = |format: &str| {
        riverbank(&[
            "plan",
            &tutorial(),
            "--format",
            format,
            "--",
            "--input",
            &input,
            "--output",
            &out,
        ])
    };
    let json = with_args("json");
    assert!(json.status.success(), "{}", text(&json.stderr));
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(json["type"], "JOB_TYPE_BATCH");
    let stages = json["executionPipelineStage"].as_array().unwrap();
    let group = stages
        .iter()
        .find(|s| {
            s["kind"] == "GroupByKey" && s["name"].as_str().unwrap().starts_with("SumPerZone/")
        })
        .expect("SumPerZone's GroupByKey stage");
    let from = group["inputSource"][0]["fromStages"][0].as_str().unwrap();
    let producer = stages.iter().find(|s| s["id"] == from).unwrap();
    assert_eq!(producer["kind"], "SDK harness", "{producer}");
    assert!(
        producer["componentTransform"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["userName"] == "SumPerZone/Precombine"),
        "{producer}"
    );
    let dot = with_args("dot");
    assert!(dot.status.success(), "{}", text(&dot.stderr));
    let dot = text(&dot.stdout);
    let into_group = format!("-> {} [", group["id"].as_str().unwrap());
    assert!(
        dot.starts_with("digraph plan {") && dot.contains(&into_group),
        "{dot}"
    );

    let serializable = with_args("plan");
    assert!(!serializable.status.success());
    assert!(
        text(&serializable.stderr).contains("a Python pipeline's is shown as text, json or dot")
    );
}

#[test]
fn a_script_that_submits_nothing_is_reported_with_its_output() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("nothing.py");
    std::fs::write(&script, "print('no pipeline here')\n").unwrap();
    let plan = riverbank(&["plan", script.to_str().unwrap()]);
    let stderr = text(&plan.stderr);
    assert!(!plan.status.success());
    assert!(
        stderr.contains("submitted no pipeline") && stderr.contains("no pipeline here"),
        "{stderr}"
    );
}

#[test]
fn arguments_after_the_double_dash_are_refused_for_a_yaml_pipeline() {
    let yaml = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/taxi/taxi.yaml");
    let out = riverbank(&["plan", yaml.to_str().unwrap(), "--", "--input", "x"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("a Python pipeline's own"),
        "{}",
        text(&out.stderr)
    );
}

/// A checkpointed streaming Python job (`--temp_location`) outlives its job server: the
/// `riverbank job-server` running it is killed (SIGKILL) once windows have fired and a
/// checkpoint is written; the same script submitted to a new job server resumes the job from
/// that checkpoint, and `streaming.py resume` checks both runs' windows together (exact,
/// nothing fired before the checkpoint fired again, the checkpoint gone at the end).
#[test]
fn a_streaming_python_job_resumes_from_its_checkpoint_on_a_new_job_server() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().display().to_string();
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../portable/tests/sdk/streaming.py")
        .display()
        .to_string();
    let submit = |endpoint: &str| {
        Command::new(beam_python())
            .args([&script, endpoint, &out, "resume"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run the pipeline")
    };
    let (mut first_server, endpoint) = job_server();
    let first = submit(&endpoint);
    let checkpoint = dir
        .path()
        .join("temp/riverbank-checkpoints/resumed/checkpoint.pb");
    let fired = || {
        std::fs::read_dir(dir.path())
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("fired-"))
            .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
            .map(|s| s.lines().count())
            .sum::<usize>()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while fired() < 4 || !checkpoint.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "no windows fired and checkpointed within 2 minutes"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    first_server.kill().unwrap();
    first_server.wait().unwrap();
    let lost = first.wait_with_output().unwrap();
    assert!(!lost.status.success(), "{}", text(&lost.stderr));

    let (mut second_server, endpoint) = job_server();
    let resumed = submit(&endpoint).wait_with_output().unwrap();
    second_server.kill().unwrap();
    second_server.wait().unwrap();
    let said = format!("{}{}", text(&resumed.stdout), text(&resumed.stderr));
    assert!(
        resumed.status.success() && said.contains("streaming resume: ok"),
        "{said}"
    );
    for line in said.lines().filter(|l| l.starts_with("streaming resume")) {
        eprintln!("{line}");
    }
}

/// `riverbank job-server --workers 2`: a pipeline given no environment (the SDK's DOCKER
/// default, which a job server alone refuses) runs its harnesses in the two Beam worker pools
/// the job server started, without Docker. A pool whose process is killed is started again,
/// and the next job runs; the pools go when the job server is killed.
#[test]
fn a_job_server_with_workers_runs_the_sdks_default_environment_in_its_worker_pools() {
    let (mut server, endpoint) = job_server_with(&["--workers", "2"]);
    let script = r#"
import sys
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

options = PipelineOptions(["--runner=PortableRunner", f"--job_endpoint={sys.argv[1]}"])
with beam.Pipeline(options=options) as p:
    counts = (p | beam.Create(list(range(300))) | beam.Reshuffle()
              | beam.Map(lambda x: (x % 3, 1)) | beam.CombinePerKey(sum))
    assert_that(counts, equal_to([(0, 100), (1, 100), (2, 100)]))
print("pools: ok")
"#;
    let run = || {
        let out = Command::new(beam_python())
            .args(["-c", script, &endpoint])
            .output()
            .expect("run the pipeline");
        let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(out.status.success() && said.contains("pools: ok"), "{said}");
    };
    run();
    let pools = children_of(server.id());
    assert_eq!(pools.len(), 2, "{pools:?}");
    let _ = Command::new("kill")
        .args(["-9", &pools[0].to_string()])
        .status();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let now = children_of(server.id());
        if now.len() == 2 && !now.contains(&pools[0]) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the killed pool was not started again: {now:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    run();
    let pools = children_of(server.id());
    server.kill().unwrap();
    server.wait().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while pools
        .iter()
        .any(|p| Path::new(&format!("/proc/{p}")).exists())
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the pools outlived the job server"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The child processes of `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let out = Command::new("pgrep")
        .args(["-P", &pid.to_string()])
        .output()
        .unwrap();
    text(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// `riverbank job-server` on a free port, once it takes connections; its endpoint.
fn job_server() -> (std::process::Child, String) {
    job_server_with(&[])
}

fn job_server_with(extra: &[&str]) -> (std::process::Child, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(env!("CARGO_BIN_EXE_riverbank"))
        .args([
            "job-server",
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
        ])
        .args(extra)
        .env("RIVERBANK_BEAM_PYTHON", beam_python())
        .current_dir(std::env::temp_dir())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run riverbank job-server");
    common::wait_for_listener(port, "the job server", std::time::Duration::from_secs(30));
    (child, format!("127.0.0.1:{port}"))
}
