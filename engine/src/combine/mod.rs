//! Beam YAML `Combine`, lifted the way Dataflow lifts it.
//!
//! Dataflow's *combine optimization* splits a `Combine` into two halves around
//! the shuffle:
//!
//! 1. a [`PartialCombiner`] runs in the producing stage. It groups its input by
//!    key and keeps one partial accumulator state per key. It behaves like a
//!    cache: the caller may [`flush`](PartialCombiner::flush) at any time (e.g.
//!    when [`memory_size`](PartialCombiner::memory_size) grows too large) and
//!    that is always correct, because the final combine merges any number of
//!    partial states per key.
//! 2. the shuffle moves partial-state batches (schema
//!    [`CombineSpec::state_schema`]), partitioned by key with
//!    [`hash_partition`].
//! 3. a [`FinalCombiner`] merges partial states per key and evaluates the final
//!    values (schema [`CombineSpec::output_schema`]). It spills sorted runs to
//!    disk when it exceeds its memory limit and k-way merges them at the end,
//!    so a combine with more keys than fit in memory still completes.
//!
//! The accumulators are DataFusion's own aggregate functions (`sum`, `min`,
//! `max`, `bool_and`, `bool_or`, `avg`, `count`, `array_agg`, `string_agg`),
//! driven through their vectorized [`GroupsAccumulator`] implementations (or
//! DataFusion's `GroupsAccumulatorAdapter` around the row-wise `Accumulator`
//! where a function has no groups accumulator for the input type), so partial
//! states are exactly DataFusion's intermediate state arrays. The group-key
//! hash table is ours: key columns are encoded with arrow's `RowConverter` and
//! interned into a `hashbrown::HashTable` keyed by the row bytes.
//!
//! # Input batches of the partial combine
//!
//! Input batches hold the key columns (in `key_fields` order) followed by the
//! *value columns*, one per aggregate **that has a value**, in aggregate order.
//! An aggregate whose `input_type` is `None` (a `count` without `value`, which
//! counts elements) has **no** column. See [`CombineSpec::input_schema`]. For
//! convenience a batch with one column for *every* aggregate is also accepted;
//! the columns of value-less counts are then ignored. Column names are not
//! checked, only positions and types; a value column whose type differs from
//! the declared `input_type` is cast to it.
//!
//! # Semantics
//!
//! * Null values are ignored by every function except `group`, which collects
//!   them (Beam's `ToList` keeps `None`s) and `count` without a value, which
//!   counts rows. A group whose values are all null yields null for
//!   sum/min/max/mean/all/any/concat and 0 for count.
//! * Keys are compared by their arrow row encoding: null keys form one group,
//!   `NaN`s with equal bit patterns group together, `-0.0` and `0.0` are
//!   distinct keys.
//! * A global combine (no key fields) over zero input rows produces **no**
//!   output row (like Beam's `CombineGlobally(..).without_defaults()`); the
//!   caller decides whether to emit defaults.
//! * `concat` concatenates in an unspecified order with no separator. `group`
//!   collects in an unspecified order.
//! * Output rows come out in no particular key order.
//!
//! # Types
//!
//! | fn     | accepted value types                  | output type                         |
//! |--------|---------------------------------------|-------------------------------------|
//! | sum    | ints, floats, decimals, durations     | Int64 (ints; UInt64 stays UInt64), Float64 (floats), widened decimal, duration |
//! | mean   | ints, floats, decimals                | Float64                             |
//! | min/max| any non-nested type DataFusion orders | the value type (dictionaries are unpacked) |
//! | all/any| Boolean                               | Boolean                             |
//! | count  | any, or no value                      | Int64 (non-nullable)                |
//! | group  | any                                   | List<item: value type>              |
//! | concat | Utf8, LargeUtf8, Utf8View; lists     | Utf8; the list type (each group's lists appended, as Beam's ConcatListCombineFn) |

mod aggregate;
mod final_combiner;
mod groups;
mod packed;
mod partial;
mod partition;
mod spill;
#[cfg(test)]
mod tests;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::error::ArrowError;
use datafusion::common::DataFusionError;
#[cfg(doc)]
use datafusion::logical_expr::GroupsAccumulator;

