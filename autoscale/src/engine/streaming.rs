//! Streaming rules (seed 000, "Streaming autoscaling"), and Riverbank's additions to them.
use super::sizes::MAX_DISKS_PER_WORKER;
use super::window::WindowStats;
use super::*;

pub(super) fn propose(cfg: &EngineConfig, s: &WindowStats) -> Proposal {
    let current = s.workers;
    let backlog = s.backlog_secs;
    let idle = backlog < IDLE_BACKLOG_SECS && s.mean_cpu < TARGET_CPU;
    if backlog > BACKLOGGED_SECS {
        scale_up(cfg, s)
    } else if idle {
        scale_down(cfg, s)
    } else if backlog < IDLE_BACKLOG_SECS {
        Proposal::hold(
            current,
            Reason::HoldHighCpu,
            format!(
                "no backlog ({backlog:.1} s) and CPU {} ≥ {}: keeping {current}",
                pct(s.mean_cpu),
                pct(TARGET_CPU)
            ),
        )
    } else {
        Proposal::hold(
            current,
            Reason::Steady,
            format!("backlog {backlog:.1} s is between 10 s and 15 s: keeping {current}"),
        )
    }
}

fn scale_up(cfg: &EngineConfig, s: &WindowStats) -> Proposal {
    let current = s.workers;
    let backlog = s.backlog_secs;
    if s.mean_cpu <= SCALE_UP_MIN_CPU {
        return Proposal::hold(
            current,
            Reason::HoldLowCpu,
            format!(
                "backlog {backlog:.0} s but CPU {} ≤ {}: more workers would not help",
                pct(s.mean_cpu),
                pct(SCALE_UP_MIN_CPU)
            ),
        );
    }
    let riverbank = cfg.policy == Policy::Riverbank;
    if riverbank
        && let Some(keys) = s.active_keys
        && keys < s.cores()
    {
        return Proposal::hold(
            current,
            Reason::HoldActiveKeys,
            format!(
                "backlog {backlog:.0} s but only {keys} active keys for {} cores: more workers would idle",
                s.cores()
            ),
        )
        .with_insight(Insight::ActiveKeys);
    }
    let per_worker = s.per_worker_throughput();
    if per_worker <= 0.0 {
        return Proposal::hold(
            current,
            Reason::HoldNoThroughput,
            format!("backlog {backlog:.0} s but nothing processed yet: keeping {current}"),
        );
    }
    // Capacity for the arrivals plus the backlog spread over 150 s.
    let needed = (s.arrival_rate + s.backlog_bytes / CLEAR_BACKLOG_SECS) / per_worker;
    let sizes = cfg.sizes();
    let documented = sizes.at_least(ceil_workers(needed));
    if documented <= current {
        return if current >= sizes.max() {
            Proposal::hold(
                current,
                Reason::HoldAtMaximum,
                format!(
                    "backlog {backlog:.0} s needs {needed:.1} workers; at maxNumWorkers {}",
                    sizes.max()
                ),
            )
        } else {
            Proposal::hold(
                current,
                Reason::Steady,
                format!(
                    "backlog {backlog:.0} s: {current} workers clear it within {CLEAR_BACKLOG_SECS:.0} s"
                ),
            )
        };
    }
    // Riverbank: scale up when the documented rule would and it pays for its pause, then size
    // for the join.
    if riverbank && let Some(hold) = scale_up_not_worth_it(cfg, s, documented) {
        return hold;
    }
    let at_join = needed_at_join(cfg, s);
    let target = if riverbank {
        documented.max(sizes.at_least(ceil_workers(at_join)))
    } else {
        documented
    };
    let mut message = format!(
        "backlogged {backlog:.0} s at CPU {}: {:.0} B/s arriving + {:.0} B backlog over {CLEAR_BACKLOG_SECS:.0} s at {per_worker:.0} B/s per worker needs {needed:.1}",
        pct(s.mean_cpu),
        s.arrival_rate,
        s.backlog_bytes
    );
    if target > documented {
        message += &format!(
            ", and {at_join:.1} once workers join in {:.0} s (backlog grown meanwhile, arrivals {:+.0} B/s per s)",
            cfg.startup_secs + cfg.pause_secs,
            s.arrival_slope.max(0.0)
        );
    }
    Proposal::new(
        target,
        Reason::ScaleUpBacklog,
        format!("{message} → {target} workers"),
    )
}

