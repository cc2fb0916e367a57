//! Element-wise transforms: one op each, with its output schema (hidden columns carried
//! through unless the transform sets them).

use arrow::datatypes::{DataType, Field, Schema};
use riverbank_pipeline::config::{EmptyMatch, Expr};
use riverbank_pipeline::windowing::WindowFn;
use std::sync::Arc;

use super::{Cx, Step};
use crate::ops::Kind;
use riverbank_elements::columns::{self, TS, WINDOW_END, WINDOW_START, has_window, ts_field};
use riverbank_udf::expr::Role;

pub(super) fn map_to_fields(
    cx: &Cx<'_>,
    append: bool,
    drop: &[String],
    fields: &[(String, Expr)],
) -> Step {
    let user = &cx.user;
    for d in drop {
        cx.field_index("drop", d)?;
    }
    if append {
        // As Beam: appending may not silently replace an input field (drop it first).
        if let Some((n, _)) = fields
            .iter()
            .find(|(n, _)| user.index_of(n).is_ok() && !drop.contains(n))
        {
            return Err(cx.err(
                &format!("fields.{n}"),
                format!(
                    "cannot append field '{n}': the input already has a field '{n}' (drop it to redefine it)"
                ),
            ));
        }
    }
    let mut compiled = vec![];
    let mut errs = vec![];
    for (n, e) in fields {
        match cx.compile(&format!("fields.{n}"), e) {
            Ok(c) => compiled.push((n.clone(), c)),
            Err(e) => errs.extend(e),
        }
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    let keep: Vec<usize> = if append {
        (0..user.fields().len())
            .filter(|&i| {
                let n = user.field(i).name();
                !drop.contains(n) && !fields.iter().any(|(f, _)| f == n)
            })
            .collect()
    } else {
        vec![]
    };
    let mut out: Vec<Field> = keep.iter().map(|&i| user.field(i).clone()).collect();
    out.extend(
        compiled
            .iter()
            .map(|(n, c)| Field::new(n, c.data_type.clone(), true)),
    );
    Ok(cx.element(
        Kind::MapToFields {
            keep,
            fields: compiled,
        },
        cx.with_hidden(out),
    ))
}

pub(super) fn filter(cx: &Cx<'_>, keep: &Expr) -> Step {
    let c = cx.compile_as("keep", keep, Role::Predicate)?;
    if c.data_type != DataType::Boolean {
        return Err(cx.err(
            "keep",
            format!(
                "'{}' must be a boolean expression, it is {}",
                keep.text, c.data_type
            ),
        ));
    }
    Ok(cx.element(Kind::Filter { keep: c }, cx.input.clone()))
}

pub(super) fn explode(cx: &Cx<'_>, fields: &[String], cross_product: bool) -> Step {
    let user = &cx.user;
    let mut idx = vec![];
    let mut out: Vec<Field> = user.fields().iter().map(|f| f.as_ref().clone()).collect();
    for f in fields {
        let i = cx.field_index("fields", f)?;
        match user.field(i).data_type() {
            DataType::List(item) => out[i] = Field::new(f, item.data_type().clone(), true),
            // As Beam (Python iterates it): a string explodes into its characters.
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
                out[i] = Field::new(f, DataType::Utf8, true)
            }
            other => {
                return Err(cx.err(
                    "fields",
                    format!("field '{f}' is a {other}, not a list or a string"),
                ));
            }
        }
        idx.push(i);
    }
    Ok(cx.element(
        Kind::Explode {
            fields: idx,
            cross_product,
        },
        cx.with_hidden(out),
    ))
}

pub(super) fn partition(
    cx: &Cx<'_>,
    by: &Expr,
    outputs: &[String],
    unknown_output: Option<&str>,
) -> Step {
    let name = &cx.t.name;
    let c = cx.compile_as("by", by, Role::Name)?;
    let outs: Vec<(String, String)> = outputs
        .iter()
        .map(|o| (o.clone(), format!("{name}.{o}")))
        .collect();
    let unknown = unknown_output.map(|u| format!("{name}.{u}"));
    let (ct, mut o) = cx.element(
        Kind::Partition {
            by: c,
            outputs: outs.clone(),
            unknown: unknown.clone(),
        },
        cx.input.clone(),
    );
    // Partition has no main output: one collection per named output.
    o.retain(|(c, _)| c != name);
    for c in outs.iter().map(|(_, c)| c).chain(unknown.as_ref()) {
        o.push((c.clone(), cx.input.clone()));
    }
    Ok((ct, o))
}

