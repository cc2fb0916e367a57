use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Date32Array, Float32Array, Float64Array, Int32Array,
    Int64Array, NullArray, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use arrow::util::display::array_value_to_string;

use super::groups::{PARTITION_SEED, stable_hash};
use super::*;

type Agg<'a> = (&'a str, CombineFn, Option<DataType>);

fn make_spec(keys: Vec<Field>, aggs: &[Agg<'_>]) -> Arc<CombineSpec> {
    Arc::new(CombineSpec {
        key_fields: keys,
        aggregates: aggs
            .iter()
            .map(|(o, f, t)| AggregateSpec::new(*o, *f, t.clone()))
            .collect(),
    })
}

fn batch(columns: Vec<ArrayRef>) -> RecordBatch {
    let fields: Vec<Field> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| Field::new(format!("c{i}"), c.data_type().clone(), true))
        .collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
}

/// Display one value; list elements are sorted, nulls are "null".
fn fmt_value(col: &dyn Array, i: usize) -> String {
    if col.is_null(i) {
        return "null".into();
    }
    match col.data_type() {
        DataType::List(_) => {
            let list = col.as_list::<i32>().value(i);
            let mut items: Vec<String> = (0..list.len()).map(|j| fmt_value(&list, j)).collect();
            items.sort();
            format!("[{}]", items.join(","))
        }
        _ => array_value_to_string(col, i).unwrap(),
    }
}

/// Output rows keyed by the display of their key columns ("|"-joined).
fn by_key(batches: &[RecordBatch], nk: usize) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for b in batches {
        for i in 0..b.num_rows() {
            let key = (0..nk)
                .map(|c| fmt_value(b.column(c), i))
                .collect::<Vec<_>>()
                .join("|");
            let vals = (nk..b.num_columns())
                .map(|c| fmt_value(b.column(c), i))
                .collect();
            assert!(
                out.insert(key.clone(), vals).is_none(),
                "duplicate key {key}"
            );
        }
    }
    out
}

fn finish_all(f: FinalCombiner, batch_size: usize) -> Vec<RecordBatch> {
    let schema = Arc::clone(f.output_schema());
    let out: Vec<RecordBatch> = f.finish(batch_size).unwrap().map(|b| b.unwrap()).collect();
    for b in &out {
        assert!(b.num_rows() <= batch_size && b.num_rows() > 0);
        assert_eq!(b.schema(), schema);
    }
    out
}

/// partial (one per input slice) → final, no memory limit.
fn combine(spec: &Arc<CombineSpec>, inputs: &[RecordBatch]) -> Vec<RecordBatch> {
    let mut fin =
        FinalCombiner::new(Arc::clone(spec), usize::MAX, Path::new("/nonexistent")).unwrap();
    for input in inputs {
        let mut p = PartialCombiner::new(Arc::clone(spec)).unwrap();
        p.update(input).unwrap();
        if let Some(state) = p.flush().unwrap() {
            assert_eq!(state.schema(), spec.state_schema().unwrap());
            fin.merge(&state).unwrap();
        }
        assert_eq!(p.num_groups(), 0);
    }
    finish_all(fin, 1024)
}

use std::path::Path;

fn sorted_chars(s: &str) -> String {
    let mut c: Vec<char> = s.chars().collect();
    c.sort();
    c.into_iter().collect()
}

#[test]
fn fn_names_parse() {
    for f in CombineFn::ALL {
        assert_eq!(f.name().parse::<CombineFn>().unwrap(), f);
    }
    let err = "median".parse::<CombineFn>().unwrap_err().to_string();
    assert!(err.contains("median"), "{err}");
    assert!(
        err.contains("sum, max, min, all, any, mean, count, group, concat"),
        "{err}"
    );
}

#[test]
fn spec_errors_name_output_and_fn() {
    let s = make_spec(vec![], &[("total", CombineFn::Sum, Some(DataType::Utf8))]);
    let err = s.output_schema().unwrap_err().to_string();
    assert!(
        err.contains("`total`") && err.contains("`sum`") && err.contains("Utf8"),
        "{err}"
    );

    let s = make_spec(vec![], &[("m", CombineFn::Mean, None)]);
    let err = PartialCombiner::new(s).unwrap_err().to_string();
    assert!(err.contains("`m`") && err.contains("`mean`"), "{err}");

    let s = make_spec(vec![], &[("a", CombineFn::All, Some(DataType::Int64))]);
    let err = s.state_schema().unwrap_err();
    assert!(
        matches!(&err, CombineError::UnsupportedType { output, func: CombineFn::All, data_type: DataType::Int64, .. } if output == "a"),
        "{err}"
    );

    let s = make_spec(vec![], &[("c", CombineFn::Concat, Some(DataType::Int64))]);
    let err = s.state_schema().unwrap_err();
    assert!(
        matches!(&err, CombineError::UnsupportedType { output, func: CombineFn::Concat, data_type: DataType::Int64, .. } if output == "c"),
        "{err}"
    );

    let s = make_spec(
        vec![Field::new("k", DataType::Utf8, true)],
        &[("k", CombineFn::Count, None)],
    );
    assert!(matches!(
        s.output_schema(),
        Err(CombineError::DuplicateField { .. })
    ));
}

