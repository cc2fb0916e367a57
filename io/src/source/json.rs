//! JSON lines sources: schema inference from a sample, and a decoder that names the bad
//! line of a failed batch.

use std::collections::VecDeque;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{Schema, SchemaRef};
use arrow::error::ArrowError;

use super::super::IoError;
use super::decode::{ChunkDecoder, Position};
use super::lines::count_newlines;
use super::{INFER_RECORDS, ReadOptions, parse_error};

/// The file schema arrow-json infers from the first [`INFER_RECORDS`] records of `head`.
pub(super) fn infer_schema(head: &[u8], shown: &str) -> Result<Schema, IoError> {
    Ok(
        arrow::json::reader::infer_json_schema(head, Some(INFER_RECORDS))
            .map_err(|e| parse_error("JSON", shown, String::new(), e))?
            .0,
    )
}

pub(super) fn decoder(
    opts: &ReadOptions,
    schema: &SchemaRef,
    start: u64,
    shown: &str,
) -> Result<JsonChunks, IoError> {
    let decoder = arrow::json::ReaderBuilder::new(Arc::clone(schema))
        .with_batch_size(opts.batch_size())
        .with_coerce_primitive(true)
        .build_decoder()
        .map_err(|e| IoError::schema(shown, e.to_string()))?;
    Ok(JsonChunks {
        decoder,
        position: Position::new(shown, start),
        batch_first_line: 1,
    })
}

pub(super) struct JsonChunks {
    decoder: arrow::json::reader::Decoder,
    position: Position,
    /// First line of the batch being built (1-based), for conversion errors.
    batch_first_line: u64,
}

impl JsonChunks {
    fn flush(&mut self, out: &mut VecDeque<RecordBatch>, last_line: u64) -> Result<(), IoError> {
        match self.decoder.flush() {
            Ok(Some(batch)) => out.push_back(batch),
            Ok(None) => {}
            Err(e) => {
                let position = self
                    .position
                    .lines(self.batch_first_line, last_line.max(self.batch_first_line));
                return Err(parse_error("JSON", &self.position.shown, position, e));
            }
        }
        self.batch_first_line = last_line + 1;
        Ok(())
    }

    /// Finds the first line of `chunk` that is not valid JSON, to name it in the error.
    fn syntax_error(&self, chunk: &[u8], lines_before: u64, e: ArrowError) -> IoError {
        let mut line = lines_before;
        for raw in chunk.split(|&b| b == b'\n') {
            line += 1;
            let trimmed = raw.strip_suffix(b"\r").unwrap_or(raw);
            if trimmed.iter().all(|b| b.is_ascii_whitespace()) {
                continue;
            }
            if let Err(bad) = serde_json::from_slice::<serde::de::IgnoredAny>(trimmed) {
                return IoError::Parse {
                    format: "JSON",
                    location: self.position.shown.clone(),
                    position: self.position.line(line),
                    message: format!("{bad} ({e})"),
                };
            }
        }
        parse_error(
            "JSON",
            &self.position.shown,
            self.position.line(lines_before + 1),
            e,
        )
    }
}

impl ChunkDecoder for JsonChunks {
    fn push(&mut self, chunk: &[u8], out: &mut VecDeque<RecordBatch>) -> Result<(), IoError> {
        let lines_before = self.position.lines;
        let mut buf = chunk;
        let mut lines = lines_before;
        while !buf.is_empty() {
            let n = match self.decoder.decode(buf) {
                Ok(n) => n,
                Err(e) => return Err(self.syntax_error(chunk, lines_before, e)),
            };
            lines += count_newlines(&buf[..n]) as u64;
            buf = &buf[n..];
            if !buf.is_empty() {
                // The decoder stops when a batch is full.
                if n == 0 && self.decoder.is_empty() {
                    return Err(parse_error(
                        "JSON",
                        &self.position.shown,
                        self.position.line(lines + 1),
                        ArrowError::JsonError("decoder made no progress".into()),
                    ));
                }
                self.flush(out, lines)?;
            }
        }
        self.position.lines = lines;
        Ok(())
    }

    fn finish(&mut self, out: &mut VecDeque<RecordBatch>) -> Result<(), IoError> {
        if self.decoder.has_partial_record() {
            return Err(parse_error(
                "JSON",
                &self.position.shown,
                self.position.line(self.position.lines.max(1)),
                ArrowError::JsonError("the last record is incomplete".into()),
            ));
        }
        let last = self.position.lines + 1;
        self.flush(out, last)
    }
}
