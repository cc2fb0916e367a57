//! The tracker's state machine, driven by hand with time as an argument.
use super::*;
use crate::shuffle::ShuffleFile;
use crate::work::{AttemptProgress, ItemFailure};

/// Create → Combine → Write: a one-item stage, then `partitions` shuffle items.
async fn tracker(partitions: u32) -> Tracker {
    let yaml = r#"
pipeline:
  transforms:
    - {type: Create, name: In, config: {elements: [{k: a, v: 1}, {k: b, v: 2}]}}
    - {type: Combine, name: Sum, input: In, config: {group_by: [k], combine: {t: {fn: sum, value: v}}}}
    - {type: WriteToJson, name: Out, input: Sum, config: {path: "memory:///out/x.jsonl"}}
"#;
    tracker_of(yaml, partitions).await
}

/// A tracker over the plan of `yaml`, shuffles cut into `partitions`.
async fn tracker_of(yaml: &str, partitions: u32) -> Tracker {
    let plan = riverbank_pipeline::load_plan(yaml, &Default::default(), "t").unwrap();
    let plan = crate::compile(plan, 1024).await.unwrap();
    Tracker::new(
        Arc::new(plan),
        partitions,
        Duration::from_secs(5),
        Instant::now(),
    )
}

/// Worker `wN`, first incarnation, serving at `hN:1`.
fn id(n: u32) -> WorkerId {
    WorkerId {
        worker: format!("w{n}"),
        incarnation: "a".into(),
        address: format!("h{n}:1"),
    }
}

/// A request for work, as the coordinator handles it: contact, then lease.
fn lease(t: &mut Tracker, w: &WorkerId, now: Instant) -> Lease {
    t.seen(w, now);
    t.lease(w, now)
}

fn work(l: Lease) -> Assignment {
    match l {
        Lease::Work(a) => *a,
        other => panic!("expected work, got {other:?}"),
    }
}

fn report_with_shuffle(partitions: u32) -> ItemReport {
    ItemReport {
        shuffle: (0..partitions)
            .map(|p| ShuffleFile {
                consumer: 1,
                input: 0,
                partition: p,
                path: "j/s0/data.arrows".into(),
                offset: u64::from(p) * 10,
                rows: 1,
                bytes: 10,
            })
            .collect(),
        ..Default::default()
    }
}

#[test]
fn only_a_running_source_item_with_units_left_to_give_can_be_split() {
    let read = |started, total, state| Item {
        item: WorkItem {
            id: 1,
            stage: 0,
            input: ItemInput::Read {
                split: 0,
                range: riverbank_io::Split {
                    location: "a.parquet".into(),
                    kind: riverbank_io::SplitKind::RowGroups { first: 0, count: 4 },
                    estimated_bytes: 4,
                    file_size: 4,
                    estimated_rows: None,
                    csv: None,
                },
            },
        },
        state,
        attempts: 1,
        units_started: started,
        units_total: total,
        ..Item::queued(WorkItem {
            id: 0,
            stage: 0,
            input: ItemInput::Create,
        })
    };
    let running = || ItemState::Running {
        worker: "w".into(),
        incarnation: "a".into(),
        attempt: 1,
        since: Instant::now(),
        unlisted: 0,
    };
    // Reading unit 1 of 4 (or not started): 3 to give. Reading the last one: nothing.
    assert!(read(1, 4, running()).splittable());
    assert!(read(0, 4, running()).splittable());
    assert!(read(3, 4, running()).splittable());
    assert!(!read(4, 4, running()).splittable());
    assert!(!read(1, 1, running()).splittable(), "one row group");
    assert!(
        !read(1, 4, ItemState::Pending).splittable(),
        "queued, not split"
    );
    let mut create = read(1, 4, running());
    create.item.input = ItemInput::Create;
    assert!(!create.splittable());
}

