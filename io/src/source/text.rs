//! Text sources: one non-null string column `line`, a row per line.

use std::collections::VecDeque;
use std::sync::Arc;

use arrow::array::{ArrayBuilder, RecordBatch, StringBuilder};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use object_store::ObjectMeta;

use super::super::IoError;
use super::super::location::Resolved;
use super::decode::{ChunkDecoder, Position};
use super::lines::{count_newlines, line_splits};
use super::{ReadOptions, SourcePlan};

pub(super) fn plan(
    opts: &ReadOptions,
    resolved: &Resolved,
    files: &[ObjectMeta],
    target: u64,
) -> Result<SourcePlan, IoError> {
    if let Some(cols) = &opts.columns
        && let Some(column) = cols.iter().find(|c| *c != "line")
    {
        return Err(IoError::MissingColumn {
            column: column.clone(),
            location: opts.path.clone(),
            available: "line".into(),
        });
    }
    Ok(SourcePlan {
        schema: text_schema(),
        splits: line_splits(resolved, files, target, None),
    })
}

fn text_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new("line", DataType::Utf8, false)]))
}

pub(super) fn decoder(
    opts: &ReadOptions,
    schema: &SchemaRef,
    start: u64,
    shown: &str,
) -> TextChunks {
    TextChunks {
        builder: StringBuilder::new(),
        batch_size: opts.batch_size(),
        schema: Arc::clone(schema),
        position: Position::new(shown, start),
    }
}

pub(super) struct TextChunks {
    builder: StringBuilder,
    batch_size: usize,
    schema: SchemaRef,
    position: Position,
}

impl TextChunks {
    fn emit(&mut self, out: &mut VecDeque<RecordBatch>) -> Result<(), IoError> {
        let array = Arc::new(self.builder.finish());
        let batch = RecordBatch::try_new(Arc::clone(&self.schema), vec![array])
            .map_err(|e| IoError::schema(&self.position.shown, e.to_string()))?;
        out.push_back(batch);
        Ok(())
    }
}

impl ChunkDecoder for TextChunks {
    fn push(&mut self, chunk: &[u8], out: &mut VecDeque<RecordBatch>) -> Result<(), IoError> {
        let text = std::str::from_utf8(chunk).map_err(|e| {
            let line = self.position.lines + count_newlines(&chunk[..e.valid_up_to()]) as u64 + 1;
            IoError::Parse {
                format: "text",
                location: self.position.shown.clone(),
                position: self.position.line(line),
                message: "invalid UTF-8".into(),
            }
        })?;
        for line in text.split_terminator('\n') {
            self.builder
                .append_value(line.strip_suffix('\r').unwrap_or(line));
            if self.builder.len() >= self.batch_size {
                self.emit(out)?;
            }
        }
        self.position.lines += count_newlines(chunk) as u64;
        Ok(())
    }

    fn finish(&mut self, out: &mut VecDeque<RecordBatch>) -> Result<(), IoError> {
        if self.builder.len() > 0 {
            self.emit(out)?;
        }
        Ok(())
    }
}
