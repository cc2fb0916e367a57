//! Mapping of Beam combine fns onto DataFusion aggregate UDFs.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray};
use arrow::buffer::BooleanBuffer;
use arrow::compute::{CastOptions, can_cast_types, cast_with_options};
use arrow::datatypes::{DataType, Field, FieldRef, Schema};
use datafusion::common::{DataFusionError, ScalarValue};
use datafusion::functions_aggregate::{
    array_agg::array_agg_udaf,
    average::avg_udaf,
    bool_and_or::{bool_and_udaf, bool_or_udaf},
    count::count_udaf,
    min_max::{max_udaf, min_udaf},
    string_agg::string_agg_udaf,
    sum::sum_udaf,
};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{AggregateUDF, EmitTo, GroupsAccumulator};
use datafusion::physical_expr::expressions::{Column, Literal};
use datafusion::physical_expr::{GroupsAccumulatorAdapter, PhysicalExpr};

use super::{AggregateSpec, CombineError, CombineFn};

/// Everything needed to run one aggregate: the DataFusion UDF, the type its
/// accumulator consumes, state fields and the Beam output type.
#[derive(Debug, Clone)]
pub(crate) struct AggPlan {
    pub output: String,
    pub func: CombineFn,
    /// `None` for a custom fn, which runs `custom` instead.
    udaf: Option<Arc<AggregateUDF>>,
    custom: Option<super::CustomFn>,
    /// Whether the input batch carries a value column for this aggregate.
    pub has_value: bool,
    /// Type fed to the accumulator (value columns are cast to it). Boolean for
    /// a value-less count, which is fed an all-true column.
    pub acc_input_type: DataType,
    /// DataFusion's return type for `acc_input_type`.
    df_return_type: DataType,
    /// State fields, renamed `{output}#state{i}`, all nullable.
    pub state_fields: Vec<FieldRef>,
    pub output_type: DataType,
    pub output_nullable: bool,
}

fn unpack(dt: &DataType) -> DataType {
    match dt {
        DataType::Dictionary(_, v) => unpack(v),
        DataType::RunEndEncoded(_, v) => unpack(v.data_type()),
        other => other.clone(),
    }
}

