//! Table-driven tests of every rule. Windows are built from 10-s observations; a "steady" window
//! has constant backlog (so arrivals equal throughput) over the 120 s the streaming rules need.
use super::*;

const TP: f64 = 10_000.0;

fn streaming(policy: Policy, max: u32) -> EngineConfig {
    EngineConfig {
        policy,
        streaming: true,
        num_workers: 10,
        max_workers: max,
        dry_run: false,
        startup_secs: 60.0,
        pause_secs: 10.0,
    }
}

fn batch(policy: Policy) -> EngineConfig {
    EngineConfig {
        streaming: false,
        max_workers: 1000,
        ..streaming(policy, 1000)
    }
}

fn obs(at: f64, workers: u32, backlog: f64, tp: f64, cpu: f64) -> Observation {
    Observation {
        at_secs: at,
        interval_secs: 10.0,
        workers,
        cores_per_worker: 4,
        backlog_bytes: backlog,
        throughput_bytes_per_sec: tp,
        avg_cpu: cpu,
        fraction_consumed: 0.5,
        runnable_items: None,
        active_keys: None,
        parallelism_capped: false,
        shuffle_data_live: false,
    }
}

/// `n` observations ending at `end`, backlog `backlog_secs` worth of `TP`.
fn steady(n: usize, end: f64, workers: u32, backlog_secs: f64, cpu: f64) -> Vec<Observation> {
    (0..n)
        .map(|i| {
            obs(
                end - 10.0 * (n - 1 - i) as f64,
                workers,
                backlog_secs * TP,
                TP,
                cpu,
            )
        })
        .collect()
}

fn decide(cfg: EngineConfig, window: &[Observation]) -> Decision {
    Engine::new(cfg).decide(&mut EngineState::default(), window)
}

#[test]
fn streaming_thresholds() {
    use Reason::*;
    // (backlog s, CPU, reason, target) at 10 workers, maxNumWorkers 60.
    let table: &[(f64, f64, Reason, u32)] = &[
        (20.0, 0.90, ScaleUpBacklog, 12), // (10000 + 200000/150) / 1000 = 11.3 → 12 (divides 60)
        (16.0, 0.21, ScaleUpBacklog, 12),
        (16.0, 0.20, HoldLowCpu, 10), // backlog with CPU ≤ 20 %: no scale-up
        (15.0, 0.90, Steady, 10),     // "above 15 s" is strict
        (12.0, 0.30, Steady, 10),
        (10.0, 0.30, Steady, 10),      // "lower than 10 s" is strict
        (9.9, 0.30, ScaleDownIdle, 4), // ceil(10 × 0.30 / 0.75) = 4
        (5.0, 0.45, ScaleDownIdle, 6),
        (5.0, 0.50, HoldDiskDistribution, 10), // 6.7 → 7, next usable count above 7 is 10
        (5.0, 0.75, HoldHighCpu, 10),          // no backlog, CPU ≥ 75 %: no scale-down
        (0.0, 0.95, HoldHighCpu, 10),
    ];
    for &(backlog, cpu, reason, target) in table {
        let d = decide(
            streaming(Policy::Documented, 60),
            &steady(12, 200.0, 10, backlog, cpu),
        );
        assert_eq!(
            (d.reason, d.target_workers),
            (reason, target),
            "backlog {backlog} cpu {cpu}: {}",
            d.message
        );
    }
}

#[test]
fn streaming_conditions_must_hold_for_the_whole_window() {
    let cfg = streaming(Policy::Documented, 60);
    let d = decide(cfg.clone(), &steady(11, 200.0, 10, 30.0, 0.9));
    assert_eq!(
        d.reason,
        Reason::Settling,
        "110 s is not a couple of minutes"
    );
    // A window that straddles a rescale only counts the part at the current size.
    let mut w = steady(6, 140.0, 8, 30.0, 0.9);
    w.extend(steady(8, 220.0, 10, 30.0, 0.9));
    assert_eq!(decide(cfg.clone(), &w).reason, Reason::Settling);
    // One backlogged reading at the end of a calm window is not "backlogged" on average.
    let mut w = steady(12, 200.0, 10, 0.0, 0.9);
    w.last_mut().unwrap().backlog_bytes = 100.0 * TP;
    let d = decide(cfg, &w);
    assert_eq!(d.reason, Reason::HoldHighCpu, "{}", d.message);
}

