//! Dataflow Insights (seed 004) from a job's signals, as pure functions: each insight's trigger
//! on what the coordinator reports ([`JobProgress`]: per-stage transforms and element counts,
//! running work items and their durations, failed attempts, keys) or on what the operator sees
//! of the pods (out-of-memory kills), with the insight's text and its recommendation.
//!
//! MAX_NUM_WORKERS and ACTIVE_KEYS are decided by the autoscaling engine (they need its window
//! of observations); [`from_decision`] gives them the same shape. The operator publishes every
//! [`Finding`] as an Event and in status.insights; `riverbank run --workers N` prints them.
//! One finding per insight: the worst case of it (the longest item, the largest fan-out), with
//! its subject, so a caller can keep the first message while the same subject holds.
use crate::engine::{Decision, Insight};
use riverbank_pipeline::{JobPhase, JobProgress, StageProgress};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Thresholds. The defaults are the operator's; tests and local runs may shorten the times.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InsightConfig {
    /// HIGH_FAN_OUT: elements out per element in, at least.
    pub fan_out_ratio: f64,
    /// HIGH_FAN_OUT: elements the transform emitted, at least (a ratio on a handful of
    /// elements says nothing).
    pub fan_out_min_elements: u64,
    /// LONG_WORK_ITEM: running this many times the stage's median finished item, ...
    pub long_item_factor: f64,
    /// ... and at least this long (Dataflow: bundles should take well under a minute).
    pub long_item_min_secs: f64,
    /// LONG_WORK_ITEM: finished items a stage needs before its median is typical.
    pub long_item_min_timed: u64,
    /// LONG_WORK_ITEM without a typical item to compare with: running at least this long.
    pub long_item_absolute_secs: f64,
    /// STUCK: failed attempts of one unfinished item (two or three retries are normal).
    pub stuck_failures: u32,
    /// HOT_KEY: the busiest key's share of its stage's input, at least ...
    pub hot_key_share: f64,
    /// ... and at least this many times a key's fair share (1 / keys).
    pub hot_key_skew: f64,
}

impl Default for InsightConfig {
    fn default() -> Self {
        InsightConfig {
            fan_out_ratio: 10.0,
            fan_out_min_elements: 10_000,
            long_item_factor: 5.0,
            long_item_min_secs: 60.0,
            long_item_min_timed: 3,
            long_item_absolute_secs: 600.0,
            stuck_failures: 4,
            hot_key_share: 0.25,
            hot_key_skew: 4.0,
        }
    }
}

/// An insight that holds now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    pub insight: Insight,
    /// What it is about: a stage and transform, a work item, pods. While the subject stays
    /// the same, a caller keeps the first message (the numbers in it move every reading).
    pub subject: String,
    /// The insight's title, then what was seen, with the numbers.
    pub message: String,
    /// What to do about it.
    pub recommendation: String,
}

impl Finding {
    fn new(insight: Insight, subject: String, detail: String, recommendation: String) -> Finding {
        Finding {
            insight,
            subject,
            message: format!("{}: {detail}", insight.title()),
            recommendation,
        }
    }
}

/// The insights the coordinator's progress shows: HIGH_FAN_OUT, LONG_WORK_ITEM, STUCK and
/// HOT_KEY, in [`Insight`] order. Nothing for a job that is not running.
pub fn from_progress(p: &JobProgress, cfg: &InsightConfig) -> Vec<Finding> {
    if p.phase != JobPhase::Running {
        return vec![];
    }
    let mut out: Vec<Finding> = [stuck(p, cfg), long_work_item(p, cfg), hot_key(p, cfg)]
        .into_iter()
        .flatten()
        .collect();
    out.extend(high_fan_out(p, cfg));
    out
}

fn stage_label(s: &StageProgress) -> String {
    match (s.transforms.first(), s.transforms.last()) {
        (Some(a), Some(b)) if a.name != b.name => format!("{} ({} … {})", s.name, a.name, b.name),
        (Some(a), _) => format!("{} ({})", s.name, a.name),
        _ => s.name.clone(),
    }
}

fn stage_of(p: &JobProgress, index: usize) -> Option<&StageProgress> {
    p.stages.iter().find(|s| s.index == index)
}

