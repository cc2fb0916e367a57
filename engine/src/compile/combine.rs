//! `Combine`: group-by keys, the aggregates' value expressions, and the output schema.

use arrow::datatypes::{Field, Schema, SchemaRef};
use riverbank_pipeline::config::AggregateConfig;
use std::sync::Arc;

use super::{CombineOp, CompiledTransform, Cx, Step};
use crate::combine::{AggregateSpec, CombineFn, CombineSpec, CustomFn};
use crate::compiled::Slices;
use riverbank_elements::columns::{self, TS, WINDOW_END, WINDOW_START, has_window, ts_field};
use riverbank_pipeline::trigger::Triggering;
use riverbank_pipeline::windowing::WindowFn;

pub(super) fn combine(
    cx: &Cx<'_>,
    group_by: &[String],
    aggregates: &[AggregateConfig],
    windowing: &(WindowFn, Triggering),
    streaming: bool,
) -> Step {
    let (sessions, triggering) = (windowing.0.is_merging(), &windowing.1);
    let mut key_fields = vec![];
    let mut keys = vec![];
    for g in group_by {
        let i = cx.field_index("group_by", g)?;
        keys.push(i);
        key_fields.push(cx.user.field(i).clone());
    }
    let windowed = has_window(&cx.input);
    if windowed {
        key_fields.push(ts_field(WINDOW_START));
        key_fields.push(ts_field(WINDOW_END));
    }
    let mut specs = vec![];
    let mut values = vec![];
    for a in aggregates {
        let builtin = a.func.parse::<CombineFn>();
        let input_type = match &a.value {
            Some(v) => {
                let c = cx.compile(&format!("combine.{}.value", a.output), v)?;
                let ty = c.data_type.clone();
                values.push(c);
                Some(ty)
            }
            None => None,
        };
        match (builtin, input_type) {
            (Ok(func), input_type) => {
                specs.push(AggregateSpec::new(a.output.clone(), func, input_type))
            }
            // The parser lets a non-built-in fn through only with language: python and a value.
            (Err(_), Some(input_type)) => {
                let custom = custom_fn(a, &input_type)
                    .map_err(|m| cx.err(&format!("combine.{}.fn", a.output), m))?;
                specs.push(AggregateSpec::custom(a.output.clone(), custom, input_type));
            }
            (Err(e), None) => return Err(cx.err(&format!("combine.{}", a.output), e.to_string())),
        }
    }
    if windowed && triggering.trigger.counts_elements() {
        specs.push(AggregateSpec::new(
            super::ELEMENT_COUNT,
            CombineFn::Count,
            None,
        ));
    }
    let spec = Arc::new(CombineSpec {
        key_fields,
        aggregates: specs,
    });
    let out = spec
        .output_schema()
        .map_err(|e| cx.err("combine", e.to_string()))?;
    spec.state_schema()
        .map_err(|e| cx.err("combine", e.to_string()))?;
    // Output: user keys and aggregates, then the window and the end-of-window timestamp.
    let mut fields: Vec<Field> = out
        .fields()
        .iter()
        .filter(|f| !columns::is_hidden(f.name()))
        .map(|f| f.as_ref().clone())
        .collect();
    if windowed {
        fields.push(ts_field(WINDOW_START));
        fields.push(ts_field(WINDOW_END));
        fields.push(ts_field(TS));
        fields.push(Field::new(columns::PANE, columns::pane_type(), false));
    }
    let output_schema: SchemaRef = Arc::new(Schema::new(fields));
    Ok((
        CompiledTransform::Combine(CombineOp {
            spec,
            keys,
            values,
            windowed,
            sessions,
            triggering: triggering.clone(),
            // Only windows fired once each, at the watermark (`Slices::of`).
            slices: streaming
                .then(|| Slices::of(&windowing.0, triggering))
                .flatten(),
            output_schema: output_schema.clone(),
        }),
        cx.main(output_schema),
    ))
}

/// A python CombineFn, loaded (a bad name or config fails here) and its output type inferred.
fn custom_fn(a: &AggregateConfig, input: &arrow::datatypes::DataType) -> Result<CustomFn, String> {
    let config = a
        .fn_config
        .as_ref()
        .map(|c| serde_json::Value::Object(c.clone()).to_string());
    #[cfg(feature = "python")]
    return riverbank_udf::python::combine::compile(&a.func, config.as_deref(), input)
        .map_err(|m| format!("cannot load python CombineFn '{}': {m}", a.func));
    #[cfg(not(feature = "python"))]
    {
        let _ = (config, input);
        Err(format!(
            "python CombineFn '{}': this riverbank was built without Python (the `python` feature)",
            a.func
        ))
    }
}
