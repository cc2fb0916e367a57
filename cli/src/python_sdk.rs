//! Beam's Python SDK for the engine's `PyTransform` stages (`riverbank_engine::python_sdk`).
//! `python_sdk.py` applies the one PTransform as Beam YAML applies it, to its inputs read from
//! Parquet as Beam's schema'd rows. At compile time it only builds that pipeline, for the
//! output's schema; at run time the pipeline (read, the PTransform, write) is submitted to a
//! job server started in this process: Riverbank's portable runner fuses it and runs it on an
//! SDK harness in the submitting Python (LOOPBACK) or, for inputs of many rows, on one harness
//! process per core (PROCESS; the inputs' row groups are where Beam's Parquet source splits,
//! so the harnesses share them), and the written Parquet is read back. Rows
//! stream both ways a batch at a time; timestamps (event times, window bounds, timestamp
//! fields) travel as Int64 microseconds, which the script turns into Beam's and back.
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, OnceLock};

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use futures::future::BoxFuture;
use futures::{StreamExt, TryStreamExt};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::{AsyncArrowWriter, ParquetRecordBatchStreamBuilder};
use riverbank_elements::columns::{TS, WINDOW_END, WINDOW_START, ts_type};
use riverbank_engine::RunError;
use riverbank_engine::python_sdk::{PyOutput, PyTransformSpec, PythonSdk, Rows};
use riverbank_pipeline::windowing::WindowFn;

const SCRIPT: &str = include_str!("python_sdk.py");

/// The job server's budget for the sub-job's materialized data, in MiB (its inputs are files).
const JOB_MEMORY_MB: usize = 256;

/// Rows per row group of an input's Parquet file.
const ROW_GROUP_ROWS: usize = 32 * 1024;

/// Input rows from which the PTransform runs on a harness process per core: below, starting
/// them (a few seconds of imports) costs more than they save.
const PROCESS_ROWS: usize = 100_000;

/// Beam's Python SDK in the Python of `RIVERBANK_BEAM_PYTHON` (else `python3`).
#[derive(Default)]
pub(crate) struct BeamPython {
    /// Outputs already asked for, by the spec's text: a compile's second pass (after pushdown
    /// narrows the sources) asks again for the same PyTransform, and Python takes seconds.
    outputs: std::sync::Mutex<std::collections::HashMap<String, PyOutput>>,
}

/// The hidden columns as `python_sdk.py` names them (microseconds, in Int64 fields: Beam's
/// Parquet rows take no Arrow timestamp).
const BEAM_NAMES: [(&str, &str); 3] = [
    (TS, "riverbank_timestamp"),
    (WINDOW_START, "riverbank_window_start"),
    (WINDOW_END, "riverbank_window_end"),
];

/// Why a PyTransform's stage failed: an input's own error (passed on as it is), or what Beam's
/// SDK or the files between said.
enum Failed {
    Input(RunError),
    Sdk(String),
}

impl From<String> for Failed {
    fn from(m: String) -> Self {
        Failed::Sdk(m)
    }
}

impl PythonSdk for BeamPython {
    fn output<'a>(&'a self, spec: &'a PyTransformSpec) -> BoxFuture<'a, Result<PyOutput, String>> {
        Box::pin(async move {
            let key = format!("{spec:?}");
            if let Some(known) = self.outputs.lock().expect("not poisoned").get(&key) {
                return Ok(known.clone());
            }
            let output = output_of(spec).await?;
            let mut outputs = self.outputs.lock().expect("not poisoned");
            outputs.insert(key, output.clone());
            Ok(output)
        })
    }

    fn apply<'a>(
        &'a self,
        spec: &'a PyTransformSpec,
        inputs: Vec<Rows>,
        output: SchemaRef,
    ) -> BoxFuture<'a, Result<Rows, RunError>> {
        Box::pin(async move {
            run(spec, inputs, output).await.map_err(|f| match f {
                Failed::Input(e) => e,
                Failed::Sdk(m) => RunError::transform(&spec.name, m),
            })
        })
    }
}

