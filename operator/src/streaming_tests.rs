//! Streaming jobs against the mock API server and a fake coordinator: drain, snapshots,
//! updates accepted and refused, starting from a snapshot, and the state shards.
use super::*;
use crate::crd::{FromSnapshotSpec, SnapshotSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use riverbank_pipeline::StreamingProgress;

const TEMP: &str = "s3://bucket/tmp";

/// A keyed windowed count over the synthetic stream; `counted` names the Combine.
fn counts(counted: &str) -> Value {
    json!({"type": "chain", "transforms": [
        {"type": "ReadFromSynthetic", "name": "Events", "config": {"rate": 100, "keys": 4}},
        {"type": "WindowInto", "windowing": {"type": "fixed", "size": "10s"}},
        {"type": "Combine", "name": counted, "config": {"group_by": "key", "combine": {"n": {"fn": "count"}}}},
        {"type": "WriteToJson", "config": {"path": "s3://bucket/out/counts.jsonl"}}
    ]})
}

fn streaming_options() -> JobOptions {
    JobOptions {
        streaming: Some(true),
        num_workers: Some(2),
        max_num_workers: Some(4),
        disk_size_gb: Some(10),
        temp_location: Some(TEMP.into()),
        ..Default::default()
    }
}

/// The coordinator's report of a running streaming job of run `run`.
fn streaming_progress(run: &str) -> JobProgress {
    JobProgress {
        streaming: Some(StreamingProgress {
            checkpoint: 7,
            watermark: Some("2025-03-01T10:04:50+00:00".into()),
            watermark_lag_seconds: Some(12.4),
            backlog_elements: 900,
            backlog_bytes: 36_000,
            backlog_seconds: Some(9.0),
            throughput_elements_per_sec: 100.0,
            state_bytes: 65_536,
            active_keys: 4,
            last_checkpoint_age_seconds: Some(1.0),
            last_checkpoint_ms: 300,
            run_id: Some(run.into()),
            ..Default::default()
        }),
        // The coordinator reports a stream's backlog where a batch job's is.
        backlog_seconds: Some(9.0),
        ..progress(JobPhase::Running)
    }
}

/// A streaming job of `generation` whose coordinator ran `pipeline` (run g1) and last said
/// Running.
fn running_streaming(pipeline: Value, generation: i64) -> DataflowJob {
    let mut job = JobBuilder::new("test")
        .pipeline(pipeline)
        .options(streaming_options())
        .finalized()
        .build();
    job.metadata.generation = Some(generation);
    let plan = job.plan().unwrap();
    let mut s = status::planned_status(
        &job,
        status::Observed {
            stages: StageStatus::from_plan(&plan),
            target_workers: 2,
            progress: Some(Ok(streaming_progress("g1"))),
            pod_problem: None,
            cancel: None,
            insights: crate::insights::Found::default(),
            autoscaling: None,
            memory: None,
            streaming: status::StreamingObserved {
                run: Some(crate::streaming::current_run(&job)),
                control: None,
            },
            now: Timestamp::from_second(1_740_823_200).unwrap(),
        },
    );
    s.current_workers = Some(2);
    job.status = Some(s);
    job
}

/// The plan ConfigMap as the API server has it: the plan of `pipeline`.
fn plan_config_map(pipeline: Value) -> Value {
    plan_config_map_of(
        &JobBuilder::new("test")
            .pipeline(pipeline)
            .options(streaming_options())
            .build(),
    )
}

impl ApiServer {
    /// The operator reads the running plan from its ConfigMap.
    async fn read_plan(&mut self, config_map: &Value) {
        let (parts, _, send) = self.next().await;
        assert_eq!(
            (parts.method.as_str(), parts.uri.path()),
            ("GET", PLAN_PATH)
        );
        send.send_response(response(200, config_map));
    }

    /// The four children; returns (plan.json, the coordinator's args).
    async fn streaming_children(&mut self) -> (String, Vec<String>) {
        let plan = self.apply(PLAN_PATH, None).await;
        self.apply(SERVICE_PATH, None).await;
        let coordinator = self.apply(COORDINATOR_PATH, None).await;
        let workers = self
            .apply(
                WORKERS_PATH,
                Some(json!({"replicas": 2, "readyReplicas": 2})),
            )
            .await;
        // The state shards' disks stay when workers go (a scale-down keeps the state).
        assert_eq!(
            workers["spec"]["persistentVolumeClaimRetentionPolicy"],
            json!({"whenDeleted": "Delete", "whenScaled": "Retain"})
        );
        let args = coordinator["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        (plan["data"]["plan.json"].as_str().unwrap().into(), args)
    }
}

fn arg_after<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let i = args.iter().position(|a| a == flag)?;
    args.get(i + 1).map(String::as_str)
}

fn with_status(mut job: DataflowJob, status: Value) -> DataflowJob {
    job.status = Some(serde_json::from_value(status).unwrap());
    job
}

#[tokio::test]
async fn a_running_streaming_job_reports_its_numbers_and_runs_its_shards() {
    let job = running_streaming(counts("Count"), 1);
    let coordinator = FakeCoordinator::answering(Some(streaming_progress("g1")));
    let (result, _) = reconcile_with(job, coordinator.clone(), |mut api| async move {
        let (_, args) = api.streaming_children().await;
        // maxNumWorkers state shards; the run's id.
        assert_eq!(arg_after(&args, "--shuffle-partitions"), Some("4"));
        assert_eq!(arg_after(&args, "--run-id"), Some("g1"));
        assert_eq!(arg_after(&args, "--from-snapshot"), None);
        let s = api.status().await;
        assert_eq!(s["state"], "Running");
        assert_eq!(s["streaming"]["checkpoint"], 7);
        assert_eq!(s["streaming"]["stateBytes"], 65_536);
        assert_eq!(s["backlogSeconds"], 9);
        api
    })
    .await;
    result.unwrap();
}

#[tokio::test]
async fn drain_asks_the_coordinator_then_the_job_ends_drained() {
    let mut job = running_streaming(counts("Count"), 2);
    job.spec.desired_state = DesiredState::Drained;
    let coordinator = FakeCoordinator::answering(Some(streaming_progress("g1")));
    let (result, _) = reconcile_with(job.clone(), coordinator.clone(), |mut api| async move {
        api.streaming_children().await;
        let s = api.status().await;
        assert_eq!(s["state"], "Draining");
        assert_eq!(s["streaming"]["watermarkLagSeconds"], 12);
        assert_eq!(s["streaming"]["backlogMessages"], 900);
        assert_eq!(s["streaming"]["shards"], 4);
        assert_eq!(s["streaming"]["shardsPerWorker"], 2);
        assert_eq!(api.event().await.1, "Draining");
        api
    })
    .await;
    result.unwrap();
    assert!(
        coordinator
            .calls()
            .contains(&format!("POST {COORDINATOR_ADDRESS}/v1/job/drain")),
        "{:?}",
        coordinator.calls()
    );

    // The drain fired every window and committed: the coordinator says Done.
    let draining = with_status(
        job,
        json!({"state": "Draining", "observedGeneration": 2, "currentWorkers": 2,
            "run": {"generation": 2}}),
    );
    *coordinator.progress.lock().unwrap() = Some(JobProgress {
        phase: JobPhase::Done,
        ..streaming_progress("g1")
    });
    let (result, _) = reconcile_with(draining, coordinator, |mut api| async move {
        api.streaming_children().await;
        let s = api.status().await;
        assert_eq!(s["state"], "Drained");
        let (_, reason, note) = api.event().await;
        assert_eq!(reason, "Drained", "{note}");
        api
    })
    .await;
    // Final: look again at once to scale the pods to zero.
    assert_eq!(result.unwrap(), Action::requeue(Duration::ZERO));
}

#[tokio::test]
async fn a_named_snapshot_is_taken_once_and_listed() {
    let mut job = running_streaming(counts("Count"), 2);
    job.spec.snapshot = Some(SnapshotSpec {
        name: "before-v2".into(),
    });
    let coordinator = FakeCoordinator::answering(Some(streaming_progress("g1")));
    let (result, _) = reconcile_with(job.clone(), coordinator.clone(), |mut api| async move {
        api.streaming_children().await;
        let s = api.status().await;
        assert_eq!(s["snapshots"][0]["name"], "before-v2");
        assert_eq!(s["snapshots"][0]["checkpoint"], 7);
        assert_eq!(
            s["snapshots"][0]["location"],
            "s3://bucket/tmp/test/snapshots/before-v2"
        );
        let (_, reason, note) = api.event().await;
        assert_eq!(reason, "SnapshotTaken");
        assert!(note.contains("checkpoint 7"), "{note}");
        api
    })
    .await;
    result.unwrap();
    let asked = |c: &FakeCoordinator| {
        c.calls()
            .iter()
            .filter(|c| c.contains("/v1/job/snapshot"))
            .count()
    };
    assert_eq!(asked(&coordinator), 1);

    // Listed: not asked again.
    let mut taken = job;
    taken.status.as_mut().unwrap().snapshots = vec![crate::crd::SnapshotStatus {
        name: "before-v2".into(),
        checkpoint: 7,
        location: "s3://bucket/tmp/test/snapshots/before-v2".into(),
        time: Time(Timestamp::from_second(1_740_823_300).unwrap()),
    }];
    let (result, _) = reconcile_with(taken, coordinator.clone(), |mut api| async move {
        api.streaming_children().await;
        let s = api.status().await;
        assert_eq!(s["snapshots"].as_array().unwrap().len(), 1);
        api
    })
    .await;
    result.unwrap();
    assert_eq!(asked(&coordinator), 1);
}

#[tokio::test]
async fn a_compatible_update_stops_with_a_snapshot_and_restarts_from_it() {
    // Generation 2 renames the Combine; the mapping keeps its state.
    let mut job = running_streaming(counts("Count"), 1);
    job.spec.pipeline = Some(counts("CountPerKey").as_object().unwrap().clone());
    job.spec.transform_name_mapping = [("Count".to_string(), "CountPerKey".to_string())].into();
    job.metadata.generation = Some(2);
    let coordinator = FakeCoordinator::answering(Some(streaming_progress("g1")));
    let old_plan = plan_config_map(counts("Count"));

    // 1. Checked, then stopped after a checkpoint; the old pipeline's pods stay meanwhile.
    let cm = old_plan.clone();
    let (result, _) = reconcile_with(job.clone(), coordinator.clone(), |mut api| async move {
        api.read_plan(&cm).await;
        let (plan, args) = api.streaming_children().await;
        assert!(plan.contains("\"Count\"") && !plan.contains("CountPerKey"));
        assert_eq!(arg_after(&args, "--run-id"), Some("g1"));
        let s = api.status().await;
        assert_eq!(s["state"], "Updating");
        assert_eq!(s["update"]["phase"], "Stopping");
        assert_eq!(condition(&s, "Updated")["reason"], "Updating");
        assert_eq!(api.event().await.1, "Updating");
        api
    })
    .await;
    result.unwrap();
    let calls = coordinator.calls();
    assert!(
        calls.iter().any(|c| c.contains("/v1/job/update-check"))
            && calls.iter().any(|c| c.ends_with("/v1/job/stop update-g2")),
        "{calls:?}"
    );
    coordinator.finish_stop("update-g2");

    // 2. The old run stopped with its snapshot: the children switch to the new pipeline,
    //    started from it, with its own run id and checkpoints.
    let stopping = with_status(
        job.clone(),
        json!({"state": "Updating", "observedGeneration": 2, "currentWorkers": 2,
            "run": {"generation": 1},
            "update": {"generation": 2, "phase": "Stopping", "message": "m",
                "time": "2025-03-01T10:05:00Z"}}),
    );
    let cm = old_plan.clone();
    let (result, _) = reconcile_with(stopping, coordinator.clone(), |mut api| async move {
        api.read_plan(&cm).await;
        let (plan, args) = api.streaming_children().await;
        assert!(plan.contains("CountPerKey"));
        assert_eq!(arg_after(&args, "--run-id"), Some("g2"));
        assert_eq!(
            arg_after(&args, "--from-snapshot"),
            Some("s3://bucket/tmp/test/snapshots/update-g2")
        );
        assert_eq!(
            arg_after(&args, "--checkpoint-dir"),
            Some("s3://bucket/tmp/test/runs/g2")
        );
        assert_eq!(
            arg_after(&args, "--transform-name-mapping"),
            Some(r#"{"Count":"CountPerKey"}"#)
        );
        let s = api.status().await;
        assert_eq!(s["state"], "Updating");
        assert_eq!(s["update"]["phase"], "Restarting");
        assert_eq!(s["run"]["generation"], 2);
        assert_eq!(s["snapshots"][0]["name"], "update-g2");
        assert_eq!(api.event().await.1, "Updating");
        api
    })
    .await;
    result.unwrap();

    // 3. The old coordinator's last word (Cancelled) does not end the job; the new run's
    //    Running does end the update.
    let restarting = with_status(
        job,
        json!({"state": "Updating", "observedGeneration": 2, "currentWorkers": 2,
            "run": {"generation": 2, "fromSnapshot": "s3://bucket/tmp/test/snapshots/update-g2",
                "checkpointLocation": "s3://bucket/tmp/test/runs/g2"},
            "update": {"generation": 2, "phase": "Restarting", "message": "m",
                "snapshot": "s3://bucket/tmp/test/snapshots/update-g2",
                "time": "2025-03-01T10:05:00Z"}}),
    );
    let (result, _) = reconcile_with(
        restarting.clone(),
        coordinator.clone(),
        |mut api| async move {
            api.streaming_children().await;
            let s = api.status().await;
            assert_eq!(
                s["state"], "Updating",
                "the old run's Cancelled is not the job's"
            );
            api
        },
    )
    .await;
    result.unwrap();
    *coordinator.progress.lock().unwrap() = Some(streaming_progress("g2"));
    let (result, _) = reconcile_with(restarting, coordinator, |mut api| async move {
        api.streaming_children().await;
        let s = api.status().await;
        assert_eq!(s["state"], "Running");
        assert_eq!(s["update"]["phase"], "Done");
        assert_eq!(condition(&s, "Updated")["status"], "True");
        assert_eq!(api.event().await.1, "Running");
        let (_, reason, note) = api.event().await;
        assert_eq!(reason, "Updated");
        assert!(note.contains("update-g2"), "{note}");
        api
    })
    .await;
    result.unwrap();
}

#[tokio::test]
async fn an_incompatible_update_is_refused_and_the_job_runs_on() {
    let mut job = running_streaming(counts("Count"), 1);
    job.spec.pipeline = Some(counts("Other").as_object().unwrap().clone());
    job.metadata.generation = Some(2);
    let coordinator = FakeCoordinator::answering(Some(streaming_progress("g1")));
    *coordinator.refuses_update.lock().unwrap() = Some(
        "the snapshot holds the state of Combine 'Count', and the pipeline has no Combine 'Count'"
            .into(),
    );
    let cm = plan_config_map(counts("Count"));
    let (result, _) = reconcile_with(job, coordinator.clone(), |mut api| async move {
        api.read_plan(&cm).await;
        let (plan, args) = api.streaming_children().await;
        assert!(plan.contains("\"Count\"") && !plan.contains("Other"));
        assert_eq!(arg_after(&args, "--run-id"), Some("g1"));
        let s = api.status().await;
        assert_eq!(s["state"], "Running");
        assert_eq!(s["update"]["phase"], "Refused");
        let updated = condition(&s, "Updated");
        assert_eq!(
            (updated["status"].as_str(), updated["reason"].as_str()),
            (Some("False"), Some("UpdateRefused"))
        );
        assert!(
            updated["message"]
                .as_str()
                .unwrap()
                .contains("no Combine 'Count'")
        );
        api.event().await; // Replanned (generation 2 observed)
        let (kind, reason, _) = api.event().await;
        assert_eq!(
            (kind.as_str(), reason.as_str()),
            ("Warning", "UpdateRefused")
        );
        api
    })
    .await;
    result.unwrap();
    assert!(
        !coordinator
            .calls()
            .iter()
            .any(|c| c.contains("/v1/job/stop")),
        "a refused update stops nothing"
    );
}

#[tokio::test]
async fn an_invalid_new_pipeline_on_a_running_streaming_job_is_a_refused_update() {
    let mut job = running_streaming(counts("Count"), 1);
    job.spec.pipeline = Some(
        json!({"type": "chain", "transforms": [{"type": "NoSuchTransform"}]})
            .as_object()
            .unwrap()
            .clone(),
    );
    job.metadata.generation = Some(2);
    let coordinator = FakeCoordinator::answering(Some(streaming_progress("g1")));
    let cm = plan_config_map(counts("Count"));
    let (result, _) = reconcile_with(job, coordinator, |mut api| async move {
        api.read_plan(&cm).await; // the running plan, for the children
        api.read_plan(&cm).await; // and the update's comparison
        let (plan, _) = api.streaming_children().await;
        assert!(plan.contains("\"Count\""));
        let s = api.status().await;
        assert_eq!(s["state"], "Running", "the job is not stopped");
        assert!(
            s["update"]["message"]
                .as_str()
                .unwrap()
                .contains("NoSuchTransform")
        );
        api.event().await;
        assert_eq!(api.event().await.1, "UpdateRefused");
        api
    })
    .await;
    result.unwrap();
}

#[tokio::test]
async fn a_job_from_a_snapshot_starts_its_coordinator_there() {
    let mut job = JobBuilder::new("test")
        .pipeline(counts("CountPerKey"))
        .options(streaming_options())
        .finalized()
        .build();
    job.spec.from_snapshot = Some(FromSnapshotSpec {
        location: "s3://bucket/tmp/old/snapshots/v1".into(),
    });
    job.spec.transform_name_mapping = [("Count".to_string(), "CountPerKey".to_string())].into();
    let coordinator = FakeCoordinator::answering(None);
    let (result, _) = reconcile_with(job, coordinator, |mut api| async move {
        let (_, args) = api.streaming_children().await;
        assert_eq!(
            arg_after(&args, "--from-snapshot"),
            Some("s3://bucket/tmp/old/snapshots/v1")
        );
        assert_eq!(
            arg_after(&args, "--transform-name-mapping"),
            Some(r#"{"Count":"CountPerKey"}"#)
        );
        // Its own, empty checkpoint directory: the snapshot is restored into it.
        assert_eq!(arg_after(&args, "--checkpoint-dir"), Some(UID_ROOT));
        let s = api.status().await;
        assert_eq!(s["state"], "Pending");
        assert_eq!(
            s["run"],
            json!({"generation": 1, "fromSnapshot": "s3://bucket/tmp/old/snapshots/v1",
                "checkpointLocation": UID_ROOT})
        );
        api.event().await; // Planned
        api
    })
    .await;
    result.unwrap();
}

/// Where the fixture's job `test` (its uid) keeps its state.
const UID_ROOT: &str = "s3://bucket/tmp/test/6f1c6a52-0000-4000-8000-00000000test";

#[tokio::test]
async fn a_new_object_is_a_new_job_whose_state_is_under_its_uid() {
    let new_job = || {
        JobBuilder::new("test")
            .pipeline(counts("Count"))
            .options(streaming_options())
            .finalized()
            .build()
    };
    // Created: its checkpoints under tempLocation/NAME/UID, recorded in status.run.
    let (result, _) = reconcile_with(
        new_job(),
        FakeCoordinator::answering(None),
        |mut api| async move {
            let (_, args) = api.streaming_children().await;
            assert_eq!(arg_after(&args, "--checkpoint-dir"), Some(UID_ROOT));
            let s = api.status().await;
            assert_eq!(
                s["run"],
                json!({"generation": 1, "checkpointLocation": UID_ROOT})
            );
            api.event().await; // Planned
            api
        },
    )
    .await;
    result.unwrap();

    // Deleted and created again under the same name: another uid, another directory, so it
    // does not resume the deleted job's checkpoint log (its source clock and offsets).
    let mut again = new_job();
    again.metadata.uid = Some("0b9e7f00-1111-4222-8333-444455556666".into());
    let (result, _) = reconcile_with(
        again,
        FakeCoordinator::answering(None),
        |mut api| async move {
            let (_, args) = api.streaming_children().await;
            assert_eq!(
                arg_after(&args, "--checkpoint-dir"),
                Some("s3://bucket/tmp/test/0b9e7f00-1111-4222-8333-444455556666")
            );
            api.status().await;
            api.event().await;
            api
        },
    )
    .await;
    result.unwrap();

    // A job that started before its location was recorded keeps the coordinator's default
    // (tempLocation/NAME), where its checkpoints are: no restart into an empty directory.
    let legacy = with_status(
        new_job(),
        json!({"state": "Running", "observedGeneration": 1, "currentWorkers": 2}),
    );
    assert_eq!(
        crate::streaming::current_run(&legacy).checkpoint_location,
        None
    );
    let legacy = with_status(
        new_job(),
        json!({"state": "Running", "observedGeneration": 1, "run": {"generation": 1}}),
    );
    assert_eq!(
        crate::streaming::current_run(&legacy).checkpoint_location,
        None
    );
}

#[test]
fn an_updated_run_keeps_its_checkpoints_under_the_jobs_directory() {
    use crate::crd::RunStatus;
    use crate::streaming::run_checkpoint_location;
    let job = JobBuilder::new("test")
        .pipeline(counts("Count"))
        .options(streaming_options())
        .build();
    let run = |location: Option<String>| RunStatus {
        generation: 1,
        spec_generation: None,
        checkpoint_location: location,
        from_snapshot: None,
    };
    let first = run(Some(UID_ROOT.into()));
    let g2 = run_checkpoint_location(&job, &first, 2).unwrap();
    assert_eq!(g2, format!("{UID_ROOT}/runs/g2"));
    // The next update's run beside it, not inside it.
    assert_eq!(
        run_checkpoint_location(&job, &run(Some(g2)), 3).unwrap(),
        format!("{UID_ROOT}/runs/g3")
    );
    // A job started before locations were recorded: under tempLocation/NAME, as before.
    assert_eq!(
        run_checkpoint_location(&job, &run(None), 2).unwrap(),
        "s3://bucket/tmp/test/runs/g2"
    );
}

#[tokio::test]
async fn a_streaming_job_without_temp_location_is_an_invalid_spec() {
    let mut options = streaming_options();
    options.temp_location = None;
    let job = JobBuilder::new("test")
        .pipeline(counts("Count"))
        .options(options)
        .finalized()
        .build();
    let coordinator = FakeCoordinator::answering(None);
    let (result, _) = reconcile_with(job, coordinator, |mut api| async move {
        let s = api.status().await;
        assert_eq!(s["state"], "Failed");
        assert_eq!(condition(&s, "Ready")["reason"], "InvalidSpec");
        assert!(s["message"].as_str().unwrap().contains("tempLocation"));
        api.event().await;
        expect_release(&mut api).await;
        api
    })
    .await;
    result.unwrap();
}

/// Requests seen by [`answer_everything`]: (method, path, body).
type Seen = Arc<Mutex<Vec<(String, String, Value)>>>;

/// Plays an API server that accepts every request, for as long as the test runs: a child or
/// status applied is echoed back (a StatefulSet with all its replicas ready), an Event created.
fn answer_everything(mut api: ApiServer, template: DataflowJob) -> Seen {
    let seen: Seen = Arc::default();
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok(Some((request, send))) =
                timeout(Duration::from_secs(60), api.0.next_request()).await
            else {
                return;
            };
            let (parts, body) = request.into_parts();
            let bytes = body.collect_bytes().await.unwrap();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let path = parts.uri.path().to_string();
            let mut reply = body.clone();
            if path.contains("/statefulsets/") {
                let replicas = body["spec"]["replicas"].clone();
                reply["status"] = json!({"replicas": replicas, "readyReplicas": replicas});
            }
            if path.ends_with("/status") {
                reply = serde_json::to_value(&template).unwrap();
                reply["status"] = body["status"].clone();
            }
            let code = if parts.method == Method::POST {
                201
            } else {
                200
            };
            send.send_response(response(code, &reply));
            log.lock()
                .unwrap()
                .push((parts.method.to_string(), path, body));
        }
    });
    seen
}