/// HIGH_FAN_OUT: a transform whose output far exceeds its input, fused with a transform after
/// it in the same stage, so every element it emits is processed on the worker that read its
/// input. Partial combines after it do not count: they shrink the data where it is.
pub fn high_fan_out(p: &JobProgress, cfg: &InsightConfig) -> Option<Finding> {
    let mut worst: Option<(f64, &StageProgress, usize, u64)> = None;
    for s in &p.stages {
        for (k, t) in s.transforms.iter().enumerate() {
            let Some(input) = t.elements_in.filter(|&n| n > 0) else {
                continue;
            };
            let ratio = t.elements_out as f64 / input as f64;
            let fused = t
                .fused_consumers
                .iter()
                .any(|c| !c.ends_with("/PartialCombine"));
            if fused
                && ratio >= cfg.fan_out_ratio
                && t.elements_out >= cfg.fan_out_min_elements
                && worst.is_none_or(|w| ratio > w.0)
            {
                worst = Some((ratio, s, k, input));
            }
        }
    }
    let (ratio, s, k, input) = worst?;
    let t = &s.transforms[k];
    let next: Vec<&str> = t
        .fused_consumers
        .iter()
        .filter(|c| !c.ends_with("/PartialCombine"))
        .map(String::as_str)
        .collect();
    Some(Finding::new(
        Insight::HighFanOut,
        format!("{}/{}", s.name, t.name),
        format!(
            "in stage {}, {} emitted {} elements for {input} received ({ratio:.0}×) and is fused with {}, which then run on the worker that read each input element",
            stage_label(s),
            t.name,
            t.elements_out,
            next.join(", ")
        ),
        format!(
            "Insert a Reshuffle after {name} (a `type: Reshuffle` transform with `input: {name}`, read by {next}): Riverbank never fuses across a Reshuffle, so the elements {name} emits are spread over all workers. Reshuffling adds the cost of a shuffle. Alternatively pass the output as a side input, which is always materialized.",
            name = t.name.split('/').next().unwrap_or(&t.name),
            next = next.join(", "),
        ),
    ))
}

/// LONG_WORK_ITEM: a running item far longer than its stage's median finished item (and than
/// a minimum), or, before the stage has typical items, longer than an absolute bound.
pub fn long_work_item(p: &JobProgress, cfg: &InsightConfig) -> Option<Finding> {
    let mut worst: Option<(f64, &riverbank_pipeline::WorkItemProgress, Option<f64>)> = None;
    for w in p.work_items.iter().filter(|w| w.state == "Running") {
        let Some(s) = stage_of(p, w.stage) else {
            continue;
        };
        let typical = s
            .median_item_secs
            .filter(|m| *m > 0.0 && s.timed_items >= cfg.long_item_min_timed);
        let bound = match typical {
            Some(m) => (m * cfg.long_item_factor).max(cfg.long_item_min_secs),
            None => cfg.long_item_absolute_secs,
        };
        let excess = w.running_secs / bound;
        if excess >= 1.0 && worst.is_none_or(|x| excess > x.0) {
            worst = Some((excess, w, typical));
        }
    }
    let (_, w, typical) = worst?;
    let s = stage_of(p, w.stage)?;
    let on = w
        .worker
        .as_deref()
        .map_or(String::new(), |n| format!(" on {n}"));
    let compared = match typical {
        Some(m) => format!(
            ", {:.0}× the stage's median item ({m:.1} s over {} finished items)",
            w.running_secs / m,
            s.timed_items
        ),
        None => String::new(),
    };
    Some(Finding::new(
        Insight::LongWorkItem,
        format!("{}/item-{}", s.name, w.item),
        format!(
            "work item {} of stage {}{on} has been running for {:.0} s{compared}",
            w.item,
            stage_label(s),
            w.running_secs
        ),
        format!(
            "Look for a slow or stuck transform in stage {}: the worker's log and CPU show whether it is busy or waiting. One large input that cannot be split (a big Parquet row group, a compressed file) also makes one long item: write smaller row groups or files. Streaming jobs work best with work that takes well under a minute.",
            s.name
        ),
    ))
}

/// STUCK: an unfinished item whose attempts keep ending without a result.
pub fn stuck(p: &JobProgress, cfg: &InsightConfig) -> Option<Finding> {
    let w = p
        .work_items
        .iter()
        .filter(|w| w.failures >= cfg.stuck_failures)
        .max_by_key(|w| (w.failures, std::cmp::Reverse(w.item)))?;
    let s = stage_of(p, w.stage)?;
    let why = w
        .last_failure
        .as_deref()
        .map_or(String::new(), |f| format!("; the last one: {f}"));
    Some(Finding::new(
        Insight::Stuck,
        format!("{}/item-{}", s.name, w.item),
        format!(
            "work item {} of stage {} failed {} times and is retried ({} attempts){why}",
            w.item,
            stage_label(s),
            w.failures,
            w.attempts
        ),
        format!(
            "A failure repeated this often will likely not resolve on its own, and it holds back the stages after {}. Look at the stage's transforms and the workers' logs for what ends the attempts (a crash, an out-of-memory kill, a record the code cannot handle), fix the pipeline and run it again; error_handling can send bad records to an error output instead.",
            s.name
        ),
    ))
}

