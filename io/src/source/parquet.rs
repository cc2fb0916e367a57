//! Parquet sources: the schema from every file's footer, splits of whole row groups, and
//! reading a run of row groups with the requested columns.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{Field, Schema, SchemaRef};
use futures::stream::{self, BoxStream};
use futures::{StreamExt, TryStreamExt};
use object_store::ObjectMeta;
use object_store::local::LocalFileSystem;
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};

use super::super::location::Resolved;
use super::super::parquet_io::{StoreReader, load_metadata};
use super::super::{IoError, describe_fields, same_fields};
use super::{ReadOptions, SourcePlan, Split, SplitKind, conform, project};

/// Parquet footers loaded concurrently while planning many files.
const PLAN_CONCURRENCY: usize = 8;

/// Parquet footers already read, by file (and its size and modification time, so a changed
/// file is read again). Planning compiles a pipeline twice (the second time with its sources
/// narrowed to the fields used), and on an object store every footer is a request.
#[derive(Default)]
pub struct FooterMemo {
    footers: std::sync::Mutex<std::collections::HashMap<FooterKey, ArrowReaderMetadata>>,
}

type FooterKey = (String, u64, chrono::DateTime<chrono::Utc>);

impl FooterMemo {
    fn get(&self, key: &FooterKey) -> Option<ArrowReaderMetadata> {
        self.footers.lock().ok()?.get(key).cloned()
    }

    fn put(&self, key: FooterKey, md: &ArrowReaderMetadata) {
        if let Ok(mut m) = self.footers.lock() {
            m.insert(key, md.clone());
        }
    }
}

/// The footers of the last few files a process read, by location and size (what a split
/// knows). A split is read a row group at a time, one after another, and parsing a large
/// file's footer for each row group cost more than decoding the row group; a few entries
/// cover every slot's current file without holding the footers of a whole job.
#[derive(Default)]
pub struct RecentFooters {
    recent: std::sync::Mutex<std::collections::VecDeque<((String, u64), ArrowReaderMetadata)>>,
}

/// Files whose footers [`RecentFooters`] keeps.
const RECENT_FOOTERS: usize = 8;

impl RecentFooters {
    fn get(&self, key: &(String, u64)) -> Option<ArrowReaderMetadata> {
        let recent = self.recent.lock().ok()?;
        recent
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, md)| md.clone())
    }

    fn put(&self, key: (String, u64), md: &ArrowReaderMetadata) {
        if let Ok(mut recent) = self.recent.lock() {
            if recent.len() == RECENT_FOOTERS {
                recent.pop_front();
            }
            recent.push_back((key, md.clone()));
        }
    }
}

pub(super) async fn plan(
    opts: &ReadOptions,
    resolved: &Resolved,
    files: &[ObjectMeta],
    target: u64,
    memo: &FooterMemo,
) -> Result<SourcePlan, IoError> {
    let footers: Vec<_> = stream::iter(files.iter().cloned())
        .map(|meta| async move {
            let shown = resolved.display_path(&meta.location);
            let key = (shown.clone(), meta.size, meta.last_modified);
            if let Some(md) = memo.get(&key) {
                return Ok::<_, IoError>((shown, meta.size, md));
            }
            let mut reader = StoreReader {
                store: Arc::clone(&resolved.store),
                path: meta.location.clone(),
                file_size: meta.size,
                local: None,
            };
            let md = load_metadata(&mut reader, &shown).await?;
            memo.put(key, &md);
            Ok::<_, IoError>((shown, meta.size, md))
        })
        .buffered(PLAN_CONCURRENCY)
        .try_collect()
        .await?;

    let file_schema = merge_schemas(&footers)?;
    let (schema, _) = project(&file_schema, opts.columns.as_deref(), &opts.path)?;
    let mut splits = Vec::new();
    for (shown, size, md) in &footers {
        row_group_splits(shown, *size, md, target, &mut splits);
    }
    Ok(SourcePlan { schema, splits })
}

