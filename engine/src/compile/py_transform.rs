//! `PyTransform`: a Beam Python PTransform, on Beam's Python SDK (`crate::python_sdk`). Its
//! output schema is the one Beam infers for the PTransform's output, asked of the SDK here, so
//! everything after it is checked as after any transform.
use riverbank_elements::columns::{has_window, user_schema};
use riverbank_pipeline::windowing::WindowFn;
use serde_json::{Map, Value};

use super::{CompiledTransform, Cx, Step};
use crate::python_sdk::{self, PyTransformSpec};

pub(super) async fn py_transform(
    cx: &Cx<'_>,
    config: &Map<String, Value>,
    input_window: &WindowFn,
    streaming: bool,
) -> Step {
    if streaming {
        return Err(cx.err(
            "",
            "a PyTransform runs in batch jobs here (`riverbank run` takes a streaming pipeline \
             with one whole through Beam's Python SDK)"
                .into(),
        ));
    }
    if *input_window != WindowFn::Global || cx.inputs.iter().any(|s| has_window(s)) {
        return Err(cx.err(
            "input",
            "a PyTransform takes inputs in the global window: its stage gives Beam's SDK the \
             rows without their windows (window after it instead)"
                .into(),
        ));
    }
    let sdk = python_sdk::sdk().map_err(|m| cx.err("", m))?;
    let spec = PyTransformSpec {
        name: cx.t.name.clone(),
        config: config.clone(),
        inputs: cx
            .t
            .inputs
            .iter()
            .zip(cx.inputs)
            .map(|((tag, _), s)| (tag.clone(), user_schema(s)))
            .collect(),
    };
    let schema = sdk.output_schema(&spec).await.map_err(|m| cx.err("", m))?;
    Ok((
        CompiledTransform::PyTransform {
            spec,
            output_schema: schema.clone(),
        },
        cx.main(schema),
    ))
}
