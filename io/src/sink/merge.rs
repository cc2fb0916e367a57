//! Writing one shard from several temp parts: bytes concatenated for line formats,
//! batches re-written for Parquet.

use std::sync::Arc;

use arrow::datatypes::{Schema, SchemaRef};
use bytes::Bytes;
use futures::StreamExt;
use object_store::buffered::BufWriter;
use object_store::{ObjectMeta, ObjectStoreExt};
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use parquet::arrow::{AsyncArrowWriter, ParquetRecordBatchStreamBuilder};
use tokio::io::AsyncWriteExt;

use super::super::location::Resolved;
use super::super::parquet_io::{StoreReader, load_metadata, writer_properties};
use super::super::{FileFormat, IoError};
use super::TempPart;
use super::writer::csv_header;

/// Bytes per request when concatenating parts.
const COPY_BLOCK: u64 = 8 << 20;

/// Writes one shard from zero or more parts (through a staging upload, so the
/// final name appears complete or not at all).
pub(super) async fn write_merged(
    format: FileFormat,
    schema: &Option<SchemaRef>,
    group: &[(&TempPart, &Resolved)],
    all_parts: &[TempPart],
    all_temps: &[Resolved],
    target: &Resolved,
) -> Result<(), IoError> {
    let shown = target.display();
    let path = target.path()?;
    let mut out = BufWriter::new(Arc::clone(&target.store), path);
    match format {
        FileFormat::Parquet => return merge_parquet(schema, group, all_temps, out, &shown).await,
        FileFormat::Csv if group.is_empty() => {
            // An empty CSV shard still gets a header when we know the columns.
            let header = known_csv_header(schema, all_parts, all_temps, &shown).await?;
            if !header.is_empty() {
                out.put(Bytes::from(header))
                    .await
                    .map_err(|e| IoError::store("write", &shown, e))?;
            }
        }
        FileFormat::Csv | FileFormat::Json | FileFormat::Text => {
            for (index, (part, temp)) in group.iter().enumerate() {
                let skip = if index > 0 && format == FileFormat::Csv {
                    part.header_bytes
                } else {
                    0
                };
                copy_bytes(temp, skip, &mut out, &shown).await?;
            }
        }
    }
    out.shutdown()
        .await
        .map_err(|e| IoError::local("finish", &shown, e))?;
    Ok(())
}

/// Re-writes the batches of Parquet parts into one file (with the schema of the first
/// part, else the stage's, else any part's).
async fn merge_parquet(
    schema: &Option<SchemaRef>,
    group: &[(&TempPart, &Resolved)],
    all_temps: &[Resolved],
    out: BufWriter,
    shown: &str,
) -> Result<(), IoError> {
    let schema = match (group.first(), schema) {
        (Some((_, temp)), _) => parquet_schema(temp).await?,
        (None, Some(schema)) => Arc::clone(schema),
        (None, None) => match all_temps.first() {
            Some(temp) => parquet_schema(temp).await?,
            None => Arc::new(Schema::empty()),
        },
    };
    let mut writer = AsyncArrowWriter::try_new(out, schema, Some(writer_properties()))
        .map_err(|e| IoError::parquet(shown, e))?;
    for (_, temp) in group {
        let temp_shown = temp.display();
        let (reader, md) = open_parquet(temp).await?;
        let mut batches = ParquetRecordBatchStreamBuilder::new_with_metadata(reader, md)
            .build()
            .map_err(|e| IoError::parquet(&temp_shown, e))?;
        while let Some(batch) = batches.next().await {
            let batch = batch.map_err(|e| IoError::parquet(&temp_shown, e))?;
            writer
                .write(&batch)
                .await
                .map_err(|e| IoError::parquet(shown, e))?;
        }
    }
    writer
        .close()
        .await
        .map_err(|e| IoError::parquet(shown, e))?;
    Ok(())
}

/// The CSV header from the stage's schema, else from the first part; empty when neither
/// is known.
async fn known_csv_header(
    schema: &Option<SchemaRef>,
    all_parts: &[TempPart],
    all_temps: &[Resolved],
    shown: &str,
) -> Result<Vec<u8>, IoError> {
    Ok(match (schema, all_parts.first().zip(all_temps.first())) {
        (Some(schema), _) => csv_header(schema, shown)?,
        (None, Some((part, temp))) if part.header_bytes > 0 => {
            let path = temp.path()?;
            temp.store
                .get_range(&path, 0..part.header_bytes)
                .await
                .map_err(|e| IoError::store("read", temp.display(), e))?
                .to_vec()
        }
        _ => Vec::new(),
    })
}

async fn head(temp: &Resolved) -> Result<ObjectMeta, IoError> {
    let path = temp.path()?;
    temp.store
        .head(&path)
        .await
        .map_err(|e| IoError::store("read", temp.display(), e))
}

/// A reader of a Parquet temp part, with its footer.
async fn open_parquet(temp: &Resolved) -> Result<(StoreReader, ArrowReaderMetadata), IoError> {
    let meta = head(temp).await?;
    let mut reader = StoreReader {
        store: Arc::clone(&temp.store),
        path: meta.location,
        file_size: meta.size,
        local: None,
    };
    let md = load_metadata(&mut reader, &temp.display()).await?;
    Ok((reader, md))
}

async fn parquet_schema(temp: &Resolved) -> Result<SchemaRef, IoError> {
    let (_, md) = open_parquet(temp).await?;
    Ok(Arc::clone(md.schema()))
}

/// Appends the bytes of `temp` from offset `skip` to `out`, in blocks.
async fn copy_bytes(
    temp: &Resolved,
    skip: u64,
    out: &mut BufWriter,
    shown: &str,
) -> Result<(), IoError> {
    let meta = head(temp).await?;
    let mut pos = skip.min(meta.size);
    while pos < meta.size {
        let to = (pos + COPY_BLOCK).min(meta.size);
        let data = temp
            .store
            .get_range(&meta.location, pos..to)
            .await
            .map_err(|e| IoError::store("read", temp.display(), e))?;
        out.put(data)
            .await
            .map_err(|e| IoError::store("write", shown, e))?;
        pos = to;
    }
    Ok(())
}
