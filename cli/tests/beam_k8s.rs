//! The pod of a Beam SDK pipeline's DataflowJob, with real processes and sockets and no cluster:
//! `riverbank runner-harness` reads a job's folder as the job service stores it
//! (`beam_k8s/stored_job.py` writes one: a word count with a staged file and a DOCKER
//! environment), fetches the staged file, starts its SDK harnesses in two real Beam worker pools
//! (`apache_beam.runners.worker.worker_pool_main`, what each SDK worker pod runs) and answers
//! `/v1/status` as the operator reads it; a restarted pod reports the job's end, not a rerun.
//! A streaming job's runner checkpoints to object storage (a real S3 server, s3s-fs): killed,
//! it goes on from its checkpoint; updated in place, the new pipeline takes over its checkpoint;
//! drained, it ends with every window fired once.
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{S3, beam_python, free_port};
use riverbank_pipeline::progress::{JobPhase, JobProgress};

/// Killed when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Beam's worker pool as the SDK container runs it; its harnesses are `python` on its PATH.
fn worker_pool(port: u16) -> Process {
    let python = beam_python();
    let bin = python.parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    Process(
        Command::new(&python)
            .args([
                "-m",
                "apache_beam.runners.worker.worker_pool_main",
                &format!("--service_port={port}"),
                "--worker_pool",
            ])
            .env("PATH", path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the worker pool"),
    )
}

/// The runner harness given the worker pools at `pools` (one per SDK worker pod); its log goes
/// to `state/../runner-PORT.log`.
fn runner(folder: &Path, pools: &[u16], port: u16, state: &Path) -> Process {
    runner_with(folder, pools, port, state, &[])
}

fn runner_with(folder: &Path, pools: &[u16], port: u16, state: &Path, extra: &[&str]) -> Process {
    Process(
        runner_command(folder, pools, port, state, extra)
            .spawn()
            .expect("start the runner harness"),
    )
}

fn runner_command(
    folder: &Path,
    pools: &[u16],
    port: u16,
    state: &Path,
    extra: &[&str],
) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_riverbank"));
    command
        .args(["runner-harness", "--pipeline-location"])
        .arg(folder);
    for pool in pools {
        command.args(["--sdk-worker-pool", &format!("localhost:{pool}")]);
    }
    let log = state.with_file_name(format!("runner-{port}.log"));
    command
        .args([
            "--sdk-workers",
            "2",
            "--bind",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--state-dir",
        ])
        .arg(state)
        .args(extra)
        .env("RIVERBANK_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    command
}

/// `/v1/status` until the job is over (a long poll, as the operator asks).
fn wait_over(port: u16) -> JobProgress {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(180);
        let mut seen = Vec::new();
        while Instant::now() < deadline {
            let url = format!("http://127.0.0.1:{port}/v1/status?wait_ms=2000");
            let answer = match client.get(url).send().await {
                Ok(r) => r
                    .bytes()
                    .await
                    .ok()
                    .and_then(|b| serde_json::from_slice::<JobProgress>(&b).ok()),
                Err(_) => None,
            };
            match answer {
                Some(p) if p.phase.is_terminal() => return p,
                Some(p) => seen.push(format!("{:?}: {}", p.phase, p.message)),
                None => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        panic!("the job did not end; it said: {seen:?}");
    })
}

/// The job's folder under `dir` as the job service stores it (`stored_job.py`: a word count
/// with a staged `helper.py`), and where its counts go.
fn stored_job(dir: &Path) -> (PathBuf, PathBuf) {
    stored_job_with(dir, &[])
}

fn stored_job_with(dir: &Path, extra: &[&str]) -> (PathBuf, PathBuf) {
    stored_job_at(dir, dir.join("out/counts.txt"), extra)
}

fn stored_job_at(dir: &Path, output: PathBuf, extra: &[&str]) -> (PathBuf, PathBuf) {
    stored_job_in(dir, dir.join("job"), output, extra)
}

fn stored_job_in(
    dir: &Path,
    folder: PathBuf,
    output: PathBuf,
    extra: &[&str],
) -> (PathBuf, PathBuf) {
    let staged = dir.join("helper.py");
    std::fs::write(&staged, "GREETING = 'staged'\n").unwrap();
    let stored = Command::new(beam_python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/beam_k8s/stored_job.py"))
        .args([&folder, &output, &staged])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        stored.status.success(),
        "{}",
        String::from_utf8_lossy(&stored.stderr)
    );
    (folder, output)
}

#[test]
fn the_runner_pod_runs_a_stored_job_on_a_worker_pool_and_keeps_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let (folder, output) = stored_job(dir.path());

    // Two SDK worker pods' pools: the runner starts its harnesses in both.
    let pools = [free_port(), free_port()];
    let _pools: Vec<Process> = pools.iter().map(|&p| worker_pool(p)).collect();
    let (port, state) = (free_port(), dir.path().join("state"));
    let first = runner(&folder, &pools, port, &state);
    let done = wait_over(port);
    assert_eq!(done.phase, JobPhase::Done, "{}", done.message);
    let log = std::fs::read_to_string(dir.path().join(format!("runner-{port}.log"))).unwrap();
    for pool in pools {
        assert!(
            log.contains(&format!("in pool localhost:{pool}")),
            "no harnesses started in the pool at {pool}:\n{log}"
        );
    }
    assert_eq!(done.work_items_done, done.work_items_total);
    assert!(done.stages.iter().all(|s| s.state == "Done"));
    let group = done
        .stages
        .iter()
        .find(|s| s.name.contains("CombinePerKey(CountCombineFn)/Group"))
        .unwrap_or_else(|| panic!("{:?}", done.stages));
    // The SDK's element counts per stage: the grouping got the precombined words (at most one
    // per word and bundle), the stage after it the six words' counts.
    assert!((6..=8).contains(&group.elements_in), "{:?}", done.stages);
    assert!(
        done.stages
            .iter()
            .any(|s| s.elements_in == 6 && s.index > group.index),
        "{:?}",
        done.stages
    );
    let mut counts: Vec<String> = std::fs::read_to_string(&output)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    counts.sort();
    assert_eq!(
        counts,
        [
            "dog: 1", "end: 1", "fox: 1", "lazy: 1", "quick: 1", "the: 3"
        ]
    );
    // The staged file was fetched from the job's folder onto the pod's disk, unchanged.
    assert_eq!(
        std::fs::read_to_string(state.join("artifacts/0-helper.py")).unwrap(),
        "GREETING = 'staged'\n"
    );
    assert!(folder.join("metrics.pb").exists(), "the job's metrics");

    // The pod restarts (a node drained after the job ended): it reports the end, runs nothing.
    drop(first);
    std::fs::remove_file(&output).unwrap();
    let port = free_port();
    let _again = runner(&folder, &pools, port, &state);
    let again = wait_over(port);
    assert_eq!(again.phase, JobPhase::Done);
    assert_eq!(again.finished_at, done.finished_at);
    assert!(!output.exists(), "the job ran again");
}

