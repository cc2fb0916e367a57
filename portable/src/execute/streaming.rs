//! A streaming pipeline (one with an unbounded PCollection) run in rounds, as Beam's portable
//! runners run unbounded splittable DoFns: each round runs every stage, in order, on what
//! arrived since the last one. An unbounded source hands back its rest as a residual with the
//! delay it asked for and the watermark its estimator reached; the residual is resumed in the
//! round after its delay. A stage's watermark is the least of the held residuals of the
//! sources upstream of it (every element earlier than it has been read, and runs through the
//! whole round: a slow branch does not hold back another's windows), and a
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
//! With a local `--temp_location`, the rounds' state is checkpointed between two rounds, and
//! the job submitted again resumes from it (`checkpoint`).
//!
//! A timer holds the watermark of the stages after its stage at its output timestamp until it
//! fires (`KeyedRounds::hold`): a processing-time timer that outputs the elements it buffered
//! with their own timestamps outputs them on time, however far the sources moved meanwhile.
//!
//! Not yet: such side inputs in other windows (refused at Prepare, `plan::unbounded`).
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message;

use crate::coders::proto_millis;
use crate::error::PortableError;
use crate::fn_api::{BundleApplication, DelayedBundleApplication};
use crate::plan::{SdkStage, StageKind, is_unbounded};
use crate::runner_api::Components;
use crate::urns;

use super::checkpoint::{
    Changed, Checkpoint, Checkpointing, Checkpoints, HeldState, KeyedState, SideState, WaitingState,
};
use super::keyed::{Clock, KeyedRounds, now_millis};
use super::pending::Pending;
use super::side_windows::{self, SideWait};
use super::spill::Block;
use super::{Ended, Run, elements};

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
            .and_then(|a| {
                a.output_watermarks
                    .values()
                    .map(|t| proto_millis(t.seconds, t.nanos))
                    .min()
            })
            .unwrap_or(i64::MIN);
        Held {
            residual,
            due: Instant::now() + delay,
            watermark,
        }
    }
}

/// The job's watermark: the least held source's, or the end of time when none is held.
fn watermark(held: &[Vec<Held>]) -> i64 {
    held.iter()
        .flatten()
        .map(|h| h.watermark)
        .min()
        .unwrap_or(i64::MAX)
}

/// What the held sources say is left to read, and the PCollections they emit: the sum of the
/// held residuals' sizes (the SDK's `restriction_size`: bytes by Beam's convention, the backlog
/// Dataflow reads), or None when none carries one.
fn source_backlog(components: &Components, held: &[Vec<Held>]) -> (Option<u64>, Vec<String>) {
    let mut backlog: Option<f64> = None;
    let mut outputs: Vec<String> = Vec::new();
    for app in held
        .iter()
        .flatten()
        .filter_map(|h| h.residual.application.as_ref())
    {
        if let Some(size) = residual_size(components, app) {
            *backlog.get_or_insert(0.0) += size;
        }
        if let Some(t) = components.transforms.get(&app.transform_id) {
            outputs.extend(t.outputs.values().cloned());
        }
    }
    outputs.sort();
    outputs.dedup();
    (backlog.map(|b| b as u64), outputs)
}

