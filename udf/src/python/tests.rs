use super::*;
use arrow::array::{Float64Array, Int64Array, StringArray, StructArray};
use arrow::datatypes::{Field, Float64Type, Int64Type};
use riverbank_pipeline::config::UdfForm;

fn batch(rows: usize) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int64, true),
        Field::new("b", DataType::Float64, true),
        Field::new("s", DataType::Utf8, true),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from_iter_values(0..rows as i64)),
            Arc::new(Float64Array::from_iter_values(
                (0..rows).map(|i| i as f64 * 0.5),
            )),
            Arc::new(StringArray::from_iter_values(
                (0..rows).map(|i| format!("s{}", i % 100)),
            )),
        ],
    )
    .unwrap()
}

fn py(text: &str) -> Expr {
    Expr::new(Language::Python, text)
}

fn callable(text: &str) -> Expr {
    Expr {
        form: UdfForm::Callable,
        ..py(text)
    }
}

#[test]
fn sql_like_expressions_run_vectorized_and_agree_with_python() {
    let b = batch(4);
    let ec = ExprCompiler::new();
    let c = ec.compile(&py("a * 2 + 1"), &b.schema()).unwrap();
    assert_eq!(c.data_type, DataType::Int64);
    assert!(
        path_of(&c.expr).unwrap().starts_with("vectorized"),
        "{}",
        c.expr
    );
    assert_eq!(
        c.eval(&b).unwrap().as_primitive::<Int64Type>().values(),
        &[1, 3, 5, 7]
    );
    let c = ec
        .compile(&py("a / 2 if s.startswith('s') else 0.0"), &b.schema())
        .unwrap();
    assert!(
        path_of(&c.expr).unwrap().starts_with("vectorized"),
        "{}",
        c.expr
    );
    assert_eq!(
        c.eval(&b).unwrap().as_primitive::<Float64Type>().values(),
        &[0.0, 0.5, 1.0, 1.5]
    );
    let keep = ec
        .compile_as(
            &py("a in (1, 3) and len(s) == 2"),
            &b.schema(),
            Role::Predicate,
        )
        .unwrap();
    assert!(path_of(&keep.expr).unwrap().starts_with("vectorized"));
    let out = keep.eval(&b).unwrap();
    assert_eq!(
        out.as_boolean()
            .iter()
            .map(Option::unwrap)
            .collect::<Vec<_>>(),
        [false, true, false, true]
    );
    // Python's modulo takes the divisor's sign, SQL's the dividend's.
    let neg = RecordBatch::try_new(
        b.schema(),
        vec![
            Arc::new(Int64Array::from(vec![-7, 7, -1, 0])),
            b.column(1).clone(),
            b.column(2).clone(),
        ],
    )
    .unwrap();
    let c = ec.compile(&py("a % 3"), &b.schema()).unwrap();
    assert_eq!(
        c.eval(&neg).unwrap().as_primitive::<Int64Type>().values(),
        &[2, 1, 2, 0]
    );
}

#[test]
fn the_rest_runs_in_the_interpreter() {
    let b = batch(3);
    let ec = ExprCompiler::new();
    let c = ec.compile(&py("s.title() + str(b)"), &b.schema()).unwrap();
    assert_eq!(
        path_of(&c.expr).unwrap(),
        "in the Python interpreter, a batch at a time"
    );
    assert_eq!(c.data_type, DataType::Utf8);
    let out = c.eval(&b).unwrap();
    assert_eq!(out.as_string::<i32>().value(2), "S21.0");
    // `a / b` divides by a field: Python raises on zero where SQL would not, so it stays.
    let c = ec.compile(&py("a / b"), &b.schema()).unwrap();
    assert_eq!(c.data_type, DataType::Float64);
    let e = c.eval(&b).unwrap_err();
    let (msg, stack) = crate::split_stack(&e);
    assert_eq!(msg, "ZeroDivisionError: float division by zero");
    let stack = stack.unwrap();
    assert!(stack.contains("File \"<expression>\", line 1"), "{e}");
    assert!(
        !stack.contains("<riverbank>"),
        "only the user's frames: {e}"
    );
    assert_eq!(
        c.eval(&b.slice(1, 2))
            .unwrap()
            .as_primitive::<Float64Type>()
            .values(),
        &[2.0, 2.0]
    );
}