#[tokio::test]
async fn stages_wait_for_their_producers_and_read_them_by_partition() {
    let mut t = tracker(2).await;
    let now = Instant::now();
    let a = work(lease(&mut t, &id(1), now));
    assert_eq!(a.item.stage, 0);
    // Nothing else runnable until the producer stage is done.
    assert_eq!(lease(&mut t, &id(2), now), Lease::Wait);
    assert!(
        t.complete(&id(1), a.item.id, a.attempt, report_with_shuffle(2), now)
            .accepted()
    );
    let b = work(lease(&mut t, &id(2), now));
    let c = work(lease(&mut t, &id(1), now));
    assert_eq!((b.item.stage, c.item.stage), (1, 1));
    assert_eq!(b.inputs[0].len(), 1);
    assert_eq!(b.inputs[0][0].address, "h1:1");
    assert_ne!(
        b.inputs[0][0].offset, c.inputs[0][0].offset,
        "each partition its own range"
    );
    for (x, n) in [(&b, 2), (&c, 1)] {
        t.complete(&id(n), x.item.id, x.attempt, ItemReport::default(), now);
    }
    assert!(t.all_done());
    assert_eq!(
        lease(&mut t, &id(1), now),
        Lease::Wait,
        "commit pending, not terminal"
    );
}

/// A sink whose files are read: its commit stage's one item is leased only once every item
/// writing the sink is done, and its lease carries the parts they reported (no shuffle input).
#[tokio::test]
async fn a_read_sinks_commit_item_waits_for_its_writers_and_gets_their_parts() {
    let yaml = r#"
pipeline:
  transforms:
    - {type: Create, name: A, config: {elements: [{x: 1}]}}
    - {type: Create, name: B, config: {elements: [{x: 2}]}}
    - {type: WriteToJson, name: W, input: [A, B], config: {path: "memory:///out/w.jsonl"}}
    - {type: LogForTesting, name: Files, input: W}
"#;
    let mut t = tracker_of(yaml, 1).await;
    let w = t
        .plan
        .plan
        .graph
        .transforms
        .iter()
        .position(|t| t.name == "W")
        .unwrap();
    let now = Instant::now();
    let part = |n: usize| riverbank_io::TempPart {
        location: format!("memory:///out/.temp-riverbank-t/w.jsonl/part-{n}"),
        part: n,
        rows: 1,
        bytes: 8,
        header_bytes: 0,
        window: None,
    };
    let writers = [
        work(lease(&mut t, &id(1), now)),
        work(lease(&mut t, &id(2), now)),
    ];
    assert_eq!(
        lease(&mut t, &id(3), now),
        Lease::Wait,
        "writers still running"
    );
    let report = |n| ItemReport {
        sink_parts: vec![(w, part(n))],
        ..Default::default()
    };
    t.complete(
        &id(1),
        writers[0].item.id,
        writers[0].attempt,
        report(0),
        now,
    );
    assert_eq!(
        lease(&mut t, &id(3), now),
        Lease::Wait,
        "one writer still running"
    );
    t.complete(
        &id(2),
        writers[1].item.id,
        writers[1].attempt,
        report(1),
        now,
    );
    let commit = work(lease(&mut t, &id(3), now));
    assert_eq!(commit.item.input, ItemInput::Gather);
    let mut parts: Vec<usize> = commit.commit.iter().map(|p| p.part).collect();
    parts.sort_unstable();
    assert_eq!(parts, [0, 1]);
    assert!(
        commit.inputs.iter().all(Vec::is_empty),
        "nothing is shuffled to it"
    );
    assert!(writers.iter().all(|a| a.commit.is_empty()));
}

#[tokio::test]
async fn only_the_current_attempt_counts() {
    let mut t = tracker(1).await;
    let now = Instant::now();
    let a = work(lease(&mut t, &id(1), now));
    // w1 goes silent; its lease expires and the item runs again elsewhere.
    let later = now + Duration::from_secs(6);
    t.seen(&id(2), later);
    t.expire(later);
    let b = work(lease(&mut t, &id(2), later));
    assert_eq!(b.item.id, a.item.id);
    assert_ne!(b.attempt, a.attempt);
    assert!(
        !t.complete(&id(1), a.item.id, a.attempt, ItemReport::default(), later)
            .accepted()
    );
    assert!(
        t.complete(&id(2), b.item.id, b.attempt, report_with_shuffle(1), later)
            .accepted()
    );
}

