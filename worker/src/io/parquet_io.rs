//! Parquet over object_store: an `AsyncFileReader` that knows the file size (so the
//! footer is one ranged read, no HEAD) and the writer properties we use.
//!
//! parquet 59.2 deprecated `ParquetObjectReader` in favour of implementing
//! `AsyncFileReader` directly; this is that implementation.

use std::ops::Range;
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
