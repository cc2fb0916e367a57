//! Beam Python SDK pipelines (apache-beam 2.77 from PyPI, in `dev/setup.sh`'s venv) submitted
//! with `--runner=PortableRunner` to a Riverbank job server started here, their user code on
//! real SDK harnesses (LOOPBACK in the submitting process, or PROCESS harnesses the runner
//! starts). Each script checks its own results with Beam's `assert_that`.
use std::path::{Path, PathBuf};

use riverbank_portable::job_api::PrepareJobRequest;
use riverbank_portable::job_api::job_service_client::JobServiceClient;
use riverbank_portable::runner_api::{Components, FunctionSpec, PCollection, PTransform, Pipeline};
use riverbank_portable::{JobServer, JobServerOptions};

fn venv_python() -> PathBuf {
    let venv = std::env::var_os("RIVERBANK_BEAM_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME"))
                .join(".cache/riverbank/beam-venv")
        });
    let python = venv.join("bin/python");
    assert!(
        python.exists(),
        "no Python with apache-beam at {}: run dev/setup.sh (it makes the venv with apache-beam 2.77.0)",
        python.display()
    );
    python
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/sdk")
        .join(name)
}

/// A job server on loopback: one harness per environment, 1 GiB of each job's data in memory.
fn options() -> JobServerOptions {
    JobServerOptions {
        bind: ([127, 0, 0, 1], 0).into(),
        fn_bind: ([127, 0, 0, 1], 0).into(),
        fn_advertise: "127.0.0.1".into(),
        sdk_workers: 1,
        artifacts_dir: None,
        plan_only: false,
        progress_every: std::time::Duration::from_secs(10),
        memory_mb: 1024,
        object_storage: None,
        worker_pools: Vec::new(),
    }
}

async fn server() -> JobServer {
    JobServer::start(options()).await.expect("job server")
}

/// Runs a script with the venv's Python (outside the runtime's threads); returns its output.
/// A script that has not ended by then has hung: it is killed, and the test fails with its output.
const SCRIPT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(240);

async fn python(args: Vec<String>) -> (bool, String) {
    python_within(args, SCRIPT_DEADLINE).await
}

async fn python_within(args: Vec<String>, deadline: std::time::Duration) -> (bool, String) {
    let python = venv_python();
    let child = tokio::process::Command::new(&python)
        .args(&args)
        .current_dir(std::env::temp_dir())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run python");
    match tokio::time::timeout(deadline, child.wait_with_output()).await {
        Ok(out) => {
            let out = out.expect("python's output");
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            (out.status.success(), text)
        }
        Err(_) => (false, format!("{args:?} did not end within {deadline:?}")),
    }
}

fn s(x: impl AsRef<std::ffi::OsStr>) -> String {
    x.as_ref().to_string_lossy().into_owned()
}

