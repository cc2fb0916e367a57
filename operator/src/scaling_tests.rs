//! The autoscaler as the reconciler drives it: windows of the coordinator's progress readings
//! through [`JobScaler`], [`target_workers`], and the status and Events they lead to.
use super::*;
use crate::crd::{DataflowJobStatus, JobOptions, StageStatus};
use crate::fixtures::{self, JobBuilder};
use crate::insights::Found;
use crate::lifecycle;
use crate::status::{self, DEGRADED, Observed};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::runtime::events::EventType;
use riverbank_autoscale::{Finding, Insight};
use riverbank_pipeline::progress::WorkerProgress;

fn job(options: JobOptions) -> DataflowJob {
    JobBuilder::new("j")
        .namespace("ns")
        .options(options)
        .build()
}

fn streaming(max: i32, num: i32) -> JobOptions {
    JobOptions {
        streaming: Some(true),
        num_workers: Some(num),
        max_num_workers: Some(max),
        ..Default::default()
    }
}

/// The coordinator's status with `workers` live workers at `cpu`, `backlog` bytes left and
/// `throughput` bytes/s.
fn reading(workers: u32, cpu: f64, backlog: u64, throughput: f64) -> JobProgress {
    JobProgress {
        streaming: None,
        job_name: "j".into(),
        message: "running".into(),
        started_at: None,
        work_items_total: 100,
        work_items_done: 10,
        work_items_running: u64::from(workers),
        fraction_consumed: 0.1,
        remaining_bytes: backlog,
        throughput_bytes_per_sec: throughput,
        throughput_elements_per_sec: throughput / 100.0,
        backlog_seconds: (throughput > 0.0).then(|| backlog as f64 / throughput),
        runnable_items: 50,
        workers: (0..workers)
            .map(|i| WorkerProgress {
                name: format!("j-worker-{i}"),
                alive: true,
                cpu,
                ..Default::default()
            })
            .collect(),
        ..fixtures::progress(JobPhase::Running)
    }
}

/// Feeds `p` every 10 s over `(from, to]`; returns the decisions made.
fn feed(
    s: &mut JobScaler,
    cfg: &EngineConfig,
    from: u32,
    to: u32,
    p: &JobProgress,
) -> Vec<Decision> {
    (from / 10 + 1..=to / 10)
        .filter_map(|i| s.observe(cfg, p, f64::from(i * 10), 4))
        .collect()
}

/// The real time of monotonic second `secs`: the operator started at 1 000 000 000.
fn wall(secs: f64) -> Timestamp {
    Timestamp::from_second(1_000_000_000).unwrap() + SignedDuration::from_secs_f64(secs)
}

fn reasons(events: &[kube::runtime::events::Event]) -> Vec<&str> {
    events.iter().map(|e| e.reason.as_str()).collect()
}

fn running_status(target: i32) -> DataflowJobStatus {
    DataflowJobStatus {
        state: Some(JobState::Running),
        target_workers: Some(target),
        current_workers: Some(target),
        observed_generation: Some(1),
        ..Default::default()
    }
}

/// The next status of a running job with the autoscaler's `insight`.
fn next_status(job: &DataflowJob, target: i32, insight: InsightState, t: i64) -> DataflowJobStatus {
    status::planned_status(
        job,
        Observed {
            stages: vec![StageStatus::default()],
            target_workers: target,
            progress: Some(Ok(reading(3, 0.5, 0, 10.0))),
            pod_problem: None,
            cancel: None,
            insights: Found {
                engine: insight,
                progress: Some(vec![]),
                pods: vec![],
            },
            autoscaling: None,
            memory: None,
            streaming: Default::default(),
            now: Timestamp::from_second(t).unwrap(),
        },
    )
}

