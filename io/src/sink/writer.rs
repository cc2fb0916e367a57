//! Writing one temp part: [`SinkWriter`] and the encoders of each format.
//!
//! Encodings: JSON lines via arrow-json (nulls omitted; floats shortest
//! round-trip such as `0.1`, `12.0`, `1.0e21`; UTC timestamps as RFC 3339 with
//! `Z`, fraction only when non-zero: `2024-01-15T00:00:00Z`,
//! `2024-01-15T00:00:00.250Z`); CSV via arrow-csv with a header line (same
//! timestamp text; naive timestamps as `2024-01-15T08:12:33`); Parquet via
//! `AsyncArrowWriter`, snappy; text writes the single string field one value per
//! line (a null becomes an empty line).
//!
//! Buffering: a local part is written behind its encoder, a chunk at a time
//! (`behind`); a remote one goes through `object_store::buffered::BufWriter`, which
//! keeps up to 10 MiB in memory and switches to a multipart upload beyond that, so
//! memory stays bounded for big outputs either way.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use bytes::Bytes;
use object_store::ObjectStoreExt;
use object_store::buffered::BufWriter;
use object_store::path::Path;
use parquet::arrow::AsyncArrowWriter;
use riverbank_elements::any;
use tokio::io::AsyncWriteExt;

use super::super::location::Resolved;
use super::super::parquet_io::writer_properties;
use super::super::{FileFormat, IoError, describe_fields, same_fields};
use super::behind::BehindWriter;
use super::naming::{Naming, join_key, unique_tag};
use super::{TempPart, WriteOptions};

/// Where a line format's encoded chunks go.
enum LinesOut {
    Local(BehindWriter),
    Store(Box<BufWriter>),
}

impl LinesOut {
    /// A local path's part is written behind its encoder; a remote one through the store.
    fn of(target: &Resolved, path: &Path) -> Self {
        if target.is_local() {
            LinesOut::Local(BehindWriter::new(target.local_path(&target.key)))
        } else {
            LinesOut::Store(Box::new(BufWriter::new(
                Arc::clone(&target.store),
                path.clone(),
            )))
        }
    }

    async fn put(&mut self, chunk: Bytes, shown: &str) -> Result<(), IoError> {
        match self {
            LinesOut::Local(out) => out
                .put(chunk)
                .await
                .map_err(|e| IoError::local("write", shown, e)),
            LinesOut::Store(out) => out
                .put(chunk)
                .await
                .map_err(|e| IoError::store("write", shown, e)),
        }
    }

    async fn finish(self, shown: &str) -> Result<(), IoError> {
        match self {
            LinesOut::Local(out) => out
                .finish()
                .await
                .map_err(|e| IoError::local("write", shown, e)),
            LinesOut::Store(mut out) => out
                .shutdown()
                .await
                .map_err(|e| IoError::local("finish", shown, e)),
        }
    }
}

/// Rows encoded at a time by a line format (~1.4 MB of Nexmark Q0's JSON).
const CHUNK_ROWS: usize = 8192;

enum WriterState {
    /// Nothing written yet: no file exists.
    Empty,
    /// CSV, JSON or text: encoded bytes go straight to the file or the store writer.
    Lines(LinesOut),
    Parquet(Box<AsyncArrowWriter<BufWriter>>),
}

/// Writes one temp part of a sink (one per sink and worker partition).
pub struct SinkWriter {
    format: FileFormat,
    target: Resolved,
    path: Path,
    part: usize,
    /// The sink's output path, for messages.
    sink: String,
    state: WriterState,
    schema: Option<SchemaRef>,
    rows: u64,
    bytes: u64,
    header_bytes: u64,
}

impl std::fmt::Debug for SinkWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkWriter")
            .field("format", &self.format)
            .field("temp", &self.target.display())
            .field("part", &self.part)
            .field("rows", &self.rows)
            .finish()
    }
}

impl SinkWriter {
    /// Prepares a temp part; no file is created until the first non-empty batch.
    pub async fn create(
        opts: &WriteOptions,
        job_token: &str,
        part: usize,
    ) -> Result<Self, IoError> {
        let naming = Naming::new(opts)?;
        let (resolved, temp_dir) = naming.temp_dir_key(job_token)?;
        let key = join_key(
            &temp_dir,
            &format!("part-{part:05}-{}{}", unique_tag(), naming.suffix),
        );
        let target = resolved.with_key(key);
        let path = target.path()?;
        Ok(SinkWriter {
            format: opts.format,
            target,
            path,
            part,
            sink: opts.path.clone(),
            state: WriterState::Empty,
            schema: None,
            rows: 0,
            bytes: 0,
            header_bytes: 0,
        })
    }

    /// Location of the temp file this writer produces.
    pub fn temp_location(&self) -> String {
        self.target.display()
    }