/// Runs `tests/sdk/NAME.py ENDPOINT ARGS...`, which checks itself with `assert_that` and ends
/// with `NAME: ok`.
async fn passes(name: &str, args: &[String]) {
    let server = server().await;
    let mut all = vec![s(script(&format!("{name}.py"))), server.addr.to_string()];
    all.extend_from_slice(args);
    let (ok, out) = python(all).await;
    assert!(ok && out.contains(&format!("{name}: ok")), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pardo_side_inputs_group_combine_flatten_and_metrics_run_on_loopback_harnesses() {
    passes("basics", &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tagged_outputs_partition_cogroupbykey_reshuffle_and_the_sdks_combiners() {
    passes("more", &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stateful_dofns_keep_state_per_key_and_window_and_fire_their_timers() {
    passes("stateful", &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_sliding_and_session_windows_and_files_through_splittable_dofns() {
    let dir = tempfile::tempdir().unwrap();
    passes("windows", &[s(dir.path())]).await;
}

/// The tutorial's pipeline (seed 001) on a generated day: Riverbank's files, on LOOPBACK and
/// on 2 PROCESS harnesses, equal Beam's DirectRunner's, line for line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_taxi_tutorial_gives_the_direct_runners_output() {
    let server = server().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("taxi");
    let opts = riverbank_datagen::TaxiOptions::new(1, Some(20_000), 7);
    riverbank_datagen::write_taxi(&opts, riverbank_datagen::OutputFormat::Parquet, &data).unwrap();
    let pipeline = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/taxi/trips_pipeline.py");
    let input = s(data.join("*.parquet"));
    let run = |out: &str, runner: Vec<String>| {
        let mut args = vec![
            s(&pipeline),
            "--input".into(),
            input.clone(),
            "--output".into(),
            s(dir.path().join(out)),
        ];
        args.extend(runner);
        python(args)
    };
    let (ok, direct) = run("direct", vec!["--runner=DirectRunner".into()]).await;
    assert!(ok, "{direct}");
    let portable = |environment: &[String]| {
        let mut args = vec![
            "--runner=PortableRunner".to_string(),
            format!("--job_endpoint={}", server.addr),
        ];
        args.extend_from_slice(environment);
        args
    };
    // The user's code in the submitting process (Beam's harness), and on 2 PROCESS harnesses
    // (Riverbank's start of Beam's harness, with lean chains).
    let process = format!(
        "{{\"command\": \"{} -m apache_beam.runners.worker.sdk_worker_main\"}}",
        venv_python().display()
    );
    let runs = [
        ("loopback", vec!["--environment_type=LOOPBACK".to_string()]),
        (
            "process",
            vec![
                "--environment_type=PROCESS".to_string(),
                format!("--environment_config={process}"),
                "--sdk_worker_parallelism=2".into(),
            ],
        ),
    ];
    for (name, environment) in runs {
        let (ok, riverbank) = run(name, portable(&environment)).await;
        assert!(ok, "{riverbank}");
        for file in ["zones", "hours"] {
            let lines = |run: &str| {
                let text = std::fs::read_to_string(dir.path().join(run).join(file)).unwrap();
                let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
                lines.sort();
                lines
            };
            let (expected, got) = (lines("direct"), lines(name));
            assert!(expected.len() > 20, "{file}: {expected:?}");
            assert_eq!(got, expected, "{name}: {file}");
        }
        assert!(
            riverbank.contains("trips in all windows: 20,000"),
            "{riverbank}"
        );
    }
}

/// PeriodicImpulse (an unbounded splittable DoFn waiting for the clock) summed per key in 3-s
/// windows: each window fires once, while the source runs, with every element in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unbounded_source_streams_each_window_fired_once_as_the_watermark_passes_it() {
    let server = streaming_case("run").await;
    let messages = messages_of_the_job(&server).await;
    assert!(
        messages.iter().any(|m| m.contains("a streaming job")),
        "{messages:#?}"
    );
    assert!(
        messages.iter().any(|m| m.contains("windows fired")),
        "{messages:#?}"
    );
    // The source's backlog as the SDK sizes its held rest (PeriodicImpulse: 8 bytes per
    // element due and not emitted): a source that keeps up is less than 10 s behind.
    let backlog = backlogs_in(&messages);
    assert!(!backlog.is_empty(), "{messages:#?}");
    assert!(backlog.iter().all(|&b| b <= 8 * 40), "{backlog:?}");
}

/// The sources' backlog as the SDK sizes what a splittable DoFn hands back: 1,000 bytes for
/// each offset left of 100, read one a round, reported as the job goes (which runs for 15 s and
/// more only if the rest waits the 0.15 s the SDK asks: a stage whose DoFn emits nowhere holds
/// its source's rest like any other).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unbounded_sources_backlog_is_the_size_the_sdk_gives_its_rest() {
    let server = streaming_case("backlog").await;
    let messages = messages_of_the_job(&server).await;
    let backlog = backlogs_in(&messages);
    assert!(!backlog.is_empty(), "{messages:#?}");
    assert!(
        backlog
            .iter()
            .all(|&b| b % 1000 == 0 && (1..100_000).contains(&b)),
        "{backlog:?}"
    );
}

/// The sources' backlogs the job's round progress lines gave, in bytes.
fn backlogs_in(messages: &[String]) -> Vec<u64> {
    messages
        .iter()
        .filter_map(|m| m.split("the sources' backlog ").nth(1))
        .filter_map(|rest| rest.split(' ').next()?.parse().ok())
        .collect()
}

/// A streaming job drained through the Job API: its source stops where it is, what it read is
/// summed (the last window partly), and it ends DRAINED within seconds, not after its 10 minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_streaming_job_stops_its_source_and_fires_what_it_read() {
    streaming_case("drain").await;
}

/// State and timers kept from round to round of a streaming job: an event-time timer sums each
/// window's bag once the watermark passes it, and a processing-time timer flushes counts every
/// second while the source runs, every element counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_and_timers_in_a_streaming_job_fire_by_the_watermark_and_the_clock() {
    let server = streaming_case("stateful").await;
    // KeepPerWindow's bags, one per key and 3-s window of the 12-s source (which starts on a
    // whole second: 4 or 5 windows), are dropped as their windows expire.
    let messages = messages_of_the_job(&server).await;
    let dropped = messages
        .iter()
        .find_map(|m| {
            let (_, rest) = m.split_once(" windows fired, ")?;
            rest.split_once(" states dropped as their windows expired")?
                .0
                .parse::<usize>()
                .ok()
        })
        .unwrap_or_else(|| panic!("no expired state: {messages:#?}"));
    assert!(matches!(dropped, 8 | 10), "{dropped}: {messages:#?}");
}

/// A timer holds the watermark of the stages after it: elements a processing-time timer lets
/// go a second later, with their own timestamps, long after the source's watermark passed
/// them, are counted in their windows, none dropped as late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timer_holds_the_watermark_after_it_so_what_it_lets_go_is_not_late() {
    let server = streaming_case("hold").await;
    let messages = messages_of_the_job(&server).await;
    assert!(
        !messages.iter().any(|m| m.contains("dropped as late")),
        "{messages:#?}"
    );
}

/// Allowed lateness on a streaming GroupByKey (accumulating): a window fires on time, then a
/// late pane for its late element, holding its earlier ones too; an element later than the
/// lateness is dropped and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_elements_within_the_allowed_lateness_fire_late_panes_and_later_ones_are_dropped() {
    let server = streaming_case("late").await;
    let messages = messages_of_the_job(&server).await;
    assert!(
        messages
            .iter()
            .any(|m| m.contains("1 element dropped as late")),
        "{messages:#?}"
    );
}

/// AfterWatermark with early firings by processing time (accumulating): panes about every
/// second while a window is open, then its on-time pane with all of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_panes_fire_by_processing_time_before_the_on_time_pane() {
    streaming_case("early").await;
}