#[test]
fn nulls_and_nans_get_pythons_meaning_on_the_translated_path() {
    let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Float64, true)]));
    let b = RecordBatch::try_new(
        schema.clone(),
        vec![Arc::new(Float64Array::from(vec![
            Some(1.0),
            Some(f64::NAN),
            Some(-2.0),
        ]))],
    )
    .unwrap();
    let ec = ExprCompiler::new();
    let keep = ec
        .compile_as(&py("x > 0"), &schema, Role::Predicate)
        .unwrap();
    assert!(path_of(&keep.expr).unwrap().starts_with("vectorized"));
    // SQL orders NaN above every number; Python's NaN compares false.
    let out = keep.eval(&b).unwrap();
    assert_eq!(
        out.as_boolean()
            .iter()
            .map(Option::unwrap)
            .collect::<Vec<_>>(),
        [true, false, false]
    );
    let with_null = RecordBatch::try_new(
        schema.clone(),
        vec![Arc::new(Float64Array::from(vec![Some(1.0), None]))],
    )
    .unwrap();
    let e = keep.eval(&with_null).unwrap_err();
    assert!(
        e.starts_with("TypeError: '>' not supported between instances of 'NoneType' and 'int'"),
        "{e}"
    );
}

#[test]
fn callables_take_rows_with_nested_rows_and_return_rows() {
    let inner = StructArray::from(vec![(
        Arc::new(Field::new("city", DataType::Utf8, true)),
        Arc::new(StringArray::from(vec!["Oslo", "Rome"])) as ArrayRef,
    )]);
    let schema = Arc::new(Schema::new(vec![
        Field::new("n", DataType::Int64, true),
        Field::new("place", inner.data_type().clone(), true),
    ]));
    let b = RecordBatch::try_new(
        schema.clone(),
        vec![Arc::new(Int64Array::from(vec![1, 2])), Arc::new(inner)],
    )
    .unwrap();
    let ec = ExprCompiler::new();
    let c = ec
        .compile(
            &callable("lambda row: Row(label=row.place.city.lower() * row.n, tags=[row.n, 2])"),
            &schema,
        )
        .unwrap();
    let DataType::Struct(fields) = &c.data_type else {
        panic!("{}", c.data_type)
    };
    assert_eq!(fields[0].data_type(), &DataType::Utf8);
    assert_eq!(
        fields[1].data_type(),
        &DataType::new_list(DataType::Int64, true)
    );
    let out = c.eval(&b).unwrap();
    let s = out.as_struct();
    assert_eq!(s.column(0).as_string::<i32>().value(1), "romerome");
    // A def, and a declared output type.
    let c = ec
        .compile(
            &Expr {
                output_type: Some(serde_json::json!("number")),
                ..callable("def f(row):\n    import math\n    return math.sqrt(row.n)\n")
            },
            &schema,
        )
        .unwrap();
    assert_eq!(c.data_type, DataType::Float64);
    let out = c.eval(&b).unwrap();
    assert_eq!(out.as_primitive::<Float64Type>().value(1), 2f64.sqrt());
}

#[test]
fn a_files_function_and_a_failing_callable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("udfs.py");
    std::fs::write(
        &path,
        "def double(row):\n    return row.a * 2\n\ndef bad(row):\n    return 1 // (row.a - 1)\n",
    )
    .unwrap();
    let b = batch(3);
    let ec = ExprCompiler::new();
    let file = |name: &str| Expr {
        form: UdfForm::File {
            path: path.display().to_string(),
            source: None,
        },
        ..py(name)
    };
    let c = ec.compile(&file("double"), &b.schema()).unwrap();
    assert_eq!(
        c.eval(&b).unwrap().as_primitive::<Int64Type>().values(),
        &[0, 2, 4]
    );
    let c = ec.compile(&file("bad"), &b.schema()).unwrap();
    let e = c.eval(&b).unwrap_err();
    let (msg, stack) = crate::split_stack(&e);
    assert_eq!(msg, "ZeroDivisionError: integer division or modulo by zero");
    assert!(stack.unwrap().contains("udfs.py\", line 5, in bad"), "{e}");
    let e = ec.compile(&file("missing"), &b.schema()).unwrap_err();
    assert!(e.contains("no function 'missing'"), "{e}");
    let e = ec.compile(&py("a +"), &b.schema()).unwrap_err();
    assert!(
        e.starts_with("cannot compile python expression 'a +': "),
        "{e}"
    );
}

