//! Windows merged by the SDK. A merging WindowFn other than sessions (which the runner merges
//! itself) is the user's code: each key's windows go to a harness of the windowing strategy's
//! environment as one element of Beam's MergeWindows transform, which answers which windows
//! merge into which. Beam's FnApiRunner asks its own workers the same way
//! (`GenericMergingWindowFn`).
use std::collections::HashMap;
use std::sync::Arc;

use prost::Message;
use prost::bytes::Bytes;

use super::{ATTEMPTS, BLOCK_BYTES};
use crate::coders::{
    Shape, Windowed, add_coder, in_the_global_window, iterable_items, read_varint, write_varint,
};
use crate::error::PortableError;
use crate::fn_api::{ProcessBundleDescriptor, RemoteGrpcPort};
use crate::fnapi::{BundleInputs, BundleState, Workers};
use crate::runner_api::{
    ApiServiceDescriptor, Components, FunctionSpec, PCollection, PTransform, Trigger,
    WindowingStrategy, accumulation_mode, closing_behavior, is_bounded, merge_status,
    on_time_behavior, output_time, trigger,
};
use crate::urns;

/// The data-plane ends of the MergeWindows descriptor.
const READ: &str = "merge_windows/read";
const WRITE: &str = "merge_windows/write";

/// Which of each key's windows merge into which: (encoded key, original window) → the window
/// it merged into. A window that merged with none is not in it.
pub(crate) type Merged = HashMap<(Vec<u8>, Vec<u8>), Vec<u8>>;

/// One GroupByKey's way to its WindowFn's `merge`: a registered descriptor and the harnesses
/// that may run it.
pub(crate) struct SdkMerge {
    workers: Arc<Workers>,
    harnesses: Vec<String>,
    descriptor: String,
    /// The answer's elements: windowed `KV(key, KV(unmerged, Iterable(KV(merged, originals))))`.
    answer: Shape,
    window: Shape,
    runtime: tokio::runtime::Handle,
    transform: String,
}

impl SdkMerge {
    /// Registers the MergeWindows descriptor `id` for `strategy`'s WindowFn with `workers`, to
    /// run on `harnesses` (of the strategy's environment) at the Fn API server `url`.
    pub(crate) fn new(
        workers: Arc<Workers>,
        url: &str,
        components: &Components,
        strategy: &WindowingStrategy,
        id: &str,
        harnesses: Vec<String>,
        transform: &str,
    ) -> Result<SdkMerge, PortableError> {
        let (descriptor, answer_coder) = descriptor(url, components, strategy, id);
        let answer = Shape::of(&descriptor.coders, &answer_coder)?;
        let window = Shape::of(&descriptor.coders, &strategy.window_coder_id)?;
        workers.register_descriptor(descriptor);
        Ok(SdkMerge {
            workers,
            harnesses,
            descriptor: id.to_string(),
            answer,
            window,
            runtime: tokio::runtime::Handle::current(),
            transform: transform.to_string(),
        })
    }

    /// Asks a harness to merge each key's windows (encoded keys and windows); blocks, so it is
    /// called off the async runtime (from the grouping's blocking task). A bundle that fails
    /// is tried on the next live harness, [`ATTEMPTS`] times in all.
    pub(crate) fn merge(&self, per_key: &[(&[u8], Vec<&[u8]>)]) -> Result<Merged, PortableError> {
        let request = request(per_key);
        let mut last = String::new();
        for attempt in 0..ATTEMPTS {
            let alive: Vec<_> = self
                .harnesses
                .iter()
                .filter_map(|id| self.workers.get(id))
                .filter(|w| w.is_alive())
                .collect();
            let Some(worker) = alive.get(attempt % alive.len().max(1)) else {
                return Err(PortableError::Harness(format!(
                    "no SDK harness is left to merge the windows of '{}'",
                    self.transform
                )));
            };
            let inputs = BundleInputs {
                data: vec![(READ.to_string(), request.clone())],
                ..Default::default()
            };
            let state = BundleState {
                side_inputs: None,
                user: None,
            };
            let instruction = self.workers.new_instruction();
            let sinks = [WRITE.to_string()];
            let done = self.runtime.block_on(self.workers.process_bundle(
                worker,
                instruction,
                &self.descriptor,
                inputs,
                &sinks,
                state,
            ));
            match done {
                Ok(mut output) => {
                    let answer = output.outputs.remove(WRITE).unwrap_or_default();
                    return read_answer(&self.answer, &self.window, &answer, &self.transform);
                }
                Err(e) => {
                    tracing::warn!(transform = %self.transform, attempt, "merging windows: {e}");
                    last = e.to_string();
                }
            }
        }
        Err(PortableError::Bundle {
            stage: format!("{} (merging windows)", self.transform),
            attempts: ATTEMPTS,
            message: last,
        })
    }
}