#[test]
fn num_workers_within_bounds() {
    assert_eq!(target_workers(&job(JobOptions::default()), None), 3);
    let o = JobOptions {
        max_num_workers: Some(2),
        ..Default::default()
    };
    assert_eq!(
        target_workers(&job(o), None),
        2,
        "default 3 never above the maximum"
    );
    let o = JobOptions {
        num_workers: Some(7),
        autoscaling_algorithm: Some(AutoscalingAlgorithm::None),
        ..Default::default()
    };
    assert_eq!(target_workers(&job(o), None), 7);
    // Streaming: at least ceil(100 / 15) = 7, and a count that spreads the 100 disks evenly.
    assert_eq!(target_workers(&job(streaming(100, 1)), None), 10);
    assert_eq!(target_workers(&job(streaming(12, 4)), None), 4);
}

#[test]
fn none_ignores_the_engine() {
    let mut j = job(JobOptions {
        num_workers: Some(5),
        max_num_workers: Some(20),
        autoscaling_algorithm: Some(AutoscalingAlgorithm::None),
        ..Default::default()
    });
    j.status = Some(running_status(9));
    assert_eq!(target_workers(&j, Some(12)), 5);
}

#[test]
fn a_running_job_keeps_its_target_until_the_engine_decides() {
    let mut j = job(JobOptions {
        num_workers: Some(2),
        max_num_workers: Some(8),
        ..Default::default()
    });
    assert_eq!(
        target_workers(&j, None),
        2,
        "a new job starts at numWorkers"
    );
    // After an operator restart: the target in status, not numWorkers again.
    j.status = Some(running_status(6));
    assert_eq!(target_workers(&j, None), 6);
    assert_eq!(target_workers(&j, Some(3)), 3, "the engine's decision wins");
    assert_eq!(target_workers(&j, Some(40)), 8, "never above maxNumWorkers");
    j.status.as_mut().unwrap().state = Some(JobState::Pending);
    assert_eq!(target_workers(&j, None), 2);
}

#[test]
fn streaming_backlog_scales_up_then_holds_then_scales_down() {
    let j = job(streaming(12, 3));
    let cfg = engine_config(&j);
    assert_eq!(cfg.evaluation_interval_secs(), 10.0);
    let mut s = JobScaler::default();

    // 80 s of backlog at 90 % CPU on 3 workers (100 B/s each): two minutes of readings
    // (the first averages the 30 s before it) before the engine decides.
    let d = feed(&mut s, &cfg, 0, 100, &reading(3, 0.9, 24_000, 300.0));
    assert_eq!(d.len(), 10, "one evaluation per 10 s reading");
    assert!(d[..9].iter().all(|d| d.reason == Reason::Settling), "{d:?}");
    let up = &d[9];
    assert_eq!(
        (up.reason, up.current_workers, up.target_workers),
        (Reason::ScaleUpBacklog, 3, 6),
        "{}",
        up.message
    );
    let view = s.view();
    assert_eq!(view.target, Some(6));
    assert_eq!(target_workers(&j, view.target), 6);
    assert_eq!(view.event.as_ref(), Some(up));
    s.published(up.at_secs);
    assert_eq!(s.view().event, None, "published once");

    // The new workers are not up yet: the engine waits, the target stays.
    let d = feed(&mut s, &cfg, 100, 120, &reading(3, 0.9, 24_000, 300.0));
    assert!(d.iter().all(|d| d.reason == Reason::RescaleInProgress));
    assert_eq!(s.view().target, Some(6));

    // Six workers, 12 s of backlog: between 10 s and 15 s, hold once the window is full.
    let d = feed(&mut s, &cfg, 120, 220, &reading(6, 0.8, 7_200, 600.0));
    let last = d.last().unwrap();
    assert_eq!(
        (last.reason, last.target_workers),
        (Reason::Steady, 6),
        "{}",
        last.message
    );
    assert!(d.iter().all(|d| !d.is_rescale()));
    assert_eq!(s.view().event, None, "holds are not Events");
    assert_eq!(s.view().target, Some(6));

    // Drained and at 30 % CPU. The first full look at it still averages in the last busy
    // readings (mean CPU 50 %, so 200 B/s per worker at 100 %): 600 B/s of arrivals at 90 % of
    // that is 3.3 → 4 workers, a count that divides the 12 disks, once; then the engine waits
    // for the new size.
    let d = feed(&mut s, &cfg, 220, 400, &reading(6, 0.3, 0, 600.0));
    let down: Vec<_> = d.iter().filter(|d| d.is_rescale()).collect();
    assert_eq!(down.len(), 1, "{d:?}");
    assert_eq!(
        (
            down[0].reason,
            down[0].current_workers,
            down[0].target_workers
        ),
        (Reason::ScaleDownIdle, 6, 4),
        "{}",
        down[0].message
    );
    assert!(
        down[0].message.contains("3 disks each"),
        "{}",
        down[0].message
    );
    assert_eq!(d.last().unwrap().reason, Reason::RescaleInProgress);
    assert_eq!(s.view().target, Some(4));
    assert_eq!(target_workers(&j, s.view().target), 4);
}

