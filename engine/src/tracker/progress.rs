//! What the tracker reports: the job's progress as the coordinator serves it (`JobProgress`),
//! the totals of the accepted reports, and the per-stage states of progress displays. Read-only
//! views of the state machine in `mod.rs`.
use super::{Item, ItemState, Tracker};
use crate::items::ItemInput;
use crate::work::ItemReport;
use riverbank_pipeline::display::component_name;
use riverbank_pipeline::progress::MAX_REPORTED_ITEMS;
use riverbank_pipeline::{
    Exchange, JobPhase, JobProgress, OpRole, Stage, StageProgress, TransformProgress,
    WorkItemProgress, WorkerProgress,
};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

impl Tracker {
    /// Per stage: 0 waiting, 1 running, 2 done (for progress displays), in one pass.
    pub fn stage_states(&self) -> Vec<u64> {
        let mut states: Vec<u64> = self
            .completed_stages()
            .into_iter()
            .map(|done| if done { 2 } else { 0 })
            .collect();
        for i in self.items.values() {
            if states[i.item.stage] == 0 && !matches!(i.state, ItemState::Pending) {
                states[i.item.stage] = 1;
            }
        }
        states
    }

    /// Elements out per transform, from accepted reports only (retries never count twice).
    /// A sink's are the rows it wrote, not the files its commit stage emits.
    pub fn elements_out(&self) -> Vec<u64> {
        let stages = &self.plan.plan.stages;
        let mut out = vec![0; self.plan.plan.graph.transforms.len()];
        for it in self.items.values() {
            if let ItemState::Done { report, .. } = &it.state {
                let commits = stages[it.item.stage].commits();
                for &(t, n) in &report.elements_out {
                    if commits != Some(t) {
                        out[t] += n;
                    }
                }
            }
        }
        out
    }

    /// Items finished per worker, for balance checks.
    pub fn items_per_worker(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for it in self.items.values() {
            if let ItemState::Done { worker, .. } = &it.state {
                *out.entry(worker.clone()).or_insert(0) += 1;
            }
        }
        out
    }

    /// (source bytes, rows) read by the finished items.
    pub fn read_totals(&self) -> (u64, u64) {
        self.done_reports()
            .fold((0, 0), |(a, b), r| (a + r.bytes_read, b + r.rows_read))
    }

    pub(super) fn sample(&mut self, now: Instant) {
        let (bytes, rows) = self.read_totals();
        self.samples.push_back((now, bytes, rows));
        while self
            .samples
            .front()
            .is_some_and(|(t, ..)| now.duration_since(*t) > Duration::from_secs(30))
            && self.samples.len() > 2
        {
            self.samples.pop_front();
        }
    }