#[test]
fn scale_up_is_sized_to_clear_the_backlog_in_150_s_including_arrivals() {
    // Backlog grows 2000 B/s while 10000 B/s are processed: 12000 B/s arrive.
    let w: Vec<_> = (0..12)
        .map(|i| {
            obs(
                10.0 * f64::from(i + 1),
                10,
                200_000.0 + 20_000.0 * f64::from(i),
                TP,
                1.0,
            )
        })
        .collect();
    let d = decide(streaming(Policy::Documented, 100), &w);
    // (12000 + 420000 / 150) / 1000 = 14.8 → 15 → 20 (usable with 100 disks)
    assert_eq!(
        (d.reason, d.target_workers),
        (Reason::ScaleUpBacklog, 20),
        "{}",
        d.message
    );
}

#[test]
fn seed_example_max_100_cannot_reach_75_percent() {
    let cfg = streaming(Policy::Documented, 100);
    // 100 workers at 56.25 % need 75 workers; the next count down is 50: no scale-down.
    let d = decide(cfg.clone(), &steady(12, 200.0, 100, 2.0, 0.5625));
    assert_eq!(
        (d.reason, d.target_workers),
        (Reason::HoldDiskDistribution, 100),
        "{}",
        d.message
    );
    assert!(d.message.contains("allow 50"), "{}", d.message);
    // At 30 % CPU 40 workers would do; the next usable count is 50 (2 disks each).
    let d = decide(cfg, &steady(12, 200.0, 100, 2.0, 0.30));
    assert_eq!((d.reason, d.target_workers), (Reason::ScaleDownIdle, 50));
    assert_eq!(d.shuffle, Some(ShuffleHandling::DisksMove));
    assert!(d.message.contains("2 disks each"), "{}", d.message);
}

#[test]
fn minimum_is_max_over_15_rounded_up_to_a_usable_count() {
    let cfg = streaming(Policy::Documented, 100);
    let d = decide(cfg.clone(), &steady(12, 200.0, 20, 0.0, 0.05));
    assert_eq!(
        d.target_workers, 10,
        "ceil(100/15) = 7, smallest count dividing 100 is 10"
    );
    let d = decide(cfg, &steady(12, 200.0, 10, 0.0, 0.05));
    assert_eq!(d.reason, Reason::HoldAtMinimum);
    let d = decide(
        streaming(Policy::Documented, 30),
        &steady(12, 200.0, 10, 0.0, 0.01),
    );
    assert_eq!(d.target_workers, 2);
}

#[test]
fn at_max_with_high_cpu_records_the_max_num_workers_insight() {
    let d = decide(
        streaming(Policy::Documented, 10),
        &steady(12, 200.0, 10, 30.0, 0.9),
    );
    assert_eq!(
        (d.reason, d.insight),
        (Reason::HoldAtMaximum, Some(Insight::MaxNumWorkers))
    );
    // Streaming: above 50 % CPU with more than 2 minutes of backlog also counts.
    let d = decide(
        streaming(Policy::Documented, 10),
        &steady(12, 200.0, 10, 150.0, 0.6),
    );
    assert_eq!(d.insight, Some(Insight::MaxNumWorkers));
    let d = decide(
        streaming(Policy::Documented, 10),
        &steady(12, 200.0, 10, 30.0, 0.6),
    );
    assert_eq!(d.insight, None);
}