#[test]
fn schemas() {
    let s = make_spec(
        vec![Field::new("k", DataType::Utf8, true)],
        &[
            ("si", CombineFn::Sum, Some(DataType::Int32)),
            ("sf", CombineFn::Sum, Some(DataType::Float32)),
            ("m", CombineFn::Mean, Some(DataType::Int64)),
            ("c", CombineFn::Count, None),
            ("g", CombineFn::Group, Some(DataType::Utf8)),
            ("cc", CombineFn::Concat, Some(DataType::Utf8)),
            ("mx", CombineFn::Max, Some(DataType::Date32)),
            ("a", CombineFn::All, Some(DataType::Boolean)),
        ],
    );
    let out = s.output_schema().unwrap();
    let types: Vec<_> = out.fields().iter().map(|f| f.data_type().clone()).collect();
    assert_eq!(
        types,
        vec![
            DataType::Utf8,
            DataType::Int64,
            DataType::Float64,
            DataType::Float64,
            DataType::Int64,
            DataType::List(Arc::new(Field::new_list_field(DataType::Utf8, true))),
            DataType::Utf8,
            DataType::Date32,
            DataType::Boolean,
        ]
    );
    assert!(!out.field_with_name("c").unwrap().is_nullable());
    let state = s.state_schema().unwrap();
    let names: Vec<_> = state.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(
        names,
        vec![
            "k",
            "si#state0",
            "sf#state0",
            "m#state0",
            "m#state1",
            "c#state0",
            "g#state0",
            "cc#state0",
            "mx#state0",
            "a#state0"
        ]
    );
    let input = s.input_schema().unwrap();
    assert_eq!(input.fields().len(), 1 + 7);
}

#[test]
fn every_fn_on_ints_floats_strings_bools() {
    let key: ArrayRef = Arc::new(StringArray::from(vec![
        Some("a"),
        Some("a"),
        Some("a"),
        Some("b"),
        None,
        None,
    ]));
    let i: ArrayRef = Arc::new(Int32Array::from(vec![
        Some(1),
        Some(2),
        None,
        Some(10),
        Some(5),
        Some(7),
    ]));
    let f: ArrayRef = Arc::new(Float64Array::from(vec![
        Some(1.5),
        Some(2.5),
        None,
        Some(-1.0),
        Some(0.5),
        Some(4.5),
    ]));
    let f32a: ArrayRef = Arc::new(Float32Array::from(vec![
        Some(1.0),
        Some(2.0),
        None,
        Some(3.0),
        Some(4.0),
        Some(0.5),
    ]));
    let s: ArrayRef = Arc::new(StringArray::from(vec![
        Some("x"),
        Some("y"),
        None,
        Some("z"),
        Some("w"),
        Some("v"),
    ]));
    let b: ArrayRef = Arc::new(BooleanArray::from(vec![
        Some(true),
        Some(false),
        None,
        Some(true),
        None,
        Some(true),
    ]));
    let i32t = Some(DataType::Int32);
    let f64t = Some(DataType::Float64);
    let st = Some(DataType::Utf8);
    let bt = Some(DataType::Boolean);
    let aggs: Vec<(Agg<'_>, Option<&ArrayRef>)> = vec![
        (("sum_i", CombineFn::Sum, i32t.clone()), Some(&i)),
        (("sum_f", CombineFn::Sum, f64t.clone()), Some(&f)),
        (
            ("sum_f32", CombineFn::Sum, Some(DataType::Float32)),
            Some(&f32a),
        ),
        (("max_i", CombineFn::Max, i32t.clone()), Some(&i)),
        (("min_i", CombineFn::Min, i32t.clone()), Some(&i)),
        (("max_f", CombineFn::Max, f64t.clone()), Some(&f)),
        (("min_f", CombineFn::Min, f64t.clone()), Some(&f)),
        (("max_s", CombineFn::Max, st.clone()), Some(&s)),
        (("min_s", CombineFn::Min, st.clone()), Some(&s)),
        (("mean_i", CombineFn::Mean, i32t.clone()), Some(&i)),
        (("mean_f", CombineFn::Mean, f64t.clone()), Some(&f)),
        (("count_i", CombineFn::Count, i32t.clone()), Some(&i)),
        (("count_s", CombineFn::Count, st.clone()), Some(&s)),
        (("count_rows", CombineFn::Count, None), None),
        (("all_b", CombineFn::All, bt.clone()), Some(&b)),
        (("any_b", CombineFn::Any, bt.clone()), Some(&b)),
        (("max_b", CombineFn::Max, bt.clone()), Some(&b)),
        (("min_b", CombineFn::Min, bt.clone()), Some(&b)),
        (("group_i", CombineFn::Group, i32t.clone()), Some(&i)),
        (("group_s", CombineFn::Group, st.clone()), Some(&s)),
        (("concat_s", CombineFn::Concat, st.clone()), Some(&s)),
    ];
    let spec = make_spec(
        vec![Field::new("k", DataType::Utf8, true)],
        &aggs.iter().map(|(a, _)| a.clone()).collect::<Vec<_>>(),
    );
    let mut cols = vec![Arc::clone(&key)];
    cols.extend(aggs.iter().filter_map(|(_, c)| c.map(Arc::clone)));
    let input = batch(cols);
    // Two producers, each seeing half of the rows.
    let out = combine(&spec, &[input.slice(0, 3), input.slice(3, 3)]);
    assert_eq!(out[0].schema(), spec.output_schema().unwrap());
    let got = by_key(&out, 1);

    let names: Vec<&str> = aggs.iter().map(|((n, _, _), _)| *n).collect();
    let expect = |vals: &[&str]| -> Vec<String> { vals.iter().map(|s| s.to_string()).collect() };
    let mut want = BTreeMap::new();
    want.insert(
        "a".to_string(),
        expect(&[
            "3",
            "4.0",
            "3.0",
            "2",
            "1",
            "2.5",
            "1.5",
            "y",
            "x",
            "1.5",
            "2.0",
            "2",
            "2",
            "3",
            "false",
            "true",
            "true",
            "false",
            "[1,2,null]",
            "[null,x,y]",
            "xy",
        ]),
    );
    want.insert(
        "b".to_string(),
        expect(&[
            "10", "-1.0", "3.0", "10", "10", "-1.0", "-1.0", "z", "z", "10.0", "-1.0", "1", "1",
            "1", "true", "true", "true", "true", "[10]", "[z]", "z",
        ]),
    );
    want.insert(
        "null".to_string(),
        expect(&[
            "12", "5.0", "4.5", "7", "5", "4.5", "0.5", "w", "v", "6.0", "2.5", "2", "2", "2",
            "true", "true", "true", "true", "[5,7]", "[v,w]", "vw",
        ]),
    );
    let concat_idx = names.iter().position(|n| *n == "concat_s").unwrap();
    let mut got = got;
    for vals in got.values_mut() {
        vals[concat_idx] = sorted_chars(&vals[concat_idx]);
    }
    for (k, vals) in &want {
        let g = &got[k];
        for (j, name) in names.iter().enumerate() {
            assert_eq!(g[j], vals[j], "key {k}, output {name}");
        }
    }
    assert_eq!(got.len(), 3);

    // The "one column for every aggregate" convention gives the same result.
    let mut cols = vec![key];
    cols.extend(aggs.iter().map(|(_, c)| match c {
        Some(c) => Arc::clone(c),
        None => Arc::new(NullArray::new(6)) as ArrayRef,
    }));
    let out2 = combine(&spec, &[batch(cols)]);
    let mut got2 = by_key(&out2, 1);
    for vals in got2.values_mut() {
        vals[concat_idx] = sorted_chars(&vals[concat_idx]);
    }
    assert_eq!(got, got2);
}

