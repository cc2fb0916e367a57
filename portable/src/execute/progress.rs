//! A running job's metrics and progress. Bundles that finished give their monitoring infos once
//! (the committed metrics); bundles still running are asked with ProcessBundleProgress how far
//! they are, and their latest answer is added to give the attempted metrics and the element
//! counts of a stage's progress lines. A bundle that fails takes its progress with it.
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::fnapi::{Worker, Workers};
use crate::metrics::JobMetrics;
use crate::runner_api::MonitoringInfo;

/// How long a harness has to answer a progress request before it is asked again next time.
const PROGRESS_WAIT: Duration = Duration::from_secs(2);

#[derive(Default)]
pub struct Live {
    inner: Mutex<Inner>,
    /// Stages run to their end, in plan order.
    stages_done: AtomicUsize,
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

    pub fn running(&self) -> usize {
        self.inner.lock().expect("live").running.len()
    }

    /// Asks every running bundle for its progress, at once.
    pub(crate) async fn poll(&self, workers: &Workers) {
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