#[test]
fn autoscaling_none_keeps_num_workers() {
    let options: PipelineOptions = serde_json::from_value(serde_json::json!({
        "streaming": true, "numWorkers": 5, "autoscalingAlgorithm": "NONE"
    }))
    .unwrap();
    let cfg = EngineConfig::from_options(&options, Policy::Riverbank);
    assert_eq!(cfg.policy, Policy::Fixed);
    let d = decide(cfg, &steady(12, 200.0, 5, 500.0, 1.0));
    assert_eq!((d.reason, d.target_workers), (Reason::AutoscalingOff, 5));
    // Dataflow's defaults.
    let defaults = EngineConfig::from_options(&PipelineOptions::default(), Policy::Documented);
    assert_eq!(
        (
            defaults.num_workers,
            defaults.max_workers,
            defaults.streaming
        ),
        (3, 1000, false)
    );
}

#[test]
fn dry_run_decides_but_does_not_apply_or_remember() {
    let options: PipelineOptions = serde_json::from_value(serde_json::json!({
        "streaming": true, "numWorkers": 10, "maxNumWorkers": 60,
        "experiments": ["autoscaling_dry_run"]
    }))
    .unwrap();
    let engine = Engine::new(EngineConfig::from_options(&options, Policy::Documented));
    let mut state = EngineState::default();
    let d = engine.decide(&mut state, &steady(12, 200.0, 10, 20.0, 0.9));
    assert!(d.dry_run && d.is_rescale());
    assert_eq!((d.target_workers, d.workers_to_apply()), (12, 10));
    assert_eq!(state.rescale, None, "nothing was asked for");
}

#[test]
fn a_rescale_in_flight_holds_until_the_workers_arrive_or_time_out() {
    let engine = Engine::new(streaming(Policy::Documented, 60));
    let mut state = EngineState::default();
    let d = engine.decide(&mut state, &steady(12, 200.0, 10, 20.0, 0.9));
    assert_eq!(d.target_workers, 12);
    let d = engine.decide(&mut state, &steady(13, 210.0, 10, 20.0, 0.9));
    assert_eq!(d.reason, Reason::RescaleInProgress);
    let mut w = steady(13, 210.0, 10, 20.0, 0.9);
    w.push(obs(220.0, 12, 20.0 * TP, TP, 0.9));
    let d = engine.decide(&mut state, &w);
    assert_eq!(d.reason, Reason::Settling, "arrived: a new window starts");
    assert_eq!(state.rescale, None);
    let mut stuck = EngineState::default();
    engine.decide(&mut stuck, &steady(12, 200.0, 10, 20.0, 0.9));
    let d = engine.decide(&mut stuck, &steady(12, 800.0, 10, 20.0, 0.9));
    assert_eq!(
        d.reason,
        Reason::ScaleUpBacklog,
        "gave up waiting after 600 s: {}",
        d.message
    );
}

#[test]
fn riverbank_does_not_scale_up_with_fewer_active_keys_than_cores() {
    let mut w = steady(12, 200.0, 10, 20.0, 0.9);
    for o in &mut w {
        o.active_keys = Some(39);
    }
    let d = decide(streaming(Policy::Riverbank, 60), &w);
    assert_eq!(
        (d.reason, d.insight),
        (Reason::HoldActiveKeys, Some(Insight::ActiveKeys))
    );
    assert_eq!(
        decide(streaming(Policy::Documented, 60), &w).reason,
        Reason::ScaleUpBacklog
    );
    for o in &mut w {
        o.active_keys = Some(40);
    }
    assert_eq!(
        decide(streaming(Policy::Riverbank, 60), &w).reason,
        Reason::ScaleUpBacklog
    );
}