#[tokio::test]
async fn a_backlogged_streaming_job_scales_up_and_its_shards_spread_over_more_workers() {
    // 4 state shards on 2 workers; the source runs 80 s behind and both workers are busy.
    let backlogged = |workers: usize| {
        let mut p = streaming_progress("g1");
        p.backlog_seconds = Some(80.0);
        p.throughput_bytes_per_sec = 200.0;
        p.throughput_elements_per_sec = 200.0;
        p.remaining_bytes = 16_000;
        p.workers = (0..workers)
            .map(|i| riverbank_pipeline::progress::WorkerProgress {
                name: format!("test-worker-{i}"),
                alive: true,
                cpu: 0.9,
                ..Default::default()
            })
            .collect();
        p
    };
    let coordinator = FakeCoordinator::answering(Some(backlogged(2)));
    let clock = Arc::new(FakeClock(Mutex::new(1_000.0)));
    let (mut ctx, api) = bare_context(coordinator.clone(), vec![]);
    // Every change of the numbers is written (none is held back for the status interval).
    ctx.status_interval = Duration::ZERO;
    let ctx = Arc::new(ctx.with_clock(clock.clone()));
    let mut job = running_streaming(counts("Count"), 1);
    let seen = answer_everything(api, job.clone());

    let mut scaled = None;
    for _ in 0..20 {
        seen.lock().unwrap().clear();
        reconcile(Arc::new(job.clone()), ctx.clone()).await.unwrap();
        let requests = seen.lock().unwrap().clone();
        if let Some((_, _, status)) = requests.iter().rev().find(|r| r.1.ends_with("/status")) {
            job.status = Some(serde_json::from_value(status["status"].clone()).unwrap());
        }
        let workers = requests
            .iter()
            .rev()
            .find(|r| r.1.ends_with("/statefulsets/test-worker"))
            .map(|r| r.2["spec"]["replicas"].as_i64().unwrap());
        let scaling = requests
            .iter()
            .find(|r| r.1.ends_with("/events") && r.2["reason"] == "Scaling")
            .map(|r| r.2["note"].as_str().unwrap().to_string());
        if let Some(note) = scaling {
            scaled = Some((workers, note));
            break;
        }
        *clock.0.lock().unwrap() += 10.0;
    }
    let (workers, note) = scaled.expect("the autoscaler scaled the job up");
    assert_eq!(
        workers,
        Some(4),
        "the worker StatefulSet carries the target"
    );
    assert!(note.starts_with("Scaling 2 -> 4 workers"), "{note}");
    // A count that divides the 4 shards, never 3.
    let status = job.status.clone().unwrap();
    assert_eq!(status.target_workers, Some(4));

    // The new workers joined: each holds one shard.
    *coordinator.progress.lock().unwrap() = Some(backlogged(4));
    *clock.0.lock().unwrap() += 10.0;
    seen.lock().unwrap().clear();
    reconcile(Arc::new(job.clone()), ctx.clone()).await.unwrap();
    let requests = seen.lock().unwrap().clone();
    let s = requests
        .iter()
        .rev()
        .find(|r| r.1.ends_with("/status"))
        .map(|r| r.2["status"].clone())
        .expect("status written");
    assert_eq!(s["streaming"]["shards"], 4);
    assert_eq!(s["streaming"]["shardsPerWorker"], 1);
    assert_eq!(s["currentWorkers"], 4);
}

