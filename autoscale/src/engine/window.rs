//! The window the rules read: observations since the worker count last changed, summarised.
//! Averaging over the window, not reading one instant, is what keeps a burst or a rescale's
//! pause from triggering a decision on its own.
use crate::observe::Observation;

/// What the rules need from a window of observations at one worker count.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowStats {
    pub workers: u32,
    pub cores_per_worker: u32,
    /// Seconds the window covers (from the start of its first interval to its last reading).
    pub coverage_secs: f64,
    /// Backlog at the latest reading.
    pub backlog_bytes: f64,
    pub mean_throughput: f64,
    /// Dataflow's estimated backlog time over the window: mean backlog / mean throughput.
    /// Infinite when there is backlog and nothing was processed.
    pub backlog_secs: f64,
    pub mean_cpu: f64,
    /// The busiest interval's CPU.
    pub peak_cpu: f64,
    /// Bytes arriving per second: what was processed plus how the backlog grew.
    pub arrival_rate: f64,
    /// Arrivals over the last 30 s of the window: where a trend is heading.
    pub recent_arrival_rate: f64,
    /// The busiest interval's arrivals.
    pub peak_arrival_rate: f64,
    /// Arrivals to provision for now, read over the lookback (arrivals do not depend on the
    /// worker count, so a rescale does not cut this history short). When a linear trend explains
    /// most of the variation (R² ≥ 0.5), the trend at the end plus the largest excursion above
    /// it; otherwise the load is noise around a level, and the window's busiest interval or the
    /// lookback's 80th percentile, whichever is higher, is what counts.
    pub planning_arrival_rate: f64,
    /// How fast arrivals change over the lookback (bytes/s per second) when a straight line
    /// explains them closely (R² ≥ 0.9: a ramp, not a step or noise); 0 otherwise. Riverbank
    /// sizes for where a ramp will be when new workers have joined.
    pub arrival_slope: f64,
    pub active_keys: Option<u64>,
    pub runnable_items: Option<u64>,
    pub parallelism_capped: bool,
    pub shuffle_data_live: bool,
}

impl WindowStats {
    /// Observed throughput of one worker.
    pub fn per_worker_throughput(&self) -> f64 {
        self.mean_throughput / f64::from(self.workers.max(1))
    }

    /// Cores of the current workers.
    pub fn cores(&self) -> u64 {
        u64::from(self.workers) * u64::from(self.cores_per_worker)
    }
}

/// The observations a job's autoscaler keeps, oldest first: the one window the operator,
/// `riverbank run --autoscale` and the simulator feed [`crate::Engine::decide`] from.
///
/// It holds [`HISTORY_SECS`](super::HISTORY_SECS), the longest span any rule reads: a reading
/// that is that old or older when a new one arrives is dropped (it starts before every rule's
/// span, so no rule would read it). A reading that comes less than `min_gap_secs` after the last
/// one kept is not kept: a caller that reads more often than its readings change (the operator
/// follows a running job about every second) would otherwise weigh one moment many times.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Window {
    observations: Vec<Observation>,
    min_gap_secs: f64,
}

impl Window {
    /// An empty window that keeps readings at least `min_gap_secs` apart (0: all of them).
    pub fn new(min_gap_secs: f64) -> Window {
        Window {
            observations: Vec::new(),
            min_gap_secs: min_gap_secs.max(0.0),
        }
    }

    /// Adds `o` (taken after every reading already kept); false when it was too close to the
    /// last one kept and was left out.
    pub fn push(&mut self, o: Observation) -> bool {
        if self
            .observations
            .last()
            .is_some_and(|last| o.at_secs - last.at_secs < self.min_gap_secs)
        {
            return false;
        }
        let keep_from = o.at_secs - super::HISTORY_SECS;
        let stale = self
            .observations
            .iter()
            .take_while(|k| k.at_secs <= keep_from)
            .count();
        self.observations.drain(..stale);
        self.observations.push(o);
        true
    }

