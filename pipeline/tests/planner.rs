//! The planner on the taxi example and on the shapes Dataflow's optimizations care about.
use riverbank_pipeline::{Exchange, OpRole, Plan, load_plan};
use serde_json::{Map, Value, json};

fn vars() -> Map<String, Value> {
    json!({"input": "data/*.parquet", "output": "out"})
        .as_object()
        .unwrap()
        .clone()
}

fn plan(yaml: &str) -> Plan {
    load_plan(yaml, &vars(), "test").unwrap_or_else(|e| panic!("{e}"))
}

fn stage_of(p: &Plan, transform: &str, role: OpRole) -> Vec<usize> {
    let t = p
        .graph
        .transforms
        .iter()
        .position(|t| t.name == transform)
        .unwrap_or_else(|| panic!("no {transform}"));
    p.stages
        .iter()
        .filter(|s| s.ops.iter().any(|o| o.transform == t && o.role == role))
        .map(|s| s.index)
        .collect()
}

#[test]
fn taxi_plan_fuses_element_wise_steps_and_lifts_both_combines() {
    let p = plan(include_str!("../../examples/taxi/taxi.yaml"));
    assert_eq!(p.job_name, "nyc-taxi");
    // Read, both branches' element-wise steps and both partial combines run in one stage.
    let s0 = stage_of(&p, "ReadTrips", OpRole::Apply);
    assert_eq!(s0.len(), 1);
    for t in ["Valid", "ZoneAmount", "Stamp", "Hourly"] {
        assert_eq!(
            stage_of(&p, t, OpRole::Apply),
            s0,
            "{t} is fused with the read"
        );
    }
    assert_eq!(stage_of(&p, "SumPerZone", OpRole::PartialCombine), s0);
    assert_eq!(stage_of(&p, "CountPerWindow", OpRole::PartialCombine), s0);
    // Each final combine starts its own stage after a shuffle of combine states...
    let zones = stage_of(&p, "SumPerZone", OpRole::FinalCombine);
    let hours = stage_of(&p, "CountPerWindow", OpRole::FinalCombine);
    assert_eq!(zones.len(), 1);
    assert_eq!(hours.len(), 1);
    assert_ne!(zones, hours);
    assert!(
        p.stages[zones[0]]
            .inputs
            .iter()
            .all(|i| matches!(i.exchange, Exchange::CombineStates { .. }) && i.from_stages == s0)
    );
    // ...and the steps after it fuse into that stage, sinks included.
    assert_eq!(stage_of(&p, "WriteZones", OpRole::Apply), zones);
    for t in ["WindowBounds", "FormatHour", "WriteHours"] {
        assert_eq!(stage_of(&p, t, OpRole::Apply), hours, "{t}");
    }
    assert_eq!(p.stages.len(), 3);
    // Dataflow-shaped JSON.
    let j = riverbank_pipeline::display::to_json(&p);
    let stages = j["executionPipelineStage"].as_array().unwrap();
    assert_eq!(stages.len(), 3);
    assert_eq!(stages[0]["id"], "S00");
    assert!(
        stages[0]["componentTransform"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["userName"] == "SumPerZone/PartialCombine")
    );
    assert_eq!(stages[1]["prerequisiteStage"], json!(["S00"]));
    assert!(riverbank_pipeline::display::to_dot(&p).contains("S00 -> S01"));
}

#[test]
fn flatten_of_two_sources_is_unzipped_into_both_stages() {
    let p = plan(
        r#"
pipeline:
  transforms:
    - {type: Create, name: A, config: {elements: [{x: 1}]}}
    - {type: Create, name: B, config: {elements: [{x: 2}]}}
    - {type: Flatten, name: Both, input: [A, B]}
    - {type: MapToFields, name: Double, input: Both, config: {language: sql, fields: {y: "x * 2"}}}
    - {type: Combine, name: Sum, input: Double, config: {group_by: [], combine: {y: sum}}}
    - {type: WriteToJson, name: Out, input: Sum, config: {path: out/s.jsonl}}
"#,
    );
    let a = stage_of(&p, "A", OpRole::Apply);
    let b = stage_of(&p, "B", OpRole::Apply);
    let mut both = a.clone();
    both.extend(&b);
    assert_eq!(stage_of(&p, "Both", OpRole::Apply), both);
    assert_eq!(stage_of(&p, "Double", OpRole::Apply), both);
    assert_eq!(stage_of(&p, "Sum", OpRole::PartialCombine), both);
    let fin = stage_of(&p, "Sum", OpRole::FinalCombine)[0];
    assert_eq!(p.stages[fin].inputs[0].from_stages, both);
    assert_eq!(p.stages.len(), 3);
}

