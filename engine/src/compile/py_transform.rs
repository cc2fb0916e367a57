//! `PyTransform`: a Beam Python PTransform, on Beam's Python SDK (`crate::python_sdk`). Its
//! output schema is the one Beam infers for the PTransform's output, asked of the SDK here, so
//! everything after it is checked as after any transform; so is its output's window fn.
use arrow::datatypes::{Schema, SchemaRef};
use riverbank_elements::columns::PANE;
use riverbank_pipeline::windowing::WindowFn;
use serde_json::{Map, Value};
use std::sync::Arc;

use super::{CompiledTransform, Cx, Step};
use crate::python_sdk::{self, PyOutput, PyTransformSpec};

/// `known`: its output as the coordinator compiled it (a worker asks Beam nothing).
pub(super) async fn py_transform(
    cx: &Cx<'_>,
    config: &Map<String, Value>,
    input_window: &WindowFn,
    streaming: bool,
    known: Option<&PyOutput>,
) -> Step {
    if streaming {
        return Err(cx.err(
            "",
            "a PyTransform runs in batch jobs here (`riverbank run` takes a streaming pipeline \
             with one whole through Beam's Python SDK)"
                .into(),
        ));
    }
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
    let output = match known {
        Some(output) => output.clone(),
        None => {
            let sdk = python_sdk::sdk().map_err(|m| cx.err("", m))?;
            sdk.output(&spec).await.map_err(|m| cx.err("", m))?
        }
    };
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

#[cfg(test)]
mod tests {
    use super::super::{Known, compile_with_known};
    use crate::compile::CompiledTransform;
    use crate::python_sdk::PyOutput;
    use arrow::datatypes::{DataType, Field, Schema};
    use riverbank_pipeline::windowing::WindowFn;
    use std::collections::HashMap;
    use std::sync::Arc;

    /// A worker compiles its coordinator's plan with the PyTransform's output the coordinator
    /// got from Beam: no Python SDK is asked (none is installed in this test's process, where
    /// asking fails naming the transform).
    #[tokio::test]
    async fn a_worker_compiles_a_py_transform_with_its_coordinators_output_and_no_sdk() {
        let yaml = "pipeline:\n  transforms:\n    - {type: Create, name: In, config: {elements: [{n: 1}]}}\n    - {type: PyTransform, name: Squares, input: In, config: {constructor: apache_beam.Map}}\n    - {type: WriteToJson, input: Squares, config: {path: /nowhere/squares.jsonl}}\n";
        let plan = riverbank_pipeline::load_plan(yaml, &serde_json::Map::new(), "t").unwrap();
        let at = plan
            .graph
            .transforms
            .iter()
            .position(|t| t.name == "Squares")
            .unwrap();

        let Err(err) = compile_with_known(plan.clone(), 1024, &Known::default()).await else {
            panic!("compiled a PyTransform without a Python SDK or its output")
        };
        let err = err.to_string();
        assert!(
            err.contains("Squares") && err.contains("Python SDK"),
            "{err}"
        );

        let schema = Arc::new(Schema::new(vec![Field::new(
            "square",
            DataType::Int64,
            true,
        )]));
        let window = WindowFn::Fixed {
            size_us: 60_000_000,
            offset_us: 0,
        };
        let known = Known {
            py_outputs: HashMap::from([(
                at,
                PyOutput {
                    schema: schema.clone(),
                    window,
                },
            )]),
            ..Known::default()
        };
        let compiled = compile_with_known(plan, 1024, &known).await.unwrap();
        let CompiledTransform::PyTransform {
            output_schema,
            output_window,
            ..
        } = &compiled.transforms[at]
        else {
            panic!("a PyTransform")
        };
        assert_eq!((output_schema, *output_window), (&schema, window));
    }
}
