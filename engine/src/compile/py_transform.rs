//! `PyTransform`: a Beam Python PTransform, on Beam's Python SDK (`crate::python_sdk`). Its
//! output schema is the one Beam infers for the PTransform's output, asked of the SDK here, so
//! everything after it is checked as after any transform; so is its output's window fn.
use arrow::datatypes::{Schema, SchemaRef};
use riverbank_elements::columns::PANE;
use riverbank_pipeline::windowing::WindowFn;
use serde_json::{Map, Value};
use std::sync::Arc;

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
    let sdk = python_sdk::sdk().map_err(|m| cx.err("", m))?;
    let spec = PyTransformSpec {
        name: cx.t.name.clone(),
        config: config.clone(),
        inputs: cx
            .t
            .inputs
            .iter()
            .zip(cx.inputs)
            .map(|((tag, _), s)| (tag.clone(), without_panes(s)))
            .collect(),
        window: *input_window,
    };
    let output = sdk.output(&spec).await.map_err(|m| cx.err("", m))?;
    Ok((
        CompiledTransform::PyTransform {
            spec,
            output_schema: output.schema.clone(),
            output_window: output.window,
        },
        cx.main(output.schema),
    ))
}

/// `schema` without the pane column: Beam's panes are its own GroupByKey's.
fn without_panes(schema: &Schema) -> SchemaRef {
    let fields: Vec<_> = schema
        .fields()
        .iter()
        .filter(|f| f.name() != PANE)
        .cloned()
        .collect();
    Arc::new(Schema::new(fields))
}
