//! Vertical autoscaling's decisions from pods and progress readings, with time moved by hand.
use super::*;
use crate::crd::{AutoscalingStatus, DataflowJobStatus, JobOptions};
use crate::fixtures::{self, JobBuilder};
use riverbank_pipeline::progress::{JobPhase, WorkerProgress};
use serde_json::json;

const GI: u64 = 1 << 30;

fn job(max: Option<&str>, memory: Option<MemoryStatus>) -> DataflowJob {
    JobBuilder::new("j")
        .options(JobOptions {
            max_worker_memory: max.map(String::from),
            ..Default::default()
        })
        .status(Some(DataflowJobStatus {
            autoscaling: memory.map(|m| AutoscalingStatus {
                memory: Some(m),
                ..Default::default()
            }),
            ..Default::default()
        }))
        .build()
}

/// A worker pod with `memory` as its container's request (and limit), OOMKilled last if `oom`.
fn worker(name: &str, memory: &str, oom: bool) -> Arc<Pod> {
    let last = if oom {
        json!({"terminated": {"exitCode": 137, "reason": "OOMKilled"}})
    } else {
        json!({})
    };
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default",
                "labels": {"riverbank.dev/job": "j", "app.kubernetes.io/component": "worker"}},
            "spec": {"containers": [{"name": "worker",
                "resources": {"requests": {"memory": memory}, "limits": {"memory": memory}}}]},
            "status": {"phase": "Running", "containerStatuses": [{"name": "worker", "image": "i",
                "imageID": "", "ready": true, "restartCount": 1, "state": {"running": {}},
                "lastState": last}]}
        }))
        .unwrap(),
    )
}

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + secs).unwrap()
}

fn decide_at(
    job: &DataflowJob,
    pods: &[Arc<Pod>],
    progress: Option<&JobProgress>,
    dry_run: bool,
    secs: i64,
) -> MemoryOutcome {
    decide(
        job,
        &OperatorSettings::default(),
        pods,
        progress,
        true,
        dry_run,
        at(secs),
    )
}

#[test]
fn quantities_parse_and_step_by_half_rounded_to_the_grain() {
    assert_eq!(parse_bytes("2Gi"), Some(2 * GI));
    assert_eq!(parse_bytes("1.5G"), Some(1_500_000_000));
    assert_eq!(parse_bytes("512Mi"), Some(512 << 20));
    assert_eq!(parse_bytes("1e9"), Some(1_000_000_000));
    assert_eq!(parse_bytes("2048"), Some(2048));
    assert_eq!(parse_bytes("lots"), None);
    assert_eq!(step_up(2 * GI), 3 * GI);
    assert_eq!(quantity(step_up(3 * GI)).0, "4608Mi");
    assert_eq!(step_down(3 * GI), 2 * GI);
    assert_eq!(
        quantity(step_up(1_000_000_000)).0,
        "1536Mi",
        "rounded up to 128 MiB"
    );
    assert_eq!(quantity(1_000).0, "1000");
}

#[test]
fn an_oom_kill_raises_the_memory_a_step_within_the_maximum() {
    let j = job(Some("4Gi"), None);
    let pods = [
        worker("j-worker-0", "2Gi", false),
        worker("j-worker-1", "2Gi", true),
    ];
    let o = decide_at(&j, &pods, None, false, 0);
    assert_eq!(o.apply, Some(Quantity("3Gi".into())));
    let m = o.status.clone().unwrap();
    assert_eq!(
        (m.current.as_str(), m.reason.as_str()),
        ("3Gi", "OOMKilled")
    );
    assert_eq!(
        m.message,
        "worker pod j-worker-1 was killed for running out of memory at 2Gi: 2Gi -> 3Gi"
    );
    assert_eq!(
        (m.last_change.0, m.last_pressure.as_ref().map(|t| t.0)),
        (at(0), Some(at(0)))
    );
    let e = o.event.unwrap();
    assert_eq!((e.reason, e.warning), ("MemoryScaling", true));
    assert!(
        e.note.starts_with(
            "Setting the workers' memory 2Gi -> 3Gi (OOMKilled: worker pod j-worker-1 was killed"
        ),
        "{}",
        e.note
    );
    assert_eq!(
        o.oom_kills,
        [OomKill {
            pod: "j-worker-1".into(),
            memory: Some("2Gi".into())
        }]
    );
    assert!(
        o.what_next
            .unwrap()
            .starts_with("The operator raises the workers' memory to 3Gi")
    );

    // Recorded: the pods are being replaced; the old one (2Gi) no longer counts.
    let j = job(Some("4Gi"), Some(m));
    let o = decide_at(&j, &pods, None, false, 10);
    assert_eq!(o.apply, Some(Quantity("3Gi".into())));
    assert_eq!(o.event, None);
    assert_eq!(
        o.status,
        j.status
            .as_ref()
            .unwrap()
            .autoscaling
            .as_ref()
            .unwrap()
            .memory
    );

    // Killed again at 3Gi: the next step would be 4.5Gi, capped at the 4Gi maximum.
    let o = decide_at(&j, &[worker("j-worker-1", "3Gi", true)], None, false, 20);
    assert_eq!(o.apply, Some(Quantity("4Gi".into())));
    let m = o.status.unwrap();
    // At the maximum and killed again: nothing more to give, said once.
    let j = job(Some("4Gi"), Some(m));
    let o = decide_at(&j, &[worker("j-worker-1", "4Gi", true)], None, false, 30);
    assert_eq!(o.apply, Some(Quantity("4Gi".into())));
    let m = o.status.unwrap();
    assert_eq!(
        (m.current.as_str(), m.reason.as_str()),
        ("4Gi", "AtMaximum")
    );
    assert_eq!(o.event.unwrap().reason, "MemoryAtMaximum");
    assert!(
        o.what_next
            .unwrap()
            .contains("options.maxWorkerMemory (4Gi): raise it")
    );
    let j = job(Some("4Gi"), Some(m.clone()));
    let o = decide_at(&j, &[worker("j-worker-1", "4Gi", true)], None, false, 40);
    assert_eq!(
        (o.event, o.status),
        (None, Some(m)),
        "refreshed at most once a minute"
    );
}