/// A file sink's output (the files it wrote) exists once the sink is committed: its readers
/// start a stage of their own after every stage writing the sink (both of an unzipped
/// Flatten's), entered by the sink's commit; a sink nobody reads gets none.
#[test]
fn a_read_sink_gets_a_commit_stage_after_its_writers() {
    let p = plan(
        r#"
pipeline:
  transforms:
    - {type: Create, name: A, config: {elements: [{x: 1}]}}
    - {type: Create, name: B, config: {elements: [{x: 2}]}}
    - {type: WriteToJson, name: W, input: [A, B], config: {path: out/w.jsonl}}
    - {type: MapToFields, name: Names, input: W, config: {language: sql, fields: {f: file_name}}}
    - {type: WriteToText, name: List, input: Names, config: {path: out/list.txt}}
    - {type: WriteToJson, name: Unread, input: A, config: {path: out/a.jsonl}}
"#,
    );
    let writers = stage_of(&p, "W", OpRole::Apply);
    assert_eq!(writers, vec![0, 1]);
    let commit = stage_of(&p, "W", OpRole::Commit);
    assert_eq!(commit.len(), 1);
    let s = &p.stages[commit[0]];
    assert_eq!(s.inputs.len(), 1);
    assert_eq!(s.inputs[0].from_stages, writers);
    assert_eq!(s.inputs[0].exchange, Exchange::WrittenFiles);
    assert_eq!(p.prerequisites(commit[0]), writers);
    assert_eq!(stage_of(&p, "Names", OpRole::Apply), commit);
    assert_eq!(stage_of(&p, "List", OpRole::Apply), commit);
    // Nothing is shuffled to it, and an unread sink stays fused with no stage of its own.
    assert!(
        p.stages
            .iter()
            .all(|s| s.outputs.iter().all(|(c, _)| c != "W"))
    );
    assert!(stage_of(&p, "Unread", OpRole::Commit).is_empty());
    assert_eq!(p.stages.len(), 3);
}

#[test]
fn reshuffle_sql_and_join_break_fusion() {
    let p = plan(
        r#"
pipeline:
  transforms:
    - {type: Create, name: A, config: {elements: [{k: 1, v: 2}]}}
    - {type: Reshuffle, name: R, input: A}
    - {type: Filter, name: F, input: R, config: {language: sql, keep: "v > 0"}}
    - {type: Sql, name: Q, input: F, config: {query: "SELECT k, SUM(v) AS v FROM PCOLLECTION GROUP BY k"}}
    - {type: Join, name: J, input: {left: Q, right: A}, config: {equalities: k, type: inner, fields: {left: [k, v]}}}
    - {type: WriteToJson, name: Out, input: J, config: {path: out/j.jsonl}}
"#,
    );
    let a = stage_of(&p, "A", OpRole::Apply);
    let r = stage_of(&p, "R", OpRole::ShuffleRead);
    assert_ne!(a, r);
    assert_eq!(
        stage_of(&p, "F", OpRole::Apply),
        r,
        "F fuses after the reshuffle"
    );
    let q = stage_of(&p, "Q", OpRole::ShuffleRead);
    let j = stage_of(&p, "J", OpRole::ShuffleRead);
    assert_eq!(stage_of(&p, "Out", OpRole::Apply), j);
    assert_eq!(p.stages[j[0]].inputs.len(), 2);
    assert_eq!(p.stages[q[0]].inputs[0].exchange, Exchange::Gather);
}