#[test]
fn wrong_column_count_is_an_error() {
    let spec = make_spec(
        vec![Field::new("k", DataType::Int64, true)],
        &[("s", CombineFn::Sum, Some(DataType::Int64))],
    );
    let mut p = PartialCombiner::new(spec).unwrap();
    let b = batch(vec![Arc::new(Int64Array::from(vec![1]))]);
    assert!(matches!(p.update(&b), Err(CombineError::BadBatch { .. })));
}

/// Deterministic pseudo-random numbers.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

#[test]
fn split_partials_shuffle_final_equals_direct() {
    let keys = vec![
        Field::new("k1", DataType::Int64, true),
        Field::new("k2", DataType::Utf8, true),
    ];
    let aggs: Vec<Agg<'_>> = vec![
        ("sum", CombineFn::Sum, Some(DataType::Int64)),
        ("min", CombineFn::Min, Some(DataType::Int64)),
        ("max", CombineFn::Max, Some(DataType::Int64)),
        ("count", CombineFn::Count, Some(DataType::Int64)),
        ("rows", CombineFn::Count, None),
        ("mean", CombineFn::Mean, Some(DataType::Float64)),
        ("maxw", CombineFn::Max, Some(DataType::Float64)),
    ];
    let spec = make_spec(keys, &aggs);

    #[derive(Default)]
    struct Ref {
        sum: Option<i64>,
        min: Option<i64>,
        max: Option<i64>,
        count: i64,
        rows: i64,
        wsum: f64,
        wn: u64,
        maxw: Option<f64>,
    }
    let mut reference: HashMap<(Option<i64>, String), Ref> = HashMap::new();
    let mut rng = Lcg(42);
    let mut inputs = Vec::new();
    for _ in 0..20 {
        let n = 1000;
        let (mut k1, mut k2, mut v, mut w) = (vec![], vec![], vec![], vec![]);
        for _ in 0..n {
            let a = (rng.next() % 60) as i64;
            let a = if a >= 50 { None } else { Some(a) };
            let b = format!("s{}", rng.next() % 5);
            let val = (rng.next() % 1000) as i64 - 500;
            let val = if rng.next().is_multiple_of(10) {
                None
            } else {
                Some(val)
            };
            let wv = (rng.next() % 100) as f64;
            let r = reference.entry((a, b.clone())).or_default();
            if let Some(x) = val {
                r.sum = Some(r.sum.unwrap_or(0) + x);
                r.min = Some(r.min.map_or(x, |m| m.min(x)));
                r.max = Some(r.max.map_or(x, |m| m.max(x)));
                r.count += 1;
            }
            r.rows += 1;
            r.wsum += wv;
            r.wn += 1;
            r.maxw = Some(r.maxw.map_or(wv, |m: f64| m.max(wv)));
            k1.push(a);
            k2.push(Some(b));
            v.push(val);
            w.push(Some(wv));
        }
        let v: ArrayRef = Arc::new(Int64Array::from(v));
        inputs.push(batch(vec![
            Arc::new(Int64Array::from(k1)),
            Arc::new(StringArray::from(k2)),
            Arc::clone(&v),
            Arc::clone(&v),
            Arc::clone(&v),
            Arc::clone(&v),
            Arc::new(Float64Array::from(w.clone())),
            Arc::new(Float64Array::from(w)),
        ]));
    }
    let f64s = |x: f64| array_value_to_string(&Float64Array::from(vec![x]), 0).unwrap();
    let opt = |x: Option<i64>| x.map_or("null".to_string(), |x| x.to_string());
    let want: BTreeMap<String, Vec<String>> = reference
        .iter()
        .map(|((a, b), r)| {
            (
                format!("{}|{}", opt(*a), b),
                vec![
                    opt(r.sum),
                    opt(r.min),
                    opt(r.max),
                    r.count.to_string(),
                    r.rows.to_string(),
                    f64s(r.wsum / r.wn as f64),
                    f64s(r.maxw.unwrap()),
                ],
            )
        })
        .collect();

    // Producer A flushes every 3 batches (a cache flush), producer B at the end.
    let mut states = Vec::new();
    let mut a = PartialCombiner::new(Arc::clone(&spec)).unwrap();
    for (i, input) in inputs[..10].iter().enumerate() {
        a.update(input).unwrap();
        assert!(a.memory_size() > 0);
        if i % 3 == 2 {
            states.extend(a.flush().unwrap());
        }
    }
    states.extend(a.flush().unwrap());
    assert!(a.flush().unwrap().is_none());
    let mut b = PartialCombiner::new(Arc::clone(&spec)).unwrap();
    for input in &inputs[10..] {
        b.update(input).unwrap();
    }
    assert_eq!(b.num_groups(), want.len());
    states.extend(b.flush().unwrap());

    // Shuffle into 3 partitions; each goes to its own final combiner.
    let partitions = 3;
    let mut per_partition = vec![Vec::new(); partitions];
    for s in &states {
        for (p, part) in hash_partition(s, 2, partitions)
            .unwrap()
            .into_iter()
            .enumerate()
        {
            per_partition[p].push(part);
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let mut out = Vec::new();
    for (p, parts) in per_partition.iter().enumerate() {
        // One partition spills, to mix both paths.
        let limit = if p == 0 { 4096 } else { usize::MAX };
        let mut f = FinalCombiner::new(Arc::clone(&spec), limit, dir.path()).unwrap();
        for part in parts {
            f.merge(part).unwrap();
        }
        if p == 0 {
            assert!(f.spill_count() > 0);
        }
        out.extend(finish_all(f, 7));
    }
    assert_eq!(by_key(&out, 2), want);

    // Direct: a single producer and a single final combiner agree too.
    assert_eq!(by_key(&combine(&spec, &inputs), 2), want);
}

#[test]
fn global_combine() {
    let spec = make_spec(
        vec![],
        &[
            ("total", CombineFn::Sum, Some(DataType::Int64)),
            ("n", CombineFn::Count, None),
            ("all", CombineFn::Group, Some(DataType::Int64)),
        ],
    );
    let col = |v: Vec<Option<i64>>| -> ArrayRef { Arc::new(Int64Array::from(v)) };
    let b1 = batch(vec![col(vec![Some(1), Some(2), Some(3)]); 2]);
    let b2 = batch(vec![col(vec![Some(4), None]); 2]);
    let out = combine(&spec, &[b1, b2]);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].num_rows(), 1);
    assert_eq!(out[0].num_columns(), 3);
    let got = by_key(&out, 0);
    assert_eq!(got[""], vec!["10", "5", "[1,2,3,4,null]"]);

    // Zero input rows: no output row at all (documented).
    let mut p = PartialCombiner::new(Arc::clone(&spec)).unwrap();
    p.update(&batch(vec![col(vec![]); 2])).unwrap();
    assert!(p.flush().unwrap().is_none());
    let f = FinalCombiner::new(Arc::clone(&spec), usize::MAX, Path::new("/nonexistent")).unwrap();
    assert_eq!(f.finish(10).unwrap().count(), 0);

    // Global combine through the spilling path.
    let dir = tempfile::tempdir().unwrap();
    let mut f = FinalCombiner::new(Arc::clone(&spec), 1, dir.path()).unwrap();
    for v in 0..5i64 {
        let mut p = PartialCombiner::new(Arc::clone(&spec)).unwrap();
        p.update(&batch(vec![col(vec![Some(v)]); 2])).unwrap();
        f.merge(&p.flush().unwrap().unwrap()).unwrap();
    }
    assert_eq!(f.spill_count(), 5);
    let got = by_key(&finish_all(f, 10), 0);
    assert_eq!(got[""], vec!["10", "5", "[0,1,2,3,4]"]);
}

