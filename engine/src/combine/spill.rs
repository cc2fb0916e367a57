//! Sorted spill runs of the final combine and their k-way merge.
//!
//! A run is an Arrow IPC file whose batches have the schema
//! `__key_row: Binary` (the arrow row encoding of the key columns) followed by
//! the aggregates' state columns; rows are sorted by `__key_row` bytes and each
//! key appears at most once per run.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BinaryArray, BinaryBuilder, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::ipc::reader::FileReader;
use arrow::ipc::writer::FileWriter;
use datafusion::logical_expr::GroupsAccumulator;
use tempfile::NamedTempFile;

use super::CombineError;
use super::aggregate::AggPlan;

/// Rows per batch written to a spill file (and hence buffered per run while
/// merging).
pub(crate) const SPILL_BATCH_ROWS: usize = 4096;

/// Name of the key-bytes column of spill files.
const KEY_ROW: &str = "__key_row";

/// Schema of spill files.
pub(crate) fn spill_schema(plans: &[AggPlan]) -> SchemaRef {
    let mut fields = vec![Field::new(KEY_ROW, DataType::Binary, false)];
    for p in plans {
        fields.extend(p.state_fields.iter().map(|f| f.as_ref().clone()));
    }
    Arc::new(Schema::new(fields))
}

/// A finished spill file (deleted when dropped).
#[derive(Debug)]
pub(crate) struct SpillRun {
    file: NamedTempFile,
}

/// Write sorted spill batches to a new IPC file in `dir`.
pub(crate) fn write_run(
    dir: &Path,
    schema: &SchemaRef,
    batches: impl Iterator<Item = Result<RecordBatch, CombineError>>,
) -> Result<SpillRun, CombineError> {
    std::fs::create_dir_all(dir)
        .map_err(CombineError::io(format!("creating {}", dir.display())))?;
    let file = tempfile::Builder::new()
        .prefix("riverbank-combine-")
        .suffix(".arrow")
        .tempfile_in(dir)
        .map_err(CombineError::io(format!(
            "creating spill file in {}",
            dir.display()
        )))?;
    let handle = file
        .as_file()
        .try_clone()
        .map_err(CombineError::io("opening spill file"))?;
    let mut writer = FileWriter::try_new_buffered(handle, schema)
        .map_err(CombineError::arrow("starting spill file"))?;
    for batch in batches {
        writer
            .write(&batch?)
            .map_err(CombineError::arrow("writing spill file"))?;
    }
    writer
        .finish()
        .map_err(CombineError::arrow("finishing spill file"))?;
    Ok(SpillRun { file })
}

/// Slice a sorted spill batch into spill-file sized batches.
pub(crate) fn chunks(
    batch: RecordBatch,
) -> impl Iterator<Item = Result<RecordBatch, CombineError>> {
    let n = batch.num_rows();
    (0..n)
        .step_by(SPILL_BATCH_ROWS)
        .map(move |off| Ok(batch.slice(off, SPILL_BATCH_ROWS.min(n - off))))
}

/// Where a run's batches come from.
pub(crate) enum RunSource {
    File {
        reader: Box<FileReader<BufReader<File>>>,
        // Keeps the file alive (and deletes it when the merge is dropped).
        _run: SpillRun,
    },
    Mem(std::vec::IntoIter<RecordBatch>),
}

impl RunSource {
    pub fn open(run: SpillRun) -> Result<Self, CombineError> {
        let f = run
            .file
            .reopen()
            .map_err(CombineError::io("reopening spill file"))?;
        let reader = FileReader::try_new_buffered(f, None)
            .map_err(CombineError::arrow("opening spill file"))?;
        Ok(RunSource::File {
            reader: Box::new(reader),
            _run: run,
        })
    }

    fn next_batch(&mut self) -> Result<Option<RecordBatch>, CombineError> {
        loop {
            let next = match self {
                RunSource::File { reader, .. } => reader
                    .next()
                    .transpose()
                    .map_err(CombineError::arrow("reading spill file"))?,
                RunSource::Mem(it) => it.next(),
            };
            match next {
                Some(b) if b.num_rows() == 0 => continue,
                other => return Ok(other),
            }
        }
    }
}

struct Cursor {
    source: RunSource,
    batch: RecordBatch,
    keys: BinaryArray,
    pos: usize,
    /// Index into `RunMerger::segments` of the segment collecting this
    /// cursor's rows for the current output chunk.
    segment: Option<usize>,
}

impl Cursor {
    fn new(mut source: RunSource) -> Result<Option<Self>, CombineError> {
        Ok(source.next_batch()?.map(|batch| Cursor {
            keys: batch.column(0).as_binary::<i32>().clone(),
            batch,
            source,
            pos: 0,
            segment: None,
        }))
    }

    #[inline]
    fn key(&self) -> &[u8] {
        self.keys.value(self.pos)
    }

    /// Advance one row; false when the run is exhausted.
    fn advance(&mut self) -> Result<bool, CombineError> {
        self.pos += 1;
        if self.pos < self.batch.num_rows() {
            return Ok(true);
        }
        self.segment = None;
        match self.source.next_batch()? {
            Some(batch) => {
                self.keys = batch.column(0).as_binary::<i32>().clone();
                self.batch = batch;
                self.pos = 0;
                Ok(true)
            }
            None => {
                // Release the batch and the file (deleting it) right away.
                self.source = RunSource::Mem(Vec::new().into_iter());
                self.batch = RecordBatch::new_empty(self.batch.schema());
                self.keys = BinaryArray::from(Vec::<&[u8]>::new());
                Ok(false)
            }
        }
    }
}