#[tokio::test]
async fn a_dead_workers_needed_output_is_recomputed_and_ten_losses_fail_the_job() {
    let mut t = tracker(1).await;
    let mut now = Instant::now();
    let a = work(lease(&mut t, &id(1), now));
    t.complete(&id(1), a.item.id, a.attempt, report_with_shuffle(1), now);
    // w1 dies while the consumer stage still needs its shuffle file.
    now += Duration::from_secs(6);
    t.seen(&id(2), now);
    let events = t.expire(now);
    assert!(
        events.contains(&Event::Invalidated { item: a.item.id }),
        "{events:?}"
    );
    let again = work(lease(&mut t, &id(2), now));
    assert_eq!(
        again.item.id, a.item.id,
        "the producer runs again before its consumers"
    );
    // An item whose worker keeps dying fails the job after 10 losses.
    for _ in 0..MAX_WORKER_LOSSES - 1 {
        now += Duration::from_secs(6);
        t.seen(&id(3), now);
        t.expire(now);
        if t.phase().is_terminal() {
            break;
        }
        work(lease(&mut t, &id(2), now));
    }
    now += Duration::from_secs(6);
    t.seen(&id(3), now);
    t.expire(now);
    assert_eq!(t.phase(), JobPhase::Failed);
    assert!(
        t.failure().unwrap().message.contains("lost 10 times"),
        "{:?}",
        t.failure()
    );
}

#[tokio::test]
async fn a_fatal_failure_fails_the_job_and_a_replayed_log_resumes_the_same_state() {
    let mut t = tracker(2).await;
    let now = Instant::now();
    let mut log = vec![t.start_epoch()];
    let a = work(lease(&mut t, &id(1), now));
    let Report::Accepted(e) = t.complete(&id(1), a.item.id, a.attempt, report_with_shuffle(2), now)
    else {
        panic!("accepted");
    };
    log.push(*e);
    let b = work(lease(&mut t, &id(1), now));
    // Replay into a fresh tracker: the done producer stays done; attempts get a new epoch.
    let mut r = tracker(2).await;
    for e in &log {
        r.apply(e, now);
    }
    let next = r.start_epoch();
    assert_eq!(next, Event::Started { epoch: 2 });
    let again = work(lease(&mut r, &id(2), now));
    assert_eq!(again.item.stage, 1, "the finished stage is not re-run");
    assert!(
        again.attempt > 2000,
        "attempts of epoch 2: {}",
        again.attempt
    );
    let events = t.fail(
        b.item.id,
        b.attempt,
        ItemFailure::Fatal(JobFailure {
            transform: Some("Sum".into()),
            message: "boom".into(),
            record: None,
            attempts: 4,
        }),
        now,
    );
    assert_eq!(events.len(), 1);
    assert_eq!(t.phase(), JobPhase::Failed);
    assert_eq!(
        lease(&mut t, &id(1), now),
        Lease::Finished(JobPhase::Failed)
    );
}

/// `w` restarted: same name, a new process.
fn restarted(w: &WorkerId, address: &str) -> WorkerId {
    WorkerId {
        incarnation: format!("{}'", w.incarnation),
        address: address.into(),
        ..w.clone()
    }
}

#[tokio::test]
async fn a_worker_restarted_under_its_name_gives_its_leases_up_at_once() {
    let mut t = tracker(1).await;
    let now = Instant::now();
    let old = id(1);
    let a = work(lease(&mut t, &old, now));
    // The process is killed and started again within the lease timeout: the old incarnation's
    // item must not wait for an expiry that never comes (the name keeps heartbeating).
    let new = restarted(&old, "h1:2");
    assert!(t.seen(&new, now).is_empty(), "one loss fails nothing");
    let (_, events) = t.heartbeat(&new, &[], 0.0, 0, now + Duration::from_secs(3));
    assert!(events.is_empty());
    let again = work(lease(&mut t, &new, now));
    assert_eq!(
        again.item.id, a.item.id,
        "the item runs again on the new process"
    );
    assert_ne!(again.attempt, a.attempt);
    assert!(
        !t.complete(&old, a.item.id, a.attempt, ItemReport::default(), now)
            .accepted(),
        "the old incarnation's report is not the current attempt"
    );
    // A stale incarnation gets no work either.
    assert_eq!(t.lease(&old, now), Lease::Wait);
    assert!(
        t.complete(
            &new,
            again.item.id,
            again.attempt,
            report_with_shuffle(1),
            now
        )
        .accepted()
    );
}