    /// The job's progress, as the coordinator serves it.
    pub fn progress(&self, job_name: &str, now: Instant) -> JobProgress {
        let remaining_bytes = self
            .items
            .values()
            .filter(|i| !matches!(i.state, ItemState::Done { .. }))
            .map(|i| {
                let b = i.item.estimated_bytes();
                // The unit being read is not done yet (as in `fraction_consumed`): a running item's
                // work never reads as nothing left before it finishes.
                let left = i
                    .units_total
                    .saturating_sub(i.units_started.saturating_sub(1));
                b.checked_mul(left)
                    .and_then(|x| x.checked_div(i.units_total))
                    .unwrap_or(b)
            })
            .sum::<u64>();
        let (tput_b, tput_r) = match (self.samples.front(), self.samples.back()) {
            (Some(a), Some(b)) if b.0 > a.0 => {
                let dt = b.0.duration_since(a.0).as_secs_f64();
                ((b.1 - a.1) as f64 / dt, (b.2 - a.2) as f64 / dt)
            }
            _ => (0.0, 0.0),
        };
        let count = |f: &dyn Fn(&Item) -> bool| self.items.values().filter(|i| f(i)).count() as u64;
        let done = count(&|i| matches!(i.state, ItemState::Done { .. }));
        let running = count(&|i| matches!(i.state, ItemState::Running { .. }));
        let runnable_stages = self.runnable_stages();
        let runnable =
            count(&|i| matches!(i.state, ItemState::Pending) && runnable_stages[i.item.stage]);
        let splittable = count(&|i| i.splittable());
        let total = self.items.len() as u64;
        // Each item counts equally; a running source item by the share of its units read.
        let fraction = self
            .items
            .values()
            .map(|i| match i.state {
                ItemState::Done { .. } => 1.0,
                ItemState::Running { .. } if i.units_total > 0 => {
                    i.units_started.saturating_sub(1) as f64 / i.units_total as f64
                }
                _ => 0.0,
            })
            .sum::<f64>()
            / total.max(1) as f64;
        let stages = self
            .plan
            .plan
            .stages
            .iter()
            .map(|s| {
                let items: Vec<&Item> = self
                    .items
                    .values()
                    .filter(|i| i.item.stage == s.index)
                    .collect();
                let done: Vec<&ItemReport> = items
                    .iter()
                    .filter_map(|i| match &i.state {
                        ItemState::Done { report, .. } => Some(report),
                        _ => None,
                    })
                    .collect();
                let running = items
                    .iter()
                    .filter(|i| matches!(i.state, ItemState::Running { .. }))
                    .count() as u64;
                let first = s.ops.first().map(|o| o.transform);
                let last = s.ops.last().map(|o| o.transform);
                let out_of = |t: Option<usize>| {
                    t.map(|t| {
                        done.iter()
                            .flat_map(|r| &r.elements_out)
                            .filter(|(x, _)| *x == t)
                            .map(|(_, n)| n)
                            .sum::<u64>()
                    })
                    .unwrap_or(0)
                };
                let durations: Vec<f64> = items
                    .iter()
                    .filter(|i| matches!(i.state, ItemState::Done { .. }))
                    .filter_map(|i| i.duration.map(|d| d.as_secs_f64()))
                    .collect();
                let keys = self.stage_keys(s, &items);
                StageProgress {
                    median_item_secs: median(durations.clone()),
                    timed_items: durations.len() as u64,
                    bundle_retries: done.iter().map(|r| r.bundle_retries).sum(),
                    transforms: self.transforms_of(s, &done),
                    keys,
                    hottest_key_share: keys.and_then(|_| self.hottest_key_share(s, &items)),
                    // A stream's, from its coordinator (`riverbank_cluster::streaming`).
                    watermark: None,
                    watermark_lag_seconds: None,
                    index: s.index,
                    name: s.id(),
                    state: if done.len() == items.len() {
                        "Done"
                    } else if running > 0 || !done.is_empty() {
                        "Running"
                    } else {
                        "Waiting"
                    }
                    .into(),
                    items_total: items.len() as u64,
                    items_done: done.len() as u64,
                    items_running: running,
                    elements_in: out_of(first),
                    elements_out: out_of(last),
                    bytes_in: done.iter().map(|r| r.bytes_read).sum::<u64>()
                        + self.shuffle_bytes_into(s.index),
                    bytes_out: done.iter().flat_map(|r| &r.shuffle).map(|f| f.bytes).sum(),
                }
            })
            .collect();
        let since = |t: Instant| {
            let ago = now.saturating_duration_since(t);
            (chrono::Utc::now() - chrono::Duration::from_std(ago).unwrap_or_default()).to_rfc3339()
        };
        let workers = self
            .workers
            .iter()
            .map(|(name, w)| WorkerProgress {
                name: name.clone(),
                address: w.address.clone(),
                alive: w.alive,
                items_done: w.items_done,
                items_running: self
                    .items
                    .values()
                    .filter(
                        |i| matches!(&i.state, ItemState::Running { worker, .. } if worker == name),
                    )
                    .count() as u64,
                cpu: w.cpu,
                rss_bytes: w.rss,
                last_seen_secs: now.duration_since(w.last_seen).as_secs_f64(),
                draining: w.draining,
            })
            .collect();
        let work_items = self.work_items(now, &since);
        let message = match self.phase {
            JobPhase::Pending => "waiting for workers".to_string(),
            JobPhase::Running => format!(
                "{done}/{total} work items done, {running} running, {} workers",
                self.workers.values().filter(|w| w.alive).count()
            ),
            JobPhase::Done => format!("done: {total} work items"),
            JobPhase::Failed => self
                .failure
                .as_ref()
                .map(|f| f.message.clone())
                .unwrap_or_else(|| "failed".into()),
            JobPhase::Cancelled => "cancelled".into(),
        };
        JobProgress {
            streaming: None,
            job_name: job_name.to_string(),
            phase: self.phase,
            message,
            failure: self.failure.clone(),
            started_at: Some(since(self.started)),
            finished_at: self.finished_at.map(since),
            work_items_total: total,
            work_items_done: done,
            work_items_running: running,
            fraction_consumed: fraction.clamp(0.0, 1.0),
            remaining_bytes,
            throughput_bytes_per_sec: tput_b,
            throughput_elements_per_sec: tput_r,
            backlog_seconds: (tput_b > 0.0).then(|| remaining_bytes as f64 / tput_b),
            active_keys: self.active_keys(now),
            runnable_items: runnable,
            splittable_items: splittable,
            workers,
            stages,
            work_items,
        }
    }