    /// Appends a batch. Batches of one writer must share a schema.
    pub async fn write(&mut self, batch: &RecordBatch) -> Result<(), IoError> {
        self.check_schema(batch.schema_ref())?;
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let shown = self.target.display();
        match self.format {
            FileFormat::Parquet => {
                if matches!(self.state, WriterState::Empty) {
                    let out = BufWriter::new(Arc::clone(&self.target.store), self.path.clone());
                    let writer =
                        AsyncArrowWriter::try_new(out, batch.schema(), Some(writer_properties()))
                            .map_err(|e| IoError::parquet(&shown, e))?;
                    self.state = WriterState::Parquet(Box::new(writer));
                }
                if let WriterState::Parquet(writer) = &mut self.state {
                    writer
                        .write(batch)
                        .await
                        .map_err(|e| IoError::parquet(&shown, e))?;
                }
                self.rows += batch.num_rows() as u64;
            }
            FileFormat::Csv | FileFormat::Json | FileFormat::Text => {
                let mut header = vec![];
                if matches!(self.state, WriterState::Empty) {
                    if self.format == FileFormat::Csv {
                        header = csv_header(batch.schema_ref(), &shown)?;
                        self.header_bytes = header.len() as u64;
                    }
                    self.state = WriterState::Lines(LinesOut::of(&self.target, &self.path));
                }
                let WriterState::Lines(out) = &mut self.state else {
                    unreachable!("a line format's writer was made above")
                };
                // A slice at a time, so that a local part's write of one slice overlaps the
                // encoding of the next.
                for offset in (0..batch.num_rows()).step_by(CHUNK_ROWS) {
                    let rows = batch.slice(offset, CHUNK_ROWS.min(batch.num_rows() - offset));
                    // Sized as the lines so far (no copy as it grows: Q0 writes ~170 B a row).
                    let line = self
                        .bytes
                        .saturating_sub(self.header_bytes)
                        .div_ceil(self.rows.max(1));
                    let mut encoded = std::mem::take(&mut header);
                    encoded.reserve(line as usize * rows.num_rows() * 9 / 8);
                    encode_lines(self.format, &rows, &mut encoded, &shown, &self.sink)?;
                    self.bytes += encoded.len() as u64;
                    self.rows += rows.num_rows() as u64;
                    out.put(Bytes::from(encoded), &shown).await?;
                }
            }
        }
        Ok(())
    }

