//! A streaming pipeline (one with an unbounded PCollection) run in rounds, as Beam's portable
//! runners run unbounded splittable DoFns: each round runs every stage, in order, on what
//! arrived since the last one. An unbounded source hands back its rest as a residual with the
//! delay it asked for and the watermark its estimator reached; the residual is resumed in the
//! round after its delay. The job's watermark is the least of its held residuals' (every
//! element earlier than it has been read, and runs through the whole round), and a
//! GroupByKey fires each window once the watermark passes its end, early panes before as its
//! trigger says, and late panes within its allowed lateness ([`Pending`]). When
//! no residual is held (the sources have ended, or the job is drained) the watermark is at
//! the end of time: a last round fires every window left, and the job is done.
//!
//! A stateful DoFn keeps its state and timers from round to round ([`KeyedRounds`]): its
//! event-time timers fire once the watermark passes them, its processing-time ones when the
//! clock reaches them (the job waits for them as for a residual).
//!
//! A side input that never ends (fixed windows) makes its consumer's main elements wait for
//! the side windows they read (`side_windows`).
//!
//! Not yet: such side inputs in other windows, composite triggers (refused at Prepare,
//! `plan::unbounded`), timers holding the watermark; the rounds' state
//! is in memory, not checkpointed, so a job server that dies loses the job.
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::PortableError;
use crate::fn_api::DelayedBundleApplication;
use crate::plan::StageKind;
use crate::runner_api::is_bounded;

use super::keyed::{Clock, KeyedRounds};
use super::pending::Pending;
use super::side_windows::{self, SideWait};
use super::spill::Block;
use super::{Ended, Run, elements, impulse};

/// What a streaming round gives an SDK stage.
#[derive(Default)]
pub(super) struct StageRound {
    /// Residuals handed back in earlier rounds, due now.
    pub resume: Vec<DelayedBundleApplication>,
    /// Return the residuals its bundles hand back (an unbounded source's rest) instead of
    /// running them in this round.
    pub hold: bool,
    /// A stateful stage's buckets of state and timers, with this round's clock.
    pub keyed: Option<Arc<KeyedRounds>>,
}

/// The rest of an unbounded source's work, waiting for its round.
struct Held {
    residual: DelayedBundleApplication,
    due: Instant,
    /// The source's watermark when it stopped (millis): no element it emits later is earlier.
    watermark: i64,
}

impl Held {
    fn new(residual: DelayedBundleApplication) -> Held {
        let delay = residual
            .requested_time_delay
            .and_then(|d| Duration::try_from(d).ok())
            .unwrap_or_default();
        // A source that names no watermark holds the job's at the start of time: its
        // windows fire when it ends, or when the job is drained.
        let watermark = residual
            .application
            .as_ref()
            .and_then(|a| a.output_watermarks.values().map(millis).min())
            .unwrap_or(i64::MIN);
        Held {
            residual,
            due: Instant::now() + delay,
            watermark,
        }
    }
}

fn millis(t: &prost_types::Timestamp) -> i64 {
    t.seconds
        .saturating_mul(1000)
        .saturating_add(i64::from(t.nanos) / 1_000_000)
}

/// The job's watermark: the least held source's, or the end of time when none is held.
fn watermark(held: &[Vec<Held>]) -> i64 {
    held.iter()
        .flatten()
        .map(|h| h.watermark)
        .min()
        .unwrap_or(i64::MAX)
}

/// A watermark as people read it.
fn shown(watermark: i64) -> String {
    match watermark {
        i64::MIN => "not yet known".into(),
        i64::MAX => "the end of time".into(),
        ms => prost_types::Timestamp {
            seconds: ms.div_euclid(1000),
            nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
        }
        .to_string(),
    }
}