#[test]
fn a_hold_never_shrinks_the_job_to_its_live_workers() {
    // One of six workers is restarting: the engine holds at its five live workers, and the
    // StatefulSet keeps six.
    let mut j = job(streaming(12, 6));
    j.status = Some(running_status(6));
    let cfg = engine_config(&j);
    let mut s = JobScaler::default();
    let d = feed(&mut s, &cfg, 0, 200, &reading(5, 0.8, 6_000, 500.0));
    assert!(d.iter().all(|d| !d.is_rescale()), "{d:?}");
    assert_eq!(s.view().target, None);
    assert_eq!(target_workers(&j, s.view().target), 6);
}

#[test]
fn dry_run_records_the_decision_without_changing_replicas() {
    let mut options = streaming(12, 3);
    options.experiments = vec!["autoscaling_dry_run".into()];
    let mut j = job(options);
    j.status = Some(running_status(3));
    let cfg = engine_config(&j);
    assert!(cfg.dry_run);
    let mut s = JobScaler::default();
    let d = feed(&mut s, &cfg, 0, 100, &reading(3, 0.9, 24_000, 300.0));
    let would = d.last().unwrap();
    assert!(would.dry_run && would.is_rescale());
    assert_eq!(would.target_workers, 6);
    assert_eq!(s.view().target, None, "nothing applied");
    assert_eq!(target_workers(&j, s.view().target), 3);

    let old = j.status.clone().unwrap();
    let new = next_status(&j, 3, s.view().insight, 100);
    assert_eq!(new.target_workers, Some(3));
    let events = status::events(&old, &new, s.view().event.as_ref());
    let dry: Vec<_> = events
        .iter()
        .filter(|e| e.reason == "ScalingDryRun")
        .collect();
    assert_eq!(dry.len(), 1, "{:?}", reasons(&events));
    let note = dry[0].note.as_deref().unwrap();
    assert!(
        note.starts_with(
            "Dry run (autoscaling_dry_run), would scale 3 -> 6 workers (SCALE_UP_BACKLOG): backlogged"
        ),
        "{note}"
    );
    assert!(note.ends_with("; keeping 3"), "{note}");
    assert!(events.iter().all(|e| e.reason != "Scaling"));
}

#[test]
fn a_rescale_is_one_scaling_event_with_its_reason_and_numbers() {
    let mut j = job(streaming(12, 3));
    j.status = Some(running_status(3));
    let cfg = engine_config(&j);
    let mut s = JobScaler::default();
    feed(&mut s, &cfg, 0, 100, &reading(3, 0.9, 24_000, 300.0));
    let target = target_workers(&j, s.view().target);
    let old = j.status.clone().unwrap();
    let new = next_status(&j, target, s.view().insight, 100);
    assert_eq!(new.target_workers, Some(6));
    let events = status::events(&old, &new, s.view().event.as_ref());
    assert_eq!(
        events.len(),
        1,
        "no second, plain Scaling event: {:?}",
        reasons(&events)
    );
    assert_eq!(events[0].reason, "Scaling");
    assert!(matches!(events[0].type_, EventType::Normal));
    let note = events[0].note.as_deref().unwrap();
    assert!(
        note.starts_with("Scaling 3 -> 6 workers (SCALE_UP_BACKLOG): backlogged 80 s at CPU 90%"),
        "{note}"
    );
    // Published: the next status change shows no decision again.
    assert!(status::events(&new, &new, None).is_empty());
}

