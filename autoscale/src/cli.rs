//! `riverbank autoscale …`: the clap commands and what they print. The binary mounts
//! [`AutoscaleCommand`] as a subcommand and prints what [`run`] returns.
use crate::engine::Policy;
use crate::error::AutoscaleError;
use crate::plot;
use crate::sim::{self, PolicyRun, Trace, WorkerModel};
use riverbank_pipeline::PipelineOptions;
use serde::Serialize;
use std::fmt::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum AutoscaleCommand {
    /// Replay load traces through a worker model under each policy and compare their cost
    /// (worker-seconds) and lag (backlog-seconds, worst backlog, rescales).
    Simulate {
        /// Trace CSVs (columns: time_s, input_rate, cost_ms[, keys, element_bytes]).
        #[arg(required = true)]
        traces: Vec<PathBuf>,
        /// Beam YAML or DataflowJob whose `options:` the job runs with (default: a streaming
        /// job with Dataflow's defaults).
        #[arg(long)]
        options: Option<PathBuf>,
        /// Policies to compare, comma-separated.
        #[arg(long = "policy", value_enum, value_delimiter = ',', default_values_t = Policy::ALL)]
        policies: Vec<Policy>,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Write an SVG of load, backlog and workers over time (one trace only).
        #[arg(long, value_name = "FILE.svg")]
        plot: Option<PathBuf>,
        /// Cores per worker (default: the options' cpuCount, else 4 streaming / 1 batch).
        #[arg(long)]
        cores: Option<u32>,
        /// Seconds from asking for a worker to its joining.
        #[arg(long, default_value_t = 60.0)]
        startup_secs: f64,
        /// Seconds a rescale stops processing.
        #[arg(long, default_value_t = 10.0)]
        pause_secs: f64,
    },
}

/// Runs a command; returns what to print on stdout.
pub fn run(cmd: AutoscaleCommand) -> Result<String, AutoscaleError> {
    match cmd {
        AutoscaleCommand::Simulate {
            traces,
            options,
            policies,
            format,
            plot,
            cores,
            startup_secs,
            pause_secs,
        } => {
            if plot.is_some() && traces.len() != 1 {
                return Err(AutoscaleError::Invalid("--plot takes one trace".into()));
            }
            if !(startup_secs >= 0.0 && pause_secs >= 0.0) {
                return Err(AutoscaleError::Invalid(
                    "start-up and pause must be ≥ 0".into(),
                ));
            }
            let options = match &options {
                Some(path) => load_options(path)?,
                None => PipelineOptions {
                    streaming: true,
                    ..Default::default()
                },
            };
            let model = WorkerModel {
                cores: cores
                    .unwrap_or(WorkerModel::from_options(&options).cores)
                    .max(1),
                startup_secs,
                pause_secs,
            };
            let mut results = Vec::new();
            for path in &traces {
                let trace = load_trace(path)?;
                let runs: Vec<PolicyRun> = sim::compare(&trace, &options, &model)
                    .into_iter()
                    .filter(|r| policies.contains(&r.totals.policy) || policies.is_empty())
                    .collect();
                results.push(TraceResult {
                    trace: trace.name,
                    duration_secs: trace.points[trace.points.len() - 1].time_s
                        - trace.points[0].time_s,
                    policies: runs,
                });
            }
            if let Some(path) = plot {
                let r = &results[0];
                std::fs::write(&path, plot::svg(&r.trace, &r.policies)).map_err(|source| {
                    AutoscaleError::Write {
                        path: path.clone(),
                        source,
                    }
                })?;
            }
            let report = Report {
                options,
                model,
                traces: results,
            };
            Ok(match format {
                Format::Text => render_text(&report),
                Format::Json => {
                    let mut s = serde_json::to_string_pretty(&report)
                        .map_err(|e| AutoscaleError::Invalid(e.to_string()))?;
                    s.push('\n');
                    s
                }
            })
        }
    }
}