#[test]
fn null_keys_group_together() {
    let spec = make_spec(
        vec![
            Field::new("a", DataType::Int64, true),
            Field::new("b", DataType::Utf8, true),
        ],
        &[("n", CombineFn::Count, None)],
    );
    let input = batch(vec![
        Arc::new(Int64Array::from(vec![
            None,
            None,
            None,
            Some(1),
            None,
            Some(1),
        ])),
        Arc::new(StringArray::from(vec![
            None,
            Some("x"),
            None,
            None,
            Some("x"),
            None,
        ])),
    ]);
    let got = by_key(&combine(&spec, &[input.slice(0, 2), input.slice(2, 4)]), 2);
    let want: BTreeMap<String, Vec<String>> =
        [("null|null", "2"), ("null|x", "2"), ("1|null", "2")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), vec![v.to_string()]))
            .collect();
    assert_eq!(got, want);
}

/// Integer and timestamp keys are packed into one word; a later batch with a null key moves
/// the groups so far to the row table without changing them.
#[test]
fn packed_keys_give_the_same_groups_and_survive_a_null_key() {
    let tz: Arc<str> = Arc::from("UTC");
    let ts = DataType::Timestamp(TimeUnit::Microsecond, Some(Arc::clone(&tz)));
    let spec = make_spec(
        vec![
            Field::new("small", DataType::Int32, true),
            Field::new("at", ts.clone(), true),
        ],
        &[
            ("n", CombineFn::Count, None),
            ("s", CombineFn::Sum, Some(DataType::Int64)),
        ],
    );
    let at = |v: Vec<Option<i64>>| {
        Arc::new(TimestampMicrosecondArray::from(v).with_timezone(Arc::clone(&tz))) as ArrayRef
    };
    let first = batch(vec![
        Arc::new(Int32Array::from(vec![Some(-1), Some(7), Some(-1), Some(7)])),
        at(vec![Some(5), Some(5), Some(5), Some(-9)]),
        Arc::new(Int64Array::from(vec![1, 2, 3, 4])),
    ]);
    let second = batch(vec![
        Arc::new(Int32Array::from(vec![None, Some(-1), Some(7)])),
        at(vec![Some(5), Some(5), Some(-9)]),
        Arc::new(Int64Array::from(vec![10, 20, 30])),
    ]);
    // One partial combiner sees both batches: packed, then rows.
    let mut p = PartialCombiner::new(Arc::clone(&spec)).unwrap();
    p.update(&first).unwrap();
    assert_eq!(p.num_groups(), 3);
    p.update(&second).unwrap();
    assert_eq!(p.num_groups(), 4);
    let state = p.flush().unwrap().unwrap();
    assert_eq!(state.schema(), spec.state_schema().unwrap());
    assert_eq!(
        state.column(1).data_type(),
        &ts,
        "the key keeps its time zone"
    );
    let mut fin =
        FinalCombiner::new(Arc::clone(&spec), usize::MAX, Path::new("/nonexistent")).unwrap();
    fin.merge(&state).unwrap();
    let got = by_key(&finish_all(fin, 1024), 2);
    let want: BTreeMap<String, Vec<String>> = [
        ("-1|1970-01-01T00:00:00.000005Z", ["3", "24"]),
        ("7|1970-01-01T00:00:00.000005Z", ["1", "2"]),
        ("7|1969-12-31T23:59:59.999991Z", ["2", "34"]),
        ("null|1970-01-01T00:00:00.000005Z", ["1", "10"]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.iter().map(|x| x.to_string()).collect()))
    .collect();
    assert_eq!(got, want);
    // The same input in one go through the row table gives the same result.
    assert_eq!(by_key(&combine(&spec, &[second, first]), 2), want);
}

