//! Producer-side partial combine.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions};
use arrow::datatypes::SchemaRef;
use datafusion::logical_expr::GroupsAccumulator;

use super::aggregate::AggPlan;
use super::groups::{GroupTable, prepare_keys};
use super::packed::PackedTable;
use super::{CombineError, CombineSpec, state_schema_from};

/// The key table: packed while every key fits (and none is null), else rows.
enum Groups {
    Packed(PackedTable),
    Rows(GroupTable),
}

impl Groups {
    fn new(spec: &CombineSpec) -> Result<Groups, CombineError> {
        Ok(match PackedTable::new(&spec.key_fields) {
            Some(p) => Groups::Packed(p),
            None => Groups::Rows(GroupTable::new(&spec.key_fields)?),
        })
    }

    fn intern(
        &mut self,
        spec: &CombineSpec,
        keys: &[ArrayRef],
        n: usize,
        out: &mut Vec<usize>,
    ) -> Result<(), CombineError> {
        if let Groups::Packed(p) = self {
            if p.intern(keys, n, out) {
                return Ok(());
            }
            // Null keys: move the groups so far to the row table, in group order, so their
            // indices (and the accumulators' states) stay as they are.
            let mut rows = GroupTable::new(&spec.key_fields)?;
            let existing = p.key_columns()?;
            rows.intern(&existing, p.num_groups(), out)?;
            *self = Groups::Rows(rows);
        }
        match self {
            Groups::Rows(t) => t.intern(keys, n, out),
            Groups::Packed(_) => unreachable!("moved to rows above"),
        }
    }

    fn num_groups(&self) -> usize {
        match self {
            Groups::Packed(p) => p.num_groups(),
            Groups::Rows(t) => t.num_groups(),
        }
    }

    fn size(&self) -> usize {
        match self {
            Groups::Packed(p) => p.size(),
            Groups::Rows(t) => t.size(),
        }
    }

    fn key_columns(&self) -> Result<Vec<ArrayRef>, CombineError> {
        match self {
            Groups::Packed(p) => p.key_columns(),
            Groups::Rows(t) => t.key_columns(),
        }
    }

    fn clear(&mut self) {
        match self {
            Groups::Packed(p) => p.clear(),
            Groups::Rows(t) => t.clear(),
        }
    }
}

/// Partial combine: groups input rows by key and keeps one DataFusion partial
/// state per key and aggregate. A cache in Dataflow's sense: flushing early is
/// always correct.
pub struct PartialCombiner {
    spec: Arc<CombineSpec>,
    plans: Vec<AggPlan>,
    state_schema: SchemaRef,
    table: Groups,
    accumulators: Vec<Box<dyn GroupsAccumulator>>,
    group_indices: Vec<usize>,
}

impl std::fmt::Debug for PartialCombiner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartialCombiner")
            .field("spec", &self.spec)
            .field("num_groups", &self.num_groups())
            .finish_non_exhaustive()
    }
}

impl PartialCombiner {
    /// Validate `spec` and build the accumulators.
    pub fn new(spec: Arc<CombineSpec>) -> Result<Self, CombineError> {
        let plans = spec.plans()?;
        let state_schema = state_schema_from(&spec, &plans);
        let table = Groups::new(&spec)?;
        let accumulators = plans
            .iter()
            .map(AggPlan::create_accumulator)
            .collect::<Result<_, _>>()?;
        Ok(PartialCombiner {
            spec,
            plans,
            state_schema,
            table,
            accumulators,
            group_indices: Vec::new(),
        })
    }

    /// The schema of the batches returned by [`flush`](Self::flush).
    pub fn state_schema(&self) -> &SchemaRef {
        &self.state_schema
    }

    /// Accumulate one input batch: key columns (in `key_fields` order), then
    /// value columns (see the [module docs](super) for the convention).
    pub fn update(&mut self, batch: &RecordBatch) -> Result<(), CombineError> {
        let nk = self.spec.key_fields.len();
        let with_value = self.plans.iter().filter(|p| p.has_value).count();
        let ncols = batch.num_columns();
        // Either exactly the valued aggregates have a column, or all of them do.
        let all_columns = if ncols == nk + with_value {
            false
        } else if ncols == nk + self.plans.len() {
            true
        } else {
            return Err(CombineError::BadBatch {
                what: "input",
                detail: format!(
                    "expected {nk} key column(s) followed by {with_value} value column(s), got {ncols} column(s)"
                ),
            });
        };
        let n = batch.num_rows();
        if n == 0 {
            return Ok(());
        }
        let keys = prepare_keys(&self.spec.key_fields, &batch.columns()[..nk])?;
        self.table
            .intern(&self.spec, &keys, n, &mut self.group_indices)?;
        let total = self.table.num_groups();
        let mut col = nk;
        for (plan, acc) in self.plans.iter().zip(self.accumulators.iter_mut()) {
            let column = if plan.has_value || all_columns {
                col += 1;
                Some(batch.column(col - 1))
            } else {
                None
            };
            let values = plan.prepare_value(column, n)?;
            acc.update_batch(&[values], &self.group_indices, None, total)
                .map_err(plan.df_err())?;
        }
        Ok(())
    }

    /// Number of keys currently held.
    pub fn num_groups(&self) -> usize {
        self.table.num_groups()
    }

    /// Approximate bytes held (key table plus accumulator states).
    pub fn memory_size(&self) -> usize {
        self.table.size()
            + self.group_indices.capacity() * size_of::<usize>()
            + self.accumulators.iter().map(|a| a.size()).sum::<usize>()
    }

    /// Emit every key's partial state ([`CombineSpec::state_schema`]) and reset
    /// to empty. `None` when nothing is held.
    pub fn flush(&mut self) -> Result<Option<RecordBatch>, CombineError> {
        let n = self.table.num_groups();
        if n == 0 {
            return Ok(None);
        }
        let mut columns: Vec<ArrayRef> = self.table.key_columns()?;
        for (plan, acc) in self.plans.iter().zip(self.accumulators.iter_mut()) {
            columns.extend(plan.state(acc.as_mut())?);
        }
        let batch = RecordBatch::try_new_with_options(
            Arc::clone(&self.state_schema),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(n)),
        )
        .map_err(CombineError::arrow("building partial state batch"))?;
        self.table.clear();
        // Fresh accumulators: some keep capacity after emitting everything.
        self.accumulators = self
            .plans
            .iter()
            .map(AggPlan::create_accumulator)
            .collect::<Result<_, _>>()?;
        self.group_indices = Vec::new();
        Ok(Some(batch))
    }
}
