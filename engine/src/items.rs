//! Work items: the unit of work a coordinator hands out, as Dataflow does. A stage is cut into
//! items (source splits, shuffle partitions, or one gathered item); an item is run whole by one
//! worker, and its outputs are kept only once it has succeeded.
//!
//! Results must not depend on which worker ran which item, nor on how items were rebalanced, so
//! every item has a canonical *order* (consumers read producers' outputs in that order; sink parts
//! are numbered by it), and reads go in fixed *units* (a Parquet row group, or an aligned range of
//! a text file) that dynamic splitting never cuts through.
use crate::compiled::{CompiledPlan, CompiledTransform};
use riverbank_io::{Split, SplitKind};
use riverbank_pipeline::{OpRole, Stage};
use serde::{Deserialize, Serialize};

/// Text splits are read, and split dynamically, in file-aligned units of this many bytes.
pub const LINE_UNIT_BYTES: u64 = 4 << 20;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkItem {
    pub id: u64,
    pub stage: usize,
    pub input: ItemInput,
}

/// What an item reads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ItemInput {
    /// A range of source split `split` (the whole split unless it was rebalanced).
    Read { split: usize, range: Split },
    /// A Create transform's elements.
    Create,
    /// Partition `p` of every shuffled input of the stage.
    Partition(u32),
    /// Partitions `first..first + count`, one after another, as if each were its own item:
    /// small neighbouring partitions of a batch stage coalesced into one item once their
    /// sizes were known (see `Tracker::coalesce`).
    Partitions { first: u32, count: u32 },
    /// All of every input (Sql, Join, AssertEqual: they need their inputs whole).
    Gather,
}

/// A streaming checkpoint's offset ranges, by source transform.
pub type StreamReads = std::collections::BTreeMap<usize, Vec<Split>>;

/// How a stage is cut into items.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StageShape {
    Read,
    Create,
    Partitioned,
    Gathered,
}

pub fn stage_shape(plan: &CompiledPlan, stage: &Stage) -> StageShape {
    let Some(entry) = stage.ops.first() else {
        return StageShape::Gathered;
    };
    match (entry.role, &plan.transforms[entry.transform]) {
        (OpRole::Apply, CompiledTransform::Read { .. } | CompiledTransform::ReadStream(_)) => {
            StageShape::Read
        }
        (OpRole::Apply, CompiledTransform::Create { .. }) => StageShape::Create,
        // One item commits the sink and emits its files.
        (OpRole::Commit, _) => StageShape::Gathered,
        (OpRole::FinalCombine, _) | (OpRole::ShuffleRead, CompiledTransform::Reshuffle) => {
            StageShape::Partitioned
        }
        // Streaming: a Sql/Join runs in state shards, its rows sharded by window (or, in the
        // global window and sessions, by key).
        (OpRole::ShuffleRead, CompiledTransform::Sql(op))
            if (op.windowed || op.keyed.is_some()) && plan.plan.is_streaming() =>
        {
            StageShape::Partitioned
        }
        _ => StageShape::Gathered,
    }
}

/// How many partitions a stage's shuffled inputs are cut into.
pub fn input_partitions(plan: &CompiledPlan, stage: &Stage, partitions: u32) -> u32 {
    match stage_shape(plan, stage) {
        StageShape::Partitioned => partitions.max(1),
        _ => 1,
    }
}

/// The items a stage starts with, with ids from `next_id` on.
pub fn initial_items(
    plan: &CompiledPlan,
    stage: &Stage,
    partitions: u32,
    next_id: &mut u64,
    reads: &StreamReads,
) -> Vec<WorkItem> {
    let mut id = || {
        *next_id += 1;
        *next_id - 1
    };
    let inputs: Vec<ItemInput> = match stage_shape(plan, stage) {
        StageShape::Read => {
            let splits = match &plan.transforms[stage.ops[0].transform] {
                CompiledTransform::Read { source, .. } => &source.splits,
                CompiledTransform::ReadStream(r) => {
                    reads.get(&stage.ops[0].transform).unwrap_or(&r.splits)
                }
                _ => unreachable!("stage_shape checked it"),
            };
            splits
                .iter()
                .enumerate()
                .map(|(split, range)| ItemInput::Read {
                    split,
                    range: range.clone(),
                })
                .collect()
        }
        StageShape::Create => vec![ItemInput::Create],
        StageShape::Partitioned => (0..partitions.max(1)).map(ItemInput::Partition).collect(),
        StageShape::Gathered => vec![ItemInput::Gather],
    };
    inputs
        .into_iter()
        .map(|input| WorkItem {
            id: id(),
            stage: stage.index,
            input,
        })
        .collect()
}