#[test]
fn max_num_workers_insight_is_listed_a_degraded_condition_and_an_event_until_it_clears() {
    let mut j = job(streaming(6, 6));
    j.status = Some(running_status(6));
    let cfg = engine_config(&j);
    let mut s = JobScaler::default();
    // At the maximum, no backlog, 90 % CPU: nothing to do, but more workers were allowed.
    let d = feed(&mut s, &cfg, 0, 100, &reading(6, 0.9, 0, 600.0));
    let last = d.last().unwrap();
    assert_eq!(last.insight, Some(Insight::MaxNumWorkers), "{last:?}");
    let InsightState::Holds(insight) = s.view().insight else {
        panic!("{:?}", s.view().insight)
    };
    assert_eq!(insight.code(), "MAX_NUM_WORKERS");

    let old = j.status.clone().unwrap();
    let raised = next_status(&j, 6, s.view().insight, 100);
    let c = lifecycle::condition(&raised, DEGRADED).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "MAX_NUM_WORKERS")
    );
    assert!(
        c.message
            .starts_with("The maximum number of workers could be increased: the job runs at maxNumWorkers (6) and is busy; no backlog (0.0 s) and CPU 90%"),
        "{}",
        c.message
    );
    assert_eq!(raised.insights.len(), 1);
    assert_eq!(raised.insights[0].type_, "MAX_NUM_WORKERS");
    assert_eq!(raised.insights[0].message, c.message);
    let events = status::events(&old, &raised, None);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].reason, "MAX_NUM_WORKERS");
    assert!(matches!(events[0].type_, EventType::Warning));
    assert_eq!(
        events[0].note.as_deref(),
        Some(
            format!(
                "{} Recommendation: {}",
                c.message, raised.insights[0].recommendation
            )
            .as_str()
        )
    );

    // Still holding with other numbers: the condition (and so status) does not churn.
    feed(&mut s, &cfg, 100, 110, &reading(6, 0.95, 0, 600.0));
    let mut j2 = j.clone();
    j2.status = Some(raised.clone());
    let again = next_status(&j2, 6, s.view().insight, 110);
    assert_eq!(again, raised);
    // After an operator restart the engine has no verdict yet: the condition stays.
    let kept = next_status(&j2, 6, InsightState::Unknown, 120);
    assert_eq!(
        lifecycle::condition(&kept, DEGRADED).unwrap().reason,
        "MAX_NUM_WORKERS"
    );
    assert!(status::events(&raised, &kept, None).is_empty());

    // CPU falls to 78 %: not busy enough for the insight (and no scale-down above 75 %).
    let d = feed(&mut s, &cfg, 110, 240, &reading(6, 0.78, 0, 600.0));
    assert_eq!(d.last().unwrap().insight, None);
    assert_eq!(s.view().insight, InsightState::Clear);
    let cleared = next_status(&j2, 6, s.view().insight, 240);
    assert_eq!(
        lifecycle::condition(&cleared, DEGRADED).unwrap().status,
        "False"
    );
    assert!(cleared.insights.is_empty());
    let events = status::events(&raised, &cleared, None);
    assert_eq!(events.len(), 1);
    assert_eq!(
        (events[0].reason.as_str(), events[0].note.as_deref()),
        (
            "MAX_NUM_WORKERS",
            Some("Cleared: no longer holds (The maximum number of workers could be increased)")
        )
    );
    assert!(matches!(events[0].type_, EventType::Normal));
}