#[tokio::test]
async fn an_item_its_worker_does_not_list_runs_again_after_two_heartbeats() {
    let mut t = tracker(1).await;
    let now = Instant::now();
    let w = id(1);
    let a = work(lease(&mut t, &w, now));
    // Within a second of the lease the reply may still be on its way: nothing happens.
    let (_, events) = t.heartbeat(&w, &[], 0.0, 0, now + Duration::from_millis(500));
    assert!(events.is_empty());
    assert!(t.is_current(a.item.id, a.attempt));
    // Listed: fine, whatever the time.
    let listed = [AttemptProgress {
        item: a.item.id,
        attempt: a.attempt,
        units_started: 1,
        units_total: 1,
        keys: 0,
    }];
    t.heartbeat(&w, &listed, 0.0, 0, now + Duration::from_secs(2));
    t.heartbeat(&w, &[], 0.0, 0, now + Duration::from_secs(3));
    assert!(t.is_current(a.item.id, a.attempt), "one miss is not enough");
    t.heartbeat(&w, &listed, 0.0, 0, now + Duration::from_secs(4));
    t.heartbeat(&w, &[], 0.0, 0, now + Duration::from_secs(5));
    assert!(
        t.is_current(a.item.id, a.attempt),
        "the count restarts when listed"
    );
    // Two heartbeats in a row without it: the worker does not know it; it runs again.
    t.heartbeat(&w, &[], 0.0, 0, now + Duration::from_secs(6));
    assert!(!t.is_current(a.item.id, a.attempt));
    let again = work(lease(&mut t, &w, now + Duration::from_secs(6)));
    assert_eq!(again.item.id, a.item.id);
}

#[tokio::test]
async fn a_restarted_workers_finished_output_is_read_where_it_serves_now() {
    let mut t = tracker(1).await;
    let now = Instant::now();
    let a = work(lease(&mut t, &id(1), now));
    t.complete(&id(1), a.item.id, a.attempt, report_with_shuffle(1), now);
    // w1 restarts on the same disk and listens on another port.
    t.seen(&restarted(&id(1), "h1:9"), now);
    let b = work(lease(&mut t, &id(2), now));
    assert_eq!(b.item.stage, 1, "the producer's output was kept");
    assert_eq!(b.inputs[0][0].address, "h1:9");
}

#[tokio::test]
async fn lost_output_alone_does_not_fail_the_job_like_a_poison_item() {
    let mut t = tracker(1).await;
    let mut now = Instant::now();
    // The producer's output is lost five times (more than a bundle's attempts): its disk keeps
    // going away, not the item's fault; the job goes on.
    for _ in 0..5 {
        let a = work(lease(&mut t, &id(1), now));
        assert_eq!(a.item.stage, 0);
        t.complete(&id(1), a.item.id, a.attempt, report_with_shuffle(1), now);
        now += Duration::from_secs(6);
        t.seen(&id(2), now);
        let events = t.expire(now);
        assert!(events.contains(&Event::Invalidated { item: a.item.id }));
    }
    assert_eq!(t.phase(), JobPhase::Running);
}

#[tokio::test]
async fn a_report_sent_again_is_accepted_again_and_logged_once() {
    let mut t = tracker(1).await;
    let now = Instant::now();
    let a = work(lease(&mut t, &id(1), now));
    let first = t.complete(&id(1), a.item.id, a.attempt, report_with_shuffle(1), now);
    assert!(matches!(first, Report::Accepted(_)));
    // The answer was lost and the worker's client sends it again: the worker must keep its
    // output (the coordinator counts on it), and there is nothing new to log.
    let again = t.complete(&id(1), a.item.id, a.attempt, report_with_shuffle(1), now);
    assert_eq!(again, Report::AcceptedBefore);
    // The same after a restarted coordinator replayed the report from its log.
    let Report::Accepted(e) = first else {
        unreachable!()
    };
    let mut r = tracker(1).await;
    r.apply(&e, now);
    r.start_epoch();
    r.seen(&id(1), now);
    assert_eq!(
        r.complete(&id(1), a.item.id, a.attempt, report_with_shuffle(1), now),
        Report::AcceptedBefore
    );
    // Another worker's report of that attempt is not.
    assert_eq!(
        t.complete(&id(2), a.item.id, a.attempt, report_with_shuffle(1), now),
        Report::Rejected
    );
}