impl WorkItem {
    /// Canonical order among the items of a stage; independent of ids and of rebalancing.
    pub fn order(&self) -> (u64, u64) {
        match &self.input {
            ItemInput::Read { split, range } => (*split as u64, first_unit(range)),
            ItemInput::Create | ItemInput::Gather => (0, 0),
            ItemInput::Partition(p) | ItemInput::Partitions { first: p, .. } => (u64::from(*p), 0),
        }
    }

    /// The shuffle partitions this item reads, in order (empty for other items).
    pub fn partitions(&self) -> std::ops::Range<u32> {
        match self.input {
            ItemInput::Partition(p) => p..p + 1,
            ItemInput::Partitions { first, count } => first..first + count,
            _ => 0..0,
        }
    }

    /// The sink part number of this item's output: sinks commit parts in this order.
    pub fn part_number(&self) -> usize {
        let (a, b) = self.order();
        (self.stage as u64 * 1_000_000_000_000 + a * 1_000_000 + b.min(999_999)) as usize
    }

    /// The units this item reads, in order (empty for non-source items).
    pub fn units(&self) -> Vec<Split> {
        match &self.input {
            ItemInput::Read { range, .. } => units(range),
            _ => vec![],
        }
    }

    pub fn estimated_bytes(&self) -> u64 {
        match &self.input {
            ItemInput::Read { range, .. } => range.estimated_bytes,
            _ => 0,
        }
    }
}

/// Index of the first unit of `range` (row group, or aligned text unit).
fn first_unit(range: &Split) -> u64 {
    match range.kind {
        SplitKind::RowGroups { first, .. } => first as u64,
        SplitKind::Lines { start, .. } => start.div_ceil(LINE_UNIT_BYTES),
        SplitKind::Offsets { from, .. } => from,
    }
}

/// The read units of a split: one per row group, or text cut at multiples of
/// [`LINE_UNIT_BYTES`] of the file.
pub fn units(range: &Split) -> Vec<Split> {
    match range.kind {
        SplitKind::RowGroups { first, count } => (first..first + count)
            .map(|rg| Split {
                kind: SplitKind::RowGroups {
                    first: rg,
                    count: 1,
                },
                estimated_bytes: range.estimated_bytes / count.max(1) as u64,
                estimated_rows: range.estimated_rows.map(|r| r / count.max(1) as u64),
                ..range.clone()
            })
            .collect(),
        SplitKind::Lines { start, end } => {
            let mut out = vec![];
            let mut at = start;
            while at < end {
                let next = ((at / LINE_UNIT_BYTES + 1) * LINE_UNIT_BYTES).min(end);
                out.push(Split {
                    kind: SplitKind::Lines {
                        start: at,
                        end: next,
                    },
                    estimated_bytes: next - at,
                    estimated_rows: None,
                    ..range.clone()
                });
                at = next;
            }
            out
        }
        // A checkpoint's offsets are read whole: checkpoints are already small.
        SplitKind::Offsets { .. } => vec![range.clone()],
    }
}

/// Joins consecutive units back into one split.
fn join_units(units: &[Split]) -> Option<Split> {
    let first = units.first()?;
    let last = units.last()?;
    let kind = match (&first.kind, &last.kind) {
        (SplitKind::RowGroups { first: a, .. }, SplitKind::RowGroups { first: b, count }) => {
            SplitKind::RowGroups {
                first: *a,
                count: b + count - a,
            }
        }
        (SplitKind::Lines { start, .. }, SplitKind::Lines { end, .. }) => SplitKind::Lines {
            start: *start,
            end: *end,
        },
        _ => return None,
    };
    Some(Split {
        kind,
        estimated_bytes: units.iter().map(|u| u.estimated_bytes).sum(),
        estimated_rows: units.iter().map(|u| u.estimated_rows).sum::<Option<u64>>(),
        ..first.clone()
    })
}

