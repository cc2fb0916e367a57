//! CSV sources: schema inference from a sample, and a decoder for one byte range that
//! knows the file's columns even when it cannot see the header.

use std::collections::VecDeque;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::csv::reader::Format;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::error::ArrowError;

use super::super::IoError;
use super::decode::{ChunkDecoder, Position};
use super::{CsvLayout, INFER_RECORDS, ReadOptions, Split, parse_error};

/// The file schema arrow-csv infers from the first [`INFER_RECORDS`] records of `head`.
pub(super) fn infer_schema(
    opts: &ReadOptions,
    head: &[u8],
    shown: &str,
) -> Result<Schema, IoError> {
    Ok(Format::default()
        .with_header(opts.csv_has_header)
        .with_delimiter(opts.csv_delimiter)
        .infer_schema(head, Some(INFER_RECORDS))
        .map_err(|e| parse_error("CSV", shown, String::new(), e))?
        .0)
}

pub(super) fn decoder(
    opts: &ReadOptions,
    schema: &SchemaRef,
    split: &Split,
    start: u64,
    shown: &str,
) -> Result<CsvChunks, IoError> {
    let layout = split.csv.clone().unwrap_or(CsvLayout {
        columns: schema.fields().iter().map(|f| f.name().clone()).collect(),
        projection: None,
    });
    let num_columns = layout.columns.len();
    // The decoder needs every file column; unprojected ones are placeholders it never parses.
    let file_schema = match &layout.projection {
        None => Arc::clone(schema),
        Some(projection) => {
            if projection.len() != schema.fields().len()
                || projection.iter().any(|&i| i >= num_columns)
            {
                return Err(IoError::schema(
                    shown,
                    "CSV split layout does not match the schema",
                ));
            }
            let fields: Vec<Field> = layout
                .columns
                .iter()
                .enumerate()
                .map(|(i, name)| match projection.iter().position(|&p| p == i) {
                    Some(out) => schema.field(out).clone(),
                    None => Field::new(name, DataType::Utf8, true),
                })
                .collect();
            Arc::new(Schema::new(fields))
        }
    };
    // The first split of each file checks its header against the planned columns,
    // so a file with other columns is an error rather than misread data.
    let header = start == 0 && opts.csv_has_header;
    let format = Format::default()
        .with_header(header)
        .with_header_validation(header)
        .with_delimiter(opts.csv_delimiter);
    let mut builder = arrow::csv::ReaderBuilder::new(file_schema)
        .with_format(format)
        .with_batch_size(opts.batch_size());
    if let Some(projection) = layout.projection {
        builder = builder.with_projection(projection);
    }
    Ok(CsvChunks {
        decoder: builder.build_decoder(),
        shown: shown.to_string(),
        start,
    })
}

pub(super) struct CsvChunks {
    decoder: arrow::csv::reader::Decoder,
    shown: String,
    start: u64,
}

impl CsvChunks {
    fn error(&self, e: ArrowError) -> IoError {
        // arrow-csv numbers lines from where this decoder started: 0-based in
        // value errors ("at line N"), 1-based in shape errors ("for line N").
        // Move the number into our position text, 1-based.
        let position = Position::new(&self.shown, self.start);
        let (message, line) = match &e {
            ArrowError::ParseError(m) => match take_line(m, " at line ") {
                Some((rest, n)) => (rest, Some(n + 1)),
                None => (e.to_string(), None),
            },
            ArrowError::CsvError(m) => match take_line(m, " for line ") {
                Some((rest, n)) => (rest, Some(n)),
                None => (e.to_string(), None),
            },
            _ => (e.to_string(), None),
        };
        let position = match line {
            Some(n) => position.line(n),
            None if self.start == 0 => String::new(),
            None => format!(" (split starting at byte {})", self.start),
        };
        IoError::Parse {
            format: "CSV",
            location: self.shown.clone(),
            position,
            message,
        }
    }

    fn flush(&mut self, out: &mut VecDeque<RecordBatch>) -> Result<(), IoError> {
        if let Some(batch) = self.decoder.flush().map_err(|e| self.error(e))? {
            out.push_back(batch);
        }
        Ok(())
    }
}

impl ChunkDecoder for CsvChunks {
    fn push(&mut self, chunk: &[u8], out: &mut VecDeque<RecordBatch>) -> Result<(), IoError> {
        let mut buf = chunk;
        while !buf.is_empty() {
            if self.decoder.capacity() == 0 {
                self.flush(out)?;
            }
            let n = self.decoder.decode(buf).map_err(|e| self.error(e))?;
            if n == 0 && self.decoder.capacity() > 0 {
                return Err(self.error(ArrowError::CsvError("decoder made no progress".into())));
            }
            buf = &buf[n..];
        }
        Ok(())
    }

    fn finish(&mut self, out: &mut VecDeque<RecordBatch>) -> Result<(), IoError> {
        loop {
            if self.decoder.capacity() == 0 {
                self.flush(out)?;
            }
            // An empty buffer tells the decoder the input ended (delimits a last line without '\n').
            if self.decoder.decode(&[]).map_err(|e| self.error(e))? == 0 {
                break;
            }
        }
        self.flush(out)
    }
}

/// Removes `{marker}N` from an arrow message, returning the rest and N.
fn take_line(message: &str, marker: &str) -> Option<(String, u64)> {
    let at = message.find(marker)?;
    let digits_start = at + marker.len();
    let digits_len = message[digits_start..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .count();
    let n = message[digits_start..digits_start + digits_len]
        .parse()
        .ok()?;
    Some((
        format!(
            "{}{}",
            &message[..at],
            &message[digits_start + digits_len..]
        ),
        n,
    ))
}