#[tokio::test]
async fn active_keys_are_those_of_the_running_and_recent_final_combines() {
    let mut t = tracker(2).await;
    let now = Instant::now();
    let a = work(lease(&mut t, &id(1), now));
    assert_eq!(t.progress("j", now).active_keys, None, "no combine ran yet");
    t.complete(&id(1), a.item.id, a.attempt, report_with_shuffle(2), now);
    let b = work(lease(&mut t, &id(1), now));
    let c = work(lease(&mut t, &id(2), now));
    let beat = |x: &Assignment, keys| AttemptProgress {
        item: x.item.id,
        attempt: x.attempt,
        units_started: 1,
        units_total: 1,
        keys,
    };
    t.heartbeat(&id(1), &[beat(&b, 3)], 0.5, 0, now);
    t.heartbeat(&id(2), &[beat(&c, 4)], 0.5, 0, now);
    assert_eq!(t.progress("j", now).active_keys, Some(7));
    let report = ItemReport {
        keys: 5,
        ..Default::default()
    };
    t.complete(&id(1), b.item.id, b.attempt, report, now);
    assert_eq!(
        t.progress("j", now).active_keys,
        Some(9),
        "5 done, 4 running"
    );
    let later = now + Duration::from_secs(31);
    t.heartbeat(&id(2), &[beat(&c, 4)], 0.5, 0, later);
    assert_eq!(
        t.progress("j", later).active_keys,
        Some(4),
        "finished combines age out"
    );
}

#[tokio::test]
async fn progress_reports_item_durations_failures_transforms_and_key_shares() {
    let mut t = tracker(2).await;
    let t0 = Instant::now();
    let a = work(lease(&mut t, &id(1), t0));
    // The Create item ran 2 s: In emitted 2 elements, the partial Sum 2 states; partition 0
    // got three times the bytes of partition 1.
    let mut report = report_with_shuffle(2);
    report.shuffle[0].bytes = 30;
    report.elements_out = vec![(0, 2), (1, 2)];
    report.bundle_retries = 1;
    let done = t0 + Duration::from_secs(2);
    assert!(
        t.complete(&id(1), a.item.id, a.attempt, report, done)
            .accepted()
    );
    let p0 = work(lease(&mut t, &id(1), done));
    let p1 = work(lease(&mut t, &id(2), done));
    let beat = |a: &Assignment, keys| AttemptProgress {
        item: a.item.id,
        attempt: a.attempt,
        keys,
        ..Default::default()
    };
    let later = done + Duration::from_secs(3);
    t.heartbeat(&id(1), &[beat(&p0, 1)], 0.5, 0, later);
    t.heartbeat(&id(2), &[beat(&p1, 3)], 0.5, 0, later);

    let p = t.progress("t", later);
    let s0 = &p.stages[0];
    assert_eq!((s0.median_item_secs, s0.timed_items), (Some(2.0), 1));
    assert_eq!(s0.bundle_retries, 1);
    let names: Vec<_> = s0.transforms.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["In", "Sum/PartialCombine"]);
    assert_eq!(
        s0.transforms[0].elements_in, None,
        "a source receives nothing"
    );
    assert_eq!(s0.transforms[0].fused_consumers, ["Sum/PartialCombine"]);
    assert_eq!(
        (s0.transforms[1].elements_in, s0.transforms[1].elements_out),
        (Some(2), 2)
    );
    let s1 = &p.stages[1];
    assert_eq!(s1.transforms[0].name, "Sum/FinalCombine");
    assert_eq!(s1.transforms[0].elements_in, None, "reads a shuffle");
    assert_eq!(s1.keys, Some(4));
    // Partition 0: 75 % of the bytes, one key: that key carries at least 75 %.
    assert_eq!(s1.hottest_key_share, Some(0.75));
    let running: Vec<_> = p
        .work_items
        .iter()
        .map(|w| (w.stage, w.partition, w.state.as_str(), w.running_secs))
        .collect();
    assert_eq!(
        running,
        [(1, Some(0), "Running", 3.0), (1, Some(1), "Running", 3.0)]
    );
    assert!(p.work_items[0].started_at.is_some());

    // w2 goes silent past the lease timeout: its item waits to run again, one failure noted.
    let expired = later + Duration::from_secs(6);
    t.seen(&id(1), expired);
    t.heartbeat(&id(1), &[beat(&p0, 1)], 0.5, 0, expired);
    t.expire(expired);
    let p = t.progress("t", expired);
    let waiting = p.work_items.iter().find(|w| w.state == "Pending").unwrap();
    assert_eq!(
        (waiting.item, waiting.failures, waiting.attempts),
        (p1.item.id, 1, 1)
    );
    assert_eq!(
        waiting.last_failure.as_deref(),
        Some("its worker was lost (w2)")
    );
    assert_eq!(p.work_items[0].running_secs, 9.0, "still running on w1");
}