#[test]
fn predicates_and_names_follow_python() {
    let b = batch(4);
    let ec = ExprCompiler::new();
    let keep = |text: &str| {
        let c = ec
            .compile_as(&py(text), &b.schema(), Role::Predicate)
            .unwrap();
        let out = c.eval(&b).unwrap();
        out.as_boolean()
            .iter()
            .map(Option::unwrap)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        keep("a % 2"),
        [false, true, false, true],
        "numbers: non-zero"
    );
    assert_eq!(keep("s if a > 1 else ''"), [false, false, true, true]);
    assert_eq!(keep("[a] if a > 2 else []"), [false, false, false, true]);
    let c = ec
        .compile_as(&py("'odd' if a % 2 else 'even'"), &b.schema(), Role::Name)
        .unwrap();
    assert_eq!(c.eval(&b).unwrap().as_string::<i32>().value(1), "odd");
    // A name that is not a string is refused before running, as Beam refuses it, whether the
    // expression translates to SQL or is typed on sample rows; one that only sometimes fails
    // is left to the rows.
    for text in ["a + 1", "len(s)"] {
        let e = ec
            .compile_as(&py(text), &b.schema(), Role::Name)
            .err()
            .unwrap_or_else(|| panic!("'{text}' was taken as a Partition function"));
        assert!(e.contains("must return a string"), "{e}");
    }
    ec.compile_as(&py("s[5]"), &b.schema(), Role::Name).unwrap();
}

#[test]
fn a_callable_gets_only_the_fields_it_reads_when_that_is_all_it_does() {
    let b = batch(2);
    let ec = ExprCompiler::new();
    let args = |e: Expr| {
        let c = ec.compile(&e, &b.schema()).unwrap();
        let p = c.expr.downcast_ref::<PyExpr>().unwrap();
        (p.program.names.clone(), c.eval(&b).unwrap())
    };
    let (names, out) = args(callable("lambda row: row.s + str(row.a)"));
    assert_eq!(names, ["a", "s"]);
    assert_eq!(out.as_string::<i32>().value(1), "s11");
    // The row itself escapes: every field.
    let (names, _) = args(callable("def f(row):\n    return len(row._asdict())\n"));
    assert_eq!(names, ["a", "b", "s"]);
    let (names, _) = args(callable("lambda row: (lambda row: 1)(row.a)"));
    assert_eq!(names, ["a", "b", "s"], "a shadowed name: every field");
}

#[test]
fn beam_and_dotted_names_are_in_scope_as_in_beam() {
    let b = batch(2);
    let ec = ExprCompiler::new();
    let c = ec
        .compile(&py("beam.Row(x=a, t=[s])"), &b.schema())
        .unwrap();
    let out = c.eval(&b).unwrap();
    assert_eq!(
        out.as_struct()
            .column(0)
            .as_primitive::<Int64Type>()
            .values(),
        &[0, 1]
    );
    // A fully qualified name is imported, as Beam loads it.
    let c = ec.compile(&callable("builtins.repr"), &b.schema()).unwrap();
    assert_eq!(c.data_type, DataType::Utf8);
    let out = c.eval(&b).unwrap();
    assert_eq!(out.as_string::<i32>().value(1), "Row(a=1, b=0.5, s='s1')");
}

/// The figures bench/README.md quotes: `cargo test --release -p riverbank-udf --lib
/// python_throughput -- --ignored --nocapture`.
#[test]
#[ignore]
fn python_throughput_on_a_million_rows() {
    let rows = 1_000_000;
    let b = batch(rows);
    let ec = ExprCompiler::new();
    for e in [
        py("a * 2 + b"),
        py("s.title()"),
        callable("lambda row: row.a + row.b"),
    ] {
        let c = ec.compile(&e, &b.schema()).unwrap();
        c.eval(&b.slice(0, 10)).unwrap();
        let t = std::time::Instant::now();
        for chunk in 0..rows / 8192 {
            c.eval(&b.slice(chunk * 8192, 8192)).unwrap();
        }
        let secs = t.elapsed().as_secs_f64();
        println!(
            "{:45} {:>12.0} rows/s ({})",
            e.text,
            (rows / 8192 * 8192) as f64 / secs,
            path_of(&c.expr).unwrap()
        );
    }
}

