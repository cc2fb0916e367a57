//! One test per insight, from `JobProgress` fixtures: it holds on the signal, not below its
//! thresholds, and says what Dataflow's insight says.
use super::*;
use riverbank_pipeline::{TransformProgress, WorkItemProgress};

fn job(stages: Vec<StageProgress>, work_items: Vec<WorkItemProgress>) -> JobProgress {
    JobProgress {
        work_items_total: 10,
        work_items_done: 5,
        work_items_running: 2,
        fraction_consumed: 0.5,
        stages,
        work_items,
        ..JobProgress::new("j", JobPhase::Running, "")
    }
}

fn op(name: &str, elements_in: Option<u64>, out: u64, consumers: &[&str]) -> TransformProgress {
    TransformProgress {
        name: name.into(),
        elements_in,
        elements_out: out,
        fused_consumers: consumers.iter().map(|c| c.to_string()).collect(),
    }
}

fn stage(index: usize, state: &str, transforms: Vec<TransformProgress>) -> StageProgress {
    StageProgress {
        index,
        name: format!("S{index:02}"),
        state: state.into(),
        transforms,
        ..Default::default()
    }
}

fn running(item: u64, stage: usize, secs: f64) -> WorkItemProgress {
    WorkItemProgress {
        item,
        stage,
        state: "Running".into(),
        worker: Some("worker-1".into()),
        running_secs: secs,
        attempts: 1,
        ..Default::default()
    }
}

/// Read → Explode (×20) → Shape → Write, in one stage.
fn fan_out_stage(read: u64, factor: u64) -> StageProgress {
    stage(
        0,
        "Running",
        vec![
            op("Read", None, read, &["Explode"]),
            op("Explode", Some(read), read * factor, &["Shape"]),
            op("Shape", Some(read * factor), read * factor, &["Write"]),
            op("Write", Some(read * factor), 0, &[]),
        ],
    )
}

#[test]
fn high_fan_out_names_the_stage_and_transform_and_recommends_a_reshuffle() {
    let cfg = InsightConfig::default();
    let p = job(vec![fan_out_stage(1_600, 20)], vec![]);
    let f = high_fan_out(&p, &cfg).expect("32 000 out of 1 600 in, fused with Shape");
    assert_eq!(f.insight.code(), "HIGH_FAN_OUT");
    assert_eq!(f.subject, "S00/Explode");
    assert!(f.message.starts_with("High fan-out detected: in stage S00 (Read … Write), Explode emitted 32000 elements for 1600 received (20×) and is fused with Shape"), "{}", f.message);
    assert!(f.recommendation.starts_with("Insert a Reshuffle after Explode (a `type: Reshuffle` transform with `input: Explode`, read by Shape)"), "{}", f.recommendation);
    assert_eq!(from_progress(&p, &cfg), vec![f]);

    // Below the ratio, or on too few elements: nothing.
    assert_eq!(
        high_fan_out(&job(vec![fan_out_stage(1_600, 9)], vec![]), &cfg),
        None
    );
    assert_eq!(
        high_fan_out(&job(vec![fan_out_stage(100, 20)], vec![]), &cfg),
        None
    );
    // Only a partial combine after it: it shrinks the data where it is, no fusion break needed.
    let mut combined = fan_out_stage(1_600, 20);
    combined.transforms[1].fused_consumers = vec!["Sum/PartialCombine".into()];
    assert_eq!(high_fan_out(&job(vec![combined], vec![]), &cfg), None);
    // A job that is not running has no insights.
    let mut done = p.clone();
    done.phase = JobPhase::Done;
    assert!(from_progress(&done, &cfg).is_empty());
}

#[test]
fn long_work_item_compares_with_the_stage_median_and_a_minimum() {
    let cfg = InsightConfig::default();
    let mut s = fan_out_stage(10, 1);
    s.median_item_secs = Some(2.0);
    s.timed_items = 5;
    // 70 s against a 2 s median: beyond both 5 × 2 s and the 60 s minimum.
    let p = job(
        vec![s.clone()],
        vec![running(3, 0, 12.0), running(7, 0, 70.0)],
    );
    let f = long_work_item(&p, &cfg).unwrap();
    assert_eq!(f.insight.code(), "LONG_WORK_ITEM");
    assert_eq!(f.subject, "S00/item-7");
    assert_eq!(
        f.message,
        "Stage spending too long on work: work item 7 of stage S00 (Read … Write) on worker-1 has been running for 70 s, 35× the stage's median item (2.0 s over 5 finished items)"
    );
    assert!(
        f.recommendation
            .contains("slow or stuck transform in stage S00")
    );
    // 50 s is 25× the median but under the minute.
    assert_eq!(
        long_work_item(&job(vec![s.clone()], vec![running(7, 0, 50.0)]), &cfg),
        None
    );
    // A shorter minimum (local runs): 5 × the median decides.
    let quick = InsightConfig {
        long_item_min_secs: 1.0,
        ..cfg.clone()
    };
    assert!(long_work_item(&job(vec![s.clone()], vec![running(7, 0, 10.5)]), &quick).is_some());
    assert_eq!(
        long_work_item(&job(vec![s.clone()], vec![running(7, 0, 9.5)]), &quick),
        None
    );
    // Too few finished items to know the typical one: only the absolute bound counts.
    s.timed_items = 2;
    assert_eq!(
        long_work_item(&job(vec![s.clone()], vec![running(7, 0, 500.0)]), &cfg),
        None
    );
    let f = long_work_item(&job(vec![s], vec![running(7, 0, 601.0)]), &cfg).unwrap();
    assert!(
        f.message.ends_with("has been running for 601 s"),
        "{}",
        f.message
    );
}