#[test]
fn chains_composites_and_source_windowing_expand() {
    let p = plan(
        r#"
pipeline:
  type: chain
  source:
    type: Create
    config: {elements: [{t: 1, n: 1}]}
    windowing: {type: fixed, size: 60}
  transforms:
    - type: composite
      name: Twice
      transforms:
        - {type: MapToFields, name: M, input: input, config: {language: sql, append: true, fields: {m: "n * 2"}}}
      output: M
  sink:
    type: WriteToJson
    config: {path: out/x.jsonl}
"#,
    );
    let names: Vec<&str> = p.graph.transforms.iter().map(|t| t.name.as_str()).collect();
    assert!(names.contains(&"Create/Windowing"), "{names:?}");
    let m = p.graph.get("Twice/M").unwrap();
    assert_eq!(m.inputs[0].1, "Create/Windowing");
    assert_eq!(p.graph.get("WriteToJson").unwrap().inputs[0].1, "Twice/M");
    assert_eq!(p.stages.len(), 1);
}

/// Beam links chain members by identity: two unnamed transforms of one type in a chain (and
/// in a nested chain) each read the one before, and a name written by the user that is
/// given twice is still ambiguous.
#[test]
fn chain_members_of_one_type_read_the_one_before_them() {
    let p = plan(
        r#"
pipeline:
  type: chain
  transforms:
    - type: Create
      config: {elements: [{n: 1}]}
    - type: Filter
      config: {language: sql, keep: "n > 0"}
    - type: Filter
      config: {language: sql, keep: "n < 9"}
    - type: chain
      name: Inner
      transforms:
        - type: Filter
          config: {language: sql, keep: "n < 8"}
        - type: Filter
          config: {language: sql, keep: "n < 7"}
    - type: WriteToJson
      config: {path: out/x.jsonl}
"#,
    );
    let input = |t: &str| p.graph.get(t).unwrap().inputs[0].1.clone();
    assert_eq!(input("Filter#1"), "Create");
    assert_eq!(input("Filter#2"), "Filter#1");
    assert_eq!(input("Inner/Filter#1"), "Filter#2");
    assert_eq!(input("Inner/Filter#2"), "Inner/Filter#1");
    assert_eq!(input("WriteToJson"), "Inner/Filter#2");
    let e = errors(
        r#"
pipeline:
  transforms:
    - {type: Create, name: A, config: {elements: [{n: 1}]}}
    - {type: Create, name: A, config: {elements: [{n: 2}]}}
    - {type: WriteToJson, input: A, config: {path: out/x.jsonl}}
"#,
    );
    assert!(e.contains("'A' is ambiguous"), "{e}");
}

fn errors(yaml: &str) -> String {
    load_plan(yaml, &vars(), "t")
        .expect_err("should be invalid")
        .to_string()
}

#[test]
fn every_structural_error_is_reported_with_its_transform_and_field() {
    let e = errors(
        r#"
pipeline:
  transforms:
    - {type: Create, name: A, config: {elements: [{x: 1}]}}
    - {type: MapToFeilds, name: B, input: A, config: {fields: {y: x}}}
    - {type: Filter, name: C, input: Nope, config: {language: sql, keep: "x > 1"}}
    - {type: Filter, name: D, input: A, config: {language: java, keep: "x > 1"}}
    - {type: Combine, name: E, input: A, config: {group_by: x, combine: {x: median}}}
"#,
    );
    assert!(
        e.contains("transform 'B'") && e.contains("did you mean MapToFields"),
        "{e}"
    );
    assert!(
        e.contains(
            "transform 'D', field 'language': language java is not supported in transform Filter"
        ),
        "{e}"
    );
    assert!(e.contains("unknown combine fn 'median'"), "{e}");
    assert!(
        e.contains("transform 'C', field 'input': 'Nope' does not name any transform"),
        "{e}"
    );
    assert!(e.contains("4 errors"), "{e}");
    let e = errors(
        "pipeline:\n  transforms:\n    - {type: Create, name: A, config: {elements: [{x: 1}]}}\n    - {type: Filter, name: C, input: Nope, config: {language: sql, keep: \"x > 1\"}}\n",
    );
    assert!(
        e.contains("transform 'C', field 'input': 'Nope' does not name any transform"),
        "{e}"
    );
    // A broker sink gives nothing to read, by its name or as `.output`.
    for input in ["W", "W.output"] {
        let e = errors(&format!(
            "pipeline:\n  transforms:\n    - {{type: ReadFromKafka, name: A, config: {{topic: t, bootstrap_servers: k:9092}}}}\n    - {{type: WriteToKafka, name: W, input: A, config: {{topic: u, bootstrap_servers: k:9092}}}}\n    - {{type: LogForTesting, name: L, input: {input}}}\n"
        ));
        assert!(
            e.contains(
                "transform 'L', field 'input': 'W' writes to a broker, which gives nothing to read"
            ),
            "{input}: {e}"
        );
    }
}