#[test]
fn too_few_active_keys_hold_and_raise_the_active_keys_insight() {
    let mut j = job(streaming(12, 3));
    j.status = Some(running_status(3));
    let cfg = engine_config(&j);
    let mut s = JobScaler::default();
    let mut p = reading(3, 0.9, 30_000, 300.0);
    // 5 keys for 3 workers × 4 cores.
    p.active_keys = Some(5);
    let d = feed(&mut s, &cfg, 0, 100, &p);
    let last = d.last().unwrap();
    assert_eq!(
        (last.reason, last.insight),
        (Reason::HoldActiveKeys, Some(Insight::ActiveKeys))
    );
    assert_eq!(s.view().target, None);
    assert_eq!(s.view().event, None, "no rescale to report");
    let next = next_status(&j, target_workers(&j, None), s.view().insight, 100);
    assert_eq!(next.target_workers, Some(3));
    let c = lifecycle::condition(&next, DEGRADED).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "ACTIVE_KEYS")
    );
    assert!(
        c.message.contains("only 5 active keys for 12 cores"),
        "{}",
        c.message
    );
    let reasons: Vec<_> = status::events(j.status.as_ref().unwrap(), &next, None)
        .into_iter()
        .map(|e| e.reason)
        .collect();
    assert_eq!(reasons, ["ACTIVE_KEYS"]);
}

#[test]
fn a_pod_problem_outranks_an_insight_and_a_finished_job_has_none() {
    let mut j = job(streaming(6, 6));
    j.status = Some(running_status(6));
    let insight = InsightState::Holds(StandingInsight {
        finding: Finding {
            insight: Insight::MaxNumWorkers,
            subject: "MAX_NUM_WORKERS".into(),
            message: "busy".into(),
            recommendation: "raise it".into(),
        },
    });
    let mut o = Observed {
        stages: vec![],
        target_workers: 6,
        progress: Some(Ok(reading(6, 0.9, 0, 600.0))),
        pod_problem: Some(crate::pods::PodProblem {
            pod: "j-worker-2".into(),
            reason: "CrashLoopBackOff".into(),
            message: "back-off".into(),
        }),
        cancel: None,
        insights: Found {
            engine: insight.clone(),
            ..Found::default()
        },
        autoscaling: None,
        memory: None,
        streaming: Default::default(),
        now: Timestamp::from_second(10).unwrap(),
    };
    let s = status::planned_status(&j, o.clone());
    assert_eq!(
        lifecycle::condition(&s, DEGRADED).unwrap().reason,
        "CrashLoopBackOff"
    );
    let mut done = reading(6, 0.9, 0, 600.0);
    done.phase = JobPhase::Done;
    o.progress = Some(Ok(done));
    o.pod_problem = None;
    let s = status::planned_status(&j, o);
    assert_eq!(lifecycle::condition(&s, DEGRADED).unwrap().status, "False");
}