/// A residual's size: the `double` its element ends with, when it is the rest of a splittable
/// DoFn's sized element (its input `KV<_, double>`, as `plan::sdf` makes it; the value comes
/// last in a windowed value, and a double is 8 bytes big-endian).
fn residual_size(components: &Components, app: &BundleApplication) -> Option<f64> {
    let input = components
        .transforms
        .get(&app.transform_id)?
        .inputs
        .get(&app.input_id)?;
    let coder = components
        .coders
        .get(&components.pcollections.get(input)?.coder_id)?;
    let urn = |id: &String| {
        components
            .coders
            .get(id)
            .and_then(|c| c.spec.as_ref())
            .map(|s| s.urn.as_str())
    };
    let sized = coder.spec.as_ref().is_some_and(|s| s.urn == urns::KV)
        && coder.component_coder_ids.get(1).and_then(urn) == Some(urns::DOUBLE);
    if !sized {
        return None;
    }
    let tail = app.element.get(app.element.len().checked_sub(8)?..)?;
    let size = f64::from_be_bytes(tail.try_into().ok()?);
    (size.is_finite() && size >= 0.0).then_some(size)
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

/// A streaming run's state from round to round.
struct Rounds {
    /// Each stage's residuals waiting for their delay.
    held: Vec<Vec<Held>>,
    /// Each GroupByKey's windows.
    pending: HashMap<usize, Pending>,
    /// Each stateful stage's state and timers.
    keyed: HashMap<usize, Arc<KeyedRounds>>,
    /// Stages reading side inputs that never end (fixed windows): what their main elements
    /// wait for; and the elements waiting, by (stage, input).
    waits: HashMap<usize, Vec<SideWait>>,
    waiting: HashMap<(usize, String), Vec<u8>>,
    /// Side inputs, kept for every round.
    sides: HashSet<String>,
    /// The watermark at which ended side windows were last dropped.
    sides_forgotten_at: Option<i64>,
    /// Each stage and the stages it reads from, directly or not (main and side inputs): the
    /// sources whose watermark is its own.
    upstream: Vec<Vec<usize>>,
    round: u64,
    /// Panes fired; states of stateful DoFns dropped as their windows expired.
    fired: usize,
    expired: usize,
}

impl Rounds {
    /// The job's watermark now: its slowest source's.
    fn watermark(&self) -> i64 {
        watermark(&self.held)
    }

    /// Windows and timers waiting to fire.
    fn waiting(&self) -> usize {
        self.pending.values().map(Pending::windows).sum::<usize>()
            + self.keyed.values().map(|k| k.timers()).sum::<usize>()
    }

    /// Stage `i`'s input watermark now: the slowest of the sources upstream of it (a slow
    /// branch does not hold back the windows of another), held back by the timers of the
    /// stateful stages upstream of it (Beam's watermark holds: a timer's output is not late
    /// after it). Once the sources are done every timer fires, and nothing is held.
    fn watermark_of(&self, i: usize) -> i64 {
        let sources = self.upstream[i]
            .iter()
            .flat_map(|s| &self.held[*s])
            .map(|h| h.watermark)
            .min()
            .unwrap_or(i64::MAX);
        if sources == i64::MAX {
            return sources;
        }
        self.upstream[i]
            .iter()
            .filter(|s| **s != i)
            .filter_map(|s| self.keyed.get(s)?.hold())
            .fold(sources, i64::min)
    }

    fn late(&self) -> u64 {
        self.pending.values().map(|p| p.late).sum()
    }
}

/// For each stage, itself and every stage it reads from, directly or not.
fn upstream(plan: &crate::plan::Plan) -> Vec<Vec<usize>> {
    let mut producer: HashMap<&String, usize> = HashMap::new();
    for (i, stage) in plan.stages.iter().enumerate() {
        for p in stage.kind.outputs() {
            producer.insert(p, i);
        }
    }
    // Stages come in execution order: a stage's producers' lists are complete before it.
    let mut upstream: Vec<Vec<usize>> = Vec::with_capacity(plan.stages.len());
    for (i, stage) in plan.stages.iter().enumerate() {
        let mut reads = stage.kind.inputs();
        if let StageKind::Sdk(s) = &stage.kind {
            reads.extend(s.side_inputs.iter().map(|x| &x.pcollection));
        }
        let mut mine: Vec<usize> = vec![i];
        for p in reads {
            if let Some(&from) = producer.get(p) {
                mine.extend(upstream[from].iter().copied());
            }
        }
        mine.sort_unstable();
        mine.dedup();
        upstream.push(mine);
    }
    upstream
}

/// `at` (processing time, millis) as an instant.
fn instant_at(at: i64) -> Instant {
    Instant::now() + Duration::from_millis(at.saturating_sub(now_millis()).max(0) as u64)
}

impl Run<'_> {
    /// Runs rounds until the sources end, the job is drained, or it is cancelled.
    pub(super) async fn rounds(
        &mut self,
        say: &(dyn Fn(String) + Send + Sync),
    ) -> Result<Ended, PortableError> {
        let mut r = self.first_round();
        self.kept_sides = Some(HashMap::new());
        say("a streaming job: run in rounds, each window fired as its trigger and its watermark say".into());
        let settings = self.settings;
        let mut checkpoints = match Checkpoints::of(
            &settings.pipeline_options,
            &settings.job_name,
            self.plan,
            settings.object_storage.as_ref(),
            settings.replaces.as_deref(),
        )? {
            Checkpointing::On(c) => Some(*c),
            Checkpointing::Unavailable(why) => {
                say(why);
                None
            }
            Checkpointing::Off => None,
        };
        if let Some(saved) = settings.resume.clone() {
            let round = saved.round;
            self.restore(&mut r, *saved)?;
            say(format!(
                "updated: goes on from the job it replaced, at round {round} (windows, state, timers and sources as they were)"
            ));
        } else if let Some(c) = checkpoints.as_mut() {
            match c.load().await? {
                Some(saved) => {
                    let (round, at) = (saved.round, saved.written_at);
                    let updated = match c.left_by_replaced(&saved) {
                        true => ", the pipeline this one updates left it",
                        false => "",
                    };
                    self.restore(&mut r, saved)?;
                    say(format!(
                        "resumed from {} (round {round}, written {:.1} s ago{updated}): windows, state, timers and sources as they were",
                        c.shown(),
                        (now_millis() - at) as f64 / 1000.0
                    ));
                }
                None => say(format!("checkpoints to {}", c.shown())),
            }
        }
        let ended = self.run_rounds(&mut r, checkpoints.as_mut(), say).await;
        // A job that ended, or was cancelled, has nothing to resume; a failed one keeps its
        // last checkpoint, so that the pipeline submitted again (fixed) resumes from it; an
        // updated one's replacement writes its own over it.
        if let Some(c) = &checkpoints
            && matches!(
                ended,
                Ok(Ended::Done | Ended::Drained) | Err(PortableError::Cancelled)
            )
        {
            c.remove().await;
        }
        ended
    }

    /// The rounds, from `r` on, checkpointed between two when due.
    async fn run_rounds(
        &mut self,
        r: &mut Rounds,
        mut checkpoints: Option<&mut Checkpoints>,
        say: &(dyn Fn(String) + Send + Sync),
    ) -> Result<Ended, PortableError> {
        let mut drain = self.settings.drain.clone();
        let mut stop = self.settings.stop.clone();
        let mut last = false;
        let mut told = Instant::now();
        loop {
            if *self.cancel.borrow() {
                return Err(PortableError::Cancelled);
            }
            if *stop.borrow() {
                // Between two rounds: nothing is in flight, the state is whole. Written too, so
                // that a process stopped (a runner pod's SIGTERM, an update's roll) resumes
                // here rather than at its last periodic checkpoint, or from nothing.
                let written = match checkpoints.as_deref_mut() {
                    Some(c) => {
                        self.checkpoint(r, c).await?;
                        format!(", checkpointed to {}", c.shown())
                    }
                    None => String::new(),
                };
                say(format!("stopped at round {}{written}", r.round));
                return Ok(Ended::Stopped(Box::new(self.save(r, true)?)));
            }
            let draining = *drain.borrow();
            if draining {
                // Beam's drain: the sources stop where they are; what was read is finished.
                r.held.iter_mut().for_each(Vec::clear);
            }
            self.round(r, say).await?;
            self.forget_side_windows(r)?;
            // The round's data is read: its memory goes back (side inputs stay kept).
            for (p, blocks) in self.data.drain() {
                if !r.sides.contains(&p) {
                    self.spill.release(&blocks);
                }
            }
            r.round += 1;
            if let Some(c) = checkpoints.as_deref_mut()
                && c.due()
            {
                self.checkpoint(r, c).await?;
            }
            let at = r.watermark();
            let (backlog, source_outputs) = source_backlog(&self.plan.components, &r.held);
            let backlog_shown = match backlog {
                Some(b) => format!(", the sources' backlog {b} bytes"),
                None => String::new(),
            };
            self.live.update_rounds(|l| {
                l.round = r.round;
                l.source_backlog_bytes = backlog;
                l.source_pcollections = source_outputs;
                l.watermark_ms = (at != i64::MIN).then_some(at);
                l.fired = r.fired as u64;
                l.late_dropped = r.late();
                l.waiting = r.waiting() as u64;
                l.draining = draining;
            });
            if at == i64::MAX {
                // Every GroupByKey that ran before the sources ended fires in one more round.
                if last {
                    say(format!(
                        "streaming: {} rounds, {} windows fired{}{}",
                        r.round,
                        r.fired,
                        match r.late() {
                            0 => String::new(),
                            n => format!(", {} dropped as late", elements(n)),
                        },
                        match r.expired {
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
                let waiting = r.waiting();
                say(format!(
                    "streaming: round {}, watermark {}, {} windows fired, {waiting} windows and timers waiting{}{backlog_shown}",
                    r.round,
                    shown(at),
                    r.fired,
                    match r.late() {
                        0 => String::new(),
                        n => format!(", {} dropped as late", elements(n)),
                    }
                ));
            }
            // Until the next residual, processing-time timer or early pane is due, or the job
            // is drained or cancelled.
            if let Some(next) = self.next_wake(r)
                && next > Instant::now()
            {
                let mut cancel = self.cancel.clone();
                tokio::select! {
                    _ = tokio::time::sleep_until(next.into()) => {}
                    Ok(()) = cancel.changed() => {}
                    Ok(()) = drain.changed() => {}
                    Ok(()) = stop.changed() => {}
                }
            }
        }
    }

    /// Writes the rounds' state as a checkpoint, told in the job's progress.
    async fn checkpoint(&self, r: &mut Rounds, c: &mut Checkpoints) -> Result<(), PortableError> {
        let started = Instant::now();
        let bounded = match c.needs_bounded() {
            true => Some(self.kept_side_states(true)?),
            false => None,
        };
        // Only what changed since the last one is encoded (and hashed) again.
        let (checkpoint, changed) = self.save_as(r, false, true)?;
        let (encoded, parts) = c.write(checkpoint, bounded, Some(&changed)).await?;
        r.pending.values_mut().for_each(Pending::saved);
        r.keyed.values().for_each(|k| k.saved());
        tracing::debug!(
            round = r.round,
            encoded,
            parts,
            took_ms = started.elapsed().as_millis() as u64,
            "checkpoint written"
        );
        self.live.update_rounds(|l| {
            l.checkpoint_round = r.round;
            l.checkpoint_at_ms = Some(now_millis());
            l.checkpoint_took_ms = started.elapsed().as_millis() as u64;
        });
        Ok(())
    }

    /// The kept side inputs of bounded PCollections (`bounded`), or of those that never end.
    fn kept_side_states(&self, bounded: bool) -> Result<Vec<SideState>, PortableError> {
        let mut sides = Vec::new();
        for (pcollection, blocks) in self.kept_sides.iter().flatten() {
            if is_unbounded(&self.plan.components, pcollection) == bounded {
                continue;
            }
            let mut elements = Vec::new();
            for b in self.spill.load_all(blocks)? {
                elements.extend_from_slice(&b);
            }
            let pcollection = pcollection.clone();
            sides.push(SideState {
                pcollection,
                elements,
            });
        }
        Ok(sides)
    }

    /// The rounds' state whole, as a job stopped for its replacement hands it over.
    fn save(&self, r: &Rounds, with_bounded: bool) -> Result<Checkpoint, PortableError> {
        Ok(self.save_as(r, with_bounded, false)?.0)
    }

    /// The rounds' state for a checkpoint: the side inputs of bounded PCollections only
    /// `with_bounded` (a checkpoint file keeps them apart, written once); of the windows and
    /// stateful buckets, `only_changed` those changed since the last checkpoint written. With
    /// what changed.
    fn save_as(
        &self,
        r: &Rounds,
        with_bounded: bool,
        only_changed: bool,
    ) -> Result<(Checkpoint, Changed), PortableError> {
        let (now, wall) = (Instant::now(), now_millis());
        let held = r
            .held
            .iter()
            .enumerate()
            .flat_map(|(stage, held)| held.iter().map(move |h| (stage, h)))
            .map(|(stage, h)| HeldState {
                stage: stage as u64,
                residual: h.residual.encode_to_vec(),
                due: wall.saturating_add(h.due.saturating_duration_since(now).as_millis() as i64),
                watermark: h.watermark,
            })
            .collect();
        let mut sides = self.kept_side_states(false)?;
        if with_bounded {
            sides.extend(self.kept_side_states(true)?);
        }
        let mut changed = Changed::default();
        let groups = r
            .pending
            .iter()
            .map(|(i, p)| {
                let (state, parts) = p.save(*i, only_changed);
                changed.groups.insert(*i as u64, parts);
                state
            })
            .collect();
        let keyed = r
            .keyed
            .iter()
            .map(|(i, k)| {
                let (buckets, which) = k.save(only_changed);
                changed.keyed.insert(*i as u64, which);
                KeyedState {
                    stage: *i as u64,
                    buckets,
                }
            })
            .collect();
        let checkpoint = Checkpoint {
            fingerprint: String::new(),
            round: r.round,
            held,
            groups,
            keyed,
            waiting: r
                .waiting
                .iter()
                .map(|((stage, input), elements)| WaitingState {
                    stage: *stage as u64,
                    input: input.clone(),
                    elements: elements.clone(),
                })
                .collect(),
            sides,
            sides_forgotten_at: r.sides_forgotten_at,
            fired: r.fired as u64,
            expired: r.expired as u64,
            written_at: wall,
            parts: Vec::new(),
        };
        Ok((checkpoint, changed))
    }

    /// The rounds' state as a checkpoint saved it, in place of a first round's.
    fn restore(&mut self, r: &mut Rounds, c: Checkpoint) -> Result<(), PortableError> {
        let stages = self.plan.stages.len();
        let stage = |i: u64| -> Result<usize, PortableError> {
            usize::try_from(i)
                .ok()
                .filter(|i| *i < stages)
                .ok_or_else(|| PortableError::Checkpoint(format!("stage {i} of {stages}")))
        };
        r.round = c.round;
        r.fired = c.fired as usize;
        r.expired = c.expired as usize;
        r.sides_forgotten_at = c.sides_forgotten_at;
        for h in c.held {
            let residual = DelayedBundleApplication::decode(&h.residual[..])
                .map_err(|e| PortableError::Checkpoint(format!("a held residual: {e}")))?;
            r.held[stage(h.stage)?].push(Held {
                residual,
                due: instant_at(h.due),
                watermark: h.watermark,
            });
        }
        for g in c.groups {
            let i = stage(g.stage)?;
            r.pending.insert(i, Pending::restore(g)?);
        }
        for k in c.keyed {
            let i = stage(k.stage)?;
            let keyed = r.keyed.get(&i).ok_or_else(|| {
                PortableError::Checkpoint(format!("keyed state of stage {i}, which keeps none"))
            })?;
            keyed.restore(k.buckets)?;
        }
        for w in c.waiting {
            r.waiting.insert((stage(w.stage)?, w.input), w.elements);
        }
        let kept = self.kept_sides.get_or_insert_with(HashMap::new);
        for side in c.sides {
            let blocks = match side.elements.is_empty() {
                true => Vec::new(),
                false => vec![self.spill.keep(side.elements.into())?],
            };
            kept.insert(side.pcollection, blocks);
        }
        Ok(())
    }

    /// The state before the first round.
    fn first_round(&self) -> Rounds {
        let plan = self.plan;
        let sdk_stages = || {
            plan.stages
                .iter()
                .enumerate()
                .filter_map(|(i, s)| match &s.kind {
                    StageKind::Sdk(s) => Some((i, s)),
                    _ => None,
                })
        };
        let keyed = sdk_stages()
            .filter_map(|(i, s)| {
                let expiry = s.inputs.first().and_then(|p| self.expiry_of(p));
                let k = s.keyed.as_ref()?;
                Some((i, Arc::new(KeyedRounds::new(k, expiry))))
            })
            .collect();
        let waits = sdk_stages()
            .filter_map(|(i, s)| {
                let waits: Vec<SideWait> = s
                    .side_inputs
                    .iter()
                    .filter(|x| is_unbounded(&plan.components, &x.pcollection))
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
        Rounds {
            held: plan.stages.iter().map(|_| Vec::new()).collect(),
            pending: HashMap::new(),
            keyed,
            waits,
            waiting: HashMap::new(),
            sides: sdk_stages()
                .flat_map(|(_, s)| s.side_inputs.iter().map(|x| x.pcollection.clone()))
                .collect(),
            upstream: upstream(plan),
            sides_forgotten_at: None,
            round: 0,
            fired: 0,
            expired: 0,
        }
    }

    /// One round: every stage, in order, on what arrived since the last.
    async fn round(
        &mut self,
        r: &mut Rounds,
        say: &(dyn Fn(String) + Send + Sync),
    ) -> Result<(), PortableError> {
        let plan = self.plan;
        for (i, stage) in plan.stages.iter().enumerate() {
            match &stage.kind {
                StageKind::Impulse { output } if r.round == 0 => self.impulse(output)?,
                StageKind::Impulse { .. } => {}
                StageKind::Concat { inputs, output, .. } => self.concat(inputs, output),
                StageKind::GroupByKey {
                    transform,
                    input,
                    output,
                } => self.group_round(r, i, transform, input, output).await?,
                StageKind::Sdk(s) => self.sdk_round(r, i, &stage.name, s, say).await?,
            }
            for p in stage.kind.outputs() {
                if r.sides.contains(p)
                    && let Some(blocks) = self.data.get(p)
                    && let Some(kept) = self.kept_sides.as_mut()
                {
                    kept.entry(p.clone())
                        .or_default()
                        .extend(blocks.iter().cloned());
                }
            }
        }
        Ok(())
    }

    /// A GroupByKey's round: what arrived added to its windows, the panes due fired.
    async fn group_round(
        &mut self,
        r: &mut Rounds,
        i: usize,
        transform: &str,
        input: &str,
        output: &str,
    ) -> Result<(), PortableError> {
        let plan = self.plan;
        let at = r.watermark_of(i);
        let blocks = self
            .spill
            .load_all(self.data.get(input).map(Vec::as_slice).unwrap_or(&[]))?;
        let shape = plan.materialized[input].shape.clone();
        let strategy = self.strategy_of(i).cloned().unwrap_or_default();
        let name = plan.name_of(transform);
        let sdk_merge = match crate::plan::merges_on_sdk(&strategy) {
            true => self.sdk_merge(i, &strategy, &name).await?,
            false => None,
        };
        let mut state = r.pending.remove(&i).unwrap_or_default();
        let (result, state) = tokio::task::spawn_blocking(move || {
            let now = now_millis();
            let result = state.add_and_fire(
                &blocks,
                &shape,
                &strategy,
                &name,
                sdk_merge.as_ref(),
                at,
                now,
            );
            (result, state)
        })
        .await
        .map_err(|e| PortableError::Harness(format!("grouping task: {e}")))?;
        r.pending.insert(i, state);
        let (out, panes) = result?;
        r.fired += panes;
        let kept = out
            .into_iter()
            .map(|b| self.spill.keep(b))
            .collect::<Result<Vec<_>, _>>()?;
        self.data.insert(output.to_string(), kept);
        Ok(())
    }

    /// An SDK stage's round: its input, the residuals due, a stateful stage's timers due; the
    /// residuals it hands back held.
    async fn sdk_round(
        &mut self,
        r: &mut Rounds,
        i: usize,
        name: &str,
        s: &SdkStage,
        say: &(dyn Fn(String) + Send + Sync),
    ) -> Result<(), PortableError> {
        let now = Instant::now();
        let (due, later): (Vec<Held>, Vec<Held>) = std::mem::take(&mut r.held[i])
            .into_iter()
            .partition(|h| h.due <= now);
        r.held[i] = later;
        let set_aside = self.hold_back(r, i, s)?;
        let has_input = s
            .inputs
            .iter()
            .any(|p| self.data.get(p).is_some_and(|b| !b.is_empty()));
        let stateful = r.keyed.get(&i).cloned();
        let timers_due = stateful.as_ref().is_some_and(|k| {
            k.set_clock(Clock::at(r.watermark_of(i)));
            k.due().contains(&true)
        });
        if !has_input && due.is_empty() && !timers_due {
            self.put_back(set_aside);
            return Ok(());
        }
        // A bounded stage's residuals (a split read) are finished in this round; an
        // unbounded one's wait for their delay.
        let round = StageRound {
            resume: due.into_iter().map(|h| h.residual).collect(),
            // Any PCollection made in the stage, not only those it hands on: a stage that ends
            // in a DoFn writing elsewhere is unbounded too, and its source's rest must wait.
            hold: s
                .transforms
                .iter()
                .filter_map(|t| self.plan.components.transforms.get(t))
                .flat_map(|t| t.outputs.values())
                .chain(&s.outputs)
                .any(|p| is_unbounded(&self.plan.components, p)),
            keyed: stateful.clone(),
        };
        let back = self.sdk_stage(i, name, s, say, Some(round)).await;
        self.put_back(set_aside);
        if let Some(k) = stateful {
            r.expired += k.expire();
        }
        r.held[i].extend(back?.into_iter().map(Held::new));
        Ok(())
    }

    /// For a stage reading side inputs that never end: its main elements whose side windows
    /// are not complete wait; the others stand in for the round's input while the stage runs.
    /// Returns the round's own input, to put back.
    fn hold_back(
        &mut self,
        r: &mut Rounds,
        i: usize,
        s: &SdkStage,
    ) -> Result<SetAside, PortableError> {
        let Some(waits) = r.waits.get(&i) else {
            return Ok(Vec::new());
        };
        let at = r.watermark_of(i);
        let mut set_aside = Vec::new();
        for p in &s.inputs {
            let mut bytes = r.waiting.remove(&(i, p.clone())).unwrap_or_default();
            let arrived = self.data.get(p).map(Vec::as_slice).unwrap_or(&[]);
            for b in self.spill.load_all(arrived)? {
                bytes.extend_from_slice(&b);
            }
            let shape = &self.plan.materialized[p].shape;
            let (go, wait) = side_windows::ready(&bytes, shape, waits, at)?;
            if !wait.is_empty() {
                r.waiting.insert((i, p.clone()), wait);
            }
            let go = match go.is_empty() {
                true => Vec::new(),
                false => vec![self.spill.keep(go.into())?],
            };
            set_aside.push((p.clone(), self.data.insert(p.clone(), go)));
        }
        Ok(set_aside)
    }

    /// Puts back the round's input [`Self::hold_back`] set aside.
    fn put_back(&mut self, set_aside: SetAside) {
        for (p, original) in set_aside {
            if let Some(ready) = self.data.remove(&p) {
                self.spill.release(&ready);
            }
            if let Some(original) = original {
                self.data.insert(p, original);
            }
        }
    }

    /// Drops the side windows that ended (of side inputs that never end): no main element
    /// that is not late reads them any more.
    fn forget_side_windows(&mut self, r: &mut Rounds) -> Result<(), PortableError> {
        let at = r.watermark();
        // No side window ends before the watermark moves.
        if r.sides_forgotten_at == Some(at) {
            return Ok(());
        }
        r.sides_forgotten_at = Some(at);
        let pcollections: HashSet<String> = r
            .waits
            .values()
            .flatten()
            .map(|w| w.pcollection.clone())
            .collect();
        for p in pcollections {
            let Some(kept) = self.kept_sides.as_mut() else {
                return Ok(());
            };
            let Some(blocks) = kept.get(&p) else {
                continue;
            };
            let mut bytes = Vec::new();
            for b in self.spill.load_all(blocks)? {
                bytes.extend_from_slice(&b);
            }
            let live = side_windows::unexpired(&bytes, &self.plan.materialized[&p].shape, at)?;
            if live.len() == bytes.len() {
                continue;
            }
            let live = match live.is_empty() {
                true => Vec::new(),
                false => vec![self.spill.keep(live.into())?],
            };
            if let Some(old) = kept.insert(p, live) {
                self.spill.release(&old);
            }
        }
        Ok(())
    }

    /// When the next residual, processing-time timer or early pane by delay is due.
    fn next_wake(&self, r: &Rounds) -> Option<Instant> {
        let timers = r.keyed.values().filter_map(|k| k.next_processing());
        let early = r.pending.values().filter_map(Pending::next_deadline);
        let clocked = timers.chain(early).min().map(instant_at);
        r.held.iter().flatten().map(|h| h.due).chain(clocked).min()
    }

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
        let strategy = crate::plan::strategy_of(components, pcollection)?;
        (*window == crate::coders::Shape::IntervalWindow).then_some(strategy.allowed_lateness)
    }

    /// The windowing strategy of stage `index`'s input, when it is a GroupByKey.
    fn strategy_of(&self, index: usize) -> Option<&crate::runner_api::WindowingStrategy> {
        let StageKind::GroupByKey { input, .. } = &self.plan.stages.get(index)?.kind else {
            return None;
        };
        crate::plan::strategy_of(&self.plan.components, input)
    }
}

/// A stage's inputs as they were before [`Run::hold_back`] (none: the input had no blocks).
type SetAside = Vec<(String, Option<Vec<Block>>)>;

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
    fn the_sources_backlog_is_the_sum_of_their_held_residuals_sizes() {
        use crate::coders::add_coder;
        use crate::runner_api::{PCollection, PTransform};
        let mut c = Components::default();
        let bytes = add_coder(&mut c, "bytes", urns::BYTES, vec![]);
        let doubles = add_coder(&mut c, "doubles", urns::DOUBLE, vec![]);
        let sized = add_coder(&mut c, "sized", urns::KV, vec![bytes.clone(), doubles]);
        for (pcoll, coder) in [("split", sized), ("plain", bytes)] {
            c.pcollections.insert(
                pcoll.into(),
                PCollection {
                    coder_id: coder,
                    ..Default::default()
                },
            );
        }
        for (t, input) in [("process", "split"), ("other", "plain")] {
            c.transforms.insert(
                t.into(),
                PTransform {
                    inputs: HashMap::from([("in".to_string(), input.to_string())]),
                    outputs: HashMap::from([("out".to_string(), format!("{t}_out"))]),
                    ..Default::default()
                },
            );
        }
        // A windowed value's bytes end with its value; a sized element's with its size.
        let held = |t: &str, size: f64| {
            let mut h = Held::new(residual(Some(0), 0));
            let app = h.residual.application.as_mut().unwrap();
            app.transform_id = t.into();
            app.input_id = "in".into();
            app.element = [&[7u8; 13][..], &size.to_be_bytes()].concat();
            h
        };
        let (backlog, outputs) = source_backlog(
            &c,
            &[vec![held("process", 800.0)], vec![held("process", 24.0)]],
        );
        assert_eq!(backlog, Some(824));
        assert_eq!(outputs, vec!["process_out".to_string()]);
        // An element that is not sized says nothing of its size.
        let (backlog, _) = source_backlog(&c, &[vec![held("other", 800.0)]]);
        assert_eq!(backlog, None);
        assert_eq!(source_backlog(&c, &[]).0, None);
    }

    #[test]
    fn a_watermark_reads_as_a_time() {
        assert_eq!(shown(1_500), "1970-01-01T00:00:01.500Z");
        assert_eq!(shown(i64::MAX), "the end of time");
    }
}