impl AggPlan {
    pub fn try_new(spec: &AggregateSpec) -> Result<Self, CombineError> {
        use DataType::*;
        let func = spec.func;
        let unsupported = |dt: &DataType, detail: &str| CombineError::UnsupportedType {
            output: spec.output.clone(),
            func,
            data_type: dt.clone(),
            detail: detail.to_string(),
        };
        let input = match (&spec.input_type, func) {
            (Some(t), _) => unpack(t),
            (None, CombineFn::Count) => Boolean,
            (None, _) => {
                return Err(CombineError::MissingValue {
                    output: spec.output.clone(),
                    func,
                });
            }
        };
        if func == CombineFn::Custom {
            return Self::custom(spec, input);
        }
        let (udaf, acc_input_type) = match func {
            CombineFn::Sum => {
                let t = match &input {
                    Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 => Int64,
                    UInt64 => UInt64,
                    Float16 | Float32 | Float64 => Float64,
                    Decimal32(..) | Decimal64(..) | Decimal128(..) | Decimal256(..)
                    | Duration(_) => input.clone(),
                    other => return Err(unsupported(other, "expected a numeric type")),
                };
                (sum_udaf(), t)
            }
            CombineFn::Mean => {
                if !(input.is_numeric()) {
                    return Err(unsupported(&input, "expected a numeric type"));
                }
                (avg_udaf(), Float64)
            }
            CombineFn::Min | CombineFn::Max => {
                if input.is_nested() || input == Null {
                    return Err(unsupported(&input, "values must be orderable scalars"));
                }
                let f = if func == CombineFn::Min {
                    min_udaf()
                } else {
                    max_udaf()
                };
                (f, input.clone())
            }
            CombineFn::All | CombineFn::Any => {
                if input != Boolean {
                    return Err(unsupported(&input, "expected Boolean"));
                }
                let f = if func == CombineFn::All {
                    bool_and_udaf()
                } else {
                    bool_or_udaf()
                };
                (f, Boolean)
            }
            CombineFn::Count => (count_udaf(), input.clone()),
            CombineFn::Group => (array_agg_udaf(), input.clone()),
            // Beam's `concat` is ConcatListCombineFn (lists appended); strings are joined.
            CombineFn::Concat => match &input {
                Utf8 | LargeUtf8 | Utf8View => (string_agg_udaf(), input.clone()),
                List(f) | LargeList(f) | ListView(f) | LargeListView(f) | FixedSizeList(f, _) => {
                    (array_agg_udaf(), List(f.clone()))
                }
                other => {
                    return Err(unsupported(other, "expected a list or a string type"));
                }
            },
            CombineFn::Custom => unreachable!("handled above"),
        };
        let df_err = |e: DataFusionError| CombineError::Accumulator {
            output: spec.output.clone(),
            func,
            source: e,
        };
        let df_return_type = udaf
            .return_type(&args_types(func, &acc_input_type))
            .map_err(df_err)?;
        let input_fields = input_fields(func, &acc_input_type);
        let return_field: FieldRef =
            Arc::new(Field::new(&spec.output, df_return_type.clone(), true));
        let state_fields = udaf
            .state_fields(StateFieldsArgs {
                name: &spec.output,
                input_fields: &input_fields,
                return_field,
                ordering_fields: &[],
                is_distinct: false,
            })
            .map_err(df_err)?
            .into_iter()
            .enumerate()
            .map(|(i, f)| {
                Arc::new(Field::new(
                    format!("{}#state{i}", spec.output),
                    f.data_type().clone(),
                    true,
                ))
            })
            .collect();
        let (output_type, output_nullable) = match func {
            CombineFn::Count => (Int64, false),
            CombineFn::Concat if concat_lists(func, &acc_input_type) => {
                (acc_input_type.clone(), true)
            }
            CombineFn::Concat => (Utf8, true),
            _ => (df_return_type.clone(), true),
        };
        let plan = AggPlan {
            output: spec.output.clone(),
            func,
            udaf: Some(udaf),
            custom: None,
            has_value: spec.input_type.is_some(),
            acc_input_type,
            df_return_type,
            state_fields,
            output_type,
            output_nullable,
        };
        // Fail early (at plan time) if DataFusion cannot build an accumulator.
        plan.create_accumulator()?;
        Ok(plan)
    }

    /// A custom fn's plan: its accumulators are Python objects, its state one Binary column of
    /// them pickled.
    fn custom(spec: &AggregateSpec, input: DataType) -> Result<Self, CombineError> {
        let custom = spec
            .custom
            .clone()
            .ok_or_else(|| CombineError::MissingValue {
                output: spec.output.clone(),
                func: CombineFn::Custom,
            })?;
        Ok(AggPlan {
            output: spec.output.clone(),
            func: CombineFn::Custom,
            udaf: None,
            has_value: true,
            acc_input_type: input,
            df_return_type: custom.output_type.clone(),
            state_fields: vec![Arc::new(Field::new(
                format!("{}#state0", spec.output),
                DataType::Binary,
                true,
            ))],
            output_type: custom.output_type.clone(),
            output_nullable: true,
            custom: Some(custom),
        })
    }

    pub fn num_state_columns(&self) -> usize {
        self.state_fields.len()
    }