#[tokio::test]
async fn a_worker_count_change_is_no_update_and_a_shard_count_change_is_refused() {
    // numWorkers: the same pipeline, so the same run (no check, no stop); the workers change.
    let mut job = running_streaming(counts("Count"), 1);
    job.spec.options.num_workers = Some(4);
    job.spec.options.autoscaling_algorithm = Some(crate::crd::AutoscalingAlgorithm::None);
    job.metadata.generation = Some(2);
    let coordinator = FakeCoordinator::answering(Some(streaming_progress("g1")));
    let running = JobBuilder::new("test")
        .pipeline(counts("Count"))
        .options(streaming_options())
        .build();
    let cm = plan_config_map_of(&running);
    let (result, _) = reconcile_with(job, coordinator.clone(), |mut api| async move {
        api.read_plan(&cm).await;
        let (_, args) = api.streaming_children().await;
        assert_eq!(arg_after(&args, "--run-id"), Some("g1"), "the same run");
        let s = api.status().await;
        assert_eq!(s["state"], "Running");
        assert_eq!(s["run"]["specGeneration"], 2);
        assert!(s.get("update").is_none());
        api.event().await; // Replanned
        let (_, reason, note) = api.event().await;
        assert_eq!(
            (reason.as_str(), note.as_str()),
            ("Scaling", "Target workers 2 -> 4")
        );
        api
    })
    .await;
    result.unwrap();
    assert!(
        !coordinator
            .calls()
            .iter()
            .any(|c| c.contains("update-check") || c.contains("/stop")),
        "{:?}",
        coordinator.calls()
    );

    // maxNumWorkers: the state's shards; refused before the coordinator is asked.
    let mut job = running_streaming(counts("Count"), 1);
    job.spec.options.max_num_workers = Some(8);
    job.metadata.generation = Some(2);
    let coordinator = FakeCoordinator::answering(Some(streaming_progress("g1")));
    let cm = plan_config_map_of(&running);
    let (result, _) = reconcile_with(job, coordinator.clone(), |mut api| async move {
        api.read_plan(&cm).await;
        let (_, args) = api.streaming_children().await;
        assert_eq!(
            arg_after(&args, "--shuffle-partitions"),
            Some("4"),
            "the running plan's shards"
        );
        let s = api.status().await;
        assert_eq!(s["update"]["phase"], "Refused");
        assert!(
            s["update"]["message"]
                .as_str()
                .unwrap()
                .contains("maxNumWorkers"),
            "{s}"
        );
        api.event().await;
        api.event().await;
        api
    })
    .await;
    result.unwrap();
    assert!(
        !coordinator
            .calls()
            .iter()
            .any(|c| c.contains("update-check")),
        "{:?}",
        coordinator.calls()
    );
}