/// A streaming job's PROCESS harness dies once inside a stateful DoFn, after its state took an
/// element: the harness is replaced and the bundle retried on the state as it was before it,
/// so every window's count is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_harness_that_dies_in_a_streaming_stateful_dofn_costs_a_retry_not_a_count() {
    streaming_case("crash").await;
}

/// Beam's slowly updating side input: a windowed PeriodicImpulse read with AsSingleton by a
/// stream in the same windows; each element sees its own window's value, having waited for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_side_input_that_never_ends_is_read_per_window_once_complete() {
    streaming_case("sides").await;
}

/// Per-stage watermarks: a branch whose source's watermark is an hour behind does not hold
/// back the windows of the branch beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_branch_does_not_hold_back_the_windows_of_another() {
    streaming_case("branches").await;
}

/// `--update`: a running streaming job replaced by one with changed code goes on from its
/// state, every window exact and fired once; an incompatible replacement is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_job_updated_with_new_code_goes_on_from_its_state() {
    use riverbank_portable::job_api::job_state;
    let server = streaming_case("update").await;
    let (mut client, jobs) = jobs_of(&server).await;
    let in_state = |s: job_state::Enum| jobs.iter().filter(|j| j.state == s as i32).count();
    // The refused replacement was prepared, never run.
    assert_eq!(
        (
            in_state(job_state::Enum::Updated),
            in_state(job_state::Enum::Done),
            in_state(job_state::Enum::Stopped)
        ),
        (1, 1, 1),
        "{jobs:?}"
    );
    let done = jobs
        .iter()
        .find(|j| j.state == job_state::Enum::Done as i32)
        .unwrap();
    let messages = messages_of(&mut client, done.job_id.clone()).await;
    assert!(
        messages.iter().any(|m| m.contains("replaces job counts-")),
        "{messages:#?}"
    );
}

/// A side input that never ends in the global window: refused at Prepare, by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_never_ending_side_input_in_the_global_window_is_refused_by_name() {
    streaming_case("refused").await;
}

/// Sessions with early firings (the merged session goes on from its panes) and OrFinally
/// ending a window's panes: the YAML runtime's event-time core fires SDK windows too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_fire_early_and_or_finally_ends_a_windows_panes() {
    let server = streaming_case("triggers").await;
    let messages = messages_of_the_job(&server).await;
    assert!(
        messages
            .iter()
            .any(|m| m.contains("3 elements dropped as late")),
        "{messages:#?}"
    );
}