    /// The readings, oldest first, as [`crate::Engine::decide`] takes them.
    pub fn observations(&self) -> &[Observation] {
        &self.observations
    }

    pub fn last(&self) -> Option<&Observation> {
        self.observations.last()
    }

    pub fn len(&self) -> usize {
        self.observations.len()
    }

    pub fn is_empty(&self) -> bool {
        self.observations.is_empty()
    }
}

/// The trailing observations at the latest worker count, at most `span_secs` long.
pub fn settled(window: &[Observation], span_secs: f64) -> &[Observation] {
    let Some(last) = window.last() else {
        return window;
    };
    let start = window
        .iter()
        .rposition(|o| {
            // An observation whose averaging interval straddles the span's start is kept: it
            // covers the start (dropping it left the span always a little short).
            o.workers != last.workers || o.at_secs <= last.at_secs - span_secs + 1e-9
        })
        .map_or(0, |i| i + 1);
    &window[start..]
}

/// The trailing observations of at most `span_secs`, whatever the worker count.
pub fn lookback(window: &[Observation], span_secs: f64) -> &[Observation] {
    let Some(last) = window.last() else {
        return window;
    };
    let start = window
        .iter()
        .rposition(|o| o.at_secs - o.interval_secs < last.at_secs - span_secs - 1e-9)
        .map_or(0, |i| i + 1);
    &window[start..]
}

/// Seconds a run of observations covers.
pub fn coverage(obs: &[Observation]) -> f64 {
    match (obs.first(), obs.last()) {
        (Some(f), Some(l)) => l.at_secs - (f.at_secs - f.interval_secs),
        _ => 0.0,
    }
}

/// The span of "recent" arrivals.
const RECENT_SECS: f64 = 30.0;

/// Bytes per second that arrived between the first and last reading: processed + backlog growth.
fn arrivals(obs: &[Observation]) -> f64 {
    match (obs.first(), obs.last()) {
        (Some(first), Some(last)) if last.at_secs > first.at_secs => {
            // Time between readings, not each reading's averaging interval: the two differ
            // when the operator polls more often than the coordinator averages.
            let processed: f64 = obs
                .windows(2)
                .map(|p| p[1].throughput_bytes_per_sec * (p[1].at_secs - p[0].at_secs))
                .sum();
            ((last.backlog_bytes - first.backlog_bytes + processed)
                / (last.at_secs - first.at_secs))
                .max(0.0)
        }
        (_, Some(last)) => last.throughput_bytes_per_sec,
        _ => 0.0,
    }
}

/// A least-squares line through `(time, rate)` points.
struct Trend {
    slope: f64,
    /// Share of the variance the line explains (1 when there is none to explain).
    r2: f64,
    /// The line at the last point, plus the largest residual above the line.
    end_plus_noise: f64,
}

impl Trend {
    /// None with fewer than two points.
    fn fit(points: &[(f64, f64)]) -> Option<Trend> {
        let (&(end, _), n) = (points.last()?, points.len() as f64);
        if points.len() < 2 {
            return None;
        }
        let mean_t = points.iter().map(|p| p.0).sum::<f64>() / n;
        let mean_r = points.iter().map(|p| p.1).sum::<f64>() / n;
        let var = points.iter().map(|p| (p.0 - mean_t).powi(2)).sum::<f64>();
        let slope = if var > 0.0 {
            points
                .iter()
                .map(|p| (p.0 - mean_t) * (p.1 - mean_r))
                .sum::<f64>()
                / var
        } else {
            0.0
        };
        let fit = |t: f64| mean_r + slope * (t - mean_t);
        let noise = points.iter().map(|p| p.1 - fit(p.0)).fold(0.0, f64::max);
        let total: f64 = points.iter().map(|p| (p.1 - mean_r).powi(2)).sum();
        let residual: f64 = points.iter().map(|p| (p.1 - fit(p.0)).powi(2)).sum();
        Some(Trend {
            slope,
            r2: if total == 0.0 {
                1.0
            } else {
                1.0 - residual / total
            },
            end_plus_noise: (fit(end) + noise).max(0.0),
        })
    }
}