/// Everything one `simulate` produced; `--format json` prints it as is.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub options: PipelineOptions,
    pub model: WorkerModel,
    pub traces: Vec<TraceResult>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TraceResult {
    pub trace: String,
    pub duration_secs: f64,
    pub policies: Vec<PolicyRun>,
}

/// A side-by-side table: one row per trace and policy.
pub fn render_text(report: &Report) -> String {
    let o = &report.options;
    let m = &report.model;
    let mut out = format!(
        "{} job, numWorkers {}, maxNumWorkers {}; workers of {} cores, start-up {} s, rescale pause {} s\n\n",
        if o.streaming { "streaming" } else { "batch" },
        o.effective_num_workers(),
        o.effective_max_workers(),
        m.cores,
        m.startup_secs,
        m.pause_secs
    );
    let _ = writeln!(
        out,
        "{:<16} {:<11} {:>11} {:>12} {:>10} {:>9}  insights",
        "trace", "policy", "worker-s", "backlog-s", "worst (s)", "rescales"
    );
    for t in &report.traces {
        for r in &t.policies {
            let x = &r.totals;
            let insights: Vec<String> = x
                .insights
                .iter()
                .map(|i| {
                    serde_json::to_value(i)
                        .ok()
                        .and_then(|v| v.as_str().map(String::from))
                        .unwrap_or_default()
                })
                .collect();
            let _ = writeln!(
                out,
                "{:<16} {:<11} {:>11.0} {:>12.0} {:>10.1} {:>9}  {}",
                trace_label(&t.trace),
                x.policy.name(),
                x.worker_seconds,
                x.backlog_seconds,
                x.worst_backlog_secs,
                x.rescales,
                insights.join(",")
            );
        }
    }
    out
}

fn trace_label(name: &str) -> &str {
    let base = name.rsplit('/').next().unwrap_or(name);
    base.strip_suffix(".csv").unwrap_or(base)
}

pub fn load_trace(path: &Path) -> Result<Trace, AutoscaleError> {
    let text = std::fs::read_to_string(path).map_err(|source| AutoscaleError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    Trace::parse(&path.display().to_string(), &text)
}

/// Reads the `options:` mapping of a Beam YAML file, or `spec.options` of a DataflowJob.
pub fn load_options(path: &Path) -> Result<PipelineOptions, AutoscaleError> {
    let text = std::fs::read_to_string(path).map_err(|source| AutoscaleError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_options(&path.display().to_string(), &text)
}

pub fn parse_options(name: &str, text: &str) -> Result<PipelineOptions, AutoscaleError> {
    let err = |message: String| AutoscaleError::Options {
        path: name.to_string(),
        message,
    };
    let yaml: serde_norway::Value = serde_norway::from_str(text).map_err(|e| err(e.to_string()))?;
    let doc = serde_json::to_value(yaml).map_err(|e| err(e.to_string()))?;
    let options = doc
        .get("options")
        .or_else(|| doc.get("spec").and_then(|s| s.get("options")))
        .ok_or_else(|| err("no 'options:' mapping (or 'spec.options' of a DataflowJob)".into()))?;
    serde_json::from_value(options.clone()).map_err(|e| err(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_come_from_beam_yaml_or_a_dataflow_job() {
        let beam =
            "pipeline:\n  transforms: []\noptions:\n  streaming: true\n  maxNumWorkers: 60\n";
        assert_eq!(parse_options("a", beam).unwrap().max_num_workers, Some(60));
        let job = "kind: DataflowJob\nspec:\n  options:\n    numWorkers: 4\n";
        assert_eq!(parse_options("b", job).unwrap().num_workers, Some(4));
        let e = parse_options("c.yaml", "pipeline: {}\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("c.yaml") && e.contains("no 'options:'"), "{e}");
        let e = parse_options("d", "options:\n  numWorkers: many\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("numWorkers") || e.contains("invalid"), "{e}");
    }
}