/// Runs `streaming.py ENDPOINT DIR MODE`, which checks itself; returns its job server.
async fn streaming_case(mode: &str) -> JobServer {
    let server = server().await;
    let dir = tempfile::tempdir().unwrap();
    let args = vec![
        s(script("streaming.py")),
        server.addr.to_string(),
        s(dir.path()),
        mode.into(),
    ];
    let (ok, out) = python(args).await;
    assert!(
        ok && out.contains(&format!("streaming {mode}: ok")),
        "{out}"
    );
    server
}

/// Runs `script ENDPOINT PYTHON ARGS... DIR` (the PROCESS harnesses' Python as PYTHON) with a
/// scratch directory the script leaves its marks in.
async fn run_in_scratch(script_name: &str, args: &[&str]) -> (tempfile::TempDir, bool, String) {
    let server = server().await;
    let dir = tempfile::tempdir().unwrap();
    let mut all = vec![
        s(script(script_name)),
        server.addr.to_string(),
        s(venv_python()),
    ];
    all.extend(args.iter().map(|a| a.to_string()));
    all.push(s(dir.path()));
    let (ok, out) = python(all).await;
    (dir, ok, out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_harness_that_dies_mid_bundle_costs_a_retry_not_the_job() {
    let (dir, ok, out) = run_in_scratch("failures.py", &["crash"]).await;
    assert!(
        dir.path().join("died").exists(),
        "the harness never died: {out}"
    );
    assert!(ok && out.contains("crash: DONE"), "{out}");
}

/// Lean chains (Riverbank's start of Beam's Python harness) give what Beam's own harness gives:
/// the same pipeline on the DirectRunner and on a PROCESS harness writes the same lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lean_chains_on_process_harnesses_give_the_direct_runners_results() {
    let (_dir, ok, out) = run_in_scratch("chains.py", &[]).await;
    assert!(ok && out.contains("chains: ok"), "{out}");
}

/// Beam's own FnApiRunnerTest and window tests, run in one Python process whose bundle
/// processors have lean chains installed: every test passes, and chains were built.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beams_own_runner_tests_pass_with_lean_chains() {
    beams_suites_pass_with_lean_chains(&[]).await;
}

/// The same with Beam's ptransform, combiners and util tests beside (3-4 min).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn more_of_beams_own_tests_pass_with_lean_chains() {
    beams_suites_pass_with_lean_chains(&["--all"]).await;
}

async fn beams_suites_pass_with_lean_chains(flags: &[&str]) {
    let package = Path::new(env!("CARGO_MANIFEST_DIR")).join("python");
    let mut args = vec![s(script("chains_beam_suites.py")), s(package)];
    args.extend(flags.iter().map(|f| f.to_string()));
    let (_, out) = python_within(args, std::time::Duration::from_secs(600)).await;
    // "chains_beam_suites: ran N, skipped S, chains C"
    let report = out
        .lines()
        .find_map(|l| l.strip_prefix("chains_beam_suites: "))
        .unwrap_or_else(|| panic!("no report: {out}"));
    let numbers: Vec<usize> = report
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect();
    let [ran, _skipped, chains] = numbers[..] else {
        panic!("{report}")
    };
    assert!(ran >= 90 && chains >= 100, "{out}");
    assert!(!out.contains("not passed:"), "{out}");
}

/// One file is one bundle; the idle harness gets half of it by a split of the running bundle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_harness_takes_half_of_a_running_bundle() {
    let (_dir, ok, out) = run_in_scratch("split.py", &[]).await;
    assert!(ok && out.contains("split: ok"), "{out}");
}