pub use final_combiner::FinalCombiner;
pub(crate) use groups::stable_hash;
pub use partial::PartialCombiner;
pub use partition::hash_partition;

use aggregate::AggPlan;

/// A Beam YAML built-in combine function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CombineFn {
    /// Sum of the non-null values.
    Sum,
    /// Largest non-null value.
    Max,
    /// Smallest non-null value.
    Min,
    /// Boolean AND of the non-null values.
    All,
    /// Boolean OR of the non-null values.
    Any,
    /// Arithmetic mean of the non-null values, as Float64.
    Mean,
    /// Number of non-null values, or of elements when there is no value field.
    Count,
    /// All values (nulls included) collected into a list.
    Group,
    /// String concatenation of the non-null values, in arbitrary order.
    Concat,
    /// A user's CombineFn in Python ([`AggregateSpec::custom`]).
    Custom,
}

pub use riverbank_udf::CustomFn;

impl CombineFn {
    /// Every function, in the order used in error messages.
    pub const ALL: [CombineFn; 9] = [
        CombineFn::Sum,
        CombineFn::Max,
        CombineFn::Min,
        CombineFn::All,
        CombineFn::Any,
        CombineFn::Mean,
        CombineFn::Count,
        CombineFn::Group,
        CombineFn::Concat,
    ];

    /// The Beam YAML name of the function.
    pub fn name(self) -> &'static str {
        match self {
            CombineFn::Sum => "sum",
            CombineFn::Max => "max",
            CombineFn::Min => "min",
            CombineFn::All => "all",
            CombineFn::Any => "any",
            CombineFn::Mean => "mean",
            CombineFn::Count => "count",
            CombineFn::Group => "group",
            CombineFn::Concat => "concat",
            CombineFn::Custom => "python",
        }
    }

    fn valid_names() -> String {
        CombineFn::ALL
            .iter()
            .map(|f| f.name())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl fmt::Display for CombineFn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CombineFn {
    type Err = CombineError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CombineFn::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| CombineError::UnknownFn {
                name: s.to_string(),
                valid: CombineFn::valid_names(),
            })
    }
}

/// One `out_name: {fn, value}` entry of a Beam YAML `Combine`.
#[derive(Debug, Clone, PartialEq)]
pub struct AggregateSpec {
    /// Output field name.
    pub output: String,
    /// The combine function.
    pub func: CombineFn,
    /// Type of the `value` field; `None` only for `count` without a value.
    pub input_type: Option<DataType>,
    /// The fn of a `CombineFn::Custom`.
    pub custom: Option<CustomFn>,
}

impl AggregateSpec {
    /// Convenience constructor.
    pub fn new(output: impl Into<String>, func: CombineFn, input_type: Option<DataType>) -> Self {
        Self {
            output: output.into(),
            func,
            input_type,
            custom: None,
        }
    }

    /// A custom (python) fn's aggregate.
    pub fn custom(output: impl Into<String>, custom: CustomFn, input_type: DataType) -> Self {
        Self {
            output: output.into(),
            func: CombineFn::Custom,
            input_type: Some(input_type),
            custom: Some(custom),
        }
    }
}

/// A whole `Combine`: key fields and aggregates.
#[derive(Debug, Clone, PartialEq)]
pub struct CombineSpec {
    /// `group_by` fields (plus hidden window columns when windowed). Empty for a
    /// global combine.
    pub key_fields: Vec<Field>,
    /// The aggregates, in output order.
    pub aggregates: Vec<AggregateSpec>,
}

impl CombineSpec {
    /// Schema of the input batches of [`PartialCombiner::update`]: key columns,
    /// then one column per aggregate that has a value (named after the output
    /// field, nullable).
    pub fn input_schema(&self) -> Result<SchemaRef, CombineError> {
        self.validate()?;
        let mut fields = self.key_fields.clone();
        for agg in &self.aggregates {
            if let Some(t) = &agg.input_type {
                fields.push(Field::new(&agg.output, t.clone(), true));
            }
        }
        Ok(Arc::new(Schema::new(fields)))
    }

    /// Schema of partial-state batches: key columns (same names/types), then
    /// each aggregate's DataFusion state columns, named `{output}#state{i}`
    /// (all nullable).
    pub fn state_schema(&self) -> Result<SchemaRef, CombineError> {
        let plans = self.plans()?;
        Ok(state_schema_from(self, &plans))
    }

