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
    pub output_schema: SchemaRef,
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
}

impl SqlOp {
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
}

impl SqlKeys {
    /// The key columns of collection `c` (one collection backs one key, even in a self-join).
    pub fn of_collection<'a>(&'a self, op: &SqlOp, c: &str) -> Option<&'a [String]> {
        op.tables
            .iter()
            .position(|(_, coll)| coll == c)
            .map(|i| self.fields[i].as_slice())
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