/// A bundle split for the idle harness, whose own harness then dies: only its primary runs
/// again (its rest is the other harness's bundle), so every line is read once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_bundle_whose_harness_dies_is_retried_as_its_primary_only() {
    let server = server().await;
    let dir = tempfile::tempdir().unwrap();
    let args = vec![
        s(script("split_crash.py")),
        server.addr.to_string(),
        s(venv_python()),
        s(dir.path()),
    ];
    let (ok, out) = python(args).await;
    assert!(
        dir.path().join("died").exists(),
        "the harness never died: {out}"
    );
    assert!(ok && out.contains("split_crash: ok"), "{out}");
    let messages = messages_of_the_job(&server).await;
    assert!(
        messages
            .iter()
            .any(|m| m.contains("running bundles split for idle harnesses")),
        "no bundle was split: {messages:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dofn_that_always_raises_fails_the_job_after_four_attempts_with_its_message() {
    let (dir, ok, out) = run_in_scratch("failures.py", &["error"]).await;
    assert!(!ok, "{out}");
    assert!(out.contains("bad record 7"), "{out}");
    // Named as Beam's harness names it, also from inside a lean chain.
    assert!(out.contains("[while running 'ParDo(Refuse)']"), "{out}");
    let attempts = std::fs::read_to_string(dir.path().join("attempts")).unwrap();
    assert_eq!(attempts.lines().count(), 4, "{out}");
}

/// A transform no SDK environment runs and Riverbank does not know: refused at Prepare, named.
#[tokio::test]
async fn an_unknown_transform_is_refused_at_prepare_by_name() {
    let server = server().await;
    let mut components = Components::default();
    components.pcollections.insert(
        "p".into(),
        PCollection {
            unique_name: "p".into(),
            ..Default::default()
        },
    );
    components.transforms.insert(
        "t".into(),
        PTransform {
            unique_name: "My/Mystery".into(),
            spec: Some(FunctionSpec {
                urn: "beam:transform:mystery:v1".into(),
                payload: vec![],
            }),
            outputs: [("out".to_string(), "p".to_string())].into(),
            ..Default::default()
        },
    );
    let pipeline = Pipeline {
        components: Some(components),
        root_transform_ids: vec!["t".into()],
        ..Default::default()
    };
    let mut client = JobServiceClient::connect(format!("http://{}", server.addr))
        .await
        .unwrap();
    let err = client
        .prepare(PrepareJobRequest {
            pipeline: Some(pipeline),
            job_name: "mystery".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("'My/Mystery'")
            && err.message().contains("beam:transform:mystery:v1"),
        "{}",
        err.message()
    );
}

/// Every message of the job `server` ran (its only one), once it has ended.
async fn messages_of_the_job(server: &JobServer) -> Vec<String> {
    let (mut client, jobs) = jobs_of(server).await;
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    messages_of(&mut client, jobs[0].job_id.clone()).await
}

/// A client of `server`'s Job API, and the jobs it knows.
async fn jobs_of(
    server: &JobServer,
) -> (
    JobServiceClient<tonic::transport::Channel>,
    Vec<riverbank_portable::job_api::JobInfo>,
) {
    use riverbank_portable::job_api::GetJobsRequest;
    let mut client = JobServiceClient::connect(format!("http://{}", server.addr))
        .await
        .unwrap();
    let jobs = client
        .get_jobs(GetJobsRequest {})
        .await
        .unwrap()
        .into_inner()
        .job_info;
    (client, jobs)
}

/// Every message of job `job_id`, once it has ended.
async fn messages_of(
    client: &mut JobServiceClient<tonic::transport::Channel>,
    job_id: String,
) -> Vec<String> {
    use futures::StreamExt;
    use riverbank_portable::job_api::{JobMessagesRequest, job_messages_response};
    let mut stream = client
        .get_message_stream(JobMessagesRequest { job_id })
        .await
        .unwrap()
        .into_inner();
    let mut lines = Vec::new();
    while let Some(Ok(m)) = stream.next().await {
        if let Some(job_messages_response::Response::MessageResponse(m)) = m.response {
            lines.push(m.message_text);
        }
    }
    lines
}

/// Files staged with a job (`--files_to_stage`, `--save_main_session`) go through the job
/// server's artifact staging to its PROCESS harnesses, which import the staged module from
/// their own `staged` directory; the job's log names what was staged, and the server's copies
/// are gone once the job has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staged_files_reach_process_harnesses_and_go_when_the_job_ends() {
    let artifacts = tempfile::tempdir().unwrap();
    let server = JobServer::start(JobServerOptions {
        artifacts_dir: Some(artifacts.path().to_path_buf()),
        ..options()
    })
    .await
    .expect("job server");
    let scratch = tempfile::tempdir().unwrap();
    let (ok, out) = python(vec![
        s(script("staged.py")),
        server.addr.to_string(),
        s(venv_python()),
        s(scratch.path()),
    ])
    .await;
    assert!(ok && out.contains("staged: ok"), "{out}");

    let staged = messages_of_the_job(&server)
        .await
        .into_iter()
        .find(|m| m.starts_with("staged artifacts:"))
        .unwrap_or_default();
    assert!(
        staged.contains("rb_staged_helper.py") && staged.contains("pickled_main_session"),
        "no staging in the job's log: {staged:?}"
    );
    let left: Vec<_> = std::fs::read_dir(artifacts.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(
        left.is_empty(),
        "the ended job's artifacts stayed: {left:?}"
    );
}

/// Packages staged with a job (`--extra_package`, `--requirements_file`) are installed for its
/// PROCESS harnesses with their command's Python, as Beam's container boot installs them, and
/// the user's code imports them from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staged_packages_are_installed_for_process_harnesses() {
    let server = JobServer::start(options()).await.expect("job server");
    let scratch = tempfile::tempdir().unwrap();
    let (ok, out) = python(vec![
        s(script("packages.py")),
        server.addr.to_string(),
        s(venv_python()),
        s(scratch.path()),
    ])
    .await;
    assert!(ok && out.contains("packages: ok"), "{out}");
}