    fn check_schema(&mut self, schema: &SchemaRef) -> Result<(), IoError> {
        if self.format == FileFormat::Text {
            check_text_schema(schema, &self.sink)?;
        }
        match &self.schema {
            None => self.schema = Some(Arc::clone(schema)),
            Some(first) if self.format != FileFormat::Json => {
                if !same_fields(first, schema) {
                    return Err(IoError::schema(
                        &self.sink,
                        format!("batch schema changed while writing: {first:?} then {schema:?}"),
                    ));
                }
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// Finishes the temp file. `None` when no row was written (no file exists).
    pub async fn close(self) -> Result<Option<TempPart>, IoError> {
        let location = self.target.display();
        let bytes = match self.state {
            WriterState::Empty => return Ok(None),
            WriterState::Lines(out) => {
                out.finish(&location).await?;
                self.bytes
            }
            WriterState::Parquet(mut writer) => {
                writer
                    .finish()
                    .await
                    .map_err(|e| IoError::parquet(&location, e))?;
                writer.bytes_written() as u64
            }
        };
        Ok(Some(TempPart {
            location,
            part: self.part,
            rows: self.rows,
            bytes,
            header_bytes: self.header_bytes,
            window: None,
        }))
    }

    /// Gives up on this part: cancels any upload and deletes what was written.
    pub async fn abort(self) {
        let mut out = match self.state {
            WriterState::Empty => return,
            WriterState::Lines(LinesOut::Local(out)) => return out.abort().await,
            WriterState::Lines(LinesOut::Store(out)) => *out,
            WriterState::Parquet(writer) => writer.into_inner(),
        };
        let _ = out.abort().await;
        let _ = self.target.store.delete(&self.path).await;
    }
}

/// Whether a text sink can write rows of `schema`: exactly one string field.
pub fn is_text_schema(schema: &Schema) -> bool {
    let fields = schema.fields();
    fields.len() == 1
        && matches!(
            fields[0].data_type(),
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
        )
}

fn check_text_schema(schema: &Schema, sink: &str) -> Result<(), IoError> {
    if is_text_schema(schema) {
        return Ok(());
    }
    Err(IoError::TextSinkSchema {
        fields: describe_fields(schema),
        location: sink.to_string(),
    })
}

/// The CSV header line for a schema.
pub(super) fn csv_header(schema: &SchemaRef, shown: &str) -> Result<Vec<u8>, IoError> {
    let mut writer = arrow::csv::WriterBuilder::new()
        .with_header(true)
        .build(Vec::new());
    writer
        .write(&any_as_str(&RecordBatch::new_empty(Arc::clone(schema))))
        .map_err(|e| IoError::Arrow {
            op: "write CSV header to",
            location: shown.to_string(),
            source: e,
        })?;
    Ok(writer.into_inner())
}

/// Encodes a batch as CSV rows (no header), JSON lines or text lines.
fn encode_lines(
    format: FileFormat,
    batch: &RecordBatch,
    out: &mut Vec<u8>,
    shown: &str,
    sink: &str,
) -> Result<(), IoError> {
    let arrow_error = |op: &'static str| {
        move |e| IoError::Arrow {
            op,
            location: shown.to_string(),
            source: e,
        }
    };
    // Instants the writers cannot print (Beam's minimum timestamp) become strings first.
    let printable = match format {
        FileFormat::Csv | FileFormat::Json => super::far_instants::printable(batch),
        _ => batch.clone(),
    };
    // An `Any` field in a CSV row is its value as Python's `str` shows it (JSON writes the
    // value itself, below).
    let printable = match format {
        FileFormat::Csv => any_as_str(&printable),
        _ => printable,
    };
    let batch = &printable;
    match format {
        FileFormat::Csv => {
            let mut writer = arrow::csv::WriterBuilder::new()
                .with_header(false)
                .build(std::mem::take(out));
            writer.write(batch).map_err(arrow_error("write CSV to"))?;
            *out = writer.into_inner();
        }
        FileFormat::Json => {
            // A null field is written as `null`, as Beam's WriteToJson writes a row's None.
            let start = out.len();
            let mut writer = arrow::json::WriterBuilder::new()
                .with_explicit_nulls(true)
                .with_encoder_factory(any::encoders())
                .build::<_, arrow::json::writer::LineDelimited>(std::mem::take(out));
            writer.write(batch).map_err(arrow_error("write JSON to"))?;
            writer.finish().map_err(arrow_error("write JSON to"))?;
            *out = writer.into_inner();
            if riverbank_elements::bare::is_bare(batch.schema_ref()) {
                bare_lines(out, start);
            }
        }
        FileFormat::Text => {
            check_text_schema(batch.schema_ref(), sink)?;
            let column = batch.column(0);
            // Nulls are written as empty lines.
            let mut push = |value: Option<&str>| {
                out.extend_from_slice(value.unwrap_or("").as_bytes());
                out.push(b'\n');
            };
            match column.data_type() {
                DataType::Utf8 => column.as_string::<i32>().iter().for_each(&mut push),
                DataType::LargeUtf8 => column.as_string::<i64>().iter().for_each(&mut push),
                _ => column.as_string_view().iter().for_each(&mut push),
            }
        }
        FileFormat::Parquet => unreachable!("parquet is not a line format"),
    }
    Ok(())
}

/// Lines `{"element":V}` from `start` on as `V`: values that are not rows are written as
/// themselves (`riverbank_elements::bare`).
fn bare_lines(out: &mut Vec<u8>, start: usize) {
    const OPEN: &[u8] = b"{\"element\":";
    let lines: Vec<u8> = out[start..]
        .split_inclusive(|b| *b == b'\n')
        .flat_map(|line| {
            let body = line.strip_suffix(b"\n").unwrap_or(line);
            let value = body
                .strip_prefix(OPEN)
                .and_then(|v| v.strip_suffix(b"}"))
                .unwrap_or(body);
            value.iter().chain(b"\n").copied().collect::<Vec<u8>>()
        })
        .collect();
    out.truncate(start);
    out.extend(lines);
}

/// The batch with each `Any` column as Python's `str` of its values.
fn any_as_str(batch: &RecordBatch) -> RecordBatch {
    let schema = batch.schema();
    if !schema.fields().iter().any(|f| any::is_any(f.data_type())) {
        return batch.clone();
    }
    let (fields, columns): (Vec<Field>, Vec<ArrayRef>) = schema
        .fields()
        .iter()
        .zip(batch.columns())
        .map(|(f, c)| {
            if any::is_any(f.data_type()) {
                (
                    Field::new(f.name(), DataType::Utf8, true),
                    any::to_python_strs(c.as_ref()),
                )
            } else {
                (f.as_ref().clone(), c.clone())
            }
        })
        .unzip();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .expect("the same rows, a column retyped")
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int64Array;

    #[test]
    fn values_that_are_not_rows_are_written_as_themselves_and_rows_as_rows() {
        let bare = Schema::new(vec![riverbank_elements::bare::field(DataType::Int64)]);
        let values = Arc::new(Int64Array::from(vec![Some(100), None]));
        let batch = RecordBatch::try_new(Arc::new(bare), vec![values.clone()]).unwrap();
        let mut out = b"7\n".to_vec();
        encode_lines(FileFormat::Json, &batch, &mut out, "x", "Out").unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "7\n100\nnull\n");

        let rows = Schema::new(vec![Field::new("element", DataType::Int64, true)]);
        let batch = RecordBatch::try_new(Arc::new(rows), vec![values]).unwrap();
        let mut out = vec![];
        encode_lines(FileFormat::Json, &batch, &mut out, "x", "Out").unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "{\"element\":100}\n{\"element\":null}\n"
        );
    }
}