/// HOT_KEY: a running stage whose busiest key carries a large share of its input, many times a
/// key's fair share: one core processes that key, so the stage cannot go faster.
pub fn hot_key(p: &JobProgress, cfg: &InsightConfig) -> Option<Finding> {
    let (share, s, keys) = p
        .stages
        .iter()
        .filter(|s| s.state == "Running")
        .filter_map(|s| {
            let share = s.hottest_key_share?;
            let keys = s.keys.filter(|&k| k > 0)?;
            let hot = share >= cfg.hot_key_share && share * keys as f64 >= cfg.hot_key_skew;
            hot.then_some((share, s, keys))
        })
        .max_by(|a, b| a.0.total_cmp(&b.0))?;
    Some(Finding::new(
        Insight::HotKey,
        s.name.clone(),
        format!(
            "in stage {}, one key carries at least {:.0}% of the input of {keys} keys: it is processed on one core, which caps the stage's throughput",
            stage_label(s),
            share * 100.0
        ),
        "Spread the hot key: combine in two steps with a random suffix added to the key first (Beam's hot-key fanout), or group by a more specific key.".into(),
    ))
}

/// A worker pod whose container was killed for running out of memory.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OomKill {
    pub pod: String,
    /// Its memory limit (or request, without a limit) as the pod spec has it.
    pub memory: Option<String>,
}

/// WORKER_OUT_OF_MEMORY: worker pods were OOMKilled. `what_next` says what happens about it
/// (the operator raises the workers' memory, or cannot), and becomes the recommendation.
pub fn worker_out_of_memory(kills: &[OomKill], what_next: Option<String>) -> Option<Finding> {
    let first = kills.first()?;
    let memory = first
        .memory
        .as_deref()
        .map_or(String::new(), |m| format!(" with {m} of memory"));
    let more = match kills.len() {
        1 => String::new(),
        n => format!(" (and {} more)", n - 1),
    };
    Some(Finding::new(
        Insight::WorkerOutOfMemory,
        first.pod.clone(),
        format!(
            "worker pod {}{memory} was killed for running out of memory{more}; the job may still finish, but the kills slow it down or can make it fail",
            first.pod
        ),
        what_next.unwrap_or_else(|| {
            "Give the workers more memory (options.minRam, or spec.pods.resources), or set options.maxWorkerMemory to let the operator raise it when workers run out; or reduce the memory the pipeline needs.".into()
        }),
    ))
}

/// MAX_NUM_WORKERS or ACTIVE_KEYS, from the engine's decision that raised it.
pub fn from_decision(insight: Insight, d: &Decision, max_workers: u32) -> Finding {
    let (detail, recommendation) = match insight {
        Insight::MaxNumWorkers => (
            format!(
                "the job runs at maxNumWorkers ({max_workers}) and is busy; {}",
                d.message
            ),
            "Increase or remove options.maxNumWorkers (without it: 1000 workers for batch, 100 for streaming). It's okay to do nothing if the job's running time (batch) or its backlog (streaming) is acceptable.".to_string(),
        ),
        _ => (
            d.message.clone(),
            "Increase the number of keys: use a more specific key (IP address and user id instead of IP address), raise a sink's number of shards, or add a hash to a hot key (fanout) to spread it over several keys.".to_string(),
        ),
    };
    Finding::new(insight, insight.code().to_string(), detail, recommendation)
}

/// The insights of a run over time, for `riverbank run`: each raised once per subject, with
/// when it was first seen, and which ones have cleared.
#[derive(Debug, Clone, Default)]
pub struct InsightBook {
    standing: BTreeMap<Insight, (f64, Finding)>,
    /// Every finding raised, in order, with when.
    history: Vec<(f64, Finding)>,
}

impl InsightBook {
    /// Records what holds at `at_secs`; returns the findings newly raised (a new insight, or
    /// the same insight about a new subject).
    pub fn update(&mut self, found: Vec<Finding>, at_secs: f64) -> Vec<Finding> {
        let mut raised = vec![];
        let mut next = BTreeMap::new();
        for f in found {
            let entry = match self.standing.remove(&f.insight) {
                Some((since, old)) if old.subject == f.subject => (since, old),
                _ => {
                    raised.push(f.clone());
                    self.history.push((at_secs, f.clone()));
                    (at_secs, f)
                }
            };
            next.insert(entry.1.insight, entry);
        }
        self.standing = next;
        raised
    }

    /// The findings that hold now, with when each was first seen.
    pub fn standing(&self) -> impl Iterator<Item = (f64, &Finding)> {
        self.standing.values().map(|(at, f)| (*at, f))
    }

    /// Everything raised during the run, first seen first.
    pub fn history(&self) -> &[(f64, Finding)] {
        &self.history
    }
}

#[cfg(test)]
mod tests;