/// The one decision of a job's pod counts, in every case the reconciler meets.
#[test]
fn replicas_are_decided_once_for_every_case() {
    let active = |workers| Replicas {
        coordinator: 1,
        workers,
    };
    // Fixed: numWorkers; autoscaled: the engine's target, within [min, maxNumWorkers].
    let fixed = job(JobOptions {
        num_workers: Some(2),
        autoscaling_algorithm: Some(AutoscalingAlgorithm::None),
        ..Default::default()
    });
    assert_eq!(replicas(&fixed, Some(7)), active(2));
    let auto = job(JobOptions {
        max_num_workers: Some(4),
        ..Default::default()
    });
    assert_eq!(replicas(&auto, None), active(3), "Dataflow's initial 3");
    assert_eq!(replicas(&auto, Some(2)), active(2));
    assert_eq!(replicas(&auto, Some(9)), active(4), "at most maxNumWorkers");
    // Streaming: never below ceil(maxNumWorkers / 15).
    assert_eq!(replicas(&job(streaming(30, 1)), Some(1)), active(2));

    // Cancelled: at once, whatever the state.
    let mut cancelled = auto.clone();
    cancelled.spec.desired_state = DesiredState::Cancelled;
    assert_eq!(replicas(&cancelled, Some(3)), Replicas::STOPPED);
    cancelled.status = Some(running_status(3));
    assert_eq!(replicas(&cancelled, Some(3)), Replicas::STOPPED);

    // Finished: once the final state is recorded, not before.
    for state in [JobState::Done, JobState::Failed, JobState::Cancelled] {
        let mut finished = auto.clone();
        finished.status = Some(DataflowJobStatus {
            state: Some(state),
            ..running_status(3)
        });
        assert_eq!(replicas(&finished, Some(3)), Replicas::STOPPED, "{state:?}");
    }
    let mut running = auto.clone();
    running.status = Some(running_status(3));
    assert_eq!(
        replicas(&running, None),
        active(3),
        "the running target stays"
    );

    // An invalid spec that was fixed (a new generation) runs again.
    let mut fixed_spec = auto.clone();
    fixed_spec.status = Some(status::invalid_status(
        &fixed_spec,
        lifecycle::INVALID_SPEC,
        "bad env",
        Timestamp::from_second(1).unwrap(),
    ));
    assert_eq!(replicas(&fixed_spec, None), active(3));
}

#[test]
fn readings_are_spaced_and_windows_bounded_and_stale_jobs_forgotten() {
    let j = job(streaming(12, 3));
    let cfg = engine_config(&j);
    let mut s = JobScaler::default();
    let p = reading(3, 0.5, 1_000, 300.0);
    assert!(s.observe(&cfg, &p, 100.0, 4).is_some());
    assert!(
        s.observe(&cfg, &p, 102.0, 4).is_none(),
        "a reconcile 2 s later adds nothing"
    );
    assert_eq!(s.window.len(), 1);
    // No live worker: nothing to measure.
    assert!(
        s.observe(&cfg, &reading(0, 0.0, 1_000, 0.0), 120.0, 4)
            .is_none()
    );
    assert_eq!(s.window.len(), 1);
    feed(&mut s, &cfg, 100, 2_000, &p);
    let kept = s.window.observations();
    let span = kept.last().unwrap().at_secs - kept[0].at_secs;
    assert!(span < riverbank_autoscale::engine::HISTORY_SECS, "{span}");

    let all = Autoscalers::default();
    let a = Autoscalers::key(&j);
    assert_eq!(a, format!("ns/j/{}", j.metadata.uid.as_deref().unwrap()));
    all.observe(&a, &cfg, Some(&p), None, 0.0, wall(0.0), 4);
    all.observe("ns/other/uid-2", &cfg, None, None, 10.0, wall(10.0), 4);
    assert_eq!(all.len(), 2);
    all.observe(
        "ns/other/uid-2",
        &cfg,
        None,
        None,
        10.0 + FORGET_AFTER_SECS,
        wall(10.0 + FORGET_AFTER_SECS),
        4,
    );
    assert_eq!(all.len(), 1, "the job not seen for an hour is gone");
    all.forget("ns/other/uid-2");
    assert!(all.is_empty());
}

#[test]
fn start_up_is_measured_on_the_job_and_replaces_the_estimate() {
    let j = job(streaming(12, 3));
    let cfg = engine_config(&j);
    assert_eq!(cfg.startup_secs, 60.0, "the estimate until measured");
    let mut s = JobScaler::default();
    let d = feed(&mut s, &cfg, 0, 100, &reading(3, 0.9, 24_000, 300.0));
    assert_eq!(d.last().unwrap().target_workers, 6);
    assert_eq!(s.memory().0, None);
    // Four workers until 170 s, all six from 180 s: 80 s after the decision at 100 s.
    feed(&mut s, &cfg, 100, 170, &reading(4, 0.9, 24_000, 400.0));
    assert_eq!(s.memory().0, None, "not all joined");
    feed(&mut s, &cfg, 170, 220, &reading(6, 0.8, 7_200, 600.0));
    assert_eq!(s.memory().0, Some(80.0));
    assert_eq!(s.configured(&cfg).startup_secs, 80.0);
    let last = s.memory().1.unwrap();
    assert_eq!(
        (last.at_secs, last.from, last.to, last.reason.as_str()),
        (100.0, 3, 6, "SCALE_UP_BACKLOG")
    );
}