#[test]
fn unconsumed_error_output_cycles_and_bad_windowing_are_rejected() {
    let e = errors(
        "pipeline:\n  transforms:\n    - {type: Create, name: A, config: {elements: [{x: 1}]}}\n    - {type: MapToFields, name: M, input: A, config: {language: sql, fields: {y: 'x / 0'}, error_handling: {output: bad}}}\n",
    );
    assert!(e.contains("error output 'bad' is not consumed"), "{e}");
    let e = errors(
        "pipeline:\n  transforms:\n    - {type: Filter, name: X, input: Y, config: {language: sql, keep: 'true'}}\n    - {type: Filter, name: Y, input: X, config: {language: sql, keep: 'true'}}\n",
    );
    assert!(e.contains("cycle"), "{e}");
    let e = errors(
        "pipeline:\n  transforms:\n    - {type: Create, name: A, config: {elements: [{x: 1}]}}\n    - {type: WindowInto, name: W, input: A, windowing: {type: tumbling, size: 5}}\n",
    );
    assert!(
        e.contains("transform 'W', field 'windowing': unknown windowing type 'tumbling'"),
        "{e}"
    );
    let e = errors("pipeline: [1, 2]\n");
    assert!(e.contains("not a mapping"), "{e}");
    let e = errors("pipeline:\n  transforms:\n    - type: Create\n      config: {elements: [1]\n");
    assert!(e.contains("YAML error"), "{e}");
}

#[test]
fn dataflowjob_manifest_is_accepted_with_its_options() {
    let p = plan(include_str!("../../examples/taxi/dataflowjob.yaml"));
    assert_eq!(p.job_name, "nyc-taxi");
    assert_eq!(p.options.max_num_workers, Some(4));
    assert_eq!(p.options.effective_max_workers(), 4);
    assert_eq!(p.stages.len(), 3);
}

#[test]
fn plan_round_trips_through_json() {
    let p = plan(include_str!("../../examples/taxi/taxi.yaml"));
    let s = serde_json::to_string(&p).unwrap();
    let back: Plan = serde_json::from_str(&s).unwrap();
    assert_eq!(back, p);
}

#[test]
fn siblings_inside_a_composite_and_a_nested_chain_resolve() {
    // A composite member reads a sibling (`SomeProducer`, `Tens.output`) and the composite's
    // input; a chain nested in a composite gives its later steps the previous step as input.
    let p = plan(
        r#"
pipeline:
  transforms:
    - {type: Create, name: Nums, config: {elements: [{n: 1}, {n: 2}]}}
    - type: composite
      name: Outer
      input: Nums
      transforms:
        - {type: MapToFields, name: SomeProducer, input: input, config: {language: sql, fields: {n: "n + 10"}}}
        - {type: Flatten, name: Flatten, input: [SomeProducer, input]}
        - type: chain
          name: Steps
          input: Flatten
          transforms:
            - {type: Filter, name: Big, config: {language: sql, keep: "n > 1"}}
            - {type: MapToFields, name: Tens, config: {language: sql, fields: {n: "n * 10"}}}
        - {type: LogForTesting, name: Log, input: Steps.output}
      output: Log
    - {type: WriteToJson, input: Outer, config: {path: out/x.jsonl}}
"#,
    );
    let inputs = |t: &str| -> Vec<String> {
        p.graph
            .get(t)
            .unwrap_or_else(|| panic!("no {t}"))
            .inputs
            .iter()
            .map(|(_, c)| c.clone())
            .collect()
    };
    assert_eq!(inputs("Outer/Flatten"), ["Outer/SomeProducer", "Nums"]);
    assert_eq!(inputs("Outer/Steps/Big"), ["Outer/Flatten"]);
    assert_eq!(inputs("Outer/Steps/Tens"), ["Outer/Steps/Big"]);
    assert_eq!(inputs("Outer/Log"), ["Outer/Steps/Tens"]);
    assert_eq!(inputs("WriteToJson"), ["Outer/Log"]);
}