/// Small keys take the direct index, others the hash table, in one batch or apart, and either
/// way the groups come out in first-seen order and survive a flush (the table is reused).
#[test]
fn direct_and_hashed_packed_keys_keep_first_seen_order() {
    let spec = make_spec(
        vec![Field::new("k", DataType::Int32, false)],
        &[("s", CombineFn::Sum, Some(DataType::Int64))],
    );
    let keys_of = |state: &RecordBatch| -> Vec<String> {
        (0..state.num_rows())
            .map(|i| fmt_value(state.column(0).as_ref(), i))
            .collect()
    };
    let mut p = PartialCombiner::new(Arc::clone(&spec)).unwrap();
    for round in 0..2 {
        // All small: the direct index alone.
        p.update(&batch(vec![
            Arc::new(Int32Array::from(vec![9, 3, 9, 0, 3])),
            Arc::new(Int64Array::from(vec![1, 2, 3, 4, 5])),
        ]))
        .unwrap();
        // Mixed: a key past the direct index and a negative one (a large word when packed).
        p.update(&batch(vec![
            Arc::new(Int32Array::from(vec![70_000, 3, -1, 70_000, 12])),
            Arc::new(Int64Array::from(vec![10, 20, 30, 40, 50])),
        ]))
        .unwrap();
        let state = p.flush().unwrap().unwrap();
        assert_eq!(
            keys_of(&state),
            ["9", "3", "0", "70000", "-1", "12"],
            "round {round}"
        );
        let mut fin =
            FinalCombiner::new(Arc::clone(&spec), usize::MAX, Path::new("/nonexistent")).unwrap();
        fin.merge(&state).unwrap();
        let got = by_key(&finish_all(fin, 1024), 1);
        let want: BTreeMap<String, Vec<String>> = [
            ("9", "4"),
            ("3", "27"),
            ("0", "4"),
            ("70000", "50"),
            ("-1", "30"),
            ("12", "50"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), vec![v.to_string()]))
        .collect();
        assert_eq!(got, want, "round {round}");
    }
}

