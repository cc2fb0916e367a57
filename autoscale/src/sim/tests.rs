//! Accounting on traces small enough to check by hand. Cost 1 ms: a core does 1000 elements/s.
use super::*;

fn options(json: serde_json::Value) -> PipelineOptions {
    serde_json::from_value(json).unwrap()
}

fn flat(rate: f64, keys: &str, secs: u32) -> Trace {
    let text =
        format!("time_s,input_rate,cost_ms,keys\n0,{rate},1,{keys}\n{secs},{rate},1,{keys}\n");
    Trace::parse("flat.csv", &text).unwrap()
}

fn run(trace: &Trace, opts: &PipelineOptions, policy: Policy, cores: u32) -> PolicyRun {
    let model = WorkerModel {
        cores,
        startup_secs: 60.0,
        pause_secs: 10.0,
    };
    let config = EngineConfig {
        startup_secs: 60.0,
        pause_secs: 10.0,
        ..EngineConfig::from_options(opts, policy)
    };
    simulate(trace, config, &model)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-6
}

#[test]
fn fixed_workers_keeping_up_cost_workers_times_seconds_and_no_backlog() {
    let opts = options(
        serde_json::json!({"streaming": true, "numWorkers": 1, "autoscalingAlgorithm": "NONE"}),
    );
    let r = run(&flat(1000.0, "", 100), &opts, Policy::Riverbank, 4);
    let t = &r.totals;
    assert_eq!((t.policy, t.rescales), (Policy::Fixed, 0));
    assert!(close(t.worker_seconds, 100.0) && close(t.backlog_seconds, 0.0));
    assert_eq!(r.timeline.len(), 10);
    assert!(
        r.timeline
            .iter()
            .all(|row| close(row.cpu, 0.25) && row.reason == Reason::AutoscalingOff)
    );
}

#[test]
fn an_overloaded_worker_accumulates_backlog_seconds_tick_by_tick() {
    let opts = options(
        serde_json::json!({"streaming": true, "numWorkers": 1, "autoscalingAlgorithm": "NONE"}),
    );
    // 5000/s arrive, 4000/s processed: after second k the backlog is 1000 k = k / 5 seconds.
    let t = run(&flat(5000.0, "", 100), &opts, Policy::Fixed, 4).totals;
    assert!(
        close(t.backlog_seconds, 5050.0 / 5.0),
        "{}",
        t.backlog_seconds
    );
    assert!(close(t.worst_backlog_secs, 20.0) && close(t.final_backlog_secs, 20.0));
    // Two keys: only two of the four cores work.
    let r = run(&flat(3000.0, "2", 100), &opts, Policy::Fixed, 4);
    assert!(close(r.totals.final_backlog_secs, 100_000.0 / 3000.0));
    assert!(close(r.timeline[0].cpu, 0.5));
}

#[test]
fn a_scale_down_pauses_then_releases_the_workers() {
    // 2 workers of 1 core at 5 % CPU; 2 disks allow 1 or 2 workers.
    let opts = options(serde_json::json!({"streaming": true, "numWorkers": 2, "maxNumWorkers": 2}));
    let r = run(&flat(100.0, "", 300), &opts, Policy::Documented, 1);
    let t = &r.totals;
    assert_eq!(t.rescales, 1);
    let d = r
        .timeline
        .iter()
        .find(|row| row.reason == Reason::ScaleDownIdle)
        .unwrap();
    assert_eq!((d.time_s, d.decision), (120.0, 1));
    // Billed 2 until the pause ends at 130 s, then 1.
    assert!(
        close(t.worker_seconds, 2.0 * 130.0 + 170.0),
        "{}",
        t.worker_seconds
    );
    // The 10-s pause queues 100/s: 1..10 s behind, then 1100 - 1000 leaves 1 s, then none.
    assert!(
        close(t.backlog_seconds, 55.0 + 1.0),
        "{}",
        t.backlog_seconds
    );
    assert!(close(t.worst_backlog_secs, 10.0));
}

#[test]
fn a_scale_up_bills_at_once_and_helps_after_startup_and_pause() {
    // 1 worker of 1 core, 1500/s arriving: the backlog grows 500/s.
    let opts = options(serde_json::json!({"streaming": true, "numWorkers": 1, "maxNumWorkers": 4}));
    let r = run(&flat(1500.0, "", 300), &opts, Policy::Documented, 1);
    let t = &r.totals;
    let d = r
        .timeline
        .iter()
        .find(|row| row.reason == Reason::ScaleUpBacklog)
        .unwrap();
    // (1500 + 60000 / 150) / 1000 = 1.9 → 2.
    assert_eq!((d.time_s, d.decision, d.workers), (120.0, 2, 2));
    assert_eq!(t.rescales, 1);
    assert!(
        close(t.worker_seconds, 120.0 + 2.0 * 180.0),
        "{}",
        t.worker_seconds
    );
    // 90000 queued at 180 s, 105000 after the pause, then drained 500/s for 110 s.
    assert!(
        close(t.worst_backlog_secs, 105_000.0 / 1500.0),
        "{}",
        t.worst_backlog_secs
    );
    assert!(
        close(t.final_backlog_secs, 50_000.0 / 1500.0),
        "{}",
        t.final_backlog_secs
    );
    let joined = r.timeline.iter().find(|row| row.time_s == 190.0).unwrap();
    assert_eq!(joined.active_workers, 2);
    let pausing = r
        .timeline
        .iter()
        .find(|row| row.time_s == 190.0 - 10.0)
        .unwrap();
    assert_eq!(pausing.active_workers, 1);
}

#[test]
fn dry_run_records_decisions_without_rescaling() {
    let opts = options(
        serde_json::json!({"streaming": true, "numWorkers": 1, "maxNumWorkers": 4,
        "experiments": ["autoscaling_dry_run"]}),
    );
    let r = run(&flat(1500.0, "", 300), &opts, Policy::Documented, 1);
    assert_eq!(r.totals.rescales, 0);
    assert!(close(r.totals.worker_seconds, 300.0));
    assert!(
        r.timeline
            .iter()
            .any(|row| row.decision == 2 && row.workers == 1)
    );
}

#[test]
fn elements_queued_on_few_keys_keep_their_key_limit_after_the_load_spreads() {
    // 1 worker of 4 cores (1 ms: 1000/s each). For 10 s 3000/s arrive on 1 key: 1000/s are
    // done and 20000 queue. Then 1000/s arrive on any key for 10 s.
    let text = "time_s,input_rate,cost_ms,keys\n0,3000,1,1\n10,3000,1,1\n10,1000,1,\n20,1000,1,\n";
    let trace = Trace::parse("hot.csv", text).unwrap();
    let opts = options(
        serde_json::json!({"streaming": true, "numWorkers": 1, "autoscalingAlgorithm": "NONE"}),
    );
    let r = run(&trace, &opts, Policy::Fixed, 4);
    // The queued elements still run one core at a time (1000/s); the new ones take the other
    // three. 10 s later 10000 of the hot ones are left; the new ones never wait.
    assert!(
        close(r.totals.final_backlog_secs, 10_000.0 / 1000.0),
        "{}",
        r.totals.final_backlog_secs
    );
    // First interval: one core of four busy; second: the hot key's core plus 1000/s.
    assert!(close(r.timeline[0].cpu, 0.25), "{}", r.timeline[0].cpu);
    assert!(close(r.timeline[1].cpu, 0.5), "{}", r.timeline[1].cpu);
}