/// Two producers, each writing `sizes[p]` bytes to partition p of the combine stage.
fn report_with_sizes(sizes: &[u64], path: &str) -> ItemReport {
    let mut offset = 0;
    ItemReport {
        shuffle: sizes
            .iter()
            .enumerate()
            .map(|(p, &bytes)| {
                offset += bytes;
                ShuffleFile {
                    consumer: 1,
                    input: 0,
                    partition: p as u32,
                    path: path.into(),
                    offset: offset - bytes,
                    rows: 1,
                    bytes,
                }
            })
            .collect(),
        ..Default::default()
    }
}

#[tokio::test]
async fn small_neighbouring_partitions_coalesce_into_items_that_read_them_in_order() {
    let now = Instant::now();
    let mut t = tracker(6).await.coalescing(100);
    assert!(t.coalesce(now).is_empty(), "the stage cannot run yet");
    let a = work(lease(&mut t, &id(1), now));
    // Per producer: partitions 0-2 small, 3 large, 4-5 small. Two producers double it: 0-2
    // total 60, 3 total 120 (over the limit on its own), 4-5 total 80.
    let sizes = [10, 10, 10, 60, 20, 20];
    // The Create stage is one item: its report stands for two producers' output.
    let mut both = report_with_sizes(&sizes, "p/a");
    both.shuffle
        .extend(report_with_sizes(&sizes, "p/b").shuffle);
    t.complete(&id(1), a.item.id, a.attempt, both.clone(), now);
    let events = t.coalesce(now);
    assert_eq!(
        events,
        vec![Event::Coalesced {
            stage: 1,
            groups: vec![3, 1, 2]
        }]
    );
    assert!(t.coalesce(now).is_empty(), "decided once");
    let mut got = vec![];
    while let Lease::Work(b) = lease(&mut t, &id(2), now) {
        let parts: Vec<u32> = b.inputs[0].iter().map(|r| r.partition).collect();
        let paths: Vec<&str> = b.inputs[0].iter().map(|r| r.path.as_str()).collect();
        got.push((b.item.partitions(), parts.clone()));
        // Partition after partition, each one's producers in order.
        for pair in paths.chunks(2) {
            assert_eq!(pair, ["p/a", "p/b"]);
        }
        t.complete(&id(2), b.item.id, b.attempt, ItemReport::default(), now);
    }
    assert_eq!(
        got,
        vec![
            (0..3, vec![0, 0, 1, 1, 2, 2]),
            (3..4, vec![3, 3]),
            (4..6, vec![4, 4, 5, 5]),
        ]
    );
    assert!(t.all_done());

    // A restarted coordinator replays the log to the same three items.
    let mut replay = tracker(6).await.coalescing(100);
    for e in [
        Event::Completed {
            item: a.item.id,
            attempt: a.attempt,
            worker: "w1".into(),
            address: "h1:1".into(),
            report: both,
        },
        events[0].clone(),
    ] {
        replay.apply(&e, now);
    }
    assert!(replay.coalesce(now).is_empty());
    let mut items = vec![];
    while let Lease::Work(b) = lease(&mut replay, &id(1), now) {
        items.push(b.item.partitions());
        replay.complete(&id(1), b.item.id, b.attempt, ItemReport::default(), now);
    }
    assert_eq!(items, vec![0..3, 3..4, 4..6]);

    // Off, or in a stage that already ran an item, nothing coalesces.
    let mut off = tracker(6).await;
    let a = work(lease(&mut off, &id(1), now));
    off.complete(
        &id(1),
        a.item.id,
        a.attempt,
        report_with_sizes(&sizes, "p"),
        now,
    );
    assert!(off.coalesce(now).is_empty());
    let mut started = tracker(6).await.coalescing(1 << 20);
    let a = work(lease(&mut started, &id(1), now));
    started.complete(
        &id(1),
        a.item.id,
        a.attempt,
        report_with_sizes(&sizes, "p"),
        now,
    );
    let first = work(started.lease(&id(1), now));
    assert_eq!(first.item.partitions(), 0..1);
    assert!(started.coalesce(now).is_empty());
}

