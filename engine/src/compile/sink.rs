//! Sinks: the write options, and the shapes a format cannot write caught before running.

use riverbank_pipeline::config::{FileFormat, WriteConfig};

use super::{CompiledTransform, Cx, Step, field_list, io_format};
use riverbank_io as io;

pub(super) fn write(cx: &Cx<'_>, wc: &WriteConfig) -> Step {
    let options = io::WriteOptions {
        format: io_format(wc.format),
        path: wc.path.clone(),
        num_shards: wc.num_shards,
        shard_name_template: wc.shard_name_template.clone(),
        file_name_suffix: wc.file_name_suffix.clone(),
    };
    let user = &cx.user;
    if wc.format == FileFormat::Text && !io::is_text_schema(user) {
        return Err(cx.err(
            "",
            format!(
                "WriteToText needs rows with one string field; got fields [{}] (use MapToFields to format a line)",
                field_list(user)
            ),
        ));
    }
    if wc.format == FileFormat::Csv
        && let Some(f) = user.fields().iter().find(|f| f.data_type().is_nested())
    {
        return Err(cx.err(
            "",
            format!(
                "WriteToCsv cannot write nested field '{}' ({})",
                f.name(),
                f.data_type()
            ),
        ));
    }
    Ok((
        CompiledTransform::Write {
            options,
            schema: user.clone(),
        },
        cx.main(crate::written_files::schema()),
    ))
}

/// A Kafka or NATS sink: a checkpoint's rows are staged as Parquet parts under `staging`, and
/// the checkpoint's commit writes them to the broker, exactly once (see `riverbank_streaming::driver`).
pub(super) fn write_connector(cx: &Cx<'_>, staging: &str) -> (CompiledTransform, super::Outs) {
    let path = format!(
        "{}/{}/part",
        staging.trim_end_matches('/'),
        crate::shards::state_name(&cx.t.name)
    );
    (
        CompiledTransform::Write {
            options: io::WriteOptions::new(io::FileFormat::Parquet, path),
            schema: cx.user.clone(),
        },
        vec![],
    )
}