/// What Beam makes of the PyTransform's output, from the pipeline `python_sdk.py` builds over
/// empty inputs of the same schemas.
async fn output_of(spec: &PyTransformSpec) -> Result<PyOutput, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let none = || futures::stream::empty().boxed();
    let inputs = spec.inputs.iter().map(|(_, s)| (s.clone(), none()));
    let schema_file = dir.path().join("schema.parquet");
    let (job, _) = write_job(dir.path(), spec, inputs.collect(), &schema_file)
        .await
        .map_err(|f| match f {
            Failed::Input(e) => e.to_string(),
            Failed::Sdk(m) => m,
        })?;
    python(&job, "schema", &[]).await?;
    let schema = std::fs::File::open(&schema_file)
        .map_err(|e| e.to_string())
        .and_then(|f| ParquetRecordBatchReaderBuilder::try_new(f).map_err(|e| e.to_string()))?
        .schema()
        .clone();
    let window =
        std::fs::read(dir.path().join("schema.parquet.json")).map_err(|e| e.to_string())?;
    let window: WindowFn =
        serde_json::from_slice(&window).map_err(|e| format!("Beam's window fn: {e}"))?;
    Ok(PyOutput {
        schema: from_beam(&schema),
        window,
    })
}

/// Where a PyTransform's stage puts its inputs' and Beam's output files, once set: the
/// worker's disk (a pod's `/tmp` is small), else the system's temp dir.
static SCRATCH: OnceLock<PathBuf> = OnceLock::new();

/// Puts a PyTransform stage's files under `dir` (the worker's data or spill directory).
/// `own`: the directory is this process's alone (a worker's disk), so what an earlier
/// incarnation killed mid-stage left there is removed.
pub(crate) fn set_scratch(dir: &Path, own: bool) {
    let dir = dir.join("py-transform");
    if own {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let _ = SCRATCH.set(dir);
}

fn scratch() -> std::io::Result<tempfile::TempDir> {
    match SCRATCH.get() {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            tempfile::tempdir_in(dir)
        }
        None => tempfile::tempdir(),
    }
}

/// The PyTransform over `inputs` on a job server in this process: its output's rows, read
/// back a batch at a time from the files Beam wrote (which go with the stream).
async fn run(spec: &PyTransformSpec, inputs: Vec<Rows>, output: SchemaRef) -> Result<Rows, Failed> {
    let dir = scratch().map_err(|e| e.to_string())?;
    let inputs = spec
        .inputs
        .iter()
        .zip(inputs)
        .map(|((_, s), rows)| (s.clone(), rows))
        .collect();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).map_err(|e| e.to_string())?;
    let (job, rows) = write_job(dir.path(), spec, inputs, &out).await?;
    // A few rows run on a harness in the submitting Python (no harness to start); many on one
    // harness process per core, which share the inputs' row groups.
    let harnesses = match rows >= PROCESS_ROWS {
        true => std::thread::available_parallelism().map_or(2, |n| n.get()),
        false => 1,
    };
    let server = crate::beam_sdk::job_server(harnesses, false, JOB_MEMORY_MB)
        .await
        .map_err(|e| format!("starting a job server: {e:#}"))?;
    let mut runner = crate::beam_sdk::portable_runner(&server).to_vec();
    if harnesses > 1 {
        let python = crate::beam_sdk::beam_python();
        runner.extend(crate::beam_sdk::process_environment(&python, harnesses));
    } else {
        runner.push("--environment_type=LOOPBACK".to_string());
    }
    python(&job, "run", &runner).await?;
    drop(server);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&out)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
        .collect();
    files.sort();
    let name = spec.name.clone();
    let rows = futures::stream::iter(files)
        .then(read_parquet)
        .try_flatten()
        .map(move |b| {
            // The files are read as the stream goes: their folder lives as long as it.
            let _files = &dir;
            b.and_then(|b| conform(&b, &output))
                .map_err(|m| RunError::transform(&name, m))
        });
    Ok(rows.boxed())
}

/// Writes each input to a Parquet file and the job for `python_sdk.py` beside them in `dir`;
/// `output` is where the script writes (the schema's file, or the folder of the output's).
/// The job's file, and how many rows the inputs have.
async fn write_job(
    dir: &Path,
    spec: &PyTransformSpec,
    inputs: Vec<(SchemaRef, Rows)>,
    output: &Path,
) -> Result<(PathBuf, usize), Failed> {
    let mut tagged = vec![];
    let mut total = 0;
    for (i, ((tag, _), (schema, rows))) in spec.inputs.iter().zip(inputs).enumerate() {
        let path = dir.join(format!("input-{i}.parquet"));
        total += write_parquet(&path, &schema, rows).await?;
        tagged.push(serde_json::json!([tag, path, instants(&schema)]));
    }
    std::fs::write(dir.join("python_sdk.py"), SCRIPT).map_err(|e| e.to_string())?;
    let job = dir.join("job.json");
    let text = serde_json::json!({
        "name": spec.name,
        "config": spec.config,
        "inputs": tagged,
        "window": spec.window,
        "output": output,
    });
    std::fs::write(&job, text.to_string()).map_err(|e| e.to_string())?;
    Ok((job, total))
}

