//! What `compile` makes of a plan and everything downstream reads: each transform bound to its
//! data (`CompiledTransform`: element ops, sources and their splits, sinks, combines, Sql),
//! and the schema of every collection.
use crate::combine::CombineSpec;
use crate::ops::ElementOp;
use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use riverbank_io as io;
use riverbank_pipeline::Plan;
use riverbank_pipeline::trigger::Triggering;
use riverbank_udf::expr::Compiled;
use std::collections::HashMap;
use std::sync::Arc;

/// A compiled Combine: how to project its input, and the spec of both halves.
#[derive(Debug)]
pub struct CombineOp {
    pub spec: Arc<CombineSpec>,
    /// Group-by columns, by index in the user-visible input.
    pub keys: Vec<usize>,
    /// Value expressions, one per aggregate that has a value.
    pub values: Vec<Compiled>,
    /// Whether window bounds are part of the key.
    pub windowed: bool,
    /// Session windows merge per key before the final combine.
    pub sessions: bool,
    /// When panes fire in streaming (a batch run fires each window once, at its end).
    pub triggering: Triggering,
    /// Streaming over sliding windows that fire once each: state kept per slice, not window.
    pub slices: Option<Slices>,
    pub output_schema: SchemaRef,
}

/// A streaming Combine over sliding windows whose size is a multiple of their period, fired
/// once each at the watermark (the default trigger, no allowed lateness): as Flink slices hop
/// windows, an element goes to the one period-long slice it falls in (not to each of its
/// `size / period` windows), its key's slices are kept in state, and a window fires as the
/// merge of its slices. The producers send each element once instead of once per window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slices {
    pub size_us: i64,
    pub period_us: i64,
}

impl Slices {
    /// Slices for `window` under `triggering` in a streaming job, where they give the same
    /// panes as windows kept one by one.
    pub fn of(
        window: &riverbank_pipeline::windowing::WindowFn,
        triggering: &Triggering,
    ) -> Option<Slices> {
        use riverbank_pipeline::trigger::Trigger;
        let riverbank_pipeline::windowing::WindowFn::Sliding {
            size_us, period_us, ..
        } = *window
        else {
            return None;
        };
        let once = match &triggering.trigger {
            Trigger::Default => true,
            Trigger::AfterWatermark { early, late } => early.is_none() && late.is_none(),
            _ => false,
        };
        (once
            && triggering.allowed_lateness_us == 0
            && period_us > 0
            && size_us > period_us
            && size_us % period_us == 0)
            .then_some(Slices { size_us, period_us })
    }

    /// The end of the last window holding the slice that ends at `slice_end`: its state is
    /// needed until the watermark passes it.
    pub fn last_window_end(&self, slice_end: i64) -> i64 {
        slice_end.saturating_add(self.size_us - self.period_us)
    }

    /// The ends of the slices that make up the window ending at `window_end`, in order.
    pub fn slice_ends(&self, window_end: i64) -> impl Iterator<Item = i64> + '_ {
        let first = window_end.saturating_sub(self.size_us - self.period_us);
        (0..self.size_us / self.period_us).map(move |j| first.saturating_add(j * self.period_us))
    }

    /// The ends of the windows holding the slice that ends at `slice_end`, in order.
    pub fn window_ends(&self, slice_end: i64) -> impl Iterator<Item = i64> + '_ {
        (0..self.size_us / self.period_us)
            .map(move |j| slice_end.saturating_add(j * self.period_us))
    }
}

/// The hidden aggregate counting a window's elements, for count triggers.
pub const ELEMENT_COUNT: &str = "__rb_n";