/// All files must agree on names and types; nullability is merged.
fn merge_schemas(footers: &[(String, u64, ArrowReaderMetadata)]) -> Result<SchemaRef, IoError> {
    let (first_shown, _, first_md) = &footers[0];
    let first_schema = Arc::clone(first_md.schema());
    let mut nullable: Vec<bool> = first_schema
        .fields()
        .iter()
        .map(|f| f.is_nullable())
        .collect();
    for (shown, _, md) in &footers[1..] {
        let schema = md.schema();
        if !same_fields(schema, &first_schema) {
            return Err(IoError::schema(
                shown,
                format!(
                    "its schema ({}) differs from that of {first_shown} ({})",
                    describe_fields(schema),
                    describe_fields(&first_schema)
                ),
            ));
        }
        for (n, f) in nullable.iter_mut().zip(schema.fields()) {
            *n |= f.is_nullable();
        }
    }
    let merged: Vec<Field> = first_schema
        .fields()
        .iter()
        .zip(&nullable)
        .map(|(f, &n)| f.as_ref().clone().with_nullable(n))
        .collect();
    Ok(Arc::new(Schema::new_with_metadata(
        merged,
        first_schema.metadata().clone(),
    )))
}

/// Cuts one file into runs of row groups of at most `target` compressed bytes.
fn row_group_splits(
    shown: &str,
    size: u64,
    md: &ArrowReaderMetadata,
    target: u64,
    splits: &mut Vec<Split>,
) {
    let groups = md.metadata().row_groups();
    let mut first = 0;
    while first < groups.len() {
        let mut bytes = 0u64;
        let mut rows = 0u64;
        let mut count = 0;
        // Greedy: add row groups while the split stays within the target
        // (a single oversized row group is a split of its own).
        while first + count < groups.len() {
            let g = &groups[first + count];
            let next = g.compressed_size().max(0) as u64;
            if count > 0 && bytes.saturating_add(next) > target {
                break;
            }
            bytes += next;
            rows += g.num_rows().max(0) as u64;
            count += 1;
        }
        splits.push(Split {
            location: shown.to_string(),
            kind: SplitKind::RowGroups { first, count },
            estimated_bytes: bytes,
            file_size: size,
            estimated_rows: Some(rows),
            csv: None,
        });
        first += count;
    }
}

pub(super) async fn read(
    opts: &ReadOptions,
    schema: SchemaRef,
    resolved: &Resolved,
    split: &Split,
    first: usize,
    count: usize,
    memo: &RecentFooters,
) -> Result<BoxStream<'static, Result<RecordBatch, IoError>>, IoError> {
    let shown = split.location.clone();
    let path = resolved.path()?;
    let local = resolved
        .is_local()
        .then(|| LocalFileSystem::new().path_to_filesystem(&path).ok())
        .flatten();
    let mut reader = StoreReader {
        store: Arc::clone(&resolved.store),
        path,
        file_size: split.file_size,
        local,
    };
    let key = (shown.clone(), split.file_size);
    let md = match memo.get(&key) {
        Some(md) => md,
        None => {
            let md = load_metadata(&mut reader, &shown).await?;
            memo.put(key, &md);
            md
        }
    };
    let num_groups = md.metadata().num_row_groups();
    if first + count > num_groups {
        return Err(IoError::schema(
            &shown,
            format!(
                "split asks for row groups {first}..{} but the file has {num_groups}",
                first + count
            ),
        ));
    }
    let (mask, reorder) = match &opts.columns {
        None => (ProjectionMask::all(), None),
        Some(columns) => {
            let (_, indices) = project(md.schema(), Some(columns), &shown)?;
            let indices = indices.unwrap_or_default();
            let mut sorted = indices.clone();
            sorted.sort_unstable();
            // The reader yields columns in file order; put them back in the requested order.
            let reorder: Vec<usize> = indices
                .iter()
                .map(|i| sorted.iter().position(|s| s == i).unwrap_or(0))
                .collect();
            let identity = reorder.iter().enumerate().all(|(a, &b)| a == b);
            let mask = ProjectionMask::roots(md.parquet_schema(), sorted);
            (mask, (!identity).then_some(reorder))
        }
    };
    let stream = ParquetRecordBatchStreamBuilder::new_with_metadata(reader, md)
        .with_row_groups((first..first + count).collect())
        .with_projection(mask)
        .with_batch_size(opts.batch_size())
        .build()
        .map_err(|e| IoError::parquet(&shown, e))?;
    Ok(stream
        .map(move |batch| {
            let batch = batch.map_err(|e| IoError::parquet(&shown, e))?;
            let batch = match &reorder {
                Some(order) => batch
                    .project(order)
                    .map_err(|e| IoError::schema(&shown, e.to_string()))?,
                None => batch,
            };
            conform(batch, &schema, &shown)
        })
        .boxed())
}
