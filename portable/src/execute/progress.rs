//! A running job's metrics and progress. Bundles that finished give their monitoring infos once
//! (the committed metrics); bundles still running are asked with ProcessBundleProgress how far
//! they are, and their latest answer is added to give the attempted metrics and the element
//! counts of a stage's progress lines. A bundle that fails takes its progress with it. It also
//! keeps what an autoscaler reads: the running SDK stage's [`Backlog`] (its bundles, and its
//! input bytes read and left, as the element counts above say) and how busy each place's
//! harnesses are ([`Place`]); and a streaming job's rounds as the last one left them
//! ([`Rounds`]: watermark, windows, checkpoints).
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::fnapi::{Worker, Workers};
use crate::metrics::JobMetrics;
use crate::runner_api::MonitoringInfo;

/// How long a harness has to answer a progress request before it is asked again next time.
const PROGRESS_WAIT: Duration = Duration::from_secs(2);

/// The running SDK stage's work left, and the job's so far, as an autoscaler reads them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Backlog {
    pub queued_bundles: u64,
    pub running_bundles: u64,
    /// Running bundles an idle harness could split (dynamic work rebalancing).
    pub splittable_bundles: u64,
    /// Input bytes processed over the whole job: the stages done, and the part of the running
    /// stage's input its bundles have read (the SDK's element counts, at the stage's bytes
    /// per element). A bundle's progress counts as it runs, not only once it ends.
    pub processed_bytes: u64,
    /// Input bytes of the running stage not read yet.
    pub remaining_bytes: u64,
}

/// The input of the SDK stage that runs: its PCollections, its size, and what had been read
/// of them before it started.
pub(crate) struct StageInput {
    pub pcollections: Vec<String>,
    pub bytes: u64,
    pub elements: u64,
    pub read_before: u64,
    /// Its bundles waiting, and running ones that could be split.
    pub bundles: Box<dyn Fn() -> (u64, u64) + Send + Sync>,
}

/// A streaming job after its last round.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rounds {
    pub round: u64,
    /// The job's watermark (its slowest source's), millis since the epoch; None before the
    /// sources have said, `i64::MAX` once they ended.
    pub watermark_ms: Option<i64>,
    /// Panes fired so far.
    pub fired: u64,
    pub late_dropped: u64,
    /// Windows and timers waiting to fire.
    pub waiting: u64,
    /// The round of the last checkpoint written (0: none yet), when (wall-clock millis) and
    /// how long writing it took.
    pub checkpoint_round: u64,
    pub checkpoint_at_ms: Option<i64>,
    pub checkpoint_took_ms: u64,
    /// The job is being drained.
    pub draining: bool,
    /// What the unbounded sources say is left to read (the held residuals' sizes: bytes by
    /// Beam's convention); None when they say nothing.
    pub source_backlog_bytes: Option<u64>,
    /// The PCollections the unbounded sources emit: their bytes read, over time, are the
    /// sources' throughput (`JobMetrics::bytes_of`).
    pub source_pcollections: Vec<String>,
}

/// Where harnesses run (a worker pool: on Kubernetes, one SDK worker pod) and how busy they are.
#[derive(Clone, Debug, PartialEq)]
pub struct Place {
    pub name: String,
    pub harnesses_alive: usize,
    /// Bundles running on them.
    pub bundles_running: usize,
}

impl Place {
    /// The share of its harnesses' bundle slots in use, 0 to 1 (what an autoscaler reads as
    /// the place's CPU: a harness's user code is out of the runner's sight).
    pub fn busy(&self) -> f64 {
        let slots = self.harnesses_alive * super::bundles::SLOTS_PER_HARNESS;
        if slots == 0 {
            return 0.0;
        }
        (self.bundles_running as f64 / slots as f64).min(1.0)
    }
}

#[derive(Default)]
pub struct Live {
    inner: Mutex<Inner>,
    /// Stages run to their end, in plan order.
    stages_done: AtomicUsize,
    /// Input bytes of the SDK stages done.
    bytes_done: AtomicU64,
    /// The SDK stage that runs.
    stage: Mutex<Option<StageInput>>,
    /// The harnesses started, by the place they run in.
    places: Mutex<HashMap<String, Vec<Arc<Worker>>>>,
    /// A streaming job's rounds.
    rounds: Mutex<Option<Rounds>>,
}

#[derive(Default)]
struct Inner {
    committed: JobMetrics,
    /// Running bundles by instruction id: their harness and latest progress.
    running: HashMap<String, (Arc<Worker>, Vec<MonitoringInfo>)>,
}

impl Live {
    pub(crate) fn started(&self, instruction: &str, worker: &Arc<Worker>) {
        self.inner
            .lock()
            .expect("live")
            .running
            .insert(instruction.to_string(), (worker.clone(), Vec::new()));
    }

