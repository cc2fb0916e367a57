//! One bundle on one harness: the ProcessBundle instruction on the control stream, the inputs
//! on the data stream, then the outputs collected until every sink said it was done and the
//! harness answered.
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use prost::bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use super::{BundleState, Incoming, Worker, Workers};
use crate::fn_api::{
    DelayedBundleApplication, Elements, FinalizeBundleRequest, InstructionRequest,
    ProcessBundleProgressRequest, ProcessBundleRequest, ProcessBundleSplitRequest,
    ProcessBundleSplitResponse, elements, instruction_request, instruction_response,
    process_bundle_split_request,
};
use crate::runner_api::MonitoringInfo;

/// A stateful DoFn's timer family: (transform id, timer family id).
pub type TimerFamily = (String, String);

/// What a bundle reads: per data source transform, blocks of whole elements; and per timer
/// family of a stateful DoFn, the timers that fire in it (every family is sent, even empty).
/// With `outputs`, its output blocks go there as they arrive instead of into its result.
#[derive(Clone, Default)]
pub struct BundleInputs {
    pub data: Vec<(String, Vec<Bytes>)>,
    pub timers: Vec<(TimerFamily, Vec<Bytes>)>,
    pub outputs: Option<Arc<dyn OutputSink>>,
}

/// Takes a bundle's output blocks (per data sink transform) as the harness sends them, so a
/// bundle's output need not wait in memory for its end.
pub trait OutputSink: Send + Sync {
    fn take(&self, sink: &str, data: Bytes);
}

/// What a bundle produced: per sink transform, its encoded elements; and its metrics.
#[derive(Debug, Default)]
pub struct BundleOutput {
    pub outputs: HashMap<String, Vec<Bytes>>,
    /// Timers the bundle set (or cleared), per family, encoded.
    pub timers: HashMap<TimerFamily, Vec<Bytes>>,
    pub monitoring_infos: Vec<MonitoringInfo>,
    /// Work the harness handed back (a splittable DoFn's rest), to run in another bundle.
    pub residuals: Vec<DelayedBundleApplication>,
    /// Bundles (instruction ids) whose user code asked to be told once their output is
    /// committed (Beam's bundle finalization).
    pub finalize: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum BundleFailure {
    /// The user's code or the harness reported an error: worth retrying elsewhere.
    #[error("{0}")]
    Failed(String),
    /// The harness went away mid-bundle.
    #[error("the SDK harness '{0}' went away during the bundle")]
    Lost(String),
}

/// How long a harness has to open its data stream after its first instruction.
const DATA_STREAM_WAIT: Duration = Duration::from_secs(120);

impl Workers {
    /// Runs descriptor `descriptor` on `worker` with `inputs` (data-source transform id, blocks
    /// of whole encoded elements); waits for the sinks in `sinks`.
    pub async fn process_bundle(
        &self,
        worker: &Arc<Worker>,
        instruction: String,
        descriptor: &str,
        inputs: BundleInputs,
        sinks: &[String],
        state: BundleState,
    ) -> Result<BundleOutput, BundleFailure> {
        let (route_tx, mut route) = mpsc::unbounded_channel();
        let (done_tx, done) = oneshot::channel();
        worker
            .routes
            .lock()
            .expect("routes")
            .insert(instruction.clone(), route_tx);
        worker
            .pending
            .lock()
            .expect("pending")
            .insert(instruction.clone(), done_tx);
        self.states
            .lock()
            .expect("states")
            .insert(instruction.clone(), state);
        let result = self
            .drive(
                worker,
                descriptor,
                &instruction,
                inputs,
                sinks,
                &mut route,
                done,
            )
            .await;
        worker.routes.lock().expect("routes").remove(&instruction);
        worker.pending.lock().expect("pending").remove(&instruction);
        self.states.lock().expect("states").remove(&instruction);
        result
    }

    /// Sends `worker` an instruction about a running bundle and waits for its answer.
    async fn instruct(
        &self,
        worker: &Arc<Worker>,
        request: instruction_request::Request,
    ) -> Result<Option<instruction_response::Response>, BundleFailure> {
        let instruction = self.new_instruction();
        let (done_tx, done) = oneshot::channel();
        worker
            .pending
            .lock()
            .expect("pending")
            .insert(instruction.clone(), done_tx);
        let request = InstructionRequest {
            instruction_id: instruction.clone(),
            request: Some(request),
        };
        let lost = || BundleFailure::Lost(worker.id.clone());
        if worker.control.send(Ok(request)).is_err() {
            worker.pending.lock().expect("pending").remove(&instruction);
            return Err(lost());
        }
        match done.await {
            Ok(r) if !r.error.is_empty() => Err(BundleFailure::Failed(r.error)),
            Ok(r) => Ok(r.response),
            Err(_) => Err(lost()),
        }
    }

    /// Asks `worker` to give back part of bundle `bundle` that it has not processed: `fraction`
    /// of the remainder of the elements arriving at data source `port` (of `elements` sent), or
    /// of the element it is on (a splittable DoFn's restriction).
    pub async fn split(
        &self,
        worker: &Arc<Worker>,
        bundle: &str,
        port: &str,
        fraction: f64,
        elements: usize,
    ) -> Result<ProcessBundleSplitResponse, BundleFailure> {
        let desired = process_bundle_split_request::DesiredSplit {
            fraction_of_remainder: fraction,
            allowed_split_points: Vec::new(),
            estimated_input_elements: elements as i64,
        };
        let request = instruction_request::Request::ProcessBundleSplit(ProcessBundleSplitRequest {
            instruction_id: bundle.to_string(),
            desired_splits: [(port.to_string(), desired)].into(),
        });
        Ok(match self.instruct(worker, request).await? {
            Some(instruction_response::Response::ProcessBundleSplit(split)) => split,
            _ => ProcessBundleSplitResponse::default(),
        })
    }