/// Contiguous rows `start..start+groups.len()` of one run batch, and the
/// output group each of them merges into.
struct Segment {
    batch: RecordBatch,
    start: usize,
    groups: Vec<usize>,
}

/// K-way merge of sorted runs, combining equal keys with the aggregates'
/// `merge_batch`.
pub(crate) struct RunMerger {
    plans: Arc<[AggPlan]>,
    cursors: Vec<Cursor>,
    /// Binary min-heap of indices of live cursors, ordered by current key.
    heap: Vec<usize>,
    accumulators: Vec<Box<dyn GroupsAccumulator>>,
    segments: Vec<Segment>,
    current_key: Vec<u8>,
}

impl RunMerger {
    pub fn new(plans: Arc<[AggPlan]>, sources: Vec<RunSource>) -> Result<Self, CombineError> {
        let mut cursors = Vec::with_capacity(sources.len());
        for s in sources {
            if let Some(c) = Cursor::new(s)? {
                cursors.push(c);
            }
        }
        let accumulators = plans
            .iter()
            .map(AggPlan::create_accumulator)
            .collect::<Result<_, _>>()?;
        let mut merger = RunMerger {
            plans,
            heap: (0..cursors.len()).collect(),
            cursors,
            accumulators,
            segments: Vec::new(),
            current_key: Vec::new(),
        };
        for i in (0..merger.heap.len() / 2).rev() {
            merger.sift_down(i);
        }
        Ok(merger)
    }

    #[inline]
    fn less(&self, a: usize, b: usize) -> bool {
        self.cursors[self.heap[a]].key() < self.cursors[self.heap[b]].key()
    }

    fn sift_down(&mut self, mut i: usize) {
        let n = self.heap.len();
        loop {
            let l = 2 * i + 1;
            if l >= n {
                return;
            }
            let m = if l + 1 < n && self.less(l + 1, l) {
                l + 1
            } else {
                l
            };
            if !self.less(m, i) {
                return;
            }
            self.heap.swap(i, m);
            i = m;
        }
    }

    /// Merge the next (at most) `max_groups` distinct keys into the
    /// accumulators (groups `0..n`). Returns their key row bytes, or `None`
    /// when all runs are exhausted. Follow with [`Self::evaluate`] or
    /// [`Self::state`].
    pub fn next_groups(&mut self, max_groups: usize) -> Result<Option<BinaryArray>, CombineError> {
        let max_groups = max_groups.max(1);
        let mut keys = BinaryBuilder::new();
        let mut ng = 0usize;
        while let Some(&ci) = self.heap.first() {
            let cursor = &mut self.cursors[ci];
            let key = cursor.key();
            if ng == 0 || key != self.current_key.as_slice() {
                if ng == max_groups {
                    break;
                }
                ng += 1;
                self.current_key.clear();
                self.current_key.extend_from_slice(key);
                keys.append_value(key);
            }
            let seg = match cursor.segment {
                Some(s) => s,
                None => {
                    self.segments.push(Segment {
                        batch: cursor.batch.clone(),
                        start: cursor.pos,
                        groups: Vec::new(),
                    });
                    cursor.segment = Some(self.segments.len() - 1);
                    self.segments.len() - 1
                }
            };
            self.segments[seg].groups.push(ng - 1);
            if !cursor.advance()? {
                // Exhausted (its source is already released): drop it from the heap.
                self.heap.swap_remove(0);
            }
            self.sift_down(0);
        }
        if ng == 0 {
            return Ok(None);
        }
        for c in &mut self.cursors {
            c.segment = None;
        }
        for seg in std::mem::take(&mut self.segments) {
            let slice = seg.batch.slice(seg.start, seg.groups.len());
            let mut col = 1;
            for (plan, acc) in self.plans.iter().zip(self.accumulators.iter_mut()) {
                let n = plan.num_state_columns();
                let cols: Vec<ArrayRef> = slice.columns()[col..col + n].to_vec();
                col += n;
                acc.merge_batch(&cols, &seg.groups, ng)
                    .map_err(plan.df_err())?;
            }
        }
        let keys = keys.finish();
        debug_assert_eq!(keys.len(), ng);
        Ok(Some(keys))
    }

    /// Final values of the groups produced by the last `next_groups`.
    pub fn evaluate(&mut self) -> Result<Vec<ArrayRef>, CombineError> {
        let out = self
            .plans
            .iter()
            .zip(self.accumulators.iter_mut())
            .map(|(p, a)| p.evaluate(a.as_mut()))
            .collect::<Result<_, _>>()?;
        self.reset()?;
        Ok(out)
    }

    /// Fresh accumulators for the next chunk of groups.
    fn reset(&mut self) -> Result<(), CombineError> {
        self.accumulators = self
            .plans
            .iter()
            .map(AggPlan::create_accumulator)
            .collect::<Result<_, _>>()?;
        Ok(())
    }

    /// States of the groups produced by the last `next_groups`.
    pub fn state(&mut self) -> Result<Vec<ArrayRef>, CombineError> {
        let mut out = Vec::new();
        for (p, a) in self.plans.iter().zip(self.accumulators.iter_mut()) {
            out.extend(p.state(a.as_mut())?);
        }
        self.reset()?;
        Ok(out)
    }
}
