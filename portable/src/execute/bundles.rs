//! Cutting a stage's input into bundles and running them over the harnesses: each harness
//! takes bundles from a shared queue, two at a time; a failed bundle goes back on the queue
//! until it has had [`ATTEMPTS`] tries, and a bundle whose harness died goes back too.
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use prost::bytes::Bytes;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::{ATTEMPTS, BLOCK_BYTES};
use crate::coders::Shape;
use crate::error::PortableError;
use crate::fn_api::DelayedBundleApplication;
use crate::fnapi::{BundleFailure, BundleOutput, SideInputStore, Workers};
use crate::runner_api::Components;

/// A bundle's inputs: data-source transform id and blocks of whole elements.
pub(crate) type Bundle = Vec<(String, Vec<Bytes>)>;

/// Bundles a harness runs at once: one computing while the next one's data arrives.
const SLOTS_PER_HARNESS: usize = 2;
/// Bundles per harness a stage's input is cut into, so that a slow one does not hold the stage.
const BUNDLES_PER_HARNESS: usize = 4;

/// Cuts `blocks` (elements of `shape`) into bundles of similar size, whole elements each.
pub(crate) fn split(
    blocks: &[Bytes],
    shape: &Shape,
    harnesses: usize,
) -> Result<Vec<Vec<Bytes>>, PortableError> {
    let mut bounds: Vec<(usize, usize, usize)> = Vec::new();
    let mut total = 0usize;
    for (b, block) in blocks.iter().enumerate() {
        let mut pos = 0;
        while pos < block.len() {
            let end = shape.skip(block, pos)?;
            bounds.push((b, pos, end));
            total += end - pos;
            pos = end;
        }
    }
    if bounds.is_empty() {
        return Ok(vec![Vec::new()]);
    }
    let pieces = harnesses.max(1) * BUNDLES_PER_HARNESS;
    let per_bundle_elements = bounds.len().div_ceil(pieces);
    let per_bundle_bytes = (total / pieces).clamp(64 << 10, 64 << 20);
    let mut bundles = Vec::new();
    let mut current: Vec<Bytes> = Vec::new();
    let (mut elements, mut bytes) = (0usize, 0usize);
    // A run of consecutive elements of one block: sliced without copying.
    let mut run: Option<(usize, usize, usize)> = None;
    let flush_run = |run: &mut Option<(usize, usize, usize)>, current: &mut Vec<Bytes>| {
        if let Some((b, s, e)) = run.take() {
            current.push(blocks[b].slice(s..e));
        }
    };
    for (b, s, e) in bounds {
        run = match run {
            Some((rb, rs, re)) if rb == b && re == s && e - rs <= BLOCK_BYTES => Some((rb, rs, e)),
            other => {
                let mut other = other;
                flush_run(&mut other, &mut current);
                Some((b, s, e))
            }
        };
        elements += 1;
        bytes += e - s;
        if elements >= per_bundle_elements || bytes >= per_bundle_bytes {
            flush_run(&mut run, &mut current);
            bundles.push(std::mem::take(&mut current));
            elements = 0;
            bytes = 0;
        }
    }
    flush_run(&mut run, &mut current);
    if !current.is_empty() {
        bundles.push(current);
    }
    Ok(bundles)
}

/// The bundles of one stage and how far they got.
pub(crate) struct Work {
    queue: Arc<Mutex<VecDeque<(Bundle, usize)>>>,
}

/// What one round over the live harnesses gave.
pub(crate) struct Round {
    pub outputs: Vec<BundleOutput>,
    /// A bundle failed [`ATTEMPTS`] times: the user's error.
    pub fatal: Option<String>,
}

impl Work {
    pub fn new(bundles: Vec<Bundle>) -> Work {
        Work {
            queue: Arc::new(Mutex::new(bundles.into_iter().map(|b| (b, 0)).collect())),
        }
    }

    pub fn is_done(&self) -> bool {
        self.queue.lock().expect("queue").is_empty()
    }