/// The plan ConfigMap of a job as the API server has it.
fn plan_config_map_of(job: &DataflowJob) -> Value {
    let plan = serde_json::to_string(&job.plan().unwrap()).unwrap();
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "test-plan", "namespace": NS},
        "data": {"plan.json": plan}})
}

/// A streaming Beam SDK pipeline's job: its runner pod checkpoints to the job's tempLocation,
/// is drained where a coordinator is (never asked for snapshots or update checks: it keeps its
/// own state), and ends Drained when drained but Done when its sources ended by themselves.
#[tokio::test]
async fn a_streaming_beam_sdk_job_is_drained_through_its_runner() {
    let sdk = |desired: DesiredState| {
        let mut job = running_streaming(counts("Count"), 1);
        job.spec.pipeline = None;
        job.spec.beam_pipeline = JobBuilder::new("test")
            .beam_sdk()
            .build()
            .spec
            .beam_pipeline;
        job.spec.options.num_workers = Some(1);
        job.spec.options.autoscaling_algorithm = Some(crate::crd::AutoscalingAlgorithm::None);
        job.spec.desired_state = desired;
        job
    };
    let runner_args = |requests: &[(String, String, Value)]| -> Vec<String> {
        let runner = requests
            .iter()
            .rev()
            .find(|r| r.1.ends_with(COORDINATOR_PATH))
            .expect("the runner's StatefulSet applied");
        serde_json::from_value(
            runner.2["spec"]["template"]["spec"]["containers"][0]["args"].clone(),
        )
        .unwrap()
    };
    let status_of = |requests: &[(String, String, Value)]| {
        requests
            .iter()
            .rev()
            .find(|r| r.1.ends_with("/status"))
            .map(|r| r.2["status"].clone())
            .expect("status written")
    };
    let reconcile_once = |job: DataflowJob, progress: JobProgress| async move {
        let coordinator = FakeCoordinator::answering(Some(progress));
        let (ctx, api) = bare_context(coordinator.clone(), vec![]);
        let seen = answer_everything(api, job.clone());
        reconcile(Arc::new(job), Arc::new(ctx)).await.unwrap();
        let requests = seen.lock().unwrap().clone();
        (requests, coordinator.calls())
    };
    let mut running = streaming_progress("g1");
    running.streaming.as_mut().unwrap().run_id = None;

    // Drained: the runner is told, nothing else of a YAML stream's control is asked.
    let (requests, calls) = reconcile_once(sdk(DesiredState::Drained), running.clone()).await;
    let args = runner_args(&requests);
    assert_eq!(args[0], "runner-harness");
    assert_eq!(arg_after(&args, "--temp-location"), Some(TEMP));
    let status = status_of(&requests);
    assert_eq!(status["state"], "Draining");
    assert_eq!(status["streaming"]["checkpoint"], 7);
    assert_eq!(status["streaming"]["shards"], 0, "its state is in no shard");
    assert!(
        calls.contains(&format!("POST {COORDINATOR_ADDRESS}/v1/job/drain")),
        "{calls:?}"
    );
    assert!(
        !calls
            .iter()
            .any(|c| c.contains("snapshot") || c.contains("update-check")),
        "{calls:?}"
    );

    // The runner ended the drain: Drained. A stream whose sources ended by themselves: Done.
    for (draining, state) in [(true, "Drained"), (false, "Done")] {
        let mut ended = JobProgress {
            phase: JobPhase::Done,
            ..running.clone()
        };
        ended.streaming.as_mut().unwrap().draining = draining;
        let desired = match draining {
            true => DesiredState::Drained,
            false => DesiredState::Running,
        };
        let (requests, _) = reconcile_once(sdk(desired), ended).await;
        assert_eq!(status_of(&requests)["state"], state);
    }
}