/// Riverbank: the workers needed when the new ones have joined. The documented rule sizes on
/// the backlog and arrivals at the moment it decides; by the time workers join (start-up, then
/// the pause) the backlog has grown and a ramp has moved on, so it often has to scale up a
/// second time, paying a second start-up and pause. This sizes on the backlog projected to the
/// join (at current capacity, arrivals following a ramp when there is a clean one) and on the
/// arrivals over the clearing period after it.
fn needed_at_join(cfg: &EngineConfig, s: &WindowStats) -> f64 {
    let capacity = s.mean_throughput / s.mean_cpu.clamp(0.05, 1.0);
    let per_worker = capacity / f64::from(s.workers.max(1));
    if per_worker <= 0.0 {
        return 0.0;
    }
    let arrival = s.arrival_rate;
    let slope = s.arrival_slope.max(0.0);
    let at = |secs: f64| arrival + slope * secs;
    let (startup, pause) = (cfg.startup_secs, cfg.pause_secs);
    let joined = startup + pause;
    let backlog = (s.backlog_bytes + (at(startup / 2.0) - capacity) * startup).max(0.0)
        + at(startup + pause / 2.0) * pause;
    // On a level load, cleared within CLEAR_BACKLOG_SECS of deciding, as the documented rule
    // means to, start-up counted (at least a minute of clearing). On a ramp, within
    // CLEAR_BACKLOG_SECS of joining: the projected arrivals already provision ahead, and
    // clearing faster on top adds workers the ramp will not grow into for a long time.
    let clear_secs = if slope > 0.0 {
        CLEAR_BACKLOG_SECS
    } else {
        (CLEAR_BACKLOG_SECS - joined).max(60.0)
    };
    let clearing = at(joined + clear_secs / 2.0) + backlog / clear_secs;
    clearing.max(at(joined + clear_secs)) / per_worker
}

/// Riverbank: a scale-up stops processing while workers start and join; skip it when the current
/// workers would clear the backlog no later than the larger job would, pause included.
fn scale_up_not_worth_it(cfg: &EngineConfig, s: &WindowStats, target: u32) -> Option<Proposal> {
    let current = s.workers;
    let capacity = s.mean_throughput / s.mean_cpu.clamp(0.05, 1.0);
    let larger = capacity * f64::from(target) / f64::from(current.max(1));
    // A rising load is judged by where it is heading.
    let (arrival, backlog) = (s.arrival_rate.max(s.recent_arrival_rate), s.backlog_bytes);
    let clear_now = if capacity > arrival {
        backlog / (capacity - arrival)
    } else {
        f64::INFINITY
    };
    let at_join =
        (backlog + (arrival - capacity) * cfg.startup_secs).max(0.0) + arrival * cfg.pause_secs;
    let clear_larger = if larger > arrival {
        cfg.startup_secs + cfg.pause_secs + at_join / (larger - arrival)
    } else {
        f64::INFINITY
    };
    (clear_now.is_finite() && clear_larger >= clear_now).then(|| {
        Proposal::hold(
            current,
            Reason::HoldPauseCost,
            format!(
                "backlog clears in {clear_now:.0} s at {current} workers; scaling to {target} (start-up and pause included) would take {clear_larger:.0} s"
            ),
        )
    })
}