/// One SDK worker pod never comes up (unschedulable, say): once the pools' wait is over the job
/// runs on the harnesses of the others, and the log says which pool it went on without.
#[test]
fn a_pool_that_never_answers_is_done_without() {
    let dir = tempfile::tempdir().unwrap();
    let (folder, output) = stored_job(dir.path());
    let (alive, gone) = (free_port(), free_port());
    let _pool = worker_pool(alive);
    let (port, state) = (free_port(), dir.path().join("state"));
    let _runner = runner_with(
        &folder,
        &[alive, gone],
        port,
        &state,
        // Long enough for the live pool to answer on a loaded machine (its Python starting).
        &["--sdk-pool-wait-secs", "10"],
    );
    let done = wait_over(port);
    assert_eq!(done.phase, JobPhase::Done, "{}", done.message);
    assert_eq!(std::fs::read_to_string(&output).unwrap().lines().count(), 6);
    let log = std::fs::read_to_string(dir.path().join(format!("runner-{port}.log"))).unwrap();
    assert!(
        log.contains(&format!(
            "going on with 2 SDK harnesses without pool localhost:{gone}"
        )),
        "{log}"
    );
}

/// The operator scales a running SDK job's worker pods and tells the runner: a pool added while
/// a stage runs gets harnesses that take part of the stage's bundles. Meanwhile the status has
/// what the autoscaler reads: the stage's input bytes left, the job's throughput, and each pool
/// as a worker, busy as its harnesses are.
#[test]
fn a_pool_added_while_a_stage_runs_takes_part_of_its_bundles() {
    let dir = tempfile::tempdir().unwrap();
    // 2,000 elements of 50 ms: 25 s on the first pool's 2 harnesses, 2 bundles each at once.
    let (folder, output) = stored_job_with(dir.path(), &["2000"]);
    let (first, added) = (free_port(), free_port());
    let _pools = [worker_pool(first), worker_pool(added)];
    let (port, state) = (free_port(), dir.path().join("state"));
    let _runner = runner(&folder, &[first], port, &state);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let seen: Vec<JobProgress> = runtime.block_on(async {
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(180);
        let mut seen: Vec<JobProgress> = Vec::new();
        let mut told = false;
        while Instant::now() < deadline {
            let url = format!("http://127.0.0.1:{port}/v1/status");
            let Ok(answer) = client.get(url).send().await else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            let p: JobProgress = serde_json::from_slice(&answer.bytes().await.unwrap()).unwrap();
            // Once the slow stage runs and has read some of its input, the operator scales up.
            // A pool that is not one of the job's pods is refused.
            let slow_stage_runs = p
                .stages
                .iter()
                .any(|s| s.name == "Slowly" && s.state == "Running");
            if !told && slow_stage_runs && p.throughput_bytes_per_sec > 0.0 && p.remaining_bytes > 0
            {
                let url = format!("http://127.0.0.1:{port}/v1/sdk-workers");
                let stranger = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(r#"{"pools": ["elsewhere.example:50000"]}"#)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(stranger.status().as_u16(), 400);
                let pools = serde_json::json!({"pools": [
                    format!("localhost:{first}"),
                    format!("localhost:{added}"),
                ]});
                let url = format!("http://127.0.0.1:{port}/v1/sdk-workers");
                let r = client
                    .post(url)
                    .header("content-type", "application/json")
                    .body(pools.to_string())
                    .send()
                    .await
                    .unwrap();
                assert!(r.status().is_success(), "{:?}", r.text().await);
                told = true;
            }
            let over = p.phase.is_terminal();
            seen.push(p);
            if over {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        panic!("the job did not end: {:?}", seen.last());
    });
    let done = seen.last().unwrap();
    assert_eq!(done.phase, JobPhase::Done, "{}", done.message);
    let expected = format!("2000 {}", (0..2000u64).sum::<u64>());
    assert_eq!(std::fs::read_to_string(&output).unwrap().trim(), expected);
    let log = std::fs::read_to_string(dir.path().join(format!("runner-{port}.log"))).unwrap();
    assert!(
        log.contains(&format!(
            "started in the added pool localhost:{added} join the stage"
        )),
        "{log}"
    );
    // The added pool's harnesses ran bundles of the stage, and both pools were reported busy.
    let busy_in = |pool: u16| {
        seen.iter().any(|p| {
            p.workers.iter().any(|w| {
                w.name == format!("localhost:{pool}")
                    && w.alive
                    && w.items_running > 0
                    && w.cpu > 0.0
            })
        })
    };
    assert!(
        busy_in(first) && busy_in(added),
        "{:#?}",
        seen.iter().map(|p| &p.workers).collect::<Vec<_>>()
    );
    // What is left of the stage went down as it ran.
    let left: Vec<u64> = seen
        .iter()
        .filter(|p| p.throughput_bytes_per_sec > 0.0)
        .map(|p| p.remaining_bytes)
        .collect();
    assert!(left.len() >= 2 && left.first() > left.last(), "{left:?}");
}

/// A folder that holds no job fails the job with the file it could not read, not the pod.
#[test]
fn a_missing_pipeline_fails_the_job_naming_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _runner = runner(
        &dir.path().join("nothing-here"),
        &[free_port()],
        port,
        &dir.path().join("state"),
    );
    let failed = wait_over(port);
    assert_eq!(failed.phase, JobPhase::Failed);
    assert!(failed.message.contains("pipeline.pb"), "{}", failed.message);
}

/// A streaming SDK pipeline on the runner pod: it checkpoints to the job's tempLocation in
/// object storage (`--temp-location s3://…`, as the operator passes `options.tempLocation`; the
/// pipeline names none), shows its watermark and checkpoints in `/v1/status`, is SIGKILLed and
/// restarted (a pod deleted and recreated) and goes on from its checkpoint, sweeping a part no
/// manifest names out of the bucket; then it is updated
/// in place (the job service's `--update`: a new folder holding version 2, whose CombinePerKey
/// is renamed with `--transform_name_mapping`, and the old pipeline under `replaces/`): the old
/// runner, sent SIGTERM as its pod is rolled, stops after a last checkpoint at the round it
/// stopped, which the runner restarted on version 2 takes over, so no window version 1 fired is
/// fired again; then it is drained through `POST /v1/job/drain` (as the operator drains a
/// coordinator). Every window is fired with one exact count (a window fired again after the
/// SIGKILL, with the same count, is what ran after the last checkpoint: output is at least
/// once), the windows together count a prefix of the stream exactly, both versions fired some,
/// and the drained job's checkpoint is gone.
#[test]
fn a_streaming_runner_pod_resumes_from_its_checkpoint_in_object_storage_is_updated_and_drains() {
    let s3 = S3::start(&["jobs"]);
    let dir = tempfile::tempdir().unwrap();
    let start = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3) as f64;
    let out = dir.path().join("fired");
    let (folder, _) = stored_job_at(dir.path(), out.clone(), &[&format!("stream:{start}")]);
    let pool = free_port();
    let _pool = worker_pool(pool);
    let state = dir.path().join("state");
    let checkpoint = s3
        .root()
        .join("jobs/temp/riverbank-checkpoints/stream/checkpoint.pb");
    let start_runner = |port: u16, folder: &Path| {
        let mut c = runner_command(
            folder,
            &[pool],
            port,
            &state,
            &["--temp-location", "s3://jobs/temp", "--job-name", "stream"],
        );
        s3.env(&mut c);
        Process(c.spawn().expect("start the runner harness"))
    };
    let fired = || -> Vec<serde_json::Value> {
        std::fs::read_dir(&out)
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|e| {
                std::fs::read_to_string(e.path())
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|l| serde_json::from_str(l).ok())
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = reqwest::Client::new();
    let status = |port: u16| -> Option<JobProgress> {
        let url = format!("http://127.0.0.1:{port}/v1/status");
        runtime.block_on(async {
            let body = client.get(url).send().await.ok()?.bytes().await.ok()?;
            serde_json::from_slice(&body).ok()
        })
    };
    let wait_for = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !done() {
            assert!(Instant::now() < deadline, "waited 2 minutes for {what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };

    let port = free_port();
    let first = start_runner(port, &folder);
    wait_for("4 windows fired and a checkpoint in S3", &|| {
        fired().len() >= 4 && checkpoint.exists()
    });
    // Its figures, as the operator reads them (refreshed every 5 s).
    wait_for("the checkpoint and watermark in /v1/status", &|| {
        status(port)
            .and_then(|p| p.streaming)
            .is_some_and(|sp| sp.checkpoint > 0 && sp.watermark.is_some())
    });
    assert_eq!(status(port).unwrap().phase, JobPhase::Running);
    drop(first);
    let killed_at = fired().len();
    let killed_time = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();

    // A part no manifest names, as a run killed between its parts and its manifest leaves.
    let orphan = checkpoint.with_file_name(format!("part-{}.pb", "0f".repeat(16)));
    std::fs::write(&orphan, b"orphaned").unwrap();

    let port = free_port();
    let second = start_runner(port, &folder);
    wait_for("4 more windows fired after the restart", &|| {
        fired().len() >= killed_at + 4
    });
    let log = std::fs::read_to_string(dir.path().join(format!("runner-{port}.log"))).unwrap();
    assert!(
        log.contains("resumed from s3://jobs/temp/riverbank-checkpoints/stream/checkpoint.pb"),
        "{log}"
    );
    assert!(!orphan.exists(), "the orphaned part is left in the bucket");

    // Version 2 in place: the job service's folder for it, with the running pipeline beside it.
    let (updated, _) = stored_job_in(
        dir.path(),
        dir.path().join("job-v2"),
        out.clone(),
        &[&format!("stream:{start}:2")],
    );
    std::fs::create_dir_all(updated.join("replaces")).unwrap();
    for file in ["pipeline.pb", "options.pb"] {
        std::fs::copy(folder.join(file), updated.join("replaces").join(file)).unwrap();
    }
    // The pod rolled: SIGTERM, a last checkpoint, out well within the pod's grace period.
    let mut second = second;
    let second_port = port;
    let stopping = Instant::now();
    unsafe { libc::kill(second.0.id() as libc::pid_t, libc::SIGTERM) };
    let exit = second.0.wait().unwrap();
    assert!(exit.success(), "{exit}");
    assert!(stopping.elapsed() < Duration::from_secs(20));
    let log =
        std::fs::read_to_string(dir.path().join(format!("runner-{second_port}.log"))).unwrap();
    let stopped_at = log
        .split("stopped at round ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap_or_else(|| panic!("no last checkpoint: {log}"))
        .to_string();
    let v1_windows: std::collections::BTreeSet<(String, i64)> = fired()
        .iter()
        .map(|l| {
            (
                l["key"].as_str().unwrap().to_string(),
                l["start"].as_f64().unwrap() as i64,
            )
        })
        .collect();
    let port = free_port();
    let _third = start_runner(port, &updated);
    wait_for("4 windows fired by version 2", &|| {
        fired()
            .iter()
            .filter(|l| l["version"].as_u64() == Some(2))
            .count()
            >= 4
    });
    let log = std::fs::read_to_string(dir.path().join(format!("runner-{port}.log"))).unwrap();
    assert!(
        log.contains("the pipeline this one updates left it"),
        "{log}"
    );
    assert!(
        log.contains(&format!("(round {stopped_at}, written")),
        "not from round {stopped_at}: {log}"
    );
    let again: Vec<_> = fired()
        .into_iter()
        .filter(|l| l["version"].as_u64() == Some(2))
        .filter(|l| {
            let k = (
                l["key"].as_str().unwrap().to_string(),
                l["start"].as_f64().unwrap() as i64,
            );
            v1_windows.contains(&k)
        })
        .collect();
    assert!(
        again.is_empty(),
        "fired again after a graceful stop: {again:?}"
    );
    let drained = runtime.block_on(
        client
            .post(format!("http://127.0.0.1:{port}/v1/job/drain"))
            .send(),
    );
    assert!(drained.unwrap().status().is_success());
    let done = wait_over(port);
    assert_eq!(done.phase, JobPhase::Done, "{}", done.message);
    assert!(done.streaming.is_some_and(|sp| sp.draining), "drained");
    assert!(!checkpoint.exists(), "the drained job's checkpoint is left");

    // Each (key, window) fired with one count; together, the first n elements exactly.
    let lines = fired();
    let mut got: std::collections::BTreeMap<(String, i64), u64> = Default::default();
    for line in &lines {
        let k = (
            line["key"].as_str().unwrap().to_string(),
            line["start"].as_f64().unwrap() as i64,
        );
        let count = line["count"].as_u64().unwrap();
        assert_eq!(
            *got.entry(k.clone()).or_insert(count),
            count,
            "{k:?}: {lines:?}"
        );
    }
    let n: u64 = got.values().sum();
    let mut want: std::collections::BTreeMap<(String, i64), u64> = Default::default();
    for k in 0..n {
        let t = start + k as f64 * 0.25;
        let window = (t / 3.0).floor() as i64 * 3;
        let key = if k % 2 == 0 { "even" } else { "odd" };
        *want.entry((key.to_string(), window)).or_default() += 1;
    }
    assert_eq!(
        got, want,
        "the windows count the stream's first {n} elements"
    );
    // Not started over: of the windows fired before the kill, not all were fired again.
    let window = |l: &serde_json::Value| (l["key"].to_string(), l["start"].to_string());
    let before: std::collections::BTreeSet<_> = lines
        .iter()
        .filter(|l| l["at"].as_f64().unwrap() < killed_time)
        .map(window)
        .collect();
    let again = lines
        .iter()
        .filter(|l| l["at"].as_f64().unwrap() >= killed_time && before.contains(&window(l)))
        .count();
    assert!(
        again < before.len(),
        "{again} of the {} windows fired before the kill fired again: {lines:?}",
        before.len()
    );
    assert!(lines.iter().any(|l| l["version"].as_u64() == Some(1)));
}