#[derive(Debug)]
pub struct SqlOp {
    pub query: String,
    /// Table name → input collection id.
    pub tables: Vec<(String, String)>,
    /// Windowed input: the query runs once per window, as Beam SQL aggregates per window.
    pub windowed: bool,
    /// Tables of unwindowed inputs beside windowed ones (side inputs, such as a `Create` or a
    /// file read): every window's query sees all of their rows.
    pub side_tables: Vec<String>,
    /// When a window's query runs in streaming (its input's triggering; batch runs each once).
    pub triggering: Triggering,
    pub output_schema: SchemaRef,
    /// On session windows: each table's key columns, by which the inputs' sessions merge
    /// before the query runs per (merged) window (`sessions::merge_across`).
    pub session_keys: Option<Vec<Vec<String>>>,
    /// A streaming query over the global window or sessions: its rows are cut into state
    /// shards by key (`riverbank_streaming::sql_keyed`: each firing emits what changed;
    /// `sql_sessions`: sessions merged per key).
    pub keyed: Option<SqlKeys>,
    /// The fields of each table the query reads, by table order (`None`: all): its producers
    /// send only these, and a streaming query's state shards keep only these.
    pub columns: Option<Vec<Vec<String>>>,
    /// Streaming: input collections that carry only a bounded source's rows (a `Create`, a file
    /// read, through row-by-row transforms): side inputs, which a discarding firing of the
    /// global window keeps (it discards the stream's rows only).
    pub bounded_inputs: std::collections::BTreeSet<String>,
    /// Input collections that carry the rows of a file read with a `refresh_interval` (through
    /// row-by-row transforms), and that read's name: a streaming shard keeps only the rows of
    /// its latest read (`CheckpointCtx::refreshed`).
    pub refreshing: std::collections::BTreeMap<String, String>,
    /// A windowed streaming query of the rows whose field is the window's greatest (or
    /// least): its shards keep only those rows of each window (`sql::extreme_rows`).
    pub extreme: Option<crate::sql::Extreme>,
    /// The tables the query reads only as sets of distinct rows (`sql::set_tables`): a
    /// windowed streaming shard keeps each checkpoint's rows of them without repeats.
    pub set_tables: Vec<String>,
}

impl SqlOp {
    /// Whether this checkpoint brings a new read of input collection `c`'s refreshed file read,
    /// whose rows replace those kept of it.
    pub fn refreshed(&self, c: &str, ctx: &crate::work::CheckpointCtx) -> bool {
        self.refreshing
            .get(c)
            .is_some_and(|source| ctx.refreshed.contains(source))
    }

    /// The fields of collection `c` that some table reading it needs (`None`: all of them).
    pub fn columns_of(&self, c: &str) -> Option<Vec<&str>> {
        let columns = self.columns.as_ref()?;
        let mut out: Vec<&str> = vec![];
        for ((_, coll), cols) in self.tables.iter().zip(columns) {
            if coll == c {
                for f in cols {
                    if !out.contains(&f.as_str()) {
                        out.push(f);
                    }
                }
            }
        }
        Some(out)
    }
}

/// How a streaming Sql/Join over the global window or sessions spreads its state: the rows of
/// each key meet in one shard, so the query over a shard's rows is the query's result for the
/// shard's keys.
#[derive(Debug, Clone)]
pub struct SqlKeys {
    /// Each table's key columns, by the op's table order (a Join's equalities; a Sql's GROUP
    /// BY fields; none: every row shares one key, and one shard).
    pub fields: Vec<Vec<String>>,
    /// Each key part's type across the tables (widened to one), so equal keys of different
    /// inputs hash alike.
    pub types: Vec<arrow::datatypes::DataType>,
    /// Each table's state TTL (its input's `windowing.state_ttl`), by table order.
    pub ttl_us: Vec<Option<i64>>,
    /// An inner Join of two distinct inputs: a firing joins each side's new rows with the
    /// other side's rows (`riverbank_streaming::sql_keyed`), rather than running the query
    /// over every kept row of the keys before and after.
    pub inner_pair: bool,
    /// A Sql whose result is a group aggregate that merges with itself (`sql::merge_query`),
    /// accumulating, without a TTL: each shard keeps one row of the result per group rather
    /// than the group's rows, and this query merges a group's kept row with the rows new ones
    /// make (`riverbank_streaming::sql_keyed`).
    pub merge: Option<String>,
    /// A Sql whose result aggregates (AVG, SUM, COUNT) another group aggregate's rows
    /// (`sql::nested_query`: Nexmark Q4's averages of final prices), accumulating, without a
    /// TTL: each shard keeps the inner rows, one per inner group, and the outer groups'
    /// sums, which a firing updates by the inner rows it changes.
    pub nested: Option<Box<crate::sql::NestedAggregate>>,
}

