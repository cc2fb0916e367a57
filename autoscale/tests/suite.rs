//! The trace suite under `examples/autoscaling/`, through the same entry point as the binary.
use riverbank_autoscale::cli::{Format, load_options, load_trace};
use riverbank_autoscale::sim::{self, WorkerModel};
use riverbank_autoscale::{AutoscaleCommand, Policy, run};
use std::path::PathBuf;

const TRACES: [&str; 6] = [
    "step_up",
    "spike",
    "diurnal",
    "slow_ramp",
    "noisy_flat",
    "hot_key",
];

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/autoscaling")
}

/// The goal: on every trace Riverbank's policy uses no more worker-seconds than the
/// documented rules, with no more backlog-seconds, and strictly less of one of them on most. On
/// this suite, with the model the options describe (60 s start-up, 10 s pause), it is strictly
/// less on every trace.
#[test]
fn riverbank_never_costs_more_than_the_documented_rules() {
    let options = load_options(&dir().join("options.yaml")).unwrap();
    let model = WorkerModel {
        startup_secs: 60.0,
        pause_secs: 10.0,
        ..WorkerModel::from_options(&options)
    };
    let mut better = Vec::new();
    for name in TRACES {
        let trace = load_trace(&dir().join(format!("{name}.csv"))).unwrap();
        let runs = sim::compare(&trace, &options, &model);
        let get = |p: Policy| {
            runs.iter()
                .find(|r| r.totals.policy == p)
                .unwrap()
                .totals
                .clone()
        };
        let (doc, rb) = (get(Policy::Documented), get(Policy::Riverbank));
        assert!(
            rb.worker_seconds <= doc.worker_seconds + 1e-6
                && rb.backlog_seconds <= doc.backlog_seconds + 1e-6,
            "{name}: riverbank {rb:?} vs documented {doc:?}"
        );
        if rb.worker_seconds < doc.worker_seconds - 1e-6
            || rb.backlog_seconds < doc.backlog_seconds - 1e-6
        {
            better.push(name);
        }
    }
    assert_eq!(better, TRACES, "strictly better only on {better:?}");
}

#[test]
fn hot_key_raises_the_active_keys_insight_and_keeps_the_workers() {
    let options = load_options(&dir().join("options.yaml")).unwrap();
    let trace = load_trace(&dir().join("hot_key.csv")).unwrap();
    let runs = sim::compare(&trace, &options, &WorkerModel::from_options(&options));
    let rb = runs
        .iter()
        .find(|r| r.totals.policy == Policy::Riverbank)
        .unwrap();
    assert!(
        rb.totals
            .insights
            .contains(&riverbank_autoscale::Insight::ActiveKeys)
    );
    let during: Vec<_> = rb
        .timeline
        .iter()
        .filter(|r| r.time_s > 1300.0 && r.time_s < 2400.0)
        .collect();
    let first = during[0].workers;
    assert!(
        during.iter().all(|r| r.workers == first),
        "no rescale while 12 keys cap the job"
    );
}

#[test]
fn simulate_command_prints_a_table_json_and_writes_a_plot() {
    let tmp = tempfile::tempdir().unwrap();
    let svg = tmp.path().join("spike.svg");
    let cmd = |format, plot| AutoscaleCommand::Simulate {
        traces: vec![dir().join("spike.csv")],
        options: Some(dir().join("options.yaml")),
        policies: Policy::ALL.to_vec(),
        format,
        plot,
        cores: None,
        startup_secs: 60.0,
        pause_secs: 10.0,
    };
    let text = run(cmd(Format::Text, Some(svg.clone()))).unwrap();
    for policy in ["fixed", "documented", "riverbank"] {
        assert!(
            text.lines()
                .any(|l| l.starts_with("spike") && l.contains(policy)),
            "{text}"
        );
    }
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(
        plot.starts_with("<svg") && plot.matches("<polyline").count() == 7,
        "load + 3 backlog + 3 workers"
    );
    let json: serde_json::Value =
        serde_json::from_str(&run(cmd(Format::Json, None)).unwrap()).unwrap();
    let policies = json["traces"][0]["policies"].as_array().unwrap();
    assert_eq!(policies.len(), 3);
    let row = &policies[2]["timeline"][0];
    for key in [
        "timeS",
        "inputRate",
        "backlogSecs",
        "workers",
        "decision",
        "reason",
        "message",
    ] {
        assert!(row.get(key).is_some(), "{key} in {row}");
    }
    assert_eq!(policies[2]["totals"]["policy"], "riverbank");
    let err = run(AutoscaleCommand::Simulate {
        traces: vec![dir().join("spike.csv"), dir().join("hot_key.csv")],
        options: None,
        policies: vec![],
        format: Format::Text,
        plot: Some(svg),
        cores: None,
        startup_secs: 60.0,
        pause_secs: 10.0,
    })
    .unwrap_err();
    assert!(err.to_string().contains("one trace"));
}