#[test]
fn a_batch_rescale_pauses_nothing() {
    let j = job(JobOptions::default());
    let cfg = engine_config(&j);
    assert!(!cfg.streaming);
    assert_eq!(cfg.pause_secs, 0.0);
    assert_eq!(engine_config(&job(streaming(12, 3))).pause_secs, 10.0);
}

#[test]
fn a_restarted_operator_reads_back_the_rescale_under_way_and_the_start_up() {
    let mut j = job(streaming(12, 3));
    j.status = Some(running_status(6));
    let cfg = engine_config(&j);
    let all = Autoscalers::default();
    let key = Autoscalers::key(&j);

    // The first operator scales 3 -> 6 at its second 100 and keeps that in status.
    let p = reading(3, 0.9, 24_000, 300.0);
    let mut memory = None;
    for i in 1..=10 {
        let t = f64::from(i * 10);
        let a = all.observe(&key, &cfg, Some(&p), None, t, wall(t), 4);
        memory = a.memory.or(memory);
    }
    let memory = memory.expect("a rescale to keep");
    let last = memory.last_rescale.clone().unwrap();
    assert_eq!((last.from_workers, last.to_workers), (3, 6));
    assert_eq!(last.time.0, wall(100.0));
    assert_eq!(memory.startup_seconds, None);

    // A new operator (its clock starts again at 0) 30 s later: the workers have not joined yet.
    // It waits for them instead of deciding again, and finishes the start-up measurement.
    let restarted = Autoscalers::default();
    let later = |t: f64| wall(130.0) + SignedDuration::from_secs_f64(t);
    let mut reasons = vec![];
    for i in 0..=12 {
        let t = f64::from(i * 10);
        let a = restarted.observe(&key, &cfg, Some(&p), Some(&memory), t, later(t), 4);
        reasons.extend(a.decided.map(|d| d.reason));
    }
    assert!(
        reasons.iter().all(|r| *r == Reason::RescaleInProgress),
        "{reasons:?}"
    );
    // Six workers at the new operator's second 130: 160 s after the decision.
    let six = reading(6, 0.8, 7_200, 600.0);
    let a = restarted.observe(
        &key,
        &cfg,
        Some(&six),
        Some(&memory),
        130.0,
        later(130.0),
        4,
    );
    let kept = a.memory.unwrap();
    assert_eq!(kept.startup_seconds, Some(160.0));
    assert_eq!(kept.last_rescale.unwrap().time.0, wall(100.0), "unchanged");

    // A rescale older than the engine's timeout is history, not something to wait for.
    let stale = JobScaler::restored(&memory, 0.0, wall(100.0 + RESCALE_TIMEOUT_SECS + 1.0));
    assert_eq!(stale.state.rescale, None);
}

#[test]
fn a_streaming_rescale_pause_measured_by_the_coordinator_replaces_the_estimate() {
    let j = job(streaming(12, 3));
    let cfg = engine_config(&j);
    assert_eq!(cfg.pause_secs, 10.0, "the engine's estimate until measured");
    let mut s = JobScaler::default();
    let mut measured = reading(3, 0.5, 0, 300.0);
    measured.streaming = Some(riverbank_pipeline::StreamingProgress {
        rescales: 1,
        last_rescale_pause_ms: Some(2_500),
        ..Default::default()
    });
    s.observe(&cfg, &measured, 0.0, 1);
    assert_eq!(s.configured(&cfg).pause_secs, 2.5);

    // A batch job's rescale pauses nothing, whatever is reported.
    let batch = engine_config(&job(JobOptions::default()));
    assert_eq!(s.configured(&batch).pause_secs, 0.0);
}
