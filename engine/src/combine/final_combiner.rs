//! Consumer-side final combine, with spilling.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BinaryBuilder, RecordBatch, RecordBatchOptions, UInt32Array};
use arrow::compute::take;
use arrow::datatypes::{DataType, SchemaRef};
use datafusion::logical_expr::GroupsAccumulator;

use super::aggregate::{AggPlan, cast_to};
use super::groups::{GroupTable, decode_keys, key_converter, key_types, prepare_keys};
use super::spill::{self, RunMerger, RunSource, SPILL_BATCH_ROWS, SpillRun};
use super::{CombineError, CombineSpec, output_schema_from, state_schema_from};

/// Rows of a state batch merged at a time (memory is checked in between).
const MERGE_CHUNK_ROWS: usize = 8192;

/// Most runs merged at once; more runs are first merged into bigger runs.
const MAX_MERGE_FAN_IN: usize = 32;

/// Final combine: merges partial-state batches per key and evaluates the
/// results. When the held state exceeds the memory limit it is sorted by key
/// and spilled to an Arrow IPC file in the spill directory; `finish` then
/// k-way merges the spilled runs with what is still in memory.
pub struct FinalCombiner {
    spec: Arc<CombineSpec>,
    plans: Arc<[AggPlan]>,
    state_schema: SchemaRef,
    output_schema: SchemaRef,
    spill_schema: SchemaRef,
    table: GroupTable,
    accumulators: Vec<Box<dyn GroupsAccumulator>>,
    group_indices: Vec<usize>,
    memory_limit: usize,
    spill_dir: PathBuf,
    runs: Vec<SpillRun>,
    spill_count: usize,
}

impl std::fmt::Debug for FinalCombiner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FinalCombiner")
            .field("spec", &self.spec)
            .field("num_groups", &self.table.num_groups())
            .field("memory_limit", &self.memory_limit)
            .field("spill_dir", &self.spill_dir)
            .field("spill_count", &self.spill_count)
            .finish_non_exhaustive()
    }
}

impl FinalCombiner {
    /// `memory_limit_bytes`: spill once the held state exceeds it (the limit
    /// is approximate; `usize::MAX` never spills). `spill_dir` is created on
    /// first spill if missing; spill files are deleted when no longer needed.
    pub fn new(
        spec: Arc<CombineSpec>,
        memory_limit_bytes: usize,
        spill_dir: &Path,
    ) -> Result<Self, CombineError> {
        let plans: Arc<[AggPlan]> = spec.plans()?.into();
        let state_schema = state_schema_from(&spec, &plans);
        let output_schema = output_schema_from(&spec, &plans);
        let spill_schema = spill::spill_schema(&plans);
        let table = GroupTable::new(&spec.key_fields)?;
        let accumulators = create_accumulators(&plans)?;
        Ok(FinalCombiner {
            spec,
            plans,
            state_schema,
            output_schema,
            spill_schema,
            table,
            accumulators,
            group_indices: Vec::new(),
            memory_limit: memory_limit_bytes,
            spill_dir: spill_dir.to_path_buf(),
            runs: Vec::new(),
            spill_count: 0,
        })
    }

    /// Schema of the batches `finish` returns.
    pub fn output_schema(&self) -> &SchemaRef {
        &self.output_schema
    }

    /// Merge one partial-state batch ([`CombineSpec::state_schema`]).
    pub fn merge(&mut self, state: &RecordBatch) -> Result<(), CombineError> {
        let expected = self.state_schema.fields();
        if state.num_columns() != expected.len() {
            return Err(CombineError::BadBatch {
                what: "state",
                detail: format!(
                    "expected {} columns ({} key(s) then state columns), got {}",
                    expected.len(),
                    self.spec.key_fields.len(),
                    state.num_columns()
                ),
            });
        }
        let nk = self.spec.key_fields.len();
        let columns: Vec<ArrayRef> = state
            .columns()
            .iter()
            .zip(expected)
            .map(|(c, f)| {
                cast_to(c, f.data_type(), || {
                    format!("casting state column `{}`", f.name())
                })
            })
            .collect::<Result<_, _>>()?;
        let n = state.num_rows();
        let mut off = 0;
        while off < n {
            let len = MERGE_CHUNK_ROWS.min(n - off);
            let chunk: Vec<ArrayRef> = columns.iter().map(|c| c.slice(off, len)).collect();
            off += len;
            let keys = prepare_keys(&self.spec.key_fields, &chunk[..nk])?;
            self.table.intern(&keys, len, &mut self.group_indices)?;
            let total = self.table.num_groups();
            let mut col = nk;
            for (plan, acc) in self.plans.iter().zip(self.accumulators.iter_mut()) {
                let ns = plan.num_state_columns();
                acc.merge_batch(&chunk[col..col + ns], &self.group_indices, total)
                    .map_err(plan.df_err())?;
                col += ns;
            }
            if self.memory_size() > self.memory_limit {
                self.spill()?;
            }
        }
        Ok(())
    }