    /// Schema of the final output: key columns, then one column per aggregate
    /// named `output` (see the module docs for result types).
    pub fn output_schema(&self) -> Result<SchemaRef, CombineError> {
        let plans = self.plans()?;
        Ok(output_schema_from(self, &plans))
    }

    fn validate(&self) -> Result<(), CombineError> {
        let mut seen = std::collections::HashSet::new();
        for name in self
            .key_fields
            .iter()
            .map(|f| f.name().as_str())
            .chain(self.aggregates.iter().map(|a| a.output.as_str()))
        {
            if !seen.insert(name) {
                return Err(CombineError::DuplicateField {
                    name: name.to_string(),
                });
            }
        }
        Ok(())
    }

    pub(crate) fn plans(&self) -> Result<Vec<AggPlan>, CombineError> {
        self.validate()?;
        self.aggregates.iter().map(AggPlan::try_new).collect()
    }
}

pub(crate) fn state_schema_from(spec: &CombineSpec, plans: &[AggPlan]) -> SchemaRef {
    let mut fields = spec.key_fields.clone();
    for p in plans {
        fields.extend(p.state_fields.iter().map(|f| f.as_ref().clone()));
    }
    Arc::new(Schema::new(fields))
}

pub(crate) fn output_schema_from(spec: &CombineSpec, plans: &[AggPlan]) -> SchemaRef {
    let mut fields = spec.key_fields.clone();
    fields.extend(
        plans
            .iter()
            .map(|p| Field::new(&p.output, p.output_type.clone(), p.output_nullable)),
    );
    Arc::new(Schema::new(fields))
}

/// Errors of the combine machinery. Messages name the output field and fn
/// where one is involved.
#[derive(thiserror::Error, Debug)]
pub enum CombineError {
    /// Unknown Beam combine fn name.
    #[error("unknown combine fn `{name}`; valid fns are: {valid}")]
    UnknownFn {
        /// The name given.
        name: String,
        /// Comma-separated valid names.
        valid: String,
    },
    /// A fn other than `count` was given no value field.
    #[error("combine output `{output}`: fn `{func}` needs a `value` field")]
    MissingValue {
        /// Output field.
        output: String,
        /// Combine fn.
        func: CombineFn,
    },
    /// The value type is not supported by the fn.
    #[error("combine output `{output}`: fn `{func}` does not support values of type {data_type}{}", if .detail.is_empty() { String::new() } else { format!(" ({})", .detail) })]
    UnsupportedType {
        /// Output field.
        output: String,
        /// Combine fn.
        func: CombineFn,
        /// The offending type.
        data_type: DataType,
        /// Extra detail, possibly empty.
        detail: String,
    },
    /// Two key/output fields share a name.
    #[error("combine field `{name}` appears more than once among keys and outputs")]
    DuplicateField {
        /// The duplicated name.
        name: String,
    },
    /// A key type the row format cannot encode.
    #[error("combine keys: unsupported key types: {0}")]
    UnsupportedKey(#[source] ArrowError),
    /// An input or state batch does not have the expected shape.
    #[error("combine: bad {what} batch: {detail}")]
    BadBatch {
        /// "input" or "state".
        what: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// A DataFusion accumulator failed.
    #[error("combine output `{output}` (fn `{func}`): {source}")]
    Accumulator {
        /// Output field.
        output: String,
        /// Combine fn.
        func: CombineFn,
        /// The DataFusion error.
        #[source]
        source: DataFusionError,
    },
    /// An arrow kernel failed.
    #[error("combine: {context}: {source}")]
    Arrow {
        /// What was being done.
        context: String,
        /// The arrow error.
        #[source]
        source: ArrowError,
    },
    /// Spill file IO failed.
    #[error("combine spill: {context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
}

impl CombineError {
    pub(crate) fn arrow(context: impl Into<String>) -> impl FnOnce(ArrowError) -> CombineError {
        let context = context.into();
        move |source| CombineError::Arrow { context, source }
    }

    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> CombineError {
        let context = context.into();
        move |source| CombineError::Io { context, source }
    }
}