#[test]
fn riverbank_skips_a_scale_up_the_current_workers_would_beat() {
    // Backlog falls 1000 B/s at full CPU: 10000 B/s capacity, 9000 B/s arriving, 160000 B left.
    let w: Vec<_> = (0..12)
        .map(|i| {
            obs(
                10.0 * f64::from(i + 1),
                10,
                270_000.0 - 10_000.0 * f64::from(i),
                TP,
                1.0,
            )
        })
        .collect();
    // (9000 + 160000/150) / 1000 = 10.07 → 11 (with 44 disks: 4, 11, 22, 44).
    let d = decide(streaming(Policy::Documented, 44), &w);
    assert_eq!((d.reason, d.target_workers), (Reason::ScaleUpBacklog, 11));
    // Now: 160 s to clear. At 11: 60 s start-up (backlog falls to 100000), 10 s pause (+90000),
    // then 190000 / 2000 = 95 s: 165 s in all. Not worth it.
    let d = decide(streaming(Policy::Riverbank, 44), &w);
    assert_eq!(d.reason, Reason::HoldPauseCost, "{}", d.message);
    let quick = EngineConfig {
        startup_secs: 30.0,
        ..streaming(Policy::Riverbank, 44)
    };
    // 30 s start-up: 130000 + 90000 = 220000 / 2000 + 40 = 150 s < 160 s.
    assert_eq!(decide(quick, &w).reason, Reason::ScaleUpBacklog);
}

#[test]
fn riverbank_scales_down_once_drained_and_to_the_peak_arrivals() {
    // 15 workers (2000 B/s each at 100 %) after a burst: 8000 B/s arrive throughout; the first
    // 30 s drain the last 440000 B of backlog at full CPU, then they idle at 27 %.
    let w: Vec<_> = (0..12)
        .map(|i| {
            let busy = i < 3;
            let tp = if busy { 30_000.0 } else { 8_000.0 };
            let backlog = if busy {
                220_000.0 * f64::from(2 - i)
            } else {
                0.0
            };
            obs(1000.0 + 10.0 * f64::from(i), 15, backlog, tp, tp / 30_000.0)
        })
        .collect();
    // The drain inflates the mean CPU to 45 %: 15 × 0.45 / 0.75 = 9 → 10 (usable with 60 disks).
    let d = decide(streaming(Policy::Documented, 60), &w);
    assert_eq!(
        (d.reason, d.target_workers),
        (Reason::ScaleDownIdle, 10),
        "{}",
        d.message
    );
    let r = decide(streaming(Policy::Riverbank, 60), &w);
    // Peak arrivals 8000 B/s at 90 % of 2000 B/s per worker: 4.4 → 5, in one step.
    assert_eq!(
        (r.reason, r.target_workers),
        (Reason::ScaleDownIdle, 5),
        "{}",
        r.message
    );
    // Still draining at the end of the window: wait.
    let mut draining = w.clone();
    draining.last_mut().unwrap().backlog_bytes = 3.0 * 8000.0;
    let r = decide(streaming(Policy::Riverbank, 60), &draining);
    assert_eq!(r.reason, Reason::HoldScaleDownDelay, "{}", r.message);
}

#[test]
fn riverbank_keeps_workers_for_the_peaks_of_a_noisy_load() {
    // 12 workers at 60 % CPU (6000 B/s, 833 B/s per worker at 100 %), one interval at 90 %.
    let mut w = steady(12, 200.0, 12, 0.0, 0.60);
    for o in &mut w {
        o.throughput_bytes_per_sec = 6000.0;
    }
    w[6].throughput_bytes_per_sec = 9000.0;
    w[6].avg_cpu = 0.9;
    // Mean CPU 62.5 %: 12 × 0.625 / 0.75 = 10.
    let d = decide(streaming(Policy::Documented, 60), &w);
    assert_eq!(
        (d.reason, d.target_workers),
        (Reason::ScaleDownIdle, 10),
        "{}",
        d.message
    );
    // No trend, so the burst counts: 9000 / (833 × 0.90) = 12.0 workers. Keep 12.
    let r = decide(streaming(Policy::Riverbank, 60), &w);
    assert_eq!(
        (r.reason, r.target_workers),
        (Reason::HoldHighCpu, 12),
        "{}",
        r.message
    );
}