    /// Number of keys held in memory (spilled keys are not counted).
    pub fn num_groups(&self) -> usize {
        self.table.num_groups()
    }

    /// Approximate bytes held in memory.
    pub fn memory_size(&self) -> usize {
        self.table.size()
            + self.group_indices.capacity() * size_of::<usize>()
            + self.accumulators.iter().map(|a| a.size()).sum::<usize>()
    }

    /// How many times the in-memory state was spilled to disk.
    pub fn spill_count(&self) -> usize {
        self.spill_count
    }

    /// Evaluate all groups into batches of [`CombineSpec::output_schema`] with
    /// at most `batch_size` rows each (a `batch_size` of 0 is treated as 1).
    pub fn finish(
        mut self,
        batch_size: usize,
    ) -> Result<Box<dyn Iterator<Item = Result<RecordBatch, CombineError>> + Send>, CombineError>
    {
        let batch_size = batch_size.max(1);
        if self.runs.is_empty() {
            let n = self.table.num_groups();
            if n == 0 {
                return Ok(Box::new(std::iter::empty()));
            }
            let mut columns = self.table.key_columns()?;
            for (plan, acc) in self.plans.iter().zip(self.accumulators.iter_mut()) {
                columns.push(plan.evaluate(acc.as_mut())?);
            }
            let batch = make_batch(&self.output_schema, columns, n)?;
            let batches: Vec<_> = (0..n)
                .step_by(batch_size)
                .map(|off| Ok(batch.slice(off, batch_size.min(n - off))))
                .collect();
            return Ok(Box::new(batches.into_iter()));
        }

        // What is still in memory becomes one more (in-memory) sorted run.
        let mut sources = Vec::new();
        if self.table.num_groups() > 0 {
            let sorted = self.sorted_state()?;
            sources.push(RunSource::Mem(
                spill::chunks(sorted)
                    .collect::<Result<Vec<_>, _>>()?
                    .into_iter(),
            ));
        }
        self.accumulators.clear();
        let mut runs = std::mem::take(&mut self.runs);
        // Bound the number of runs open at once with intermediate merges.
        while runs.len() + sources.len() > MAX_MERGE_FAN_IN {
            let group: Vec<RunSource> = runs
                .drain(..MAX_MERGE_FAN_IN.min(runs.len()))
                .map(RunSource::open)
                .collect::<Result<_, _>>()?;
            let mut merger = RunMerger::new(Arc::clone(&self.plans), group)?;
            let schema = Arc::clone(&self.spill_schema);
            let batches = std::iter::from_fn(|| match merger.next_groups(SPILL_BATCH_ROWS) {
                Ok(None) => None,
                Ok(Some(keys)) => Some(merger.state().and_then(|states| {
                    let n = keys.len();
                    let mut cols: Vec<ArrayRef> = vec![Arc::new(keys)];
                    cols.extend(states);
                    make_batch(&schema, cols, n)
                })),
                Err(e) => Some(Err(e)),
            });
            runs.push(spill::write_run(
                &self.spill_dir,
                &self.spill_schema,
                batches,
            )?);
        }
        for run in runs {
            sources.push(RunSource::open(run)?);
        }
        let merger = RunMerger::new(Arc::clone(&self.plans), sources)?;
        let converter = key_converter(&self.spec.key_fields)?;
        Ok(Box::new(MergeOutput {
            merger,
            converter,
            key_types: key_types(&self.spec.key_fields),
            output_schema: Arc::clone(&self.output_schema),
            batch_size,
            done: false,
        }))
    }