/// Below this share of variance explained, a window's slope is noise, not a trend.
const TREND_MIN_R2: f64 = 0.5;
/// A slope is extrapolated only when the line explains this much: a step fits a line with
/// R² ≈ 0.75, and extrapolating it would provision for a ramp that is not there.
const RAMP_MIN_R2: f64 = 0.9;

/// Without a trend, the lookback's arrivals are a level with noise: this quantile of them is
/// provisioned for (with the window's own peak), so recurring bursts count and a one-off burst
/// that has passed does not hold a scale-down for the whole lookback.
const LEVEL_QUANTILE: f64 = 0.8;

/// The `q` quantile (nearest rank) of `values`; 0 when there are none.
fn quantile(values: impl Iterator<Item = f64>, q: f64) -> f64 {
    let mut v: Vec<f64> = values.collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// Summarises a non-empty run of observations at one worker count; the planning arrivals come
/// from `lookback`, a longer run ending at the same observation.
pub fn stats(obs: &[Observation], lookback: &[Observation]) -> Option<WindowStats> {
    let last = obs.last()?;
    let weight: f64 = obs.iter().map(|o| o.interval_secs).sum();
    let weighted = |f: fn(&Observation) -> f64| {
        if weight > 0.0 {
            obs.iter().map(|o| f(o) * o.interval_secs).sum::<f64>() / weight
        } else {
            f(last)
        }
    };
    let mean_backlog = weighted(|o| o.backlog_bytes);
    let mean_throughput = weighted(|o| o.throughput_bytes_per_sec);
    let backlog_secs = if mean_throughput > 0.0 {
        mean_backlog / mean_throughput
    } else if mean_backlog > 0.0 {
        f64::INFINITY
    } else {
        0.0
    };
    let arrival_rate = arrivals(obs);
    let recent_from = last.at_secs - RECENT_SECS;
    let recent = &obs[obs
        .iter()
        .position(|o| o.at_secs >= recent_from - 1e-9)
        .unwrap_or(0)..];
    let per_interval = |obs: &[Observation]| -> Vec<(f64, f64)> {
        obs.windows(2)
            .map(|p| (p[1].at_secs, arrivals(p)))
            .collect()
    };
    let peak_arrival_rate = per_interval(obs)
        .iter()
        .map(|p| p.1)
        .fold(arrival_rate, f64::max);
    let long = per_interval(if lookback.len() > obs.len() {
        lookback
    } else {
        obs
    });
    let long_peak = long.iter().map(|p| p.1).fold(peak_arrival_rate, f64::max);
    let trend = Trend::fit(&long);
    let planning_arrival_rate = trend.as_ref().filter(|t| t.r2 >= TREND_MIN_R2).map_or_else(
        || peak_arrival_rate.max(quantile(long.iter().map(|p| p.1), LEVEL_QUANTILE)),
        |t| t.end_plus_noise.min(long_peak),
    );
    let arrival_slope = trend
        .filter(|t| t.r2 >= RAMP_MIN_R2)
        .map_or(0.0, |t| t.slope);
    Some(WindowStats {
        workers: last.workers,
        cores_per_worker: last.cores_per_worker.max(1),
        coverage_secs: coverage(obs),
        backlog_bytes: last.backlog_bytes,
        mean_throughput,
        backlog_secs,
        mean_cpu: weighted(|o| o.avg_cpu),
        peak_cpu: obs.iter().map(|o| o.avg_cpu).fold(0.0, f64::max),
        arrival_rate,
        recent_arrival_rate: arrivals(recent),
        peak_arrival_rate,
        planning_arrival_rate,
        arrival_slope,
        active_keys: last.active_keys,
        runnable_items: last.runnable_items,
        parallelism_capped: last.parallelism_capped,
        shuffle_data_live: last.shuffle_data_live,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn obs(at: f64, workers: u32, backlog: f64, tp: f64, cpu: f64) -> Observation {
        Observation {
            at_secs: at,
            interval_secs: 10.0,
            workers,
            cores_per_worker: 4,
            backlog_bytes: backlog,
            throughput_bytes_per_sec: tp,
            avg_cpu: cpu,
            fraction_consumed: 0.0,
            runnable_items: None,
            active_keys: None,
            parallelism_capped: false,
            shuffle_data_live: false,
        }
    }

    #[test]
    fn the_window_keeps_history_secs_and_spaces_readings() {
        let mut w = Window::new(5.0);
        assert!(w.is_empty());
        assert!(w.push(obs(100.0, 2, 0.0, 1.0, 0.5)));
        assert!(!w.push(obs(104.9, 2, 0.0, 1.0, 0.5)), "closer than the gap");
        assert!(
            w.push(obs(105.0, 2, 0.0, 1.0, 0.5)),
            "exactly the gap apart"
        );
        assert_eq!(w.len(), 2);
        // A reading exactly HISTORY_SECS older than the newest goes; a younger one stays.
        assert!(w.push(obs(700.0, 2, 0.0, 1.0, 0.5)));
        assert_eq!(
            w.observations()
                .iter()
                .map(|o| o.at_secs)
                .collect::<Vec<_>>(),
            [105.0, 700.0]
        );
        assert!(w.push(obs(705.5, 2, 0.0, 1.0, 0.5)));
        assert_eq!(w.observations()[0].at_secs, 700.0);
        assert_eq!(w.last().map(|o| o.at_secs), Some(705.5));

        // Without a gap every reading is kept (the simulator's readings are 10 s apart).
        let mut all = Window::new(0.0);
        for i in 0..100 {
            assert!(all.push(obs(f64::from(i) * 10.0, 2, 0.0, 1.0, 0.5)));
        }
        assert_eq!(all.len(), 60, "600 s of 10-s readings");
        assert_eq!(all.observations()[0].at_secs, 400.0);
    }

    #[test]
    fn settled_window_stops_at_the_last_worker_change_and_the_span() {
        let w: Vec<_> = (1..=30)
            .map(|i| {
                obs(
                    f64::from(i) * 10.0,
                    if i <= 10 { 3 } else { 6 },
                    0.0,
                    1.0,
                    0.5,
                )
            })
            .collect();
        let s = settled(&w, 120.0);
        assert_eq!(s.len(), 12);
        assert_eq!(coverage(s), 120.0);
        let s = settled(&w, 600.0);
        assert_eq!(s.len(), 20, "only the observations at 6 workers");
    }

    #[test]
    fn backlog_time_is_mean_backlog_over_mean_throughput_and_arrival_adds_growth() {
        // Backlog grows 100 B/s while 1000 B/s are processed: 1100 B/s arrive.
        let w: Vec<_> = (0..=12)
            .map(|i| {
                obs(
                    f64::from(i) * 10.0,
                    4,
                    10_000.0 + 1000.0 * f64::from(i),
                    1000.0,
                    0.9,
                )
            })
            .collect();
        let s = stats(&w, &w).unwrap();
        assert!((s.backlog_secs - 16.0).abs() < 1e-9, "{}", s.backlog_secs);
        assert!((s.arrival_rate - 1100.0).abs() < 1e-9, "{}", s.arrival_rate);
        assert!((s.recent_arrival_rate - 1100.0).abs() < 1e-9);
        // A burst in one interval: 5000 B more backlog in 10 s on top of 1000 B/s processed.
        let mut w = w;
        for o in &mut w[6..] {
            o.backlog_bytes += 5000.0;
        }
        let s = stats(&w, &w).unwrap();
        assert!(
            (s.peak_arrival_rate - 1600.0).abs() < 1e-9,
            "{}",
            s.peak_arrival_rate
        );
        assert!((s.recent_arrival_rate - 1100.0).abs() < 1e-9);
        assert_eq!(s.per_worker_throughput(), 250.0);
        let stalled = stats(&[obs(10.0, 4, 5.0, 0.0, 0.0)], &[]).unwrap();
        assert!(stalled.backlog_secs.is_infinite());
    }
}