#[test]
fn a_composite_may_read_a_sibling_defined_after_it() {
    // Beam resolves names in a scope regardless of their order in the file.
    let p = plan(
        r#"
pipeline:
  transforms:
    - type: composite
      name: Outer
      transforms:
        - type: composite
          name: Inner
          input: Later
          transforms:
            - {type: MapToFields, name: M, input: input, config: {language: sql, fields: {n: "n * 2"}}}
          output: M
        - {type: Create, name: Later, config: {elements: [{n: 1}]}}
      output: Inner
    - {type: WriteToJson, input: Outer, config: {path: out/x.jsonl}}
"#,
    );
    assert_eq!(
        p.graph.get("Outer/Inner/M").unwrap().inputs[0].1,
        "Outer/Later"
    );
}

#[test]
fn generic_expressions_are_fields_literals_or_one_comparison() {
    let e = errors(
        r#"
pipeline:
  transforms:
    - {type: Create, name: A, config: {elements: [{x: 1}]}}
    - {type: MapToFields, name: Sum, input: A, config: {fields: {y: "x + 1"}}}
    - {type: MapToFields, name: Big, input: A, config: {fields: {y: 3000000000}}}
    - {type: Filter, name: Two, input: A, config: {keep: "x > 1 > 0"}}
    - {type: Partition, name: P, input: A, config: {by: "x == 1", outputs: [a]}}
    - {type: MapToFields, name: Ok, input: A, config: {fields: {a: 1, b: 2.5, c: '"s"', d: "x >= 1", e: "x"}}}
"#,
    );
    assert!(
        e.contains("transform 'Sum', field 'fields.y': 'x + 1' is not"),
        "{e}"
    );
    assert!(
        e.contains("transform 'Big', field 'fields.y'") && e.contains("3000000000"),
        "{e}"
    );
    assert!(
        e.contains("transform 'Two', field 'keep'") && e.contains("one comparison"),
        "{e}"
    );
    assert!(
        e.contains("transform 'P', field 'by'") && e.contains("comparison"),
        "{e}"
    );
    assert!(!e.contains("'Ok'"), "{e}");
    assert!(e.contains("4 errors"), "{e}");
}

#[test]
fn validate_with_schema_checks_its_schema() {
    let e = errors(
        r#"
pipeline:
  transforms:
    - {type: Create, name: A, config: {elements: [{x: 1}]}}
    - {type: ValidateWithSchema, name: NoSchema, input: A, config: {}}
    - {type: ValidateWithSchema, name: BadType, input: A, config: {schema: {type: object, properties: {x: {type: int}}}}}
    - {type: ValidateWithSchema, name: Unsupported, input: A, config: {schema: {type: object, properties: {x: {oneOf: [{type: integer}]}}}}}
    - {type: ValidateWithSchema, name: BadPattern, input: A, config: {schema: {properties: {x: {pattern: "("}}}}}
    - {type: ValidateWithSchema, name: Ok, input: A, config: {schema: {type: object, properties: {x: {type: [integer, "null"], minimum: 0, description: any}}, required: [x], additionalProperties: false}}}
"#,
    );
    assert!(
        e.contains("transform 'NoSchema', field 'schema': is required"),
        "{e}"
    );
    assert!(
        e.contains("transform 'BadType', field 'schema'")
            && e.contains("properties.x.type")
            && e.contains("'int'"),
        "{e}"
    );
    assert!(
        e.contains("transform 'Unsupported', field 'schema'") && e.contains("'oneOf'"),
        "{e}"
    );
    assert!(
        e.contains("transform 'BadPattern', field 'schema'") && e.contains("properties.x.pattern"),
        "{e}"
    );
    assert!(!e.contains("'Ok'"), "{e}");
    assert!(e.contains("4 errors"), "{e}");
}