#[test]
fn multiple_keys_with_timestamps_dates_bools_floats() {
    let tz: Arc<str> = Arc::from("UTC");
    let ts_type = DataType::Timestamp(TimeUnit::Microsecond, Some(Arc::clone(&tz)));
    let keys = vec![
        Field::new("__window_start", ts_type.clone(), false),
        Field::new("__window_end", ts_type.clone(), false),
        Field::new("user", DataType::Int32, true),
        Field::new("day", DataType::Date32, true),
        Field::new("flag", DataType::Boolean, true),
        Field::new("score", DataType::Float64, true),
    ];
    let spec = make_spec(
        keys.clone(),
        &[
            ("n", CombineFn::Count, None),
            ("s", CombineFn::Sum, Some(DataType::Int64)),
        ],
    );
    let start = TimestampMicrosecondArray::from(vec![0, 0, 60_000_000, 0, 60_000_000])
        .with_timezone(Arc::clone(&tz));
    let end = TimestampMicrosecondArray::from(vec![
        60_000_000,
        60_000_000,
        120_000_000,
        60_000_000,
        120_000_000,
    ])
    .with_timezone(Arc::clone(&tz));
    let input = batch(vec![
        Arc::new(start),
        Arc::new(end),
        Arc::new(Int32Array::from(vec![1, 1, 1, 2, 1])),
        Arc::new(Date32Array::from(vec![
            Some(19000),
            Some(19000),
            Some(19000),
            None,
            Some(19000),
        ])),
        Arc::new(BooleanArray::from(vec![true, true, true, false, true])),
        Arc::new(Float64Array::from(vec![0.5, 0.5, 0.5, 1.0, 0.5])),
        Arc::new(Int64Array::from(vec![1, 2, 4, 8, 16])),
    ]);
    let out = combine(&spec, &[input.slice(0, 3), input.slice(3, 2)]);
    let schema = out[0].schema();
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(schema.field(i).data_type(), k.data_type());
        assert_eq!(schema.field(i).name(), k.name());
    }
    let got = by_key(&out, 6);
    let want: BTreeMap<String, Vec<String>> = [
        (
            "1970-01-01T00:00:00Z|1970-01-01T00:01:00Z|1|2022-01-08|true|0.5",
            ["2", "3"],
        ),
        (
            "1970-01-01T00:01:00Z|1970-01-01T00:02:00Z|1|2022-01-08|true|0.5",
            ["2", "20"],
        ),
        (
            "1970-01-01T00:00:00Z|1970-01-01T00:01:00Z|2|null|false|1.0",
            ["1", "8"],
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.iter().map(|s| s.to_string()).collect()))
    .collect();
    assert_eq!(got, want);
}

/// Partial states for `n` distinct keys, each key in two state batches (from
/// two producers). `group`/`concat` values are the same in both rounds so the
/// (arbitrary) merge order does not matter.
fn many_key_states(spec: &Arc<CombineSpec>, n: i64) -> Vec<RecordBatch> {
    let mut states = Vec::new();
    for round in 0..2i64 {
        let mut p = PartialCombiner::new(Arc::clone(spec)).unwrap();
        for start in (0..n).step_by(1024) {
            let end = (start + 1024).min(n);
            // Visit keys in a scrambled order.
            let ids: Vec<i64> = (start..end).map(|i| (i * 7919 + round * 13) % n).collect();
            let tags: Vec<String> = ids.iter().map(|i| format!("k{}", i % 1000)).collect();
            let cat: Vec<String> = ids.iter().map(|i| (i % 10).to_string()).collect();
            let ids: ArrayRef = Arc::new(Int64Array::from(ids));
            p.update(&batch(vec![
                Arc::clone(&ids),
                Arc::new(StringArray::from(tags)),
                arrow::compute::kernels::numeric::add(&ids, &Int64Array::new_scalar(round))
                    .unwrap(),
                Arc::new(StringArray::from(cat)),
                ids,
            ]))
            .unwrap();
            if p.memory_size() > (1 << 20) {
                states.extend(p.flush().unwrap());
            }
        }
        states.extend(p.flush().unwrap());
    }
    // Re-chunk into small state batches so memory is checked often.
    states
        .iter()
        .flat_map(|s| {
            (0..s.num_rows())
                .step_by(1024)
                .map(|o| s.slice(o, 1024.min(s.num_rows() - o)))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// All output rows in one batch, sorted by the first (unique) key column.
fn sorted_by_first_column(batches: &[RecordBatch]) -> RecordBatch {
    let all = arrow::compute::concat_batches(&batches[0].schema(), batches).unwrap();
    let idx = arrow::compute::sort_to_indices(all.column(0), None, None).unwrap();
    arrow::compute::take_record_batch(&all, &idx).unwrap()
}

#[test]
fn final_combine_spills_and_matches_unlimited() {
    let spec = make_spec(
        vec![
            Field::new("id", DataType::Int64, false),
            Field::new("tag", DataType::Utf8, false),
        ],
        &[
            ("sum", CombineFn::Sum, Some(DataType::Int64)),
            ("n", CombineFn::Count, None),
            ("cat", CombineFn::Concat, Some(DataType::Utf8)),
            ("grp", CombineFn::Group, Some(DataType::Int64)),
        ],
    );
    let n = 200_000;
    let states = many_key_states(&spec, n);
    let dir = tempfile::tempdir().unwrap();

    let limit = 64 * 1024;
    let mut limited = FinalCombiner::new(Arc::clone(&spec), limit, dir.path()).unwrap();
    let mut unlimited = FinalCombiner::new(Arc::clone(&spec), usize::MAX, dir.path()).unwrap();
    for s in &states {
        limited.merge(s).unwrap();
        unlimited.merge(s).unwrap();
        assert!(limited.memory_size() <= limit);
    }
    assert_eq!(unlimited.spill_count(), 0);
    let spills = limited.spill_count();
    // More runs than the merge fan-in: exercises intermediate merges too.
    assert!(
        spills > 32,
        "expected a multi-pass merge, got {spills} spills"
    );

    let a = finish_all(limited, 10_000);
    // Spill files are gone once the merge has been consumed.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    let b = finish_all(unlimited, 10_000);
    assert_eq!(a.iter().map(|b| b.num_rows()).sum::<usize>(), n as usize);
    // Spilled output comes out in key order.
    let ids: Vec<i64> = a
        .iter()
        .flat_map(|b| {
            b.column(0)
                .as_primitive::<arrow::datatypes::Int64Type>()
                .values()
                .to_vec()
        })
        .collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]));

    let (a, b) = (sorted_by_first_column(&a), sorted_by_first_column(&b));
    assert_eq!(a.num_rows(), n as usize);
    assert_eq!(a, b);
    let row7: Vec<String> = (2..a.num_columns())
        .map(|c| fmt_value(a.column(c), 7))
        .collect();
    assert_eq!(row7, ["15", "2", "77", "[7,7]"]);
}