    pub(crate) fn finished(&self, instruction: &str, infos: &[MonitoringInfo]) {
        let mut inner = self.inner.lock().expect("live");
        inner.running.remove(instruction);
        inner.committed.add(infos);
    }

    /// The SDK stage of `input` starts.
    pub(crate) fn stage_started(&self, input: StageInput) {
        *self.stage.lock().expect("stage") = Some(input);
    }

    /// The SDK stage that ran has ended (however it ended).
    pub(crate) fn stage_ended(&self) {
        if let Some(input) = self.stage.lock().expect("stage").take() {
            self.bytes_done.fetch_add(input.bytes, Ordering::Relaxed);
        }
    }

    /// The running SDK stage's work left and the job's bytes processed (no stage: none left).
    pub fn backlog(&self) -> Backlog {
        let done = self.bytes_done.load(Ordering::Relaxed);
        let stage = self.stage.lock().expect("stage");
        let Some(input) = stage.as_ref() else {
            return Backlog {
                processed_bytes: done,
                ..Backlog::default()
            };
        };
        let read = self
            .attempted()
            .elements_of(&input.pcollections)
            .saturating_sub(input.read_before)
            .min(input.elements);
        let per_element = input.bytes as f64 / input.elements.max(1) as f64;
        let read_bytes = ((read as f64 * per_element) as u64).min(input.bytes);
        let (queued, splittable) = (input.bundles)();
        Backlog {
            queued_bundles: queued,
            running_bundles: self.running() as u64,
            splittable_bundles: splittable,
            processed_bytes: done + read_bytes,
            remaining_bytes: input.bytes - read_bytes,
        }
    }

    /// Harnesses started in `place`.
    pub(crate) fn started_in(&self, place: &str, harnesses: Vec<Arc<Worker>>) {
        self.places
            .lock()
            .expect("places")
            .entry(place.to_string())
            .or_default()
            .extend(harnesses);
    }

    /// Each place with live harnesses, or that had some, and the bundles running there.
    pub fn places(&self) -> Vec<Place> {
        let places = self.places.lock().expect("places");
        let inner = self.inner.lock().expect("live");
        let mut out: Vec<Place> = places
            .iter()
            .map(|(name, harnesses)| {
                let here = |w: &Arc<Worker>| harnesses.iter().any(|h| h.id == w.id);
                Place {
                    name: name.clone(),
                    harnesses_alive: harnesses.iter().filter(|h| h.is_alive()).count(),
                    bundles_running: inner.running.values().filter(|(w, _)| here(w)).count(),
                }
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    pub(crate) fn failed(&self, instruction: &str) {
        self.inner.lock().expect("live").running.remove(instruction);
    }

    /// What finished bundles reported.
    pub fn committed(&self) -> JobMetrics {
        self.inner.lock().expect("live").committed.clone()
    }

    /// What finished bundles reported, and running ones so far.
    pub fn attempted(&self) -> JobMetrics {
        let inner = self.inner.lock().expect("live");
        let mut all = inner.committed.clone();
        for (_, infos) in inner.running.values() {
            all.add(infos);
        }
        all
    }

    /// How many of the plan's stages have ended (they run in order).
    pub fn stages_done(&self) -> usize {
        self.stages_done.load(Ordering::SeqCst)
    }

    pub(crate) fn stage_done(&self) {
        self.stages_done.fetch_add(1, Ordering::SeqCst);
    }

    /// A streaming job's rounds as the last one left them (None: not a streaming job, or no
    /// round yet).
    pub fn rounds(&self) -> Option<Rounds> {
        self.rounds.lock().expect("rounds").clone()
    }

    pub(crate) fn update_rounds(&self, f: impl FnOnce(&mut Rounds)) {
        f(self
            .rounds
            .lock()
            .expect("rounds")
            .get_or_insert_with(Rounds::default));
    }

    pub fn running(&self) -> usize {
        self.inner.lock().expect("live").running.len()
    }

    /// Asks every running bundle for its progress, at once.
    pub async fn poll(&self, workers: &Workers) {
        let running: Vec<(String, Arc<Worker>)> = self
            .inner
            .lock()
            .expect("live")
            .running
            .iter()
            .map(|(id, (worker, _))| (id.clone(), worker.clone()))
            .collect();
        let asks = running.iter().map(|(id, worker)| async move {
            let answer = tokio::time::timeout(PROGRESS_WAIT, workers.progress(worker, id)).await;
            (id, answer)
        });
        for (id, answer) in futures::future::join_all(asks).await {
            if let Ok(Ok(infos)) = answer
                && let Some(entry) = self.inner.lock().expect("live").running.get_mut(id)
            {
                entry.1 = infos;
            }
        }
    }
}
