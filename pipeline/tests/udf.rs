//! UDF configs as Beam YAML takes them: `language: javascript` in its three forms (expression,
//! `callable`, `path` + `name`) with `output_type`, Beam's argument checks, and the languages
//! Riverbank refuses.
use riverbank_pipeline::config::{Expr, Language, TransformConfig, UdfForm};
use riverbank_pipeline::{Plan, load_plan};
use serde_json::{Map, json};

fn plan(yaml: &str) -> Result<Plan, String> {
    load_plan(yaml, &Map::new(), "t").map_err(|e| e.to_string())
}

fn with(config: &str) -> String {
    format!(
        "pipeline:\n  transforms:\n    - {{type: Create, name: In, config: {{elements: [{{x: 1}}]}}}}\n    - {{type: MapToFields, name: M, input: In, config: {config}}}\n"
    )
}

fn fields(p: &Plan) -> Vec<(String, Expr)> {
    match &p.graph.get("M").unwrap().config {
        TransformConfig::MapToFields { fields, .. } => fields.clone(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn javascript_udfs_in_every_form_beam_takes() {
    let p = plan(&with(
        r#"{language: javascript, fields: {
            a: "x + 1",
            b: {expression: "x * 2", output_type: integer},
            c: {callable: "function (row) { return row.x }"},
            d: {path: /udfs/f.js, name: f, output_type: {type: array, items: {type: string}}}}}"#,
    ))
    .unwrap();
    let f = fields(&p);
    assert_eq!(f[0].1, Expr::new(Language::Javascript, "x + 1"));
    assert_eq!(
        (&f[1].1.form, &f[1].1.output_type),
        (&UdfForm::Expression, &Some(json!("integer")))
    );
    assert_eq!(
        (&f[2].1.form, f[2].1.text.as_str()),
        (&UdfForm::Callable, "function (row) { return row.x }")
    );
    assert_eq!(
        f[3].1.form,
        UdfForm::File {
            path: "/udfs/f.js".into(),
            source: None
        }
    );
    assert_eq!(f[3].1.text, "f");
    // The forms survive the plan's trip to the workers.
    let back: Plan = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
    assert_eq!(back, p);
}

#[test]
fn beams_argument_checks_name_the_transform_and_field() {
    for (udf, want) in [
        (
            r#"{}"#,
            "must give 'expression', 'callable', or both 'path' and 'name'",
        ),
        (
            r#"{expression: "x", callable: "f"}"#,
            "cannot give both 'expression' and 'callable'",
        ),
        (
            r#"{callable: "f", path: a.js}"#,
            "cannot give 'expression' or 'callable' with 'path' or 'name'",
        ),
        (r#"{path: a.js}"#, "'path' needs 'name'"),
        (r#"{name: f}"#, "'name' needs 'path'"),
        (r#"{path: a.py, name: f}"#, "'a.py' is not a .js file"),
        (
            r#"{path: a.js, name: "f()"}"#,
            "'name' must be a function's name",
        ),
        (r#"{expression: "x", typo: 1}"#, "unknown key 'typo'"),
        (
            r#"{expression: "x", output_type: 3}"#,
            "'output_type' must be",
        ),
        (r#"3"#, "must be an expression string"),
    ] {
        let e = plan(&with(&format!(
            "{{language: javascript, fields: {{y: {udf}}}}}"
        )))
        .expect_err(udf);
        assert!(
            e.contains(&format!("transform 'M', field 'fields.y': {want}")),
            "{udf}: {e}"
        );
    }
}

#[test]
fn java_is_refused_python_taken_and_callables_need_a_udf_language() {
    let e = plan(&with("{language: java, fields: {y: x}}")).unwrap_err();
    assert!(
        e.contains("transform 'M', field 'language': language java is not supported in transform MapToFields: Riverbank runs no Java UDFs"),
        "{e}"
    );
    plan(&with(
        r#"{language: python, fields: {y: {callable: "lambda row: row.x"}}}"#,
    ))
    .unwrap();
    let e = plan(&with(
        r#"{language: python, fields: {y: {path: "f.js", name: "f"}}}"#,
    ))
    .unwrap_err();
    assert!(e.contains("'f.js' is not a .py file"), "{e}");
    let e = plan(&with(r#"{language: sql, fields: {y: {callable: "f"}}}"#)).unwrap_err();
    assert!(
        e.contains(
            "field 'fields.y': callables need a UDF language (language: python or javascript)"
        ),
        "{e}"
    );
}

#[test]
fn python_dependencies_are_taken_out_of_the_config_and_checked() {
    let p = plan(&with(
        r#"{language: python, dependencies: ['scipy>=1.15', ' /wheels/a.whl '], fields: {y: "x + 1"}}"#,
    ))
    .unwrap();
    assert_eq!(
        p.graph.get("M").unwrap().dependencies,
        ["scipy>=1.15", "/wheels/a.whl"]
    );
    assert_eq!(fields(&p).len(), 1);
    let e = plan(&with(
        r#"{language: sql, dependencies: [x], fields: {y: "x"}}"#,
    ))
    .unwrap_err();
    assert!(
        e.contains("'M'") && e.contains("dependencies") && e.contains("language: python"),
        "{e}"
    );
    let e = plan(&with(
        r#"{language: python, dependencies: scipy, fields: {y: "x"}}"#,
    ))
    .unwrap_err();
    assert!(e.contains("must be a list"), "{e}");
}

#[test]
fn custom_combine_fns_need_python_and_keep_their_config() {
    let combine = |lang: &str, agg: &str| {
        format!(
            "pipeline:\n  transforms:\n    - {{type: Create, name: In, config: {{elements: [{{k: a, x: 1}}]}}}}\n    - {{type: Combine, name: C, input: In, config: {{language: {lang}, group_by: k, combine: {{top: {agg}}}}}}}\n"
        )
    };
    let p = plan(&combine(
        "python",
        "{value: x, fn: {type: apache_beam.transforms.combiners.TopCombineFn, config: {n: 3}}}",
    ))
    .unwrap();
    match &p.graph.get("C").unwrap().config {
        TransformConfig::Combine { aggregates, .. } => {
            assert_eq!(
                aggregates[0].func,
                "apache_beam.transforms.combiners.TopCombineFn"
            );
            assert_eq!(aggregates[0].fn_config.as_ref().unwrap()["n"], json!(3));
        }
        other => panic!("{other:?}"),
    }
    let e = plan(&combine("generic", "{value: x, fn: {type: my.Fn}}")).unwrap_err();
    assert!(
        e.contains("combine.top") && e.contains("language: python"),
        "{e}"
    );
    let e = plan(&combine(
        "python",
        "{value: x, fn: {type: sum, config: {n: 1}}}",
    ))
    .unwrap_err();
    assert!(e.contains("takes no config"), "{e}");
}

#[test]
fn a_py_transform_is_a_stage_of_its_own_and_its_config_is_checked() {
    let p = plan(
        "pipeline:\n  type: chain\n  transforms:\n    - {type: Create, config: {elements: [{x: 1}]}}\n    - {type: PyTransform, name: Py, config: {constructor: __callable__, kwargs: {source: 'def f(pcoll): return pcoll'}}}\n    - {type: LogForTesting}\n",
    )
    .unwrap();
    let py = p
        .graph
        .transforms
        .iter()
        .position(|t| t.name == "Py")
        .unwrap();
    // Gathered after a shuffle, as Beam gives a PTransform its whole input; the LogForTesting
    // after it is fused into its stage.
    let stage = p.stages.iter().find(|s| s.ops[0].transform == py).unwrap();
    assert_eq!(stage.ops.len(), 2);
    assert_eq!(
        stage.inputs[0].exchange,
        riverbank_pipeline::plan::Exchange::Gather
    );

    let e = plan(
        "pipeline:\n  transforms:\n    - {type: PyTransform, name: Read, config: {kwargs: {path: /x.csv}}}\n    - {type: LogForTesting, input: Read}\n",
    )
    .unwrap_err();
    assert!(e.contains("'Read'") && e.contains("constructor"), "{e}");
    let e = plan(
        "pipeline:\n  type: chain\n  transforms:\n    - {type: Create, config: {elements: [{x: 1}]}}\n    - {type: PyTransform, config: {constructor: __callable__}}\n    - {type: LogForTesting}\n",
    )
    .unwrap_err();
    assert!(e.contains("kwargs.source"), "{e}");
    let e = plan(
        "pipeline:\n  transforms:\n    - {type: PyTransform, name: Read, config: {constructor: a.B, args: 3}}\n",
    )
    .unwrap_err();
    assert!(e.contains("args") && e.contains("list"), "{e}");
}
