//! Batch rules (seed 000, "Batch autoscaling"), and Riverbank's pause-cost check.
use super::window::WindowStats;
use super::*;

pub(super) fn propose(cfg: &EngineConfig, s: &WindowStats) -> Proposal {
    let current = s.workers;
    let per_worker = s.per_worker_throughput();
    if per_worker <= 0.0 {
        return Proposal::hold(
            current,
            Reason::HoldNoThroughput,
            format!("no throughput measured yet: keeping {current}"),
        );
    }
    // Remaining work in worker-seconds at the current throughput per worker.
    let work = s.backlog_bytes / per_worker;
    let sizes = cfg.sizes();
    let wanted = ceil_workers((work / BATCH_REFERENCE_SECS).sqrt()).clamp(sizes.min(), sizes.max());
    let cap = match s.runnable_items {
        Some(items) if items < u64::from(wanted) => Some(u32::try_from(items).unwrap_or(u32::MAX)),
        _ if s.parallelism_capped => Some(current),
        _ => None,
    };
    let target = cap.map_or(wanted, |c| wanted.min(c.max(sizes.min())));
    let why = format!(
        "{:.0} worker-s of work left at {per_worker:.0} B/s per worker → {wanted} workers",
        work
    );
    let riverbank = cfg.policy == Policy::Riverbank;
    if target > current {
        if s.mean_cpu < BATCH_MIN_CPU {
            return Proposal::hold(
                current,
                Reason::HoldLowCpu,
                format!(
                    "{why}, but CPU {} < {}: keeping {current}",
                    pct(s.mean_cpu),
                    pct(BATCH_MIN_CPU)
                ),
            );
        }
        if riverbank {
            let finish_now = work / f64::from(current);
            let head_start = f64::from(current) * cfg.startup_secs;
            let finish_larger = cfg.startup_secs
                + cfg.pause_secs
                + (work - head_start).max(0.0) / f64::from(target);
            if finish_larger >= finish_now {
                // The usual case of a small job: the work left is done before a new worker
                // would have started.
                let message = if finish_now <= cfg.startup_secs {
                    format!(
                        "{} kept: {finish_now:.0} s of work left is less than a {:.0} s start-up ({why})",
                        workers(current),
                        cfg.startup_secs
                    )
                } else {
                    format!(
                        "{why}, but {current} workers finish in {finish_now:.0} s and {target} (start-up and pause included) in {finish_larger:.0} s"
                    )
                };
                return Proposal::hold(current, Reason::HoldPauseCost, message);
            }
        }
        return Proposal::new(
            target,
            Reason::ScaleToRemainingWork,
            format!("{why}: {current} → {target}"),
        );
    }
    if target == current {
        if wanted > current {
            return Proposal::hold(
                current,
                Reason::HoldParallelismCapped,
                format!(
                    "{why}, but parallelism is capped at {}: keeping {current}",
                    cap.unwrap_or(current)
                ),
            );
        }
        return Proposal::hold(current, Reason::Steady, format!("{why}: keeping {current}"));
    }
    if s.shuffle_data_live {
        return Proposal::hold(
            current,
            Reason::HoldShuffleData,
            format!("{why}, but a later stage still reads shuffle data on the workers' disks: keeping {current} until it is consumed"),
        )
        .with_shuffle(ShuffleHandling::WaitForConsumers);
    }
    if riverbank {
        // The departing workers would be billed for the rest of the job at the current size.
        let saved = f64::from(current - target) * work / f64::from(current);
        let paused = f64::from(current) * cfg.pause_secs;
        if saved <= paused {
            return Proposal::hold(
                current,
                Reason::HoldPauseCost,
                format!(
                    "{why}, but {current} → {target} saves {saved:.0} worker-s and its pause costs {paused:.0}"
                ),
            );
        }
    }
    let capped = match cap {
        Some(c) if target < wanted => format!(", but only {c} work items wait to run"),
        _ => String::new(),
    };
    Proposal::new(
        target,
        Reason::ScaleToRemainingWork,
        format!("{why}{capped}: {current} → {target}, no shuffle data to keep"),
    )
    .with_shuffle(ShuffleHandling::NoLiveData)
}

/// `1 worker`, `3 workers`.
fn workers(n: u32) -> String {
    if n == 1 {
        "1 worker".into()
    } else {
        format!("{n} workers")
    }
}