#[test]
fn riverbank_skips_a_scale_down_whose_pause_costs_more() {
    // 10 workers at 45 %: 4.5 at 90 % → 5. 10 → 5 saves 5 × 300 = 1500 worker-s; a pause
    // costs 10 × pause_secs.
    for (pause, reason) in [
        (140.0, Reason::ScaleDownIdle),
        (150.0, Reason::HoldPauseCost),
    ] {
        let cfg = EngineConfig {
            pause_secs: pause,
            ..streaming(Policy::Riverbank, 60)
        };
        let d = decide(cfg, &steady(12, 200.0, 10, 0.0, 0.45));
        assert_eq!(d.reason, reason, "pause {pause}: {}", d.message);
    }
}

#[test]
fn riverbank_sizes_a_scale_up_for_the_backlog_when_the_workers_join() {
    // A step: 6 workers (2000 B/s each at 100 %) fall behind 20000 B/s arriving; the backlog
    // grows 8000 B/s for the whole window.
    let w: Vec<_> = (0..12)
        .map(|i| {
            let at = 10.0 * f64::from(i + 1);
            obs(at, 6, 8000.0 * at, 12_000.0, 1.0)
        })
        .collect();
    // (20000 + 960000 / 150) / 2000 = 13.2 → 15 with 60 disks.
    let d = decide(streaming(Policy::Documented, 60), &w);
    assert_eq!((d.reason, d.target_workers), (Reason::ScaleUpBacklog, 15));
    // With 30 disks (1, 2, 3, 5, 6, 10, 15, 30) the documented rule stops at 15 too, but by the
    // join the backlog is 960000 + 8000 × 60 + 20000 × 10 = 1640000 B, cleared within 150 s of
    // deciding (80 s after the join): (20000 + 1640000 / 80) / 2000 = 20.3 → 30.
    let d = decide(streaming(Policy::Riverbank, 30), &w);
    assert_eq!(
        (d.reason, d.target_workers),
        (Reason::ScaleUpBacklog, 30),
        "{}",
        d.message
    );
    assert!(d.message.contains("once workers join"), "{}", d.message);
    let d = decide(streaming(Policy::Documented, 30), &w);
    assert_eq!(d.target_workers, 15, "{}", d.message);
}

#[test]
fn riverbank_does_not_scale_down_while_arrivals_ramp_up() {
    // 10 workers (1000 B/s each at 100 %) at 30–41 % CPU, arrivals rising 10 B/s every second
    // (a clean ramp).
    let w: Vec<_> = (0..12)
        .map(|i| {
            let tp = 3000.0 + 100.0 * f64::from(i);
            obs(10.0 * f64::from(i + 1), 10, 0.0, tp, tp / 10_000.0)
        })
        .collect();
    let d = decide(streaming(Policy::Documented, 60), &w);
    assert_eq!(d.reason, Reason::ScaleDownIdle, "{}", d.message);
    let r = decide(streaming(Policy::Riverbank, 60), &w);
    assert_eq!(
        (r.reason, r.target_workers),
        (Reason::HoldScaleDownDelay, 10),
        "{}",
        r.message
    );
    assert!(r.message.contains("ramping up"), "{}", r.message);
    // The same load falling is scaled down: 3000 B/s at 90 % of 1000 B/s per worker → 4.
    let falling: Vec<_> = w
        .iter()
        .zip(w.iter().rev())
        .map(|(o, mirror)| Observation {
            throughput_bytes_per_sec: mirror.throughput_bytes_per_sec,
            avg_cpu: mirror.avg_cpu,
            ..o.clone()
        })
        .collect();
    let r = decide(streaming(Policy::Riverbank, 60), &falling);
    assert_eq!(
        (r.reason, r.target_workers),
        (Reason::ScaleDownIdle, 4),
        "{}",
        r.message
    );
}

