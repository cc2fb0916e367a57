//! Parquet over object_store: an `AsyncFileReader` that knows the file size (so the
//! footer is one ranged read, no HEAD) and the writer properties we use.
//!
//! parquet 59.2 deprecated `ParquetObjectReader` in favour of implementing
//! `AsyncFileReader` directly; this is that implementation.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::basic::Compression;
use parquet::errors::ParquetError;
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use parquet::file::properties::WriterProperties;

use super::IoError;

/// Footer bytes fetched up front; most footers fit, so metadata is one request.
const FOOTER_PREFETCH: usize = 512 << 10;

/// Reads one Parquet object with ranged GETs.
#[derive(Clone, Debug)]
pub(crate) struct StoreReader {
    pub store: Arc<dyn ObjectStore>,
    pub path: Path,
    pub file_size: u64,
    /// The file on the local filesystem, read directly: the local store zero-fills each
    /// buffer before reading into it, which costs as much as the read on a large scan.
    pub local: Option<PathBuf>,
}

/// Reads `ranges` of a local file into buffers that are never zero-filled first.
fn read_local(file: &std::path::Path, ranges: &[Range<u64>]) -> std::io::Result<Vec<Bytes>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(file)?;
    ranges
        .iter()
        .map(|r| {
            let len = (r.end - r.start) as usize;
            f.seek(SeekFrom::Start(r.start))?;
            let mut buf = Vec::with_capacity(len);
            (&mut f).take(len as u64).read_to_end(&mut buf)?;
            if buf.len() != len {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("{} ends before byte {}", file.display(), r.end),
                ));
            }
            Ok(Bytes::from(buf))
        })
        .collect()
}

fn external(e: object_store::Error) -> ParquetError {
    ParquetError::External(Box::new(e))
}

impl AsyncFileReader for StoreReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        async move {
            self.store
                .get_range(&self.path, range)
                .await
                .map_err(external)
        }
        .boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        async move {
            if let Some(file) = self.local.clone() {
                return tokio::task::spawn_blocking(move || read_local(&file, &ranges))
                    .await
                    .map_err(|e| ParquetError::External(Box::new(e)))?
                    .map_err(|e| ParquetError::External(Box::new(e)));
            }
            self.store
                .get_ranges(&self.path, &ranges)
                .await
                .map_err(external)
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        async move {
            let file_size = self.file_size;
            let metadata = ParquetMetaDataReader::new()
                .with_arrow_reader_options(options)
                .with_prefetch_hint(Some(FOOTER_PREFETCH))
                .load_and_finish(self, file_size)
                .await?;
            Ok(Arc::new(metadata))
        }
        .boxed()
    }
}

/// Loads footer metadata and the Arrow schema of one file.
pub(crate) async fn load_metadata(
    reader: &mut StoreReader,
    shown: &str,
) -> Result<ArrowReaderMetadata, IoError> {
    ArrowReaderMetadata::load_async(reader, ArrowReaderOptions::new())
        .await
        .map_err(|e| IoError::parquet(shown, e))
}

/// Snappy, as Beam/Dataflow and most engines default to; fast to decode.
pub(crate) fn writer_properties() -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .build()
}