#[test]
fn hash_partition_is_stable_and_complete() {
    // Pinned: every process and release must agree on these.
    assert_eq!(
        stable_hash(PARTITION_SEED, b""),
        stable_hash(PARTITION_SEED, b"")
    );
    assert_eq!(
        stable_hash(PARTITION_SEED, b"riverbank"),
        0x1bb2_abb3_373d_8561
    );

    let n = 10_000;
    let keys: Vec<Option<i64>> = (0..n)
        .map(|i| if i % 97 == 0 { None } else { Some(i % 500) })
        .collect();
    let tags: Vec<String> = (0..n).map(|i| format!("t{}", i % 3)).collect();
    let b = batch(vec![
        Arc::new(Int64Array::from(keys)),
        Arc::new(StringArray::from(tags)),
        Arc::new(Int64Array::from((0..n).collect::<Vec<_>>())),
    ]);
    let parts = hash_partition(&b, 2, 4).unwrap();
    assert_eq!(parts.len(), 4);
    assert_eq!(parts, hash_partition(&b, 2, 4).unwrap());
    // Every row exactly once.
    let mut rows: Vec<i64> = parts
        .iter()
        .flat_map(|p| {
            p.column(2)
                .as_primitive::<arrow::datatypes::Int64Type>()
                .values()
                .to_vec()
        })
        .collect();
    rows.sort();
    assert_eq!(rows, (0..n).collect::<Vec<_>>());
    // Each key in exactly one partition; all partitions used.
    let mut owner: HashMap<String, usize> = HashMap::new();
    for (p, part) in parts.iter().enumerate() {
        assert!(part.num_rows() > 0);
        assert_eq!(part.schema(), b.schema());
        for i in 0..part.num_rows() {
            let k = format!(
                "{}|{}",
                fmt_value(part.column(0), i),
                fmt_value(part.column(1), i)
            );
            assert_eq!(*owner.entry(k).or_insert(p), p);
        }
    }
    // Independent of how rows are batched.
    let sliced = hash_partition(&b.slice(5000, 5000), 2, 4).unwrap();
    for (p, part) in sliced.iter().enumerate() {
        for i in 0..part.num_rows() {
            let k = format!(
                "{}|{}",
                fmt_value(part.column(0), i),
                fmt_value(part.column(1), i)
            );
            assert_eq!(owner[&k], p);
        }
    }
    // Global (no keys): everything in one partition.
    let g = hash_partition(&b, 0, 4).unwrap();
    assert_eq!(g.iter().filter(|p| p.num_rows() > 0).count(), 1);
    let err = hash_partition(&b, 2, 0).unwrap_err();
    assert!(
        matches!(&err, CombineError::BadBatch { what: "state", detail } if detail.contains("at least one partition")),
        "{err}"
    );
}