#[test]
fn riverbank_remembers_recurring_bursts_across_a_rescale() {
    // 6 workers at a level of 6000 B/s (50 % of 2000 B/s each), with a 9000 B/s interval every
    // 30 s over the last 10 minutes, the last of them before the settled window at 6 began.
    let history: Vec<_> = (0..60)
        .map(|i| {
            let burst = i % 3 == 0 && i < 48;
            let tp = if burst { 9000.0 } else { 6000.0 };
            let workers = if i < 48 { 10 } else { 6 };
            obs(
                10.0 * f64::from(i + 1),
                workers,
                0.0,
                tp,
                tp / (2000.0 * f64::from(workers)),
            )
        })
        .collect();
    // The settled window alone (6000 B/s at 50 %) would go to 6000 / 1800 = 3.3 → 4.
    let settled = &history[48..];
    let r = decide(streaming(Policy::Riverbank, 60), settled);
    assert_eq!(r.target_workers, 4, "{}", r.message);
    // Over the lookback one interval in three bursts: 9000 B/s is its 80th percentile, and
    // 9000 / 1800 = 5.
    let r = decide(streaming(Policy::Riverbank, 60), &history);
    assert_eq!(
        (r.reason, r.target_workers),
        (Reason::ScaleDownIdle, 5),
        "{}",
        r.message
    );
}

fn batch_window(workers: u32, remaining: f64, per_worker: f64, cpu: f64) -> Vec<Observation> {
    (0..3)
        .map(|i| {
            obs(
                10.0 * f64::from(i + 1),
                workers,
                remaining,
                per_worker * f64::from(workers),
                cpu,
            )
        })
        .collect()
}

#[test]
fn batch_sizes_sublinearly_from_remaining_work() {
    use Reason::*;
    // (workers, remaining bytes at 1000 B/s per worker, CPU, runnable items, capped, shuffle live,
    //  reason, target)
    type Row = (u32, f64, f64, Option<u64>, bool, bool, Reason, u32);
    let table: &[Row] = &[
        (
            5,
            30_000.0 * 100.0,
            0.9,
            None,
            false,
            false,
            ScaleToRemainingWork,
            10,
        ), // sqrt(3e6/1000/30)=10
        (
            5,
            30_000.0 * 400.0,
            0.9,
            None,
            false,
            false,
            ScaleToRemainingWork,
            20,
        ), // 4× work → 2×
        (5, 30_000.0 * 400.0, 0.04, None, false, false, HoldLowCpu, 5), // CPU < 5 %
        (
            5,
            30_000.0 * 400.0,
            0.9,
            Some(3),
            false,
            false,
            ScaleToRemainingWork,
            3,
        ), // fewer items
        (
            5,
            30_000.0 * 400.0,
            0.9,
            Some(5),
            false,
            false,
            HoldParallelismCapped,
            5,
        ),
        (
            5,
            30_000.0 * 400.0,
            0.9,
            None,
            true,
            false,
            HoldParallelismCapped,
            5,
        ),
        (
            20,
            30_000.0 * 100.0,
            0.9,
            None,
            false,
            false,
            ScaleToRemainingWork,
            10,
        ),
        (
            20,
            30_000.0 * 100.0,
            0.9,
            None,
            false,
            true,
            HoldShuffleData,
            20,
        ),
        (
            20,
            30_000.0 * 100.0,
            0.01,
            None,
            false,
            false,
            ScaleToRemainingWork,
            10,
        ), // may decrease
        (10, 30_000.0 * 100.0, 0.9, None, false, false, Steady, 10),
    ];
    for &(workers, remaining, cpu, items, capped, live, reason, target) in table {
        let mut w = batch_window(workers, remaining, 1000.0, cpu);
        for o in &mut w {
            o.runnable_items = items;
            o.parallelism_capped = capped;
            o.shuffle_data_live = live;
        }
        let d = decide(batch(Policy::Documented), &w);
        assert_eq!(
            (d.reason, d.target_workers),
            (reason, target),
            "{workers} {remaining} {cpu}: {}",
            d.message
        );
        if reason == HoldShuffleData {
            assert_eq!(d.shuffle, Some(ShuffleHandling::WaitForConsumers));
        }
        if reason == ScaleToRemainingWork && target < workers {
            assert_eq!(d.shuffle, Some(ShuffleHandling::NoLiveData));
        }
    }
}