    pub fn df_err(&self) -> impl FnOnce(DataFusionError) -> CombineError + '_ {
        move |source| CombineError::Accumulator {
            output: self.output.clone(),
            func: self.func,
            source,
        }
    }

    /// A fresh groups accumulator (DataFusion's own when available, otherwise
    /// the row-wise accumulator behind `GroupsAccumulatorAdapter`).
    pub fn create_accumulator(&self) -> Result<Box<dyn GroupsAccumulator>, CombineError> {
        let Some(udaf) = &self.udaf else {
            return self.custom_accumulator();
        };
        let owned = OwnedArgs::new(self);
        let supported = owned.with_args(|args| udaf.groups_accumulator_supported(args));
        if supported {
            owned
                .with_args(|args| udaf.create_groups_accumulator(args))
                .map_err(self.df_err())
        } else {
            // Check once that a row accumulator can be built, then defer to the adapter.
            owned
                .with_args(|args| udaf.accumulator(args))
                .map_err(self.df_err())?;
            let udaf = Arc::clone(udaf);
            Ok(Box::new(GroupsAccumulatorAdapter::new(move || {
                owned.with_args(|args| udaf.accumulator(args))
            })))
        }
    }

    fn custom_accumulator(&self) -> Result<Box<dyn GroupsAccumulator>, CombineError> {
        #[cfg(feature = "python")]
        {
            let custom = self
                .custom
                .as_ref()
                .expect("a plan without a udaf has a custom fn");
            let acc = riverbank_udf::python::combine::PyAccumulator::new(custom, &self.output)
                .map_err(self.df_err())?;
            Ok(Box::new(acc))
        }
        #[cfg(not(feature = "python"))]
        Err(self.df_err()(DataFusionError::NotImplemented(format!(
            "python CombineFn '{}': this riverbank was built without Python (the `python` feature)",
            self.custom
                .as_ref()
                .map(|c| c.source.as_str())
                .unwrap_or("?")
        ))))
    }

    /// Prepare a value column for `update_batch`: cast to the accumulator's
    /// input type if necessary. For a value-less count, build an all-true
    /// column of `num_rows`.
    pub fn prepare_value(
        &self,
        column: Option<&ArrayRef>,
        num_rows: usize,
    ) -> Result<ArrayRef, CombineError> {
        match column {
            Some(c) if self.has_value => cast_to(c, &self.acc_input_type, || {
                format!(
                    "casting value of output `{}` (fn `{}`)",
                    self.output, self.func
                )
            }),
            _ => Ok(Arc::new(BooleanArray::new(
                BooleanBuffer::new_set(num_rows),
                None,
            ))),
        }
    }

    /// Evaluate the accumulator into the Beam output type.
    pub fn evaluate(&self, acc: &mut dyn GroupsAccumulator) -> Result<ArrayRef, CombineError> {
        let mut out = acc.evaluate(EmitTo::All).map_err(self.df_err())?;
        if concat_lists(self.func, &self.acc_input_type) {
            // array_agg gave each group its list of lists: append them.
            out = append_lists(&out).map_err(|source| CombineError::Arrow {
                context: format!("appending the lists of output `{}`", self.output),
                source,
            })?;
        }
        cast_to(&out, &self.output_type, || {
            format!(
                "converting result of output `{}` (fn `{}`) from {}",
                self.output, self.func, self.df_return_type
            )
        })
    }

    /// Emit the accumulator's state, cast to the declared state field types.
    pub fn state(&self, acc: &mut dyn GroupsAccumulator) -> Result<Vec<ArrayRef>, CombineError> {
        let state = acc.state(EmitTo::All).map_err(self.df_err())?;
        if state.len() != self.state_fields.len() {
            return Err(CombineError::Accumulator {
                output: self.output.clone(),
                func: self.func,
                source: DataFusionError::Internal(format!(
                    "accumulator produced {} state columns, expected {}",
                    state.len(),
                    self.state_fields.len()
                )),
            });
        }
        state
            .iter()
            .zip(&self.state_fields)
            .map(|(a, f)| {
                cast_to(a, f.data_type(), || {
                    format!("casting state column `{}`", f.name())
                })
            })
            .collect()
    }
}

pub(crate) fn cast_to(
    array: &ArrayRef,
    to: &DataType,
    context: impl FnOnce() -> String,
) -> Result<ArrayRef, CombineError> {
    if array.data_type() == to {
        return Ok(Arc::clone(array));
    }
    if !can_cast_types(array.data_type(), to) {
        return Err(CombineError::BadBatch {
            what: "input",
            detail: format!("{}: cannot cast {} to {}", context(), array.data_type(), to),
        });
    }
    // Strict cast: a value that does not fit is an error, never a silent null.
    let options = CastOptions {
        safe: false,
        ..Default::default()
    };
    cast_with_options(array, to, &options).map_err(|source| CombineError::Arrow {
        context: context(),
        source,
    })
}