/// Keys read as Beam's loader reads them: a Combine output named `n` stays `n` (YAML 1.1 has no
/// single-letter booleans), and `on`/`yes` values are booleans.
#[test]
fn yaml_scalars_are_read_as_beam_reads_them() {
    let p = plan(
        r#"
pipeline:
  transforms:
    - type: Create
      config:
        elements:
          - {k: a, v: 0x10, w: 010, x: 1_000, y: .5, z: yes, o: on, s: n, t: 1e3}
    - type: Combine
      input: Create
      config:
        group_by: k
        combine:
          n: {value: v, fn: count}
          y: {value: v, fn: sum}
"#,
    );
    let create = &p.graph.transforms[0];
    let json = serde_json::to_value(&create.config).unwrap();
    assert_eq!(
        json.pointer("/elements/0")
            .or(json.pointer("/Create/elements/0")),
        Some(
            &json!({"k": "a", "v": 16, "w": 8, "x": 1000, "y": 0.5, "z": true, "o": true, "s": "n", "t": "1e3"})
        ),
        "{json}"
    );
    let combine = serde_json::to_string(&p.graph.transforms[1].config).unwrap();
    assert!(combine.contains("\"n\""), "{combine}");
    assert!(!combine.contains("false"), "{combine}");
}

/// `resource_hints` on the pipeline, a composite and a transform, merged as Beam merges them
/// and carried in the plan.
#[test]
fn resource_hints_are_carried_into_the_plan() {
    let p = plan(
        r#"
pipeline:
  resource_hints: {cpu_count: 2}
  transforms:
    - type: Create
      config: {elements: [{a: 1}]}
    - type: composite
      name: Heavy
      input: Create
      resource_hints: {min_ram: 8GB, accelerator: "type:nvidia-l4;count:1"}
      transforms:
        - type: MapToFields
          name: Big
          input: input
          resource_hints: {minRam: 16GiB, cpuCount: 1}
          config: {fields: {a: a}}
        - type: Filter
          name: Small
          input: Big
          config: {keep: "a > 0"}
      output: Small
"#,
    );
    let hints = |name: &str| {
        p.graph
            .transforms
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("no {name}"))
            .resource_hints
            .clone()
    };
    assert_eq!(hints("Create").cpu_count, Some(2));
    assert_eq!(hints("Create").min_ram_bytes, None);
    let big = hints("Heavy/Big");
    assert_eq!(big.min_ram_bytes, Some(16 << 30));
    assert_eq!(big.cpu_count, Some(2));
    assert_eq!(big.accelerator.as_deref(), Some("type:nvidia-l4;count:1"));
    assert_eq!(hints("Heavy/Small").min_ram_bytes, Some(8_000_000_000));
    let w = p.worker_resource_hints();
    assert_eq!((w.min_ram_bytes, w.cpu_count), (Some(16 << 30), Some(2)));
    // They ride in the serialized plan the operator and the workers read.
    let json = serde_json::to_string(&p).unwrap();
    assert!(json.contains("\"minRamBytes\":17179869184"), "{json}");

    let bad = load_plan(
        "pipeline:\n  transforms:\n    - type: Create\n      resource_hints: {memory: 1GB}\n      config: {elements: [{a: 1}]}\n",
        &vars(),
        "t",
    )
    .unwrap_err()
    .to_string();
    assert!(
        bad.contains("resource_hints") && bad.contains("unknown resource hint: memory"),
        "{bad}"
    );
}