/// Reads the harness's answer (elements of `answer`, windows of `window`) into [`Merged`].
fn read_answer(
    answer: &Shape,
    window: &Shape,
    blocks: &[Bytes],
    transform: &str,
) -> Result<Merged, PortableError> {
    let unmerged = Shape::Iterable(Box::new(window.clone()));
    let merge = Shape::Kv(Box::new(window.clone()), Box::new(unmerged.clone()));
    let mut merged = Merged::new();
    for block in blocks {
        let mut pos = 0;
        while pos < block.len() {
            let element = Windowed::read(answer, block, pos)?;
            pos = element.end;
            let v = element.value;
            let (len, at) = read_varint(v, 0)?;
            let key_end = at + len as usize;
            let key = v.get(at..key_end).ok_or_else(|| cut_short(transform))?;
            let after_unmerged = unmerged.skip(v, key_end)?;
            let (merges, _) = iterable_items(&merge, v, after_unmerged)?;
            for m in merges {
                let window_end = window.skip(m, 0)?;
                let (originals, _) = iterable_items(window, m, window_end)?;
                for original in originals {
                    merged.insert((key.to_vec(), original.to_vec()), m[..window_end].to_vec());
                }
            }
        }
    }
    Ok(merged)
}

fn cut_short(transform: &str) -> PortableError {
    PortableError::Coding {
        coder: format!("{transform} merge answer"),
        reason: "element cut short".into(),
    }
}

/// Each key (as the nonce, a byte string) with its windows, in the global window, in blocks of
/// whole elements.
fn request(per_key: &[(&[u8], Vec<&[u8]>)]) -> Vec<Bytes> {
    let mut blocks = Vec::new();
    let mut block = Vec::new();
    let mut value = Vec::new();
    for (key, windows) in per_key {
        value.clear();
        write_varint(&mut value, key.len() as u64);
        value.extend_from_slice(key);
        value.extend_from_slice(&(windows.len() as i32).to_be_bytes());
        for w in windows {
            value.extend_from_slice(w);
        }
        in_the_global_window(&mut block, &value);
        if block.len() >= BLOCK_BYTES {
            blocks.push(Bytes::from(std::mem::take(&mut block)));
        }
    }
    if !block.is_empty() {
        blocks.push(Bytes::from(block));
    }
    blocks
}