#[test]
fn stuck_is_an_item_whose_attempts_keep_failing() {
    let cfg = InsightConfig::default();
    let s = stage(1, "Running", vec![op("Sum/FinalCombine", None, 3, &[])]);
    let item = |failures| WorkItemProgress {
        item: 12,
        stage: 1,
        state: "Pending".into(),
        attempts: failures,
        failures,
        last_failure: Some("its worker was lost (worker-2)".into()),
        ..Default::default()
    };
    // Two or three retries are normal.
    assert_eq!(stuck(&job(vec![s.clone()], vec![item(3)]), &cfg), None);
    let f = stuck(&job(vec![s], vec![item(4)]), &cfg).unwrap();
    assert_eq!(f.insight.code(), "STUCK");
    assert_eq!(
        f.message,
        "Job is stuck due to failed and retried work item: work item 12 of stage S01 (Sum/FinalCombine) failed 4 times and is retried (4 attempts); the last one: its worker was lost (worker-2)"
    );
    assert!(f.recommendation.contains("fix the pipeline"));
}

#[test]
fn hot_key_needs_a_large_and_skewed_share() {
    let cfg = InsightConfig::default();
    let keyed = |share: f64, keys: u64, state: &str| StageProgress {
        keys: Some(keys),
        hottest_key_share: Some(share),
        ..stage(2, state, vec![op("PerUser/FinalCombine", None, keys, &[])])
    };
    let f = hot_key(&job(vec![keyed(0.6, 40, "Running")], vec![]), &cfg).unwrap();
    assert_eq!(f.insight.code(), "HOT_KEY");
    assert_eq!(
        f.message,
        "Hot key detected: in stage S02 (PerUser/FinalCombine), one key carries at least 60% of the input of 40 keys: it is processed on one core, which caps the stage's throughput"
    );
    assert!(f.recommendation.contains("hot-key fanout"));
    // Two keys sharing the work evenly: few keys (ACTIVE_KEYS), not a hot one.
    assert_eq!(
        hot_key(&job(vec![keyed(0.5, 2, "Running")], vec![]), &cfg),
        None
    );
    // A small share, or a stage that is over.
    assert_eq!(
        hot_key(&job(vec![keyed(0.1, 400, "Running")], vec![]), &cfg),
        None
    );
    assert_eq!(
        hot_key(&job(vec![keyed(0.6, 40, "Done")], vec![]), &cfg),
        None
    );
}

#[test]
fn worker_out_of_memory_names_the_pod_and_what_happens_next() {
    assert_eq!(worker_out_of_memory(&[], None), None);
    let kills = [
        OomKill {
            pod: "j-worker-1".into(),
            memory: Some("2Gi".into()),
        },
        OomKill {
            pod: "j-worker-3".into(),
            memory: Some("2Gi".into()),
        },
    ];
    let f = worker_out_of_memory(&kills, None).unwrap();
    assert_eq!(f.insight.code(), "WORKER_OUT_OF_MEMORY");
    assert_eq!(f.subject, "j-worker-1");
    assert!(f.message.starts_with("Some workers are out of memory: worker pod j-worker-1 with 2Gi of memory was killed for running out of memory (and 1 more)"), "{}", f.message);
    assert!(f.recommendation.contains("options.maxWorkerMemory"));
    let f = worker_out_of_memory(
        &kills[..1],
        Some("Raising the workers' memory to 3Gi.".into()),
    )
    .unwrap();
    assert_eq!(f.recommendation, "Raising the workers' memory to 3Gi.");
}

#[test]
fn engine_insights_take_the_same_shape() {
    let d = Decision {
        at_secs: 0.0,
        current_workers: 4,
        target_workers: 4,
        reason: crate::Reason::HoldAtMaximum,
        message: "backlog 200 s needs 9.0 workers; at maxNumWorkers 4".into(),
        insight: Some(Insight::MaxNumWorkers),
        shuffle: None,
        dry_run: false,
    };
    let f = from_decision(Insight::MaxNumWorkers, &d, 4);
    assert_eq!(
        f.message,
        "The maximum number of workers could be increased: the job runs at maxNumWorkers (4) and is busy; backlog 200 s needs 9.0 workers; at maxNumWorkers 4"
    );
    assert!(
        f.recommendation
            .starts_with("Increase or remove options.maxNumWorkers")
    );
    let f = from_decision(Insight::ActiveKeys, &d, 4);
    assert!(f.message.starts_with("Active keys can be increased: "));
    for i in Insight::ALL {
        assert_eq!(Insight::from_code(i.code()), Some(i));
        assert_eq!(serde_json::to_value(i).unwrap(), i.code());
    }
}

#[test]
fn the_book_raises_each_subject_once_and_keeps_the_history() {
    let cfg = InsightConfig {
        long_item_min_secs: 1.0,
        ..InsightConfig::default()
    };
    let mut s = fan_out_stage(10, 1);
    s.median_item_secs = Some(1.0);
    s.timed_items = 4;
    let mut book = InsightBook::default();
    let at = |secs: f64, item: u64| {
        from_progress(&job(vec![s.clone()], vec![running(item, 0, secs)]), &cfg)
    };
    assert_eq!(book.update(at(6.0, 7), 1.0).len(), 1);
    assert!(
        book.update(at(7.0, 7), 2.0).is_empty(),
        "the same item: raised once"
    );
    assert!(book.update(at(0.5, 7), 3.0).is_empty(), "cleared");
    assert_eq!(book.update(at(6.0, 9), 4.0)[0].subject, "S00/item-9");
    assert_eq!(
        book.history()
            .iter()
            .map(|(t, f)| (*t, f.subject.as_str()))
            .collect::<Vec<_>>(),
        [(1.0, "S00/item-7"), (4.0, "S00/item-9")]
    );
}