/// Scale-down, on a usable count. The documented rule sizes to about 75 % of the window's mean
/// CPU. Riverbank scales down on the same trigger, but waits until the backlog has drained (a
/// pause while draining costs twice) and sizes on the arrivals of the last
/// [`ARRIVAL_LOOKBACK_SECS`] instead: their trend at the end plus the largest burst above it,
/// or without a clear trend the window's busiest interval or the lookback's 80th percentile,
/// at up to [`PEAK_CPU`]. It does not scale down while arrivals ramp up: the ramp would soon need a
/// scale-up, and the two pauses and the reactive scale-up's backlog cost more than was saved.
/// After a burst that skips the documented rule's intermediate steps (15 → 12 → 6 becomes
/// 15 → 6: merged); on a noisy load it keeps room for the bursts (no flapping); on a smooth load
/// it does not keep a margin for variation that is not there. A scale-down too small to pay for
/// its pause is skipped.
fn scale_down(cfg: &EngineConfig, s: &WindowStats) -> Proposal {
    let current = s.workers;
    let sizes = cfg.sizes();
    let riverbank = cfg.policy == Policy::Riverbank;
    let why = format!(
        "backlog {:.1} s and CPU {} < {} for {:.0} s",
        s.backlog_secs,
        pct(s.mean_cpu),
        pct(TARGET_CPU),
        s.coverage_secs
    );
    let (needed, target_cpu) = if riverbank {
        let draining = s.backlog_bytes / s.mean_throughput.max(f64::MIN_POSITIVE);
        if draining > DRAINED_SECS {
            return Proposal::hold(
                current,
                Reason::HoldScaleDownDelay,
                format!(
                    "{why}, but {draining:.1} s of backlog is still draining: scaling down after"
                ),
            );
        }
        if s.arrival_slope > 0.0 {
            return Proposal::hold(
                current,
                Reason::HoldScaleDownDelay,
                format!(
                    "{why}, but arrivals are ramping up ({:+.0} B/s per s): a scale-down now would be undone by a scale-up",
                    s.arrival_slope
                ),
            );
        }
        // What one worker does at 100 % CPU.
        let per_worker =
            s.mean_throughput / (f64::from(current) * s.mean_cpu).max(f64::MIN_POSITIVE);
        (s.planning_arrival_rate / (per_worker * PEAK_CPU), PEAK_CPU)
    } else {
        (f64::from(current) * s.mean_cpu / TARGET_CPU, TARGET_CPU)
    };
    let raw = ceil_workers(needed).max(sizes.min());
    let target = sizes.at_least(raw);
    if target >= current {
        let reason = if current <= sizes.at_least(sizes.min()) {
            Reason::HoldAtMinimum
        } else if raw < current {
            Reason::HoldDiskDistribution
        } else {
            Reason::HoldHighCpu
        };
        let message = match reason {
            Reason::HoldAtMinimum => format!(
                "{why}: already at the minimum (ceil({} / {MAX_DISKS_PER_WORKER}) = {}, usable {current})",
                sizes.max(),
                sizes.min()
            ),
            Reason::HoldDiskDistribution => format!(
                "{why}: {raw} workers would reach {} but {} disks spread evenly allow {} below {current}; keeping {current}",
                pct(target_cpu),
                sizes.max(),
                sizes
                    .all()
                    .into_iter()
                    .rfind(|&c| c < current)
                    .map_or("nothing".into(), |n| n.to_string())
            ),
            _ => format!(
                "{why}, but {:.0} B/s of arrivals (trend and bursts) need {needed:.1} workers at {}",
                s.planning_arrival_rate,
                pct(target_cpu)
            ),
        };
        return Proposal::hold(current, reason, message);
    }
    if riverbank {
        let saved = f64::from(current - target) * SCALE_DOWN_HORIZON_SECS;
        let paused = f64::from(current) * cfg.pause_secs;
        if saved <= paused {
            return Proposal::hold(
                current,
                Reason::HoldPauseCost,
                format!(
                    "{why}: {current} → {target} saves {saved:.0} worker-s over {SCALE_DOWN_HORIZON_SECS:.0} s, its pause costs {paused:.0}"
                ),
            );
        }
    }
    let cpu_after = needed * target_cpu / f64::from(target);
    Proposal::new(
        target,
        Reason::ScaleDownIdle,
        format!(
            "{why}: {current} → {target} workers (≈{} CPU, {} disks each)",
            pct(cpu_after),
            sizes.disks_per_worker(target)
        ),
    )
    .with_shuffle(ShuffleHandling::DisksMove)
}
