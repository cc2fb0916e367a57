//! Streaming rules (seed 000, "Streaming autoscaling"), and Riverbank's additions to them.
use super::sizes::MAX_DISKS_PER_WORKER;
use super::window::WindowStats;
use super::*;

pub(super) fn propose(
    cfg: &EngineConfig,
    state: &mut EngineState,
    s: &WindowStats,
    now: f64,
) -> Proposal {
    let current = s.workers;
    let backlog = s.backlog_secs;
    let idle = backlog < IDLE_BACKLOG_SECS && s.mean_cpu < TARGET_CPU;
    if !idle {
        // A merged scale-down is only kept while the load stays low throughout.
        state.scale_down = None;
    }
    if backlog > BACKLOGGED_SECS {
        scale_up(cfg, s)
    } else if idle {
        scale_down(cfg, state, s, now)
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
    let target = sizes.at_least(ceil_workers(needed));
    if target <= current {
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
    if riverbank && let Some(hold) = scale_up_not_worth_it(cfg, s, target) {
        return hold;
    }
    Proposal::new(
        target,
        Reason::ScaleUpBacklog,
        format!(
            "backlogged {backlog:.0} s at CPU {}: {:.0} B/s arriving + {:.0} B backlog over {CLEAR_BACKLOG_SECS:.0} s at {per_worker:.0} B/s per worker needs {needed:.1} → {target} workers",
            pct(s.mean_cpu),
            s.arrival_rate,
            s.backlog_bytes
        ),
    )
}

/// Riverbank: a scale-up stops processing while workers start and join; skip it when the current
/// workers would clear the backlog no later than the larger job would, pause included.
fn scale_up_not_worth_it(cfg: &EngineConfig, s: &WindowStats, target: u32) -> Option<Proposal> {
    let current = s.workers;
    let capacity = s.mean_throughput / s.mean_cpu.clamp(0.05, 1.0);
    let larger = capacity * f64::from(target) / f64::from(current.max(1));
    let (arrival, backlog) = (s.arrival_rate, s.backlog_bytes);
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

fn scale_down(cfg: &EngineConfig, state: &mut EngineState, s: &WindowStats, now: f64) -> Proposal {
    let current = s.workers;
    let sizes = cfg.sizes();
    let raw = ceil_workers(f64::from(current) * s.mean_cpu / TARGET_CPU).max(sizes.min());
    let target = sizes.at_least(raw);
    let why = format!(
        "backlog {:.1} s and CPU {} < {} for {:.0} s",
        s.backlog_secs,
        pct(s.mean_cpu),
        pct(TARGET_CPU),
        s.coverage_secs
    );
    if target >= current {
        return if current > sizes.at_least(sizes.min()) {
            let next = sizes.all().into_iter().rfind(|&c| c < current);
            Proposal::hold(
                current,
                Reason::HoldDiskDistribution,
                format!(
                    "{why}: {raw} workers would reach {} but {} disks spread evenly allow {} below {current}; keeping {current}",
                    pct(TARGET_CPU),
                    sizes.max(),
                    next.map_or("nothing".into(), |n| n.to_string())
                ),
            )
        } else {
            Proposal::hold(
                current,
                Reason::HoldAtMinimum,
                format!(
                    "{why}: already at the minimum (ceil({} / {MAX_DISKS_PER_WORKER}) = {}, usable {current})",
                    sizes.max(),
                    sizes.min()
                ),
            )
        };
    }
    let mut target = target;
    if cfg.policy == Policy::Riverbank {
        let wanted = state.scale_down.get_or_insert(WantedScaleDown {
            since_secs: now,
            target,
        });
        wanted.target = wanted.target.max(target);
        target = wanted.target;
        let waited = now - wanted.since_secs;
        if waited < SCALE_DOWN_DELAY_SECS {
            return Proposal::hold(
                current,
                Reason::HoldScaleDownDelay,
                format!(
                    "{why}: scale-down to {target} wanted for {waited:.0} s; acting after {SCALE_DOWN_DELAY_SECS:.0} s"
                ),
            );
        }
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
    Proposal::new(
        target,
        Reason::ScaleDownIdle,
        format!(
            "{why}: {current} → {target} workers (≈{} CPU, {} disks each)",
            pct(s.mean_cpu * f64::from(current) / f64::from(target)),
            sizes.disks_per_worker(target)
        ),
    )
    .with_shuffle(ShuffleHandling::DisksMove)
}