    /// Queues what a splittable DoFn handed back, as a bundle of the input it came from.
    pub fn push_residual(
        &mut self,
        components: &Components,
        ports: &HashMap<String, String>,
        residual: DelayedBundleApplication,
        stage: &str,
    ) -> Result<(), PortableError> {
        let app = residual.application.unwrap_or_default();
        let input = components
            .transforms
            .get(&app.transform_id)
            .and_then(|t| t.inputs.get(&app.input_id));
        let port = input.and_then(|p| ports.get(p)).ok_or_else(|| {
            PortableError::unsupported(
                stage,
                format!(
                    "a residual of '{}' that does not read the stage's input",
                    app.transform_id
                ),
            )
        })?;
        self.queue
            .lock()
            .expect("queue")
            .push_back((vec![(port.clone(), vec![Bytes::from(app.element)])], 0));
        Ok(())
    }

    /// Runs queued bundles on `harnesses` until the queue is empty, a bundle has failed for
    /// good, or every harness is gone (the caller then starts new ones).
    pub async fn run(
        &mut self,
        workers: Arc<Workers>,
        harnesses: &[String],
        descriptor: &str,
        sinks: &[String],
        side_inputs: Option<Arc<SideInputStore>>,
        cancel: &watch::Receiver<bool>,
    ) -> Round {
        let outputs = Arc::new(Mutex::new(Vec::new()));
        let fatal: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
        let mut tasks = JoinSet::new();
        for id in harnesses {
            let Some(worker) = workers.get(id) else {
                continue;
            };
            for _ in 0..SLOTS_PER_HARNESS {
                let (workers, worker, queue) =
                    (workers.clone(), worker.clone(), self.queue.clone());
                let (outputs, fatal, cancel) = (outputs.clone(), fatal.clone(), cancel.clone());
                let (descriptor, sinks, side_inputs) =
                    (descriptor.to_string(), sinks.to_vec(), side_inputs.clone());
                tasks.spawn(async move {
                    loop {
                        if fatal.lock().expect("fatal").is_some() || *cancel.borrow() {
                            return;
                        }
                        let Some((bundle, attempt)) = queue.lock().expect("queue").pop_front() else { return };
                        let result = workers.process_bundle(&worker, &descriptor, bundle.clone(), &sinks, side_inputs.clone()).await;
                        match result {
                            Ok(out) => outputs.lock().expect("outputs").push(out),
                            Err(failure) => {
                                tracing::warn!(harness = %worker.id, attempt = attempt + 1, "bundle failed: {failure}");
                                if attempt + 1 >= ATTEMPTS {
                                    *fatal.lock().expect("fatal") = Some(failure.to_string());
                                    return;
                                }
                                queue.lock().expect("queue").push_back((bundle, attempt + 1));
                                if matches!(failure, BundleFailure::Lost(_)) {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        }
        while tasks.join_next().await.is_some() {}
        let outputs = std::mem::take(&mut *outputs.lock().expect("outputs"));
        let fatal = fatal.lock().expect("fatal").take();
        Round { outputs, fatal }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundles_hold_whole_elements_and_spread_over_harnesses() {
        // 100 bytes elements (a varint length 99, then 99 bytes), 40 of them over 2 blocks.
        let element = |i: u8| {
            let mut e = vec![99u8];
            e.extend(std::iter::repeat_n(i, 99));
            e
        };
        let blocks: Vec<Bytes> = [0..20u8, 20..40u8]
            .into_iter()
            .map(|r| Bytes::from(r.flat_map(element).collect::<Vec<u8>>()))
            .collect();
        let bundles = split(&blocks, &Shape::Bytes, 2).unwrap();
        assert_eq!(bundles.len(), 8);
        let mut seen = Vec::new();
        for bundle in &bundles {
            for block in bundle {
                for e in Shape::Bytes.split(block).unwrap() {
                    assert_eq!(e.len(), 100);
                    seen.push(e[1]);
                }
            }
        }
        assert_eq!(seen, (0..40).collect::<Vec<u8>>());
    }
}