#[test]
fn a_worker_near_its_limit_is_pressure_too() {
    let j = job(Some("8Gi"), None);
    let mut p = fixtures::progress(JobPhase::Running);
    p.workers = vec![WorkerProgress {
        name: "j-worker-0".into(),
        alive: true,
        rss_bytes: 1_900 << 20,
        ..Default::default()
    }];
    let pods = [worker("j-worker-0", "2Gi", false)];
    let o = decide_at(&j, &pods, Some(&p), false, 0);
    let m = o.status.unwrap();
    assert_eq!(
        (m.current.as_str(), m.reason.as_str()),
        ("3Gi", "NearLimit")
    );
    assert_eq!(
        m.message,
        "worker pod j-worker-0 uses 1920Mi of its 2Gi (93%): 2Gi -> 3Gi"
    );
    assert!(o.oom_kills.is_empty());
    // 80 %: fine.
    p.workers[0].rss_bytes = 1_640 << 20;
    assert_eq!(decide_at(&j, &pods, Some(&p), false, 0).status, None);
}

#[test]
fn quiet_for_half_an_hour_steps_back_down_to_the_base() {
    let raised = MemoryStatus {
        current: "3Gi".into(),
        reason: "OOMKilled".into(),
        message: String::new(),
        last_change: Time(at(0)),
        last_pressure: Some(Time(at(0))),
        proposed: None,
    };
    let j = job(Some("8Gi"), Some(raised));
    let pods = [worker("j-worker-0", "3Gi", false)];
    assert_eq!(decide_at(&j, &pods, None, false, 29 * 60).event, None);
    let o = decide_at(&j, &pods, None, false, 30 * 60);
    assert_eq!(o.apply, None, "back at the configured 2Gi");
    let m = o.status.unwrap();
    assert_eq!((m.current.as_str(), m.reason.as_str()), ("2Gi", "Quiet"));
    let e = o.event.unwrap();
    assert_eq!((e.reason, e.warning), ("MemoryScaling", false));
    // At the base there is nothing to shrink.
    let j = job(Some("8Gi"), Some(m));
    assert_eq!(decide_at(&j, &pods, None, false, 90 * 60).event, None);
}

#[test]
fn dry_run_proposes_once_and_keeps_the_memory() {
    let j = job(Some("8Gi"), None);
    let pods = [worker("j-worker-1", "2Gi", true)];
    let o = decide_at(&j, &pods, None, true, 0);
    assert_eq!(o.apply, None);
    let m = o.status.unwrap();
    assert_eq!(
        (m.current.as_str(), m.proposed.as_deref()),
        ("2Gi", Some("3Gi"))
    );
    let e = o.event.unwrap();
    assert_eq!(e.reason, "MemoryScalingDryRun");
    assert!(e.note.ends_with("; keeping 2Gi"), "{}", e.note);
    let j = job(Some("8Gi"), Some(m));
    let o = decide_at(&j, &pods, None, true, 10);
    assert_eq!((o.apply, o.event), (None, None), "proposed once");
}

#[test]
fn without_max_worker_memory_nothing_changes_but_kills_are_reported() {
    let j = job(None, None);
    let o = decide_at(&j, &[worker("j-worker-1", "2Gi", true)], None, false, 0);
    assert_eq!((o.apply, o.status, o.event), (None, None, None));
    assert_eq!(o.oom_kills.len(), 1);
    assert_eq!(
        o.what_next, None,
        "the insight's default recommendation applies"
    );
    // A finished job keeps what it had.
    let j = job(Some("8Gi"), None);
    let o = decide(
        &j,
        &OperatorSettings::default(),
        &[worker("j-worker-1", "2Gi", true)],
        None,
        false,
        false,
        at(0),
    );
    assert_eq!((o.apply, o.status, o.event), (None, None, None));
}