    /// The merged partial states (key columns, then state columns) without evaluating them:
    /// what a streaming state shard keeps between checkpoints. Only for a combiner that never
    /// spilled (give it an unbounded memory limit: a checkpoint's keys are few).
    pub fn into_states(mut self) -> Result<RecordBatch, CombineError> {
        if !self.runs.is_empty() {
            return Err(CombineError::BadBatch {
                what: "state",
                detail: "a spilled combiner cannot give its states back".into(),
            });
        }
        let n = self.table.num_groups();
        let mut columns = if n == 0 && !self.spec.key_fields.is_empty() {
            self.spec
                .key_fields
                .iter()
                .map(|f| arrow::array::new_empty_array(f.data_type()))
                .collect()
        } else {
            self.table.key_columns()?
        };
        for (plan, acc) in self.plans.iter().zip(self.accumulators.iter_mut()) {
            columns.extend(plan.state(acc.as_mut())?);
        }
        make_batch(&self.state_schema, columns, n)
    }

    /// Sort the in-memory groups by key bytes and emit them in spill schema;
    /// resets the in-memory state.
    fn sorted_state(&mut self) -> Result<RecordBatch, CombineError> {
        let n = self.table.num_groups();
        let order = self.table.sorted_groups();
        let mut keys = BinaryBuilder::with_capacity(n, 0);
        for &g in &order {
            keys.append_value(self.table.row_bytes(g as usize));
        }
        let order = UInt32Array::from(order);
        let mut columns: Vec<ArrayRef> = vec![Arc::new(keys.finish())];
        for (plan, acc) in self.plans.iter().zip(self.accumulators.iter_mut()) {
            for state in plan.state(acc.as_mut())? {
                columns.push(
                    take(&state, &order, None)
                        .map_err(CombineError::arrow("sorting spill state"))?,
                );
            }
        }
        let batch = make_batch(&self.spill_schema, columns, n)?;
        self.table.clear();
        self.accumulators = create_accumulators(&self.plans)?;
        self.group_indices = Vec::new();
        Ok(batch)
    }

    fn spill(&mut self) -> Result<(), CombineError> {
        if self.table.num_groups() == 0 {
            return Ok(());
        }
        let sorted = self.sorted_state()?;
        let rows = sorted.num_rows();
        let run = spill::write_run(&self.spill_dir, &self.spill_schema, spill::chunks(sorted))?;
        self.runs.push(run);
        self.spill_count += 1;
        tracing::debug!(
            rows,
            spill_count = self.spill_count,
            dir = %self.spill_dir.display(),
            "combine: spilled final-combine state"
        );
        Ok(())
    }
}

fn create_accumulators(plans: &[AggPlan]) -> Result<Vec<Box<dyn GroupsAccumulator>>, CombineError> {
    plans.iter().map(AggPlan::create_accumulator).collect()
}

fn make_batch(
    schema: &SchemaRef,
    columns: Vec<ArrayRef>,
    num_rows: usize,
) -> Result<RecordBatch, CombineError> {
    RecordBatch::try_new_with_options(
        Arc::clone(schema),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(num_rows)),
    )
    .map_err(CombineError::arrow("building combine batch"))
}

/// Streams the k-way merge of spilled runs as output batches.
struct MergeOutput {
    merger: RunMerger,
    converter: arrow::row::RowConverter,
    key_types: Arc<[DataType]>,
    output_schema: SchemaRef,
    batch_size: usize,
    done: bool,
}

impl MergeOutput {
    fn next_batch(&mut self) -> Result<Option<RecordBatch>, CombineError> {
        let Some(keys) = self.merger.next_groups(self.batch_size)? else {
            return Ok(None);
        };
        let n = keys.len();
        let rows = self.converter.from_binary(keys);
        let mut columns = decode_keys(&self.converter, &self.key_types, &rows)?;
        columns.extend(self.merger.evaluate()?);
        make_batch(&self.output_schema, columns, n).map(Some)
    }
}

impl Iterator for MergeOutput {
    type Item = Result<RecordBatch, CombineError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let next = self.next_batch().transpose();
        if !matches!(next, Some(Ok(_))) {
            self.done = true;
        }
        next
    }
}