/// `rows` (of `schema`) into a Parquet file as `python_sdk.py` reads it, a batch at a time;
/// how many.
async fn write_parquet(path: &Path, schema: &Schema, mut rows: Rows) -> Result<usize, Failed> {
    let shown = |e: &dyn std::fmt::Display| format!("writing {}: {e}", path.display());
    // Row groups Beam's Parquet source can split at, so its harnesses share the input.
    let props = parquet::file::properties::WriterProperties::builder()
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .build();
    let file = tokio::fs::File::create(path).await.map_err(|e| shown(&e))?;
    let mut w = AsyncArrowWriter::try_new(file, to_beam_schema(schema), Some(props))
        .map_err(|e| shown(&e))?;
    let mut written = 0;
    while let Some(b) = rows.next().await {
        let b = to_beam(&b.map_err(Failed::Input)?)?;
        written += b.num_rows();
        w.write(&b).await.map_err(|e| shown(&e))?;
    }
    w.close().await.map_err(|e| shown(&e))?;
    Ok(written)
}

/// One file's batches, as they are read.
async fn read_parquet(
    path: PathBuf,
) -> Result<futures::stream::BoxStream<'static, Result<RecordBatch, String>>, String> {
    let shown = |e: &dyn std::fmt::Display| format!("reading {}: {e}", path.display());
    let file = tokio::fs::File::open(&path).await.map_err(|e| shown(&e))?;
    let rows = ParquetRecordBatchStreamBuilder::new(file)
        .await
        .and_then(|b| b.build())
        .map_err(|e| shown(&e))?;
    Ok(rows.map_err(|e| e.to_string()).boxed())
}

/// `schema` as `python_sdk.py` reads it: its hidden columns renamed, and every timestamp as
/// Int64 microseconds (Beam reads no Arrow timestamp; the script makes them Beam `Timestamp`s).
fn to_beam_schema(schema: &Schema) -> SchemaRef {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(
            |f| match BEAM_NAMES.iter().find(|(ours, _)| ours == f.name()) {
                Some((_, beam)) => Field::new(*beam, DataType::Int64, false),
                None if is_instant(f) => Field::new(f.name(), DataType::Int64, f.is_nullable()),
                None => f.as_ref().clone(),
            },
        )
        .collect();
    Arc::new(Schema::new(fields))
}

fn is_instant(f: &Field) -> bool {
    matches!(f.data_type(), DataType::Timestamp(..))
}

/// The user fields of `schema` that `python_sdk.py` turns into Beam `Timestamp`s.
fn instants(schema: &Schema) -> Vec<&str> {
    schema
        .fields()
        .iter()
        .filter(|f| is_instant(f) && !BEAM_NAMES.iter().any(|(ours, _)| ours == f.name()))
        .map(|f| f.name().as_str())
        .collect()
}

/// A schema `python_sdk.py` wrote, its timestamp and window fields as the engine's hidden
/// columns.
fn from_beam(schema: &Schema) -> SchemaRef {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(
            |f| match BEAM_NAMES.iter().find(|(_, beam)| beam == f.name()) {
                Some((ours, _)) => Field::new(*ours, ts_type(), false),
                None => f.as_ref().clone(),
            },
        )
        .collect();
    Arc::new(Schema::new(fields))
}