impl SqlKeys {
    /// The key columns of collection `c` (one collection backs one key, even in a self-join).
    pub fn of_collection<'a>(&'a self, op: &SqlOp, c: &str) -> Option<&'a [String]> {
        op.tables
            .iter()
            .position(|(_, coll)| coll == c)
            .map(|i| self.fields[i].as_slice())
    }

    /// How a shard keeps aggregates rather than rows, if it does: the merge query, or the
    /// nested aggregate's form (what a shard records, and an update's state check compares).
    pub fn aggregate_form(&self) -> Option<String> {
        self.merge
            .clone()
            .or_else(|| self.nested.as_ref().map(|n| n.form()))
    }
}

/// Every transform, ready to run.
#[derive(Debug)]
pub enum CompiledTransform {
    Read {
        options: io::ReadOptions,
        source: io::SourcePlan,
    },
    Create {
        batch: RecordBatch,
    },
    /// An unbounded source; `splits` are the current checkpoint's offset ranges.
    ReadStream(StreamRead),
    Write {
        options: io::WriteOptions,
        schema: SchemaRef,
    },
    Element(ElementOp),
    Combine(CombineOp),
    Sql(SqlOp),
    Reshuffle,
    AssertEqual {
        expected: Vec<serde_json::Value>,
    },
    /// A Beam Python PTransform, run on Beam's Python SDK (`crate::python_sdk`) over its
    /// gathered inputs.
    PyTransform {
        spec: crate::python_sdk::PyTransformSpec,
        output_schema: SchemaRef,
        output_window: riverbank_pipeline::windowing::WindowFn,
    },
}

pub use riverbank_io::unbounded::StreamSpec;

#[derive(Debug, Clone)]
pub struct StreamRead {
    pub spec: StreamSpec,
    /// With the hidden event-time column.
    pub schema: SchemaRef,
    pub splits: Vec<io::Split>,
}

pub struct CompiledPlan {
    pub plan: Plan,
    pub transforms: Vec<CompiledTransform>,
    /// Collection id → schema (with hidden columns).
    pub schemas: HashMap<String, SchemaRef>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use riverbank_pipeline::windowing::WindowFn;

    fn triggering(v: serde_json::Value) -> Triggering {
        Triggering::parse(v.as_object().unwrap()).unwrap()
    }

    /// Slices only where they give the panes windows kept one by one would: sliding windows
    /// a whole number of periods long, fired once each at the watermark.
    #[test]
    fn sliding_windows_fired_once_each_are_kept_as_slices() {
        const S: i64 = 1_000_000;
        let sliding = |size, period| WindowFn::Sliding {
            size_us: size * S,
            period_us: period * S,
            offset_us: 0,
        };
        let once = Triggering::default();
        let s = Slices::of(&sliding(10, 2), &once).unwrap();
        assert_eq!((s.size_us, s.period_us), (10 * S, 2 * S));
        assert_eq!(
            s.window_ends(4 * S).collect::<Vec<_>>(),
            [4, 6, 8, 10, 12].map(|e| e * S)
        );
        assert_eq!(s.last_window_end(4 * S), 12 * S);
        assert_eq!(
            s.slice_ends(12 * S).collect::<Vec<_>>(),
            [4, 6, 8, 10, 12].map(|e| e * S)
        );
        let watermark = triggering(serde_json::json!({"trigger": "after_watermark"}));
        assert!(Slices::of(&sliding(10, 2), &watermark).is_some());
        // Not a whole number of periods, one window per period, other window fns.
        assert_eq!(Slices::of(&sliding(10, 3), &once), None);
        assert_eq!(Slices::of(&sliding(2, 2), &once), None);
        let fixed = WindowFn::Fixed {
            size_us: 10 * S,
            offset_us: 0,
        };
        assert_eq!(Slices::of(&fixed, &once), None);
        // Panes other than one on-time pane per window need each window's own state.
        for t in [
            serde_json::json!({"allowed_lateness": "60s"}),
            serde_json::json!({"trigger": {"after_watermark": {"early": {"after_count": 10}}}}),
            serde_json::json!({"trigger": {"repeatedly": {"after_count": 10}}}),
        ] {
            assert_eq!(
                Slices::of(&sliding(10, 2), &triggering(t.clone())),
                None,
                "{t}"
            );
        }
    }
}