/// What Python iterates is a list here, as Beam's Explode takes any iterable: a range, a
/// tuple, a generator, a set.
#[test]
fn iterables_are_lists() {
    let b = batch(3);
    let ec = ExprCompiler::new();
    for (text, want) in [
        ("range(a)", vec![vec![], vec![0], vec![0, 1]]),
        ("(a, a + 1)", vec![vec![0, 1], vec![1, 2], vec![2, 3]]),
        (
            "(i * 10 for i in range(a))",
            vec![vec![], vec![0], vec![0, 10]],
        ),
        ("{a}", vec![vec![0], vec![1], vec![2]]),
        (
            "map(abs, [a, -a])",
            vec![vec![0, 0], vec![1, 1], vec![2, 2]],
        ),
    ] {
        let c = ec
            .compile(&py(text), &b.schema())
            .unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(
            c.data_type,
            DataType::new_list(DataType::Int64, true),
            "{text}"
        );
        let out = c.eval(&b).unwrap_or_else(|e| panic!("{text}: {e}"));
        let got: Vec<Vec<i64>> = (0..3)
            .map(|i| {
                out.as_list::<i32>()
                    .value(i)
                    .as_primitive::<Int64Type>()
                    .values()
                    .to_vec()
            })
            .collect();
        assert_eq!(got, want, "{text}");
    }
}

/// When every sample row raises, the field is typed as Beam types it, `Any`, and runs: a row
/// that raises is an error for the error output, one that returns a value keeps it; for
/// AssignTimestamps, a timestamp.
#[test]
fn untold_output_types_run() {
    use riverbank_elements::any;
    let schema = Arc::new(Schema::new(vec![Field::new("s", DataType::Utf8, true)]));
    let b = RecordBatch::try_new(
        schema.clone(),
        vec![Arc::new(StringArray::from(vec!["2024-01-02", "x"]))],
    )
    .unwrap();
    let ec = ExprCompiler::new();
    let square = ec.compile(&py("s * s"), &schema).unwrap();
    assert_eq!(square.data_type, any::data_type());
    let e = square.eval(&b).unwrap_err();
    assert!(e.contains("TypeError: can't multiply sequence"), "{e}");
    let parse = "lambda row: __import__('datetime').datetime.strptime(row.s, '%Y-%m-%d').year";
    let c = ec.compile(&callable(parse), &schema).unwrap();
    assert_eq!(c.data_type, any::data_type());
    let out = c.eval(&b.slice(0, 1)).unwrap();
    assert_eq!(any::values(&out), [Some(serde_json::json!(2024))]);
    // Results of several types are `Any` too, each kept as it is; what reads an `Any` field
    // is `Any`, and gets the value itself.
    let mixed = ec
        .compile(
            &callable("lambda row: len(row.s) if row.s < 'b' else row.s"),
            &schema,
        )
        .unwrap();
    assert_eq!(mixed.data_type, any::data_type());
    let out = mixed.eval(&b).unwrap();
    assert_eq!(
        any::values(&out),
        [Some(serde_json::json!(10)), Some(serde_json::json!("x"))]
    );
    let anys = Arc::new(Schema::new(vec![Field::new("v", any::data_type(), true)]));
    let rows = RecordBatch::try_new(anys.clone(), vec![out]).unwrap();
    let twice = ec.compile(&py("v * 2"), &anys).unwrap();
    assert_eq!(twice.data_type, any::data_type());
    assert_eq!(
        any::values(&twice.eval(&rows).unwrap()),
        [Some(serde_json::json!(20)), Some(serde_json::json!("xx"))]
    );
    let parse = "lambda row: __import__('datetime').datetime.strptime(row.s, '%Y-%m-%d')";
    let ts = ec
        .compile_as(&callable(parse), &schema, Role::Timestamp)
        .unwrap();
    assert_eq!(ts.data_type, riverbank_elements::columns::ts_type());
    let out = ts.eval(&b.slice(0, 1)).unwrap();
    assert!(out.is_valid(0));
    assert!(ts.eval(&b).unwrap_err().contains("ValueError"));
    // A program that does not load is still an error before running.
    assert!(ec.compile(&py("s +"), &schema).is_err());
}