/// Dynamic work rebalancing: cuts the unread remainder of `range`, of which `started` units
/// have been started, into what the current worker keeps and a residual for another worker.
/// The residual is the later half of the units not yet started. `None` when there is nothing
/// left to give away.
pub fn split_remainder(range: &Split, started: usize) -> Option<(Split, Split)> {
    let units = units(range);
    let unstarted = units.len().saturating_sub(started);
    if unstarted == 0 {
        return None;
    }
    // Keep at least one unit (the one in progress, or the next) with the current worker.
    let give = if started == 0 {
        unstarted / 2
    } else {
        unstarted.div_ceil(2)
    };
    if give == 0 {
        return None;
    }
    let cut = units.len() - give;
    Some((join_units(&units[..cut])?, join_units(&units[cut..])?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(kind: SplitKind, bytes: u64) -> Split {
        Split {
            location: "f".into(),
            kind,
            estimated_bytes: bytes,
            file_size: 100 << 20,
            estimated_rows: None,
            csv: None,
        }
    }

    #[test]
    fn text_units_are_file_aligned_so_splitting_never_changes_them() {
        let s = split(
            SplitKind::Lines {
                start: 1 << 20,
                end: 14 << 20,
            },
            13 << 20,
        );
        let u = units(&s);
        let bounds: Vec<(u64, u64)> = u
            .iter()
            .map(|u| match u.kind {
                SplitKind::Lines { start, end } => (start >> 20, end >> 20),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(bounds, vec![(1, 4), (4, 8), (8, 12), (12, 14)]);
        let (keep, give) = split_remainder(&s, 1).unwrap();
        assert_eq!(
            keep.kind,
            SplitKind::Lines {
                start: 1 << 20,
                end: 8 << 20
            }
        );
        assert_eq!(
            give.kind,
            SplitKind::Lines {
                start: 8 << 20,
                end: 14 << 20
            }
        );
        // The halves' units are exactly the original's.
        let mut again = units(&keep);
        again.extend(units(&give));
        assert_eq!(again, u);
    }

    #[test]
    fn row_groups_split_at_group_boundaries_and_keep_the_one_in_progress() {
        let s = split(SplitKind::RowGroups { first: 2, count: 5 }, 500);
        let (keep, give) = split_remainder(&s, 3).unwrap();
        assert_eq!(keep.kind, SplitKind::RowGroups { first: 2, count: 4 });
        assert_eq!(give.kind, SplitKind::RowGroups { first: 6, count: 1 });
        assert_eq!(keep.estimated_bytes + give.estimated_bytes, 500);
        assert!(split_remainder(&s, 5).is_none());
        let one = split(SplitKind::RowGroups { first: 0, count: 1 }, 10);
        assert!(split_remainder(&one, 0).is_none());
        let (keep, give) = split_remainder(&s, 0).unwrap();
        assert_eq!(keep.kind, SplitKind::RowGroups { first: 2, count: 3 });
        assert_eq!(give.kind, SplitKind::RowGroups { first: 5, count: 2 });
    }

    #[test]
    fn order_and_part_numbers_follow_the_data_not_the_ids() {
        let a = WorkItem {
            id: 9,
            stage: 1,
            input: ItemInput::Read {
                split: 0,
                range: split(SplitKind::RowGroups { first: 3, count: 1 }, 1),
            },
        };
        let b = WorkItem {
            id: 2,
            stage: 1,
            input: ItemInput::Read {
                split: 1,
                range: split(SplitKind::RowGroups { first: 0, count: 1 }, 1),
            },
        };
        assert!(a.order() < b.order());
        assert!(a.part_number() < b.part_number());
    }
}