/// The value of user counter `name` among `infos`.
fn counter(infos: &[riverbank_portable::runner_api::MonitoringInfo], name: &str) -> Option<u64> {
    infos
        .iter()
        .find(|i| i.labels.get("NAME").map(String::as_str) == Some(name))
        .map(|i| {
            riverbank_portable::coders::read_varint(&i.payload, 0)
                .unwrap()
                .0
        })
}

/// A running job is followed as it runs: GetJobMetrics' attempted metrics grow while the job is
/// RUNNING (running bundles asked with ProcessBundleProgress, finished ones counted), and the
/// job's messages tell the stage's elements so far, then its elements in and out when done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_jobs_metrics_and_progress_are_told_while_it_runs() {
    use riverbank_portable::job_api::{
        GetJobMetricsRequest, GetJobStateRequest, GetJobsRequest, job_state,
    };

    const N: u64 = 400;
    let server = JobServer::start(JobServerOptions {
        progress_every: std::time::Duration::from_millis(300),
        ..options()
    })
    .await
    .expect("job server");
    let script = tokio::spawn(python(vec![
        s(script("progress.py")),
        server.addr.to_string(),
        N.to_string(),
    ]));
    let mut client = JobServiceClient::connect(format!("http://{}", server.addr))
        .await
        .unwrap();
    let mut seen_while_running = Vec::new();
    let job_id = loop {
        let jobs = client
            .get_jobs(GetJobsRequest {})
            .await
            .unwrap()
            .into_inner();
        if let Some(job) = jobs.job_info.first() {
            break job.job_id.clone();
        }
        assert!(!script.is_finished(), "the script ended before submitting");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    while !script.is_finished() {
        let metrics = client
            .get_job_metrics(GetJobMetricsRequest {
                job_id: job_id.clone(),
            })
            .await
            .unwrap()
            .into_inner()
            .metrics
            .unwrap();
        let state = client
            .get_state(GetJobStateRequest {
                job_id: job_id.clone(),
            })
            .await
            .unwrap()
            .into_inner()
            .state;
        if state == job_state::Enum::Running as i32
            && let Some(n) = counter(&metrics.attempted, "seen")
        {
            seen_while_running.push(n);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let (ok, out) = script.await.unwrap();
    assert!(ok && out.contains("progress: ok"), "{out}");
    assert!(
        seen_while_running.iter().any(|&n| n > 0 && n < N),
        "no partial count while running: {seen_while_running:?}"
    );
    let metrics = client
        .get_job_metrics(GetJobMetricsRequest {
            job_id: job_id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .metrics
        .unwrap();
    assert_eq!(counter(&metrics.committed, "seen"), Some(N));
    assert_eq!(counter(&metrics.attempted, "seen"), Some(N));

    let lines = messages_of(&mut client, job_id).await;
    let progress = lines.iter().position(|l| l.contains("elements in after"));
    let done = lines
        .iter()
        .position(|l| l.contains("done in") && l.contains(&format!("{N} elements in")));
    assert!(
        matches!((progress, done), (Some(p), Some(d)) if p < d),
        "{lines:#?}"
    );
    let partial = lines.iter().any(|l| {
        l.split(" elements in after")
            .next()
            .and_then(|head| head.rsplit(' ').next())
            .and_then(|n| n.replace(',', "").parse::<u64>().ok())
            .is_some_and(|n| n > 0 && n < N)
    });
    assert!(partial, "no stage was seen part way: {lines:#?}");
}

/// CombinePerKey submitted whole (as Java and Go submit it) is lifted by the runner: its plan
/// has a Precombine before a GroupByKey of accumulators, and sums, means, a CombineFn with its
/// own accumulator, fixed and session windows all give Beam's results.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn combiners_the_sdk_left_whole_are_lifted_by_the_runner() {
    let server = server().await;
    let (ok, out) = python(vec![s(script("lifting.py")), server.addr.to_string()]).await;
    assert!(ok && out.contains("lifting: ok"), "{out}");
    let messages = messages_of_the_job(&server).await;
    let plan = messages
        .iter()
        .find(|m| m.starts_with("plan:"))
        .expect("the plan message");
    assert!(
        plan.contains("Sum/Precombine")
            && plan.contains("GroupByKey Sum/Group (")
            && !plan.contains("Sum/GroupByKey"),
        "{plan}"
    );
}

/// A GroupByKey and a stateful DoFn over about 11 MB on a job server holding 1 MiB of a job's
/// data in memory: the rest waits in the spill file, the grouping goes a hash partition of keys
/// at a time, the stateful DoFn's input is cut by key a block at a time, and every key still
/// gets all its values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_by_key_larger_than_the_memory_budget_spills_and_stays_exact() {
    let server = JobServer::start(JobServerOptions {
        memory_mb: 1,
        ..options()
    })
    .await
    .expect("job server");
    let (ok, out) = python(vec![s(script("spill.py")), server.addr.to_string()]).await;
    assert!(ok && out.contains("spill: ok"), "{out}");
    let messages = messages_of_the_job(&server).await;
    assert!(
        messages
            .iter()
            .any(|m| m.starts_with("spilled ") && m.contains("memory budget 1 MiB")),
        "{messages:#?}"
    );
}

/// Beam's own `PortableRunnerTest` (76 FnApiRunnerTest cases, 9 of which Beam skips for portable
/// runners) against this job server: every case passes, a custom merging WindowFn's among them
/// (its windows merged by the SDK). Takes 1.5 to 4 minutes, so it runs on request:
/// `cargo nextest run -p riverbank-portable --run-ignored only`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "Beam's runner suite takes minutes"]
async fn beams_own_portable_runner_tests_pass() {
    beams_runner_suite_passes(&[]).await;
}

/// The same suite with `--streaming`, as Beam's `FlinkRunnerTestStreaming` runs it: every
/// pipeline a streaming job, run in rounds (its GroupByKeys, state and timers, side inputs and
/// splittable DoFns through `execute::streaming`). Every case passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "Beam's runner suite takes minutes"]
async fn beams_own_portable_runner_tests_pass_as_streaming_jobs() {
    beams_runner_suite_passes(&["--streaming"]).await;
}

/// The same suite on PROCESS harnesses, which the job server starts as Riverbank's start of
/// Beam's harness: every case passes with lean chains, in batch and as streaming jobs (one more
/// skipped: it looks for a warning of the harness in the test's own process, as Beam's harness
/// on PROCESS fails it too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "Beam's runner suite takes minutes"]
async fn beams_own_portable_runner_tests_pass_on_process_harnesses() {
    beams_runner_suite_passes(&["--process"]).await;
    beams_runner_suite_passes(&["--process", "--streaming"]).await;
}

async fn beams_runner_suite_passes(flags: &[&str]) {
    let server = server().await;
    let mut args = vec![s(script("validates_runner.py")), server.addr.to_string()];
    args.extend(flags.iter().map(|f| f.to_string()));
    let (_, out) = python_within(args, std::time::Duration::from_secs(900)).await;
    let ran = out
        .lines()
        .find_map(|l| l.strip_prefix("validates_runner: ran "))
        .unwrap_or_else(|| panic!("the suite did not run: {out}"));
    let skipped = if flags.contains(&"--process") { 10 } else { 9 };
    assert!(ran.starts_with(&format!("76, skipped {skipped}")), "{ran}");
    let not_passed: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("not passed: "))
        .collect();
    assert!(not_passed.is_empty(), "{not_passed:?}\n{out}");
}