impl Run<'_> {
    /// The allowed lateness of `pcollection`'s windows when they are interval windows: when a
    /// stateful DoFn's state in them expires.
    fn expiry_of(&self, pcollection: &str) -> Option<i64> {
        let components = &self.plan.components;
        let (_, window) = self
            .plan
            .materialized
            .get(pcollection)?
            .shape
            .windowed_kv()?;
        let strategy = components.windowing_strategies.get(
            &components
                .pcollections
                .get(pcollection)?
                .windowing_strategy_id,
        )?;
        (*window == crate::coders::Shape::IntervalWindow).then_some(strategy.allowed_lateness)
    }

    /// The windowing strategy of stage `index`'s input, when it is a GroupByKey.
    fn strategy_of(&self, index: usize) -> Option<&crate::runner_api::WindowingStrategy> {
        let StageKind::GroupByKey { input, .. } = &self.plan.stages.get(index)?.kind else {
            return None;
        };
        let components = &self.plan.components;
        components
            .windowing_strategies
            .get(&components.pcollections.get(input)?.windowing_strategy_id)
    }

    pub(super) async fn rounds(
        &mut self,
        say: &(dyn Fn(String) + Send + Sync),
    ) -> Result<Ended, PortableError> {
        let plan = self.plan;
        let unbounded = |p: &String| {
            plan.components
                .pcollections
                .get(p)
                .is_some_and(|p| p.is_bounded == is_bounded::Enum::Unbounded as i32)
        };
        // Side inputs (bounded, complete after the first round) are kept for every round.
        let sides: HashSet<String> = plan
            .stages
            .iter()
            .filter_map(|s| match &s.kind {
                StageKind::Sdk(s) => Some(s.side_inputs.iter().map(|x| x.pcollection.clone())),
                _ => None,
            })
            .flatten()
            .collect();
        self.kept_sides = Some(HashMap::new());
        let mut held: Vec<Vec<Held>> = plan.stages.iter().map(|_| Vec::new()).collect();
        let mut pending: HashMap<usize, Pending> = HashMap::new();
        // Each stateful stage's state and timers, kept from round to round.
        let keyed: HashMap<usize, Arc<KeyedRounds>> = plan
            .stages
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match &s.kind {
                StageKind::Sdk(s) => s.keyed.as_ref().map(|k| {
                    let expiry = s.inputs.first().and_then(|p| self.expiry_of(p));
                    (i, Arc::new(KeyedRounds::new(k, expiry)))
                }),
                _ => None,
            })
            .collect();
        // Stages with side inputs that never end (in fixed windows): what their main elements
        // wait for, and the elements waiting, by (stage, input).
        let waits: HashMap<usize, Vec<SideWait>> = plan
            .stages
            .iter()
            .enumerate()
            .filter_map(|(i, stage)| {
                let StageKind::Sdk(s) = &stage.kind else {
                    return None;
                };
                let waits: Vec<SideWait> = s
                    .side_inputs
                    .iter()
                    .filter(|x| unbounded(&x.pcollection))
                    .filter_map(|x| {
                        let (size, offset) =
                            crate::plan::fixed_windows(&plan.components, &x.pcollection)?;
                        Some(SideWait {
                            pcollection: x.pcollection.clone(),
                            size,
                            offset,
                        })
                    })
                    .collect();
                (!waits.is_empty()).then_some((i, waits))
            })
            .collect();
        let mut waiting: HashMap<(usize, String), Vec<u8>> = HashMap::new();
        let mut drain = self.settings.drain.clone();
        let (mut round, mut fired, mut last) = (0u64, 0usize, false);
        // States of stateful DoFns dropped as their windows expired.
        let mut expired = 0usize;
        let mut told = Instant::now();
        say("a streaming job (it reads an unbounded PCollection): run in rounds, each window fired once the watermark passes it".into());
        loop {
            if *self.cancel.borrow() {
                return Err(PortableError::Cancelled);
            }
            let draining = *drain.borrow();
            if draining {
                // Beam's drain: the sources stop where they are; what was read is finished.
                held.iter_mut().for_each(Vec::clear);
            }
            for (i, stage) in plan.stages.iter().enumerate() {
                match &stage.kind {
                    StageKind::Impulse { output } => {
                        if round == 0 {
                            let block = self.spill.keep(impulse())?;
                            self.data.insert(output.clone(), vec![block]);
                        }
                    }
                    StageKind::Concat { inputs, output, .. } => {
                        let blocks: Vec<Block> = inputs
                            .iter()
                            .flat_map(|p| self.data.get(p).cloned().unwrap_or_default())
                            .collect();
                        self.data.insert(output.clone(), blocks);
                    }
                    StageKind::GroupByKey {
                        transform,
                        input,
                        output,
                    } => {
                        let at = watermark(&held);
                        let blocks = self
                            .spill
                            .load_all(self.data.get(input).map(Vec::as_slice).unwrap_or(&[]))?;
                        let shape = plan.materialized[input].shape.clone();
                        let strategy = plan.components.windowing_strategies
                            [&plan.components.pcollections[input].windowing_strategy_id]
                            .clone();
                        let name = plan.name_of(transform);
                        let sdk_merge = match crate::plan::merges_on_sdk(&strategy) {
                            true => self.sdk_merge(i, &strategy, &name).await?,
                            false => None,
                        };
                        let mut state = pending.remove(&i).unwrap_or_default();
                        let (result, state) = tokio::task::spawn_blocking(move || {
                            let result = state.add_and_fire(
                                &blocks,
                                &shape,
                                &strategy,
                                &name,
                                sdk_merge.as_ref(),
                                at,
                                Clock::at(at).now,
                            );
                            (result, state)
                        })
                        .await
                        .map_err(|e| PortableError::Harness(format!("grouping task: {e}")))?;
                        pending.insert(i, state);
                        let (out, windows) = result?;
                        fired += windows;
                        let kept = out
                            .into_iter()
                            .map(|b| self.spill.keep(b))
                            .collect::<Result<Vec<_>, _>>()?;
                        self.data.insert(output.clone(), kept);
                    }
                    StageKind::Sdk(s) => {
                        let now = Instant::now();
                        let (due, later): (Vec<Held>, Vec<Held>) = std::mem::take(&mut held[i])
                            .into_iter()
                            .partition(|h| h.due <= now);
                        held[i] = later;
                        // Main elements whose side windows are not complete wait; the others
                        // stand in for the round's input while the stage runs.
                        let mut set_aside: Vec<(String, Option<Vec<Block>>)> = Vec::new();
                        if let Some(waits) = waits.get(&i) {
                            let at = watermark(&held);
                            for p in &s.inputs {
                                let mut bytes = waiting.remove(&(i, p.clone())).unwrap_or_default();
                                for b in self
                                    .spill
                                    .load_all(self.data.get(p).map(Vec::as_slice).unwrap_or(&[]))?
                                {
                                    bytes.extend_from_slice(&b);
                                }
                                let shape = &plan.materialized[p].shape;
                                let (go, wait) = side_windows::ready(&bytes, shape, waits, at)?;
                                if !wait.is_empty() {
                                    waiting.insert((i, p.clone()), wait);
                                }
                                let go = match go.is_empty() {
                                    true => Vec::new(),
                                    false => vec![self.spill.keep(go.into())?],
                                };
                                set_aside.push((p.clone(), self.data.insert(p.clone(), go)));
                            }
                        }
                        let has_input = s
                            .inputs
                            .iter()
                            .any(|p| self.data.get(p).is_some_and(|b| !b.is_empty()));
                        let stateful = keyed.get(&i).cloned();
                        let timers_due = stateful.as_ref().is_some_and(|k| {
                            k.set_clock(Clock::at(watermark(&held)));
                            k.due().contains(&true)
                        });
                        if !has_input && due.is_empty() && !timers_due {
                            for (p, original) in set_aside {
                                if let Some(original) = original {
                                    self.data.insert(p, original);
                                }
                            }
                            continue;
                        }
                        // A bounded stage's residuals (a split read) are finished in this
                        // round; an unbounded one's wait for their delay.
                        let round = StageRound {
                            resume: due.into_iter().map(|h| h.residual).collect(),
                            hold: s.outputs.iter().any(unbounded),
                            keyed: stateful,
                        };
                        let stateful = round.keyed.clone();
                        let back = self.sdk_stage(i, &stage.name, s, say, Some(round)).await;
                        for (p, original) in set_aside {
                            if let Some(ready) = self.data.remove(&p) {
                                self.spill.release(&ready);
                            }
                            if let Some(original) = original {
                                self.data.insert(p, original);
                            }
                        }
                        let back = back?;
                        if let Some(k) = stateful {
                            expired += k.expire();
                        }
                        held[i].extend(back.into_iter().map(Held::new));
                    }
                }
                for p in stage.kind.outputs() {
                    if sides.contains(p)
                        && let Some(blocks) = self.data.get(p)
                        && let Some(kept) = self.kept_sides.as_mut()
                    {
                        kept.entry(p.clone())
                            .or_default()
                            .extend(blocks.iter().cloned());
                    }
                }
            }
            // Side windows of unbounded side inputs that have ended are read by no one now.
            let at = watermark(&held);
            for wait in waits.values().flatten() {
                let Some(kept) = self
                    .kept_sides
                    .as_mut()
                    .and_then(|k| k.get_mut(&wait.pcollection))
                else {
                    continue;
                };
                let shape = &plan.materialized[&wait.pcollection].shape;
                let blocks = std::mem::take(kept);
                let mut bytes = Vec::new();
                for b in self.spill.load_all(&blocks)? {
                    bytes.extend_from_slice(&b);
                }
                self.spill.release(&blocks);
                let live = side_windows::unexpired(&bytes, shape, at)?;
                if !live.is_empty() {
                    let block = self.spill.keep(live.into())?;
                    if let Some(kept) = self
                        .kept_sides
                        .as_mut()
                        .and_then(|k| k.get_mut(&wait.pcollection))
                    {
                        kept.push(block);
                    }
                }
            }
            // The round's data is read: its memory goes back (side inputs stay kept).
            for (p, blocks) in self.data.drain() {
                if !sides.contains(&p) {
                    self.spill.release(&blocks);
                }
            }
            round += 1;
            let at = watermark(&held);
            let waiting: usize = pending.values().map(Pending::windows).sum::<usize>()
                + keyed.values().map(|k| k.timers()).sum::<usize>();
            let late: u64 = pending.values().map(|p| p.late).sum();
            if at == i64::MAX {
                // Every GroupByKey that ran before the sources ended fires in one more round.
                if last {
                    say(format!(
                        "streaming: {round} rounds, {fired} windows fired{}{}",
                        match late {
                            0 => String::new(),
                            n => format!(", {} dropped as late", elements(n)),
                        },
                        match expired {
                            0 => String::new(),
                            n => format!(", {n} states dropped as their windows expired"),
                        }
                    ));
                    return Ok(if draining {
                        Ended::Drained
                    } else {
                        Ended::Done
                    });
                }
                last = true;
                continue;
            }
            if told.elapsed() >= self.settings.progress_every {
                told = Instant::now();
                say(format!(
                    "streaming: round {round}, watermark {}, {fired} windows fired, {waiting} windows and timers waiting{}",
                    shown(at),
                    match late {
                        0 => String::new(),
                        n => format!(", {} dropped as late", elements(n)),
                    }
                ));
            }
            // Until the next residual or processing-time timer is due, or the job is drained
            // or cancelled.
            let next_timer = keyed
                .values()
                .filter_map(|k| k.next_processing())
                .min()
                .map(|ms| {
                    let now = Clock::at(at).now;
                    Instant::now() + Duration::from_millis(ms.saturating_sub(now).max(0) as u64)
                });
            let next_early = pending
                .iter()
                .filter_map(|(i, p)| p.next_early(self.strategy_of(*i)?))
                .min()
                .map(|ms| {
                    let now = Clock::at(at).now;
                    Instant::now() + Duration::from_millis(ms.saturating_sub(now).max(0) as u64)
                });
            let next = held
                .iter()
                .flatten()
                .map(|h| h.due)
                .chain(next_timer)
                .chain(next_early)
                .min();
            if let Some(next) = next
                && next > Instant::now()
            {
                let mut cancel = self.cancel.clone();
                tokio::select! {
                    _ = tokio::time::sleep_until(next.into()) => {}
                    Ok(()) = cancel.changed() => {}
                    Ok(()) = drain.changed() => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fn_api::BundleApplication;

    fn residual(watermark_ms: Option<i64>, delay_ms: i64) -> DelayedBundleApplication {
        let output_watermarks = watermark_ms
            .map(|ms| {
                let t = prost_types::Timestamp {
                    seconds: ms.div_euclid(1000),
                    nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
                };
                HashMap::from([("out".to_string(), t)])
            })
            .unwrap_or_default();
        DelayedBundleApplication {
            application: Some(BundleApplication {
                output_watermarks,
                ..BundleApplication::default()
            }),
            requested_time_delay: Some(prost_types::Duration {
                seconds: delay_ms / 1000,
                nanos: ((delay_ms % 1000) * 1_000_000) as i32,
            }),
        }
    }

    #[test]
    fn the_watermark_is_the_least_held_sources_and_the_end_of_time_without_one() {
        assert_eq!(watermark(&[]), i64::MAX);
        let held = vec![
            vec![Held::new(residual(Some(5_250), 0))],
            vec![],
            vec![Held::new(residual(Some(3_000), 2_000))],
        ];
        assert_eq!(watermark(&held), 3_000);
        // A source that names no watermark holds the job's back.
        let unknown = vec![vec![Held::new(residual(None, 0))]];
        assert_eq!(watermark(&unknown), i64::MIN);
        assert!(held[2][0].due > Instant::now() + Duration::from_millis(1_500));
    }

    #[test]
    fn a_watermark_reads_as_a_time() {
        assert_eq!(shown(1_500), "1970-01-01T00:00:01.500Z");
        assert_eq!(shown(i64::MAX), "the end of time");
    }
}