    /// The running items, longest-running first (at most [`MAX_REPORTED_ITEMS`]), then the
    /// unfinished items that failed before and wait to run again.
    fn work_items(&self, now: Instant, at: &dyn Fn(Instant) -> String) -> Vec<WorkItemProgress> {
        let entry = |i: &Item| WorkItemProgress {
            item: i.item.id,
            stage: i.item.stage,
            state: match i.state {
                ItemState::Running { .. } => "Running",
                _ => "Pending",
            }
            .into(),
            attempts: i.attempts,
            failures: i.failures,
            last_failure: i.last_failure.clone(),
            partition: match i.item.input {
                ItemInput::Partition(p) | ItemInput::Partitions { first: p, .. } => Some(p),
                _ => None,
            },
            keys: i.keys,
            ..Default::default()
        };
        let mut running: Vec<(std::time::Duration, WorkItemProgress)> = self
            .items
            .values()
            .filter_map(|i| match &i.state {
                ItemState::Running { worker, since, .. } => {
                    let ran = now.saturating_duration_since(*since);
                    Some((
                        ran,
                        WorkItemProgress {
                            worker: Some(worker.clone()),
                            started_at: Some(at(*since)),
                            running_secs: ran.as_secs_f64(),
                            ..entry(i)
                        },
                    ))
                }
                _ => None,
            })
            .collect();
        running.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.item.cmp(&b.1.item)));
        running.truncate(MAX_REPORTED_ITEMS);
        let waiting = self
            .items
            .values()
            .filter(|i| matches!(i.state, ItemState::Pending) && i.failures > 0)
            .take(MAX_REPORTED_ITEMS)
            .map(entry);
        running.into_iter().map(|(_, p)| p).chain(waiting).collect()
    }

    /// The stage's ops with their element counts from finished items, the elements each
    /// received from the ops before it in the stage, and the ops fused after it.
    fn transforms_of(&self, s: &Stage, done: &[&ItemReport]) -> Vec<TransformProgress> {
        let plan = &self.plan.plan;
        let out_of = |t: usize| -> u64 {
            done.iter()
                .flat_map(|r| &r.elements_out)
                .filter(|(x, _)| *x == t)
                .map(|(_, n)| n)
                .sum()
        };
        // The op of this stage producing each collection.
        let mut producer: BTreeMap<String, usize> = BTreeMap::new();
        for (k, op) in s.ops.iter().enumerate() {
            for c in plan.graph.transforms[op.transform].outputs() {
                producer.insert(c, k);
            }
        }
        let inputs_of = |k: usize| -> Option<Vec<usize>> {
            let op = &s.ops[k];
            if !matches!(op.role, OpRole::Apply | OpRole::PartialCombine) {
                return None; // reads a shuffle, or commits a sink
            }
            let inputs = &plan.graph.transforms[op.transform].inputs;
            if inputs.is_empty() {
                return None; // a source
            }
            inputs
                .iter()
                .map(|(_, c)| producer.get(c).copied().filter(|&j| j < k))
                .collect()
        };
        s.ops
            .iter()
            .enumerate()
            .map(|(k, op)| TransformProgress {
                name: component_name(plan, op.transform, op.role),
                elements_in: inputs_of(k).map(|from| {
                    let mut from = from;
                    from.dedup();
                    from.iter().map(|&j| out_of(s.ops[j].transform)).sum()
                }),
                elements_out: out_of(op.transform),
                fused_consumers: (k + 1..s.ops.len())
                    .filter(|&j| inputs_of(j).is_some_and(|from| from.contains(&k)))
                    .map(|j| component_name(plan, s.ops[j].transform, s.ops[j].role))
                    .collect(),
            })
            .collect()
    }

    /// Keys of the stage's final combine: held by its running items, produced by its finished
    /// ones. None for a stage without a final combine.
    fn stage_keys(&self, s: &Stage, items: &[&Item]) -> Option<u64> {
        s.ops
            .iter()
            .any(|o| o.role == OpRole::FinalCombine)
            .then(|| {
                items
                    .iter()
                    .filter(|i| !matches!(i.state, ItemState::Pending))
                    .map(|i| i.keys)
                    .sum()
            })
    }

    /// A lower bound of the share of a combine stage's input its busiest key carries: per
    /// partition, the share of the shuffled bytes it receives over the keys it holds (a key
    /// lives in one partition, so the busiest key of a partition carries at least the
    /// partition's mean). Only partitions whose item reported its keys count; an item of
    /// coalesced partitions reports them partition by partition once done.
    fn hottest_key_share(&self, s: &Stage, items: &[&Item]) -> Option<f64> {
        let combines = s
            .inputs
            .iter()
            .any(|i| matches!(i.exchange, Exchange::CombineStates { .. }));
        // (partitions, their keys)
        let mut units: Vec<(Vec<u32>, u64)> = vec![];
        for i in items {
            match &i.state {
                ItemState::Done { report, .. } if !report.partition_keys.is_empty() => {
                    units.extend(report.partition_keys.iter().map(|&(p, k)| (vec![p], k)))
                }
                // Running, its keys are those of the partition it is at: not comparable yet.
                _ if matches!(i.item.input, ItemInput::Partitions { .. }) => {}
                _ => units.push((i.item.partitions().collect(), i.keys)),
            }
        }
        if !combines || units.len() < 2 {
            return None;
        }
        let mut bytes: BTreeMap<u32, u64> = BTreeMap::new();
        for r in self.done_reports() {
            for f in r.shuffle.iter().filter(|f| f.consumer == s.index) {
                *bytes.entry(f.partition).or_insert(0) += f.bytes;
            }
        }
        let total: u64 = bytes.values().sum();
        if total == 0 {
            return None;
        }
        units
            .iter()
            .filter(|(partitions, keys)| *keys > 0 && !partitions.is_empty())
            .map(|(partitions, keys)| {
                let b: u64 = partitions.iter().filter_map(|p| bytes.get(p)).sum();
                b as f64 / total as f64 / *keys as f64
            })
            .reduce(f64::max)
    }

    /// The reports of the finished items.
    pub fn done_reports(&self) -> impl Iterator<Item = &ItemReport> {
        self.items.values().filter_map(|i| match &i.state {
            ItemState::Done { report, .. } => Some(report),
            _ => None,
        })
    }

    /// Shuffle bytes written by the finished items.
    pub fn shuffle_bytes(&self) -> u64 {
        self.done_reports()
            .flat_map(|r| &r.shuffle)
            .map(|f| f.bytes)
            .sum()
    }

    fn shuffle_bytes_into(&self, stage: usize) -> u64 {
        self.done_reports()
            .flat_map(|r| &r.shuffle)
            .filter(|f| f.consumer == stage)
            .map(|f| f.bytes)
            .sum()
    }

    /// Keys of the job's final combines in the last [`ACTIVE_KEYS_WINDOW`]: held by the running
    /// ones, produced by those that finished within it. Keys bound how many cores a shuffle
    /// stage can use (one key runs on one core), which is what the ACTIVE_KEYS insight checks.
    /// None for a job without a combine, or before any combine ran.
    fn active_keys(&self, now: Instant) -> Option<u64> {
        let combines: Vec<bool> = self
            .plan
            .plan
            .stages
            .iter()
            .map(|s| s.ops.iter().any(|o| o.role == OpRole::FinalCombine))
            .collect();
        let mut seen = false;
        let mut keys = 0;
        for i in self.items.values().filter(|i| combines[i.item.stage]) {
            let recent = match i.state {
                ItemState::Running { .. } => true,
                ItemState::Done { .. } => i
                    .done_at
                    .is_some_and(|t| now.saturating_duration_since(t) <= ACTIVE_KEYS_WINDOW),
                ItemState::Pending => false,
            };
            if recent {
                seen = true;
                keys += i.keys;
            }
        }
        seen.then_some(keys)
    }
}

/// The median of `values` (None when empty).
fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    Some(if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    })
}

/// How far back finished combines count toward the active keys.
const ACTIVE_KEYS_WINDOW: Duration = Duration::from_secs(30);