/// `output_schema` on a transform: a ValidateWithSchema on its main output that readers see
/// instead; with error_handling, its failures join the transform's error output (as Beam).
#[test]
fn output_schema_checks_the_main_output() {
    let p = plan(
        r#"
pipeline:
  transforms:
    - type: Create
      config:
        elements: [{a: 1}, {a: -1}]
        output_schema: {type: object, properties: {a: {type: integer}}}
    - type: MapToFields
      name: Double
      input: Create
      config:
        language: python
        fields: {b: "a * 2"}
        error_handling: {output: bad}
        output_schema: {type: object, properties: {b: {type: integer, minimum: 0}}}
    - type: WriteToJson
      name: Good
      input: Double
      config: {path: out/good}
    - type: WriteToJson
      name: Bad
      input: Double.bad
      config: {path: out/bad}
"#,
    );
    let t = |name: &str| {
        p.graph
            .transforms
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("no {name}"))
    };
    assert_eq!(t("Create/EnforceOutputSchema").inputs[0].1, "Create");
    assert_eq!(t("Create/EnforceOutputSchema").error_output, None);
    assert_eq!(t("Double").inputs[0].1, "Create/EnforceOutputSchema");
    let v = t("Double/EnforceOutputSchema");
    assert_eq!(v.type_name, "ValidateWithSchema");
    assert_eq!(v.error_output.as_deref(), Some("bad"));
    assert_eq!(t("Good").inputs[0].1, "Double/EnforceOutputSchema");
    assert_eq!(t("Bad").inputs[0].1, "Double/EnforceOutputSchema/Errors");
    let errors: Vec<&str> = t("Double/EnforceOutputSchema/Errors")
        .inputs
        .iter()
        .map(|(_, c)| c.as_str())
        .collect();
    assert_eq!(errors, ["Double.bad", "Double/EnforceOutputSchema.bad"]);

    let err = |yaml: &str| load_plan(yaml, &vars(), "t").unwrap_err().to_string();
    let e = err(
        "pipeline:\n  transforms:\n    - type: Create\n      config:\n        elements: [{a: 1}]\n        output_schema: {type: object, error_handling: {output: x}}\n",
    );
    assert!(
        e.contains("output_schema") && e.contains("error_handling"),
        "{e}"
    );
    // A broker sink has no output to check; a file sink's is the files it wrote.
    let e = err(
        "pipeline:\n  transforms:\n    - type: ReadFromKafka\n      config: {topic: t, bootstrap_servers: k:9092}\n    - type: WriteToKafka\n      input: ReadFromKafka\n      config:\n        topic: u\n        bootstrap_servers: k:9092\n        output_schema: {type: object}\n",
    );
    assert!(
        e.contains("WriteToKafka") && e.contains("no main output"),
        "{e}"
    );
    let p = plan(
        "pipeline:\n  transforms:\n    - type: Create\n      config:\n        elements: [{a: 1}]\n    - type: WriteToJson\n      input: Create\n      config:\n        path: x\n        output_schema: {type: object, required: [file_name]}\n",
    );
    let v = p.graph.get("WriteToJson/EnforceOutputSchema").unwrap();
    assert_eq!(v.inputs[0].1, "WriteToJson");
}

/// With error_handling, Beam names a transform's main output `good` (ValidateWithSchema's
/// valid rows are read as `UnderTest.good`).
#[test]
fn error_handling_main_output_is_good() {
    let p = plan(
        r#"
pipeline:
  transforms:
    - type: Create
      config: {elements: [{a: 1}]}
    - type: ValidateWithSchema
      name: UnderTest
      input: Create
      config:
        schema: {type: object, properties: {a: {type: integer}}}
        error_handling: {output: bad}
    - type: WriteToJson
      name: Good
      input: UnderTest.good
      config: {path: out/good}
    - type: WriteToJson
      name: Bad
      input: UnderTest.bad
      config: {path: out/bad}
"#,
    );
    let good = p
        .graph
        .transforms
        .iter()
        .find(|t| t.name == "Good")
        .unwrap();
    assert_eq!(good.inputs[0].1, "UnderTest");
}
