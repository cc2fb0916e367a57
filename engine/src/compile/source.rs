//! Sources: files read with a planned split list, and elements given inline (`Create`).

use riverbank_pipeline::config::ReadConfig;
use serde_json::Value;

use super::{CompiledTransform, Cx, Step, TARGET_SPLIT_BYTES, io_format};
use riverbank_elements::json_rows::batch_from_elements;
use riverbank_io as io;

/// An unbounded source: its schema is the generator's (or the connector's), known offline.
pub(super) fn read_stream(
    cx: &Cx<'_>,
    spec: super::StreamSpec,
    schema: arrow::datatypes::SchemaRef,
) -> (CompiledTransform, super::Outs) {
    (
        CompiledTransform::ReadStream(super::StreamRead {
            spec,
            schema: schema.clone(),
            splits: vec![],
        }),
        {
            // A connector's records that do not decode go to `error_handling`'s output.
            let mut outs = cx.main(schema);
            if let Some(tag) = &cx.t.error_output {
                outs.push((
                    format!("{}.{tag}", cx.t.name),
                    riverbank_io::connectors::format::bad_record_schema(),
                ));
            }
            outs
        },
    )
}

/// A bounded source of a streaming job as the stream that reads it once, or every
/// `refresh_us` (`Bounded`); any other transform as it is.
pub(super) fn bounded_as_stream(
    ct: CompiledTransform,
    refresh_us: Option<i64>,
) -> CompiledTransform {
    use riverbank_io::unbounded::Bounded;
    let (rows, schema) = match ct {
        CompiledTransform::Create { batch } => {
            let schema = batch.schema();
            (Bounded::Rows(batch), schema)
        }
        CompiledTransform::Read { options, source } => {
            let schema = source.schema.clone();
            let files = Bounded::Files {
                options,
                source,
                split_bytes: TARGET_SPLIT_BYTES,
                refresh_us,
            };
            (files, schema)
        }
        other => return other,
    };
    CompiledTransform::ReadStream(super::StreamRead {
        spec: super::StreamSpec::Bounded(std::sync::Arc::new(rows)),
        schema,
        splits: vec![],
    })
}

pub(super) async fn read(
    cx: &Cx<'_>,
    rc: &ReadConfig,
    batch_size: usize,
    known_source: Option<&arrow::datatypes::SchemaRef>,
    footers: &io::FooterMemo,
) -> Step {
    let options = io::ReadOptions {
        format: io_format(rc.format),
        path: rc.path.clone(),
        columns: rc.columns.clone(),
        csv_delimiter: rc
            .delimiter
            .as_ref()
            .and_then(|d| d.bytes().next())
            .unwrap_or(b','),
        csv_has_header: true,
        batch_size,
    };
    let source = match known_source {
        Some(schema) => io::SourcePlan {
            schema: schema.clone(),
            splits: vec![],
        },
        None => io::plan_source_with(&options, TARGET_SPLIT_BYTES, footers)
            .await
            .map_err(|e| cx.err("path", e.to_string()))?,
    };
    let schema = source.schema.clone();
    Ok((CompiledTransform::Read { options, source }, cx.main(schema)))
}

pub(super) fn create(cx: &Cx<'_>, elements: &[Value]) -> Step {
    let batch = batch_from_elements(elements).map_err(|m| cx.err("elements", m))?;
    let schema = batch.schema();
    Ok((CompiledTransform::Create { batch }, cx.main(schema)))
}