/// `batch` as `python_sdk.py` reads it (`to_beam_schema`).
fn to_beam(batch: &RecordBatch) -> Result<RecordBatch, String> {
    // Microseconds whatever the unit: through a timestamp in µs first.
    let micros = DataType::Timestamp(arrow::datatypes::TimeUnit::Microsecond, None);
    let columns = batch
        .columns()
        .iter()
        .map(|c| match c.data_type() {
            DataType::Timestamp(..) => arrow::compute::cast(c, &micros),
            _ => Ok(c.clone()),
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let schema = to_beam_schema(batch.schema_ref());
    batch_in(schema, columns, batch.num_rows())
}

/// `batch` (as `python_sdk.py` wrote it) in `schema` (the one compile time gave): Parquet gives
/// back the types it was written with, save nullability and metadata.
fn conform(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch, String> {
    let columns = schema
        .fields()
        .iter()
        .map(|f| {
            let name = BEAM_NAMES
                .iter()
                .find(|(ours, _)| ours == f.name())
                .map_or(f.name().as_str(), |(_, beam)| beam);
            let c = batch.column_by_name(name);
            c.cloned()
                .ok_or_else(|| format!("Beam's SDK gave no field '{}'", f.name()))
        })
        .collect::<Result<Vec<_>, String>>()?;
    batch_in(schema.clone(), columns, batch.num_rows())
}

/// `columns` (one per field, in order) cast to `schema`'s types as a batch of `rows` rows.
fn batch_in(
    schema: SchemaRef,
    columns: Vec<arrow::array::ArrayRef>,
    rows: usize,
) -> Result<RecordBatch, String> {
    let columns = columns
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| arrow::compute::cast(c, f.data_type()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let options = arrow::array::RecordBatchOptions::new().with_row_count(Some(rows));
    RecordBatch::try_new_with_options(schema, columns, &options).map_err(|e| e.to_string())
}

/// Runs `python_sdk.py MODE JOB OPTIONS` beside `job`; its failure as what it said last.
async fn python(job: &Path, mode: &str, options: &[String]) -> Result<(), String> {
    let python = crate::beam_sdk::beam_python();
    let script = job.with_file_name("python_sdk.py");
    let out = tokio::process::Command::new(&python)
        .arg(&script)
        .arg(mode)
        .arg(job)
        .args(options)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| format!("running {}: {e}", python.display()))?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    tracing::debug!("{} {mode} failed:\n{stderr}", script.display());
    Err(failure(&python, &stderr))
}

/// What a failed run of the script said, in a line: Riverbank's own refusal, the missing SDK,
/// or Python's exception.
fn failure(python: &Path, stderr: &str) -> String {
    if stderr.contains("No module named 'apache_beam'") {
        if std::env::var_os("POD_NAMESPACE").is_some() {
            // A DataflowJob's pod (the operator sets POD_NAMESPACE): its image is the remedy.
            return format!(
                "a PyTransform runs on Apache Beam's Python SDK, and this pod's image has none \
                 ({} cannot import apache_beam): leave spec.pods.image unset for the worker \
                 image with Beam (the chart's jobDefaults.beamWorkerImage), or name an image \
                 with apache-beam and RIVERBANK_BEAM_PYTHON set to its Python",
                python.display()
            );
        }
        return format!(
            "a PyTransform runs on Apache Beam's Python SDK, and {} cannot import apache_beam: \
             set RIVERBANK_BEAM_PYTHON to a Python with apache-beam installed (dev/setup.sh \
             makes one)",
            python.display()
        );
    }
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty() && !l.starts_with("WARNING:") && !l.starts_with("INFO:"))
        .collect();
    if let Some(r) = lines
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("riverbank: "))
    {
        return r.to_string();
    }
    // Python's exception: the last unindented `Name: message` line (Beam's harness logs the
    // user's traceback, then the job's failure wraps it).
    let exception = lines.iter().rev().find(|l| {
        !l.starts_with(' ')
            && l.split_once(": ").is_some_and(|(name, _)| {
                !name.is_empty()
                    && name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
            })
    });
    match exception {
        Some(e) => format!("Beam's Python SDK failed: {e}"),
        None => {
            let tail = lines.len().saturating_sub(3);
            format!("Beam's Python SDK failed: {}", lines[tail..].join(" | "))
        }
    }
}

/// The SDK this process gives the engine.
pub(crate) fn install() {
    riverbank_engine::python_sdk::install(Arc::new(BeamPython::default()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_is_the_refusal_or_the_exception_python_printed_last() {
        let py = Path::new("python3");
        let refused = "WARNING:root:x\nriverbank: it has several outputs (a, b)\n";
        assert_eq!(failure(py, refused), "it has several outputs (a, b)");
        let missing = "Traceback\nModuleNotFoundError: No module named 'apache_beam'\n";
        assert!(failure(py, missing).contains("RIVERBANK_BEAM_PYTHON"));
        let raised = "Traceback (most recent call last):\n  File \"x\"\nValueError: bad k\n";
        assert_eq!(
            failure(py, raised),
            "Beam's Python SDK failed: ValueError: bad k"
        );
        let wrapped = "ZeroDivisionError: by zero [while running 'Map']\n job=job-1\n";
        assert!(failure(py, wrapped).ends_with("ZeroDivisionError: by zero [while running 'Map']"));
    }
}