    /// Tells `worker` that bundle `bundle`'s output is committed: the callbacks its user code
    /// registered run now.
    pub async fn finalize(&self, worker: &Arc<Worker>, bundle: &str) -> Result<(), BundleFailure> {
        let request = instruction_request::Request::FinalizeBundle(FinalizeBundleRequest {
            instruction_id: bundle.to_string(),
        });
        self.instruct(worker, request).await.map(drop)
    }

    /// Asks `worker` how bundle `bundle` is going: its monitoring infos so far (empty when the
    /// harness has not started it, or has finished it).
    pub async fn progress(
        &self,
        worker: &Arc<Worker>,
        bundle: &str,
    ) -> Result<Vec<MonitoringInfo>, BundleFailure> {
        let request =
            instruction_request::Request::ProcessBundleProgress(ProcessBundleProgressRequest {
                instruction_id: bundle.to_string(),
            });
        Ok(match self.instruct(worker, request).await? {
            Some(instruction_response::Response::ProcessBundleProgress(p)) => p.monitoring_infos,
            _ => Vec::new(),
        })
    }

    #[allow(clippy::too_many_arguments)]
    async fn drive(
        &self,
        worker: &Arc<Worker>,
        descriptor: &str,
        instruction: &str,
        BundleInputs {
            data: inputs,
            timers,
            outputs: sink,
        }: BundleInputs,
        sinks: &[String],
        route: &mut mpsc::UnboundedReceiver<Incoming>,
        mut done: oneshot::Receiver<crate::fn_api::InstructionResponse>,
    ) -> Result<BundleOutput, BundleFailure> {
        let lost = || BundleFailure::Lost(worker.id.clone());
        let request = InstructionRequest {
            instruction_id: instruction.to_string(),
            request: Some(instruction_request::Request::ProcessBundle(
                ProcessBundleRequest {
                    process_bundle_descriptor_id: descriptor.to_string(),
                    ..Default::default()
                },
            )),
        };
        worker.control.send(Ok(request)).map_err(|_| lost())?;

        // The harness opens its data stream when it first meets a data port.
        let data = {
            let deadline = tokio::time::Instant::now() + DATA_STREAM_WAIT;
            loop {
                let ready = worker.data_ready.notified();
                if let Some(tx) = worker.data.lock().expect("data").clone() {
                    break tx;
                }
                if !worker.is_alive() || tokio::time::timeout_at(deadline, ready).await.is_err() {
                    return Err(lost());
                }
            }
        };
        let send = |message: Elements| data.send(Ok(message)).map_err(|_| lost());
        for (transform, blocks) in inputs {
            for block in blocks {
                let d = elements::Data {
                    instruction_id: instruction.to_string(),
                    transform_id: transform.clone(),
                    data: block,
                    is_last: false,
                };
                send(Elements {
                    data: vec![d],
                    timers: vec![],
                })?;
            }
            let last = elements::Data {
                instruction_id: instruction.to_string(),
                transform_id: transform,
                data: Bytes::new(),
                is_last: true,
            };
            send(Elements {
                data: vec![last],
                timers: vec![],
            })?;
        }
        // Every timer family of a stateful DoFn is an input of every bundle, fired timers or none.
        let families: Vec<TimerFamily> = timers.iter().map(|(f, _)| f.clone()).collect();
        for ((transform_id, timer_family_id), blocks) in timers {
            let timer = |timers: Vec<u8>, is_last: bool| elements::Timers {
                instruction_id: instruction.to_string(),
                transform_id: transform_id.clone(),
                timer_family_id: timer_family_id.clone(),
                timers,
                is_last,
            };
            for block in blocks {
                send(Elements {
                    data: vec![],
                    timers: vec![timer(block.to_vec(), false)],
                })?;
            }
            send(Elements {
                data: vec![],
                timers: vec![timer(Vec::new(), true)],
            })?;
        }

        let mut output = BundleOutput::default();
        let mut open: Vec<&String> = sinks.iter().collect();
        let mut open_timers: Vec<TimerFamily> = families;
        let mut response = None;
        while response.is_none() || !open.is_empty() || !open_timers.is_empty() {
            tokio::select! {
                item = route.recv() => match item {
                    Some(Incoming::Data(d)) => {
                        if !d.data.is_empty() {
                            match &sink {
                                Some(sink) => sink.take(&d.transform_id, d.data),
                                None => output.outputs.entry(d.transform_id.clone()).or_default().push(d.data),
                            }
                        }
                        if d.is_last {
                            open.retain(|s| **s != d.transform_id);
                        }
                    }
                    Some(Incoming::Timers(t)) => {
                        let family = (t.transform_id, t.timer_family_id);
                        if !t.timers.is_empty() {
                            output.timers.entry(family.clone()).or_default().push(Bytes::from(t.timers));
                        }
                        if t.is_last {
                            open_timers.retain(|f| *f != family);
                        }
                    }
                    None => return Err(lost()),
                },
                r = &mut done, if response.is_none() => match r {
                    Ok(r) if !r.error.is_empty() => return Err(BundleFailure::Failed(r.error)),
                    Ok(r) => response = Some(r),
                    Err(_) => return Err(lost()),
                },
            }
        }
        if let Some(instruction_response::Response::ProcessBundle(pb)) =
            response.and_then(|r| r.response)
        {
            output.monitoring_infos = pb.monitoring_infos;
            output.residuals = pb.residual_roots;
            if pb.requires_finalization {
                output.finalize.push(instruction.to_string());
            }
        }
        Ok(output)
    }
}