/// The MergeWindows descriptor (a data source, the SDK's MergeWindows with the strategy's
/// WindowFn, a data sink) and the id of its answer's windowed coder. Coders as Beam's
/// FnApiRunner builds them: in `KV(bytes, Iterable(W))`, out
/// `KV(bytes, KV(Iterable(W), Iterable(KV(W, Iterable(W)))))`, both in the global window.
fn descriptor(
    url: &str,
    components: &Components,
    strategy: &WindowingStrategy,
    id: &str,
) -> (ProcessBundleDescriptor, String) {
    let mut c = Components {
        coders: components.coders.clone(),
        ..Default::default()
    };
    let coder = |c: &mut Components, urn: &str, parts: &[&str]| {
        let parts = parts.iter().map(|p| p.to_string()).collect();
        add_coder(c, "merge_windows", urn, parts)
    };
    let window = strategy.window_coder_id.as_str();
    let bytes = coder(&mut c, urns::BYTES, &[]);
    let global = coder(&mut c, urns::GLOBAL_WINDOW, &[]);
    let windows = coder(&mut c, urns::ITERABLE, &[window]);
    let input = coder(&mut c, urns::KV, &[&bytes, &windows]);
    let one_merge = coder(&mut c, urns::KV, &[window, &windows]);
    let merges = coder(&mut c, urns::ITERABLE, &[&one_merge]);
    let result = coder(&mut c, urns::KV, &[&windows, &merges]);
    let output = coder(&mut c, urns::KV, &[&bytes, &result]);
    let windowed_input = coder(&mut c, urns::WINDOWED_VALUE, &[&input, &global]);
    let windowed_output = coder(&mut c, urns::WINDOWED_VALUE, &[&output, &global]);

    let global_strategy = WindowingStrategy {
        window_fn: Some(FunctionSpec {
            urn: urns::GLOBAL_WINDOWS.into(),
            payload: Vec::new(),
        }),
        merge_status: merge_status::Enum::NonMerging as i32,
        window_coder_id: global.clone(),
        trigger: Some(Trigger {
            trigger: Some(trigger::Trigger::Default(trigger::Default {})),
        }),
        accumulation_mode: accumulation_mode::Enum::Discarding as i32,
        output_time: output_time::Enum::EndOfWindow as i32,
        closing_behavior: closing_behavior::Enum::EmitIfNonempty as i32,
        allowed_lateness: 0,
        on_time_behavior: on_time_behavior::Enum::FireIfNonempty as i32,
        assigns_to_one_window: true,
        environment_id: strategy.environment_id.clone(),
    };
    let strategy_id = format!("{id}/global");
    let pcollection = |name: &str, coder_id: &str| PCollection {
        unique_name: name.to_string(),
        coder_id: coder_id.to_string(),
        is_bounded: is_bounded::Enum::Bounded as i32,
        windowing_strategy_id: strategy_id.clone(),
        display_data: Vec::new(),
    };
    let port = |coder_id: &str| {
        RemoteGrpcPort {
            api_service_descriptor: Some(ApiServiceDescriptor {
                url: url.to_string(),
                authentication: None,
            }),
            coder_id: coder_id.to_string(),
        }
        .encode_to_vec()
    };
    let transform = |name: &str, urn: &str, payload: Vec<u8>, input: &str, output: &str| {
        let one = |p: &str| match p {
            "" => HashMap::new(),
            p => HashMap::from([("0".to_string(), p.to_string())]),
        };
        PTransform {
            unique_name: name.to_string(),
            spec: Some(FunctionSpec {
                urn: urn.to_string(),
                payload,
            }),
            inputs: one(input),
            outputs: one(output),
            environment_id: match urn {
                urns::MERGE_WINDOWS => strategy.environment_id.clone(),
                _ => String::new(),
            },
            ..Default::default()
        }
    };
    let window_fn = strategy
        .window_fn
        .as_ref()
        .map(Message::encode_to_vec)
        .unwrap_or_default();
    let descriptor = ProcessBundleDescriptor {
        id: id.to_string(),
        transforms: HashMap::from([
            (
                READ.to_string(),
                transform(READ, urns::DATA_INPUT, port(&windowed_input), "", "windows"),
            ),
            (
                "merge_windows".to_string(),
                transform(
                    "MergeWindows",
                    urns::MERGE_WINDOWS,
                    window_fn,
                    "windows",
                    "merged",
                ),
            ),
            (
                WRITE.to_string(),
                transform(
                    WRITE,
                    urns::DATA_OUTPUT,
                    port(&windowed_output),
                    "merged",
                    "",
                ),
            ),
        ]),
        pcollections: HashMap::from([
            ("windows".to_string(), pcollection("windows", &input)),
            ("merged".to_string(), pcollection("merged", &output)),
        ]),
        windowing_strategies: HashMap::from([(strategy_id.clone(), global_strategy)]),
        coders: c.coders,
        environments: components.environments.clone(),
        state_api_service_descriptor: Some(ApiServiceDescriptor {
            url: url.to_string(),
            authentication: None,
        }),
        ..Default::default()
    };
    (descriptor, windowed_output)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coders::Interval;

    #[test]
    fn a_request_holds_each_key_with_its_windows_in_the_global_window() {
        let (a, b) = (
            Interval { start: 0, end: 10 },
            Interval { start: 5, end: 20 },
        );
        let (a, b) = (a.encode(), b.encode());
        let blocks = request(&[(b"k1", vec![&a, &b]), (b"k2", vec![&b])]);
        let shape = Shape::WindowedValue {
            value: Box::new(Shape::Kv(
                Box::new(Shape::Bytes),
                Box::new(Shape::Iterable(Box::new(Shape::IntervalWindow))),
            )),
            window: Box::new(Shape::GlobalWindow),
        };
        let elements = shape.split(&blocks[0]).unwrap();
        assert_eq!(elements.len(), 2);
        let first = Windowed::read(&shape, elements[0], 0).unwrap();
        assert_eq!(first.windows, vec![&[] as &[u8]]);
        assert_eq!(&first.value[..3], b"\x02k1");
        let (windows, end) = iterable_items(&Shape::IntervalWindow, first.value, 3).unwrap();
        assert_eq!(windows, vec![&a[..], &b[..]]);
        assert_eq!(end, first.value.len());
    }

    #[test]
    fn an_answer_maps_each_original_window_to_the_one_it_merged_into() {
        let w = |start, end| Interval { start, end }.encode();
        let (a, b, c, m) = (w(0, 10), w(5, 15), w(40, 50), w(0, 15));
        // KV(b"k", KV([c], [KV(m, [a, b])])) in the global window, as the SDK writes it.
        let mut value = b"\x01k".to_vec();
        value.extend_from_slice(&1i32.to_be_bytes());
        value.extend_from_slice(&c);
        value.extend_from_slice(&1i32.to_be_bytes());
        value.extend_from_slice(&m);
        value.extend_from_slice(&2i32.to_be_bytes());
        value.extend_from_slice(&a);
        value.extend_from_slice(&b);
        let mut block = Vec::new();
        in_the_global_window(&mut block, &value);
        let window = Box::new(Shape::IntervalWindow);
        let windows = Box::new(Shape::Iterable(window.clone()));
        let answer = Shape::WindowedValue {
            value: Box::new(Shape::Kv(
                Box::new(Shape::Bytes),
                Box::new(Shape::Kv(
                    windows.clone(),
                    Box::new(Shape::Iterable(Box::new(Shape::Kv(window, windows)))),
                )),
            )),
            window: Box::new(Shape::GlobalWindow),
        };
        let merged =
            read_answer(&answer, &Shape::IntervalWindow, &[Bytes::from(block)], "G").unwrap();
        let k = b"k".to_vec();
        assert_eq!(merged.len(), 2, "{merged:?}");
        assert_eq!(merged[&(k.clone(), a)], m);
        assert_eq!(merged[&(k.clone(), b)], m);
        assert!(!merged.contains_key(&(k, c)));
    }
}