/// Whether this is a `concat` of list values (run as array_agg, then each group's lists
/// appended).
fn concat_lists(func: CombineFn, input: &DataType) -> bool {
    func == CombineFn::Concat && matches!(input, DataType::List(_))
}

/// Each row of a list of lists → the row's lists appended, in order (a null list adds nothing).
fn append_lists(array: &ArrayRef) -> Result<ArrayRef, arrow::error::ArrowError> {
    use arrow::array::{AsArray, ListArray};
    use arrow::buffer::OffsetBuffer;
    let outer = array.as_list::<i32>();
    let inner = outer.values().as_list::<i32>();
    let (item, _, _, _) = inner.clone().into_parts();
    let mut take: Vec<u32> = vec![];
    let mut lengths: Vec<usize> = Vec::with_capacity(outer.len());
    for row in 0..outer.len() {
        let mut n = 0;
        if outer.is_valid(row) {
            let (start, end) = (outer.value_offsets()[row], outer.value_offsets()[row + 1]);
            for l in start as usize..end as usize {
                if inner.is_valid(l) {
                    let (a, b) = (inner.value_offsets()[l], inner.value_offsets()[l + 1]);
                    take.extend(a as u32..b as u32);
                    n += (b - a) as usize;
                }
            }
        }
        lengths.push(n);
    }
    let values = arrow::compute::take(
        inner.values().as_ref(),
        &arrow::array::UInt32Array::from(take),
        None,
    )?;
    Ok(Arc::new(ListArray::try_new(
        item,
        OffsetBuffer::from_lengths(lengths),
        values,
        outer.nulls().cloned(),
    )?))
}

fn args_types(func: CombineFn, input: &DataType) -> Vec<DataType> {
    match func {
        CombineFn::Concat if concat_lists(func, input) => vec![input.clone()],
        CombineFn::Concat => vec![input.clone(), DataType::Utf8],
        _ => vec![input.clone()],
    }
}

fn input_fields(func: CombineFn, input: &DataType) -> Vec<FieldRef> {
    let mut fields = vec![Arc::new(Field::new("value", input.clone(), true))];
    if func == CombineFn::Concat && !concat_lists(func, input) {
        fields.push(Arc::new(Field::new("delimiter", DataType::Utf8, true)));
    }
    fields
}

/// Owned pieces of an [`AccumulatorArgs`], so accumulators can be created
/// repeatedly (also from the adapter's factory closure).
struct OwnedArgs {
    return_field: FieldRef,
    schema: Schema,
    exprs: Vec<Arc<dyn PhysicalExpr>>,
    expr_fields: Vec<FieldRef>,
    name: String,
}

impl OwnedArgs {
    fn new(plan: &AggPlan) -> Self {
        let expr_fields = input_fields(plan.func, &plan.acc_input_type);
        let schema = Schema::new(
            expr_fields
                .iter()
                .map(|f| f.as_ref().clone())
                .collect::<Vec<_>>(),
        );
        let mut exprs: Vec<Arc<dyn PhysicalExpr>> = vec![Arc::new(Column::new("value", 0))];
        if plan.func == CombineFn::Concat && !concat_lists(plan.func, &plan.acc_input_type) {
            exprs.push(Arc::new(Literal::new(ScalarValue::Utf8(Some(
                String::new(),
            )))));
        }
        OwnedArgs {
            return_field: Arc::new(Field::new(&plan.output, plan.df_return_type.clone(), true)),
            schema,
            exprs,
            expr_fields,
            name: plan.output.clone(),
        }
    }

    fn with_args<T>(&self, f: impl FnOnce(AccumulatorArgs) -> T) -> T {
        f(AccumulatorArgs {
            return_field: Arc::clone(&self.return_field),
            schema: &self.schema,
            // `group` keeps nulls, like Beam's ToList.
            ignore_nulls: false,
            order_bys: &[],
            is_reversed: false,
            name: &self.name,
            is_distinct: false,
            exprs: &self.exprs,
            expr_fields: &self.expr_fields,
        })
    }
}