/// `cargo test --release -p riverbank-engine combine -- --ignored --nocapture`
#[test]
#[ignore]
fn bench_partial_sum_f64_3m_rows_260_keys() {
    let rows = 3_000_000usize;
    let keys = 260u64;
    let batch_rows = 8192;
    let mut rng = Lcg(7);
    let mut int_batches = Vec::new();
    let mut str_batches = Vec::new();
    let mut window_batches = Vec::new();
    let mut left = rows;
    while left > 0 {
        let n = batch_rows.min(left);
        left -= n;
        let k: Vec<i64> = (0..n).map(|_| (rng.next() % keys) as i64).collect();
        let v: ArrayRef = Arc::new(Float64Array::from(
            (0..n)
                .map(|_| (rng.next() % 1000) as f64 * 0.25)
                .collect::<Vec<_>>(),
        ));
        let s: Vec<String> = k.iter().map(|k| format!("customer-{k:05}")).collect();
        // Hourly windows: start and end, as a windowed Combine keys them.
        let hour = 3_600_000_000i64;
        let start: Vec<i64> = k.iter().map(|k| k * hour).collect();
        let end: Vec<i64> = start.iter().map(|s| s + hour).collect();
        window_batches.push(batch(vec![
            Arc::new(TimestampMicrosecondArray::from(start)),
            Arc::new(TimestampMicrosecondArray::from(end)),
            Arc::clone(&v),
        ]));
        int_batches.push(batch(vec![Arc::new(Int64Array::from(k)), Arc::clone(&v)]));
        str_batches.push(batch(vec![Arc::new(StringArray::from(s)), v]));
    }
    let ts = DataType::Timestamp(TimeUnit::Microsecond, None);
    for (name, key_fields, batches) in [
        (
            "Int64 key",
            vec![Field::new("k", DataType::Int64, false)],
            &int_batches,
        ),
        (
            "Utf8 key",
            vec![Field::new("k", DataType::Utf8, false)],
            &str_batches,
        ),
        (
            "window start+end keys",
            vec![
                Field::new("start", ts.clone(), false),
                Field::new("end", ts.clone(), false),
            ],
            &window_batches,
        ),
    ] {
        let spec = make_spec(
            key_fields,
            &[("s", CombineFn::Sum, Some(DataType::Float64))],
        );
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = Instant::now();
            let mut p = PartialCombiner::new(Arc::clone(&spec)).unwrap();
            for b in batches.iter() {
                p.update(b).unwrap();
            }
            let state = p.flush().unwrap().unwrap();
            let mut f =
                FinalCombiner::new(Arc::clone(&spec), usize::MAX, Path::new("/tmp")).unwrap();
            f.merge(&state).unwrap();
            let out: Vec<_> = f.finish(8192).unwrap().collect();
            assert_eq!(out[0].as_ref().unwrap().num_rows(), keys as usize);
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!(
            "combine bench ({name}): {rows} rows x {keys} keys sum(f64): best {:.1} ms, {:.0} M rows/s",
            best * 1e3,
            rows as f64 / best / 1e6
        );
    }
}

/// `concat` of list values appends each group's lists, as Beam's ConcatListCombineFn (the
/// order of the lists is unspecified; within one list it is kept); a null list adds nothing.
#[test]
fn concat_appends_lists() {
    use arrow::array::{ListBuilder, StringBuilder};
    let mut lists = ListBuilder::new(StringBuilder::new());
    for v in [
        Some(vec!["a", "b"]),
        Some(vec!["c"]),
        None,
        Some(vec![]),
        Some(vec!["d"]),
    ] {
        match v {
            Some(items) => {
                for i in items {
                    lists.values().append_value(i);
                }
                lists.append(true);
            }
            None => lists.append(false),
        }
    }
    let lists: ArrayRef = Arc::new(lists.finish());
    let keys: ArrayRef = Arc::new(StringArray::from(vec!["x", "x", "x", "y", "z"]));
    let list_type = lists.data_type().clone();
    let spec = make_spec(
        vec![Field::new("k", DataType::Utf8, true)],
        &[("all", CombineFn::Concat, Some(list_type.clone()))],
    );
    assert_eq!(
        spec.output_schema().unwrap().field(1).data_type(),
        &list_type
    );
    let input = batch(vec![keys, lists]);
    let out = combine(&spec, &[input.slice(0, 2), input.slice(2, 3)]);
    let got = by_key(&out, 1);
    assert_eq!(got["x"], vec!["[a,b,c]".to_string()]);
    assert_eq!(got["y"], vec!["[]".to_string()]);
    assert_eq!(got["z"], vec!["[d]".to_string()]);
    // Neither a list nor a string.
    let s = make_spec(vec![], &[("c", CombineFn::Concat, Some(DataType::Float64))]);
    let err = s.state_schema().unwrap_err().to_string();
    assert!(err.contains("expected a list or a string type"), "{err}");
}

/// GroupByKey over coder-encoded bytes: the lifted combine groups opaque values by opaque keys.
#[test]
fn encoded_elements_group_by_key() {
    use arrow::array::{AsArray, BinaryArray, RecordBatch, TimestampMicrosecondArray};
    use riverbank_elements::columns::encoded_schema;
    let schema = encoded_schema(false);
    let keys = BinaryArray::from(vec![&b"\x01k1"[..], b"\x01k2", b"\x01k1"]);
    let values = BinaryArray::from(vec![&b"\x00\x01"[..], b"\x00\x02", b"\x00\x03"]);
    let ts = TimestampMicrosecondArray::from(vec![0, 1, 2]).with_timezone("UTC");
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![Arc::new(keys), Arc::new(values), Arc::new(ts)],
    )
    .unwrap();
    let spec = Arc::new(CombineSpec {
        key_fields: vec![schema.field(0).clone()],
        aggregates: vec![AggregateSpec::new(
            "values",
            CombineFn::Group,
            Some(DataType::Binary),
        )],
    });
    let mut partial = PartialCombiner::new(spec.clone()).unwrap();
    partial.update(&batch.project(&[0, 1]).unwrap()).unwrap();
    let states = partial.flush().unwrap().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut fin = FinalCombiner::new(spec, usize::MAX, dir.path()).unwrap();
    fin.merge(&states).unwrap();
    let out: Vec<RecordBatch> = fin.finish(16).unwrap().map(|b| b.unwrap()).collect();
    let out = &out[0];
    let mut groups: Vec<(Vec<u8>, usize)> = (0..out.num_rows())
        .map(|i| {
            (
                out.column(0).as_binary::<i32>().value(i).to_vec(),
                out.column(1).as_list::<i32>().value(i).len(),
            )
        })
        .collect();
    groups.sort();
    assert_eq!(
        groups,
        vec![(b"\x01k1".to_vec(), 2), (b"\x01k2".to_vec(), 1)]
    );
}