#[tokio::test]
async fn a_coalesced_items_key_share_is_judged_per_partition_once_it_is_done() {
    let now = Instant::now();
    let mut t = tracker(2).await.coalescing(1 << 20);
    let a = work(lease(&mut t, &id(1), now));
    let mut report = report_with_shuffle(2);
    report.shuffle[0].bytes = 30;
    t.complete(&id(1), a.item.id, a.attempt, report, now);
    t.coalesce(now);
    let b = work(lease(&mut t, &id(1), now));
    assert_eq!(b.item.partitions(), 0..2);
    // Running, its keys are those of the partition it is at: no share yet.
    let beat = AttemptProgress {
        item: b.item.id,
        attempt: b.attempt,
        keys: 3,
        ..Default::default()
    };
    t.heartbeat(&id(1), &[beat], 0.5, 0, now);
    assert_eq!(t.progress("t", now).stages[1].hottest_key_share, None);
    // Done: partition 0 has 75 % of the bytes in one key, partition 1 the rest in three.
    let done = ItemReport {
        keys: 4,
        partition_keys: vec![(0, 1), (1, 3)],
        ..Default::default()
    };
    t.complete(&id(1), b.item.id, b.attempt, done, now);
    assert_eq!(t.progress("t", now).stages[1].hottest_key_share, Some(0.75));
}

#[tokio::test]
async fn unreachable_output_is_recomputed_on_its_reader_after_a_backoff_and_fails_only_after_the_patience()
 {
    let patience = Duration::from_secs(200);
    let mut t = tracker(1).await.with_output_patience(patience);
    let start = Instant::now();
    let mut now = start;
    let (w1, w2) = (id(1), id(2));
    let a = work(lease(&mut t, &w1, now));
    assert_eq!(a.item.stage, 0);
    t.complete(&w1, a.item.id, a.attempt, report_with_shuffle(1), now);
    let dns = "http://h1:1/v1/shuffle/0/10/j: error sending request: client error (Connect): dns error: failed to lookup address information";
    let mut times = 0;
    loop {
        // The reader cannot fetch the producer's output (the producer's name does not resolve
        // from its worker yet).
        let b = work(lease(&mut t, &w2, now));
        assert_eq!(b.item.stage, 1, "the consumer runs once its input is there");
        let events = t.fail(
            b.item.id,
            b.attempt,
            ItemFailure::ShuffleLost {
                producer: a.item.id,
                message: dns.into(),
            },
            now,
        );
        times += 1;
        if t.phase() == JobPhase::Failed {
            break;
        }
        assert!(events.contains(&Event::Invalidated { item: a.item.id }));
        assert!(
            now.duration_since(start) < patience || times < MAX_WORKER_LOSSES,
            "still running after {times} losses over {:?}",
            now.duration_since(start)
        );
        // Not at once: the consumer waits out a backoff, and the producer runs again on the
        // reader's worker (its output is then on the reader's own disk), not on w1.
        assert_eq!(
            lease(&mut t, &w1, now),
            Lease::Wait,
            "the reader is preferred"
        );
        let again = work(lease(&mut t, &w2, now));
        assert_eq!(again.item.id, a.item.id);
        t.complete(
            &w2,
            again.item.id,
            again.attempt,
            report_with_shuffle(1),
            now,
        );
        // Its input is back, but the consumer waits out its backoff first.
        assert_eq!(lease(&mut t, &w2, now), Lease::Wait, "no retry at once");
        // (The reader's copy is unreachable too in this test: it stands for an address that
        // does not resolve from anywhere yet.)
        now += Duration::from_secs(11);
    }
    let elapsed = now.duration_since(start);
    assert!(
        elapsed >= patience && times >= MAX_WORKER_LOSSES,
        "failed after {times} losses over {elapsed:?}"
    );
    let message = &t.failure().unwrap().message;
    for part in [
        "unreachable",
        "on worker w2 at h2:1",
        "dns error",
        "--output-patience-secs",
    ] {
        assert!(message.contains(part), "{part} in: {message}");
    }
}

#[tokio::test]
async fn a_checkpoint_tracker_of_a_running_job_reports_running_before_any_lease() {
    let mut first = tracker(1).await;
    let now = Instant::now();
    work(lease(&mut first, &id(1), now));
    assert_eq!(first.phase(), JobPhase::Running);
    let mut next = tracker(1).await;
    assert_eq!(next.phase(), JobPhase::Pending);
    next.inherit_workers(&first);
    assert_eq!(
        next.phase(),
        JobPhase::Running,
        "not \"waiting for workers\""
    );
}