pub(super) fn assign_timestamps(cx: &Cx<'_>, timestamp: &Expr) -> Step {
    let c = cx.compile_as("timestamp", timestamp, Role::Timestamp)?;
    let mut fields: Vec<Field> = cx
        .input
        .fields()
        .iter()
        .filter(|f| f.name() != TS)
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(ts_field(TS));
    Ok(cx.element(
        Kind::AssignTimestamps { timestamp: c },
        Arc::new(Schema::new(fields)),
    ))
}

pub(super) fn window_into(cx: &Cx<'_>, windowing: WindowFn) -> Step {
    // Elements without an event timestamp have the minimum one, as in Beam.
    let mut fields: Vec<Field> = cx
        .input
        .fields()
        .iter()
        .filter(|f| f.name() != WINDOW_START && f.name() != WINDOW_END)
        .map(|f| f.as_ref().clone())
        .collect();
    if windowing != WindowFn::Global {
        fields.push(ts_field(WINDOW_START));
        fields.push(ts_field(WINDOW_END));
    }
    Ok(cx.element(
        Kind::WindowInto { window: windowing },
        Arc::new(Schema::new(fields)),
    ))
}

pub(super) fn extract_windowing_info(cx: &Cx<'_>, fields: &[(String, String)]) -> Step {
    let user = &cx.user;
    let mut out: Vec<Field> = user.fields().iter().map(|f| f.as_ref().clone()).collect();
    for (f, param) in fields {
        if user.index_of(f).is_ok() {
            return Err(cx.err("fields", format!("the input already has a field '{f}'")));
        }
        out.push(match param.as_str() {
            "window_type" | "window_string" => Field::new(f, DataType::Utf8, false),
            "pane_info" => Field::new(f, columns::pane_type(), false),
            _ => Field::new(f, columns::ts_type(), true),
        });
    }
    Ok(cx.element(
        Kind::ExtractWindowingInfo {
            fields: fields.to_vec(),
        },
        cx.with_hidden(out),
    ))
}

pub(super) fn flatten(cx: &Cx<'_>) -> Step {
    // The union of the inputs' fields, each widened to a type that holds every input's values
    // (`widen.rs`); an event timestamp when any input has one (absent = the minimum).
    let mut fields = arrow::datatypes::Fields::empty();
    for s in cx.inputs {
        let user = columns::user_schema(s);
        fields = riverbank_elements::widen::unify_fields(&fields, user.fields());
    }
    let mut fields: Vec<Field> = fields.iter().map(|f| f.as_ref().clone()).collect();
    if cx.inputs.iter().any(|s| s.index_of(TS).is_ok()) {
        fields.push(ts_field(TS));
    }
    let windowed: Vec<bool> = cx.inputs.iter().map(|s| has_window(s)).collect();
    if windowed.iter().any(|w| *w != windowed[0]) {
        return Err(cx.err(
            "input",
            "inputs have different windowing; window them the same way before Flatten".into(),
        ));
    }
    if windowed.first() == Some(&true) {
        fields.push(ts_field(WINDOW_START));
        fields.push(ts_field(WINDOW_END));
    }
    Ok(cx.element(Kind::Flatten, Arc::new(Schema::new(fields))))
}

pub(super) fn log_for_testing(cx: &Cx<'_>, level: &str, prefix: &str) -> Step {
    Ok(cx.element(
        Kind::LogForTesting {
            level: level.to_string(),
            prefix: prefix.to_string(),
        },
        cx.input.clone(),
    ))
}

/// Beam's `MatchAll`: the pattern is `file_pattern`'s field, or the input's only field; as
/// Beam, any other choice is refused naming the fields.
pub(super) fn match_all(cx: &Cx<'_>, file_pattern: Option<&str>, empty: EmptyMatch) -> Step {
    let names: Vec<&String> = cx.user.fields().iter().map(|f| f.name()).collect();
    let field = match (file_pattern, names.as_slice()) {
        (Some(f), _) if names.iter().any(|n| *n == f) => f.to_string(),
        (Some(f), _) => {
            return Err(cx.err(
                "file_pattern",
                format!("field '{f}' not found in input schema fields: {names:?}"),
            ));
        }
        (None, [only]) => only.to_string(),
        (None, _) => {
            return Err(cx.err(
                "file_pattern",
                format!(
                    "the input has fields {names:?}: name the one holding the pattern in \
                     'file_pattern'"
                ),
            ));
        }
    };
    Ok(cx.element(
        Kind::MatchAll { field, empty },
        cx.with_hidden(crate::match_all::output_fields()),
    ))
}