#[test]
fn batch_reevaluates_every_30_s() {
    let engine = Engine::new(batch(Policy::Documented));
    let mut state = EngineState::default();
    let mut w = batch_window(10, 30_000.0 * 100.0, 1000.0, 0.9);
    assert_eq!(engine.decide(&mut state, &w).reason, Reason::Steady);
    w.push(obs(40.0, 10, 30_000.0 * 100.0, 10_000.0, 0.9));
    assert_eq!(engine.decide(&mut state, &w).reason, Reason::NotDue);
    w.push(obs(60.0, 10, 30_000.0 * 100.0, 10_000.0, 0.9));
    assert_eq!(engine.decide(&mut state, &w).reason, Reason::Steady);
}

#[test]
fn riverbank_batch_skips_rescales_that_do_not_pay() {
    // 30000 worker-s left on 5 workers: 6000 s. 10 workers: 70 + (30000 - 300)/10 = 3040 s.
    let w = batch_window(5, 30_000.0 * 1000.0, 1000.0, 0.9);
    assert_eq!(
        decide(batch(Policy::Riverbank), &w).reason,
        Reason::ScaleToRemainingWork
    );
    // 400 worker-s left on 5 workers: 80 s. Growing to 4? No: sqrt(400/30) = 3.7 → 4, a
    // scale-down saving 1 × 80 = 80 worker-s against a 5 × 10 = 50 pause: worth it.
    let w = batch_window(5, 400_000.0, 1000.0, 0.9);
    assert_eq!(decide(batch(Policy::Riverbank), &w).target_workers, 4);
    // 250 worker-s on 4 workers: wants 3, saves 62 worker-s, the pause costs 40... and on 2
    // workers with 40 worker-s left (wants 2: steady) nothing happens.
    let w = batch_window(3, 30_000.0 * 27.0, 1000.0, 0.9);
    // sqrt(810/30) = 5.2 → 6: 3 workers finish in 270 s, 6 in 70 + (810 - 180)/6 = 175 s.
    assert_eq!(decide(batch(Policy::Riverbank), &w).target_workers, 6);
    let w = batch_window(3, 30_000.0 * 6.0, 1000.0, 0.9);
    // 180 worker-s: sqrt(6) → 3: steady. 300 worker-s on 2 workers: sqrt(10) → 4; 2 finish in
    // 150 s, 4 in 70 + (300 - 120)/4 = 115 s: worth it; with a 60-s pause it is not.
    assert_eq!(decide(batch(Policy::Riverbank), &w).reason, Reason::Steady);
    let w = batch_window(2, 300_000.0, 1000.0, 0.9);
    assert_eq!(decide(batch(Policy::Riverbank), &w).target_workers, 4);
    let slow = EngineConfig {
        pause_secs: 60.0,
        ..batch(Policy::Riverbank)
    };
    assert_eq!(decide(slow, &w).reason, Reason::HoldPauseCost);
}

#[test]
fn a_small_batch_job_says_why_it_keeps_its_one_worker() {
    // 50 worker-s left on 1 worker: sqrt(50/30) → 2 wanted, but the one worker is done in
    // 50 s, before a second one would have started (60 s).
    let w = batch_window(1, 50_000.0, 1000.0, 0.9);
    let d = decide(batch(Policy::Riverbank), &w);
    assert_eq!((d.reason, d.target_workers), (Reason::HoldPauseCost, 1));
    assert_eq!(
        d.message,
        "1 worker kept: 50 s of work left is less than a 60 s start-up (50 worker-s of work left at 1000 B/s per worker → 2 workers)"
    );
}
