//! Beam's Python SDK for the engine's `PyTransform` stages (`riverbank_engine::python_sdk`).
//! `python_sdk.py` applies the one PTransform as Beam YAML applies it, to its inputs read from
//! Parquet as Beam's schema'd rows. At compile time it only builds that pipeline, for the
//! output's schema; at run time the pipeline (read, the PTransform, write) is submitted to a
//! job server started in this process: Riverbank's portable runner fuses it and runs it on an
//! SDK harness in the submitting Python (LOOPBACK), and the written Parquet is read back.
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use arrow::array::{RecordBatch, RecordBatchReader};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use futures::future::BoxFuture;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use riverbank_elements::columns::{TS, WINDOW_END, WINDOW_START, ts_type};
use riverbank_engine::python_sdk::{PyOutput, PyTransformSpec, PythonSdk};
use riverbank_pipeline::windowing::WindowFn;

const SCRIPT: &str = include_str!("python_sdk.py");

/// The job server's budget for the sub-job's materialized data, in MiB (its inputs are files).
const JOB_MEMORY_MB: usize = 256;

/// Beam's Python SDK in the Python of `RIVERBANK_BEAM_PYTHON` (else `python3`).
pub(crate) struct BeamPython;

/// The hidden columns as `python_sdk.py` names them (microseconds, in Int64 fields: Beam reads
/// Arrow's timestamps as a logical type its schemas do not map back).
const BEAM_NAMES: [(&str, &str); 3] = [
    (TS, "riverbank_timestamp"),
    (WINDOW_START, "riverbank_window_start"),
    (WINDOW_END, "riverbank_window_end"),
];

impl PythonSdk for BeamPython {
    fn output<'a>(&'a self, spec: &'a PyTransformSpec) -> BoxFuture<'a, Result<PyOutput, String>> {
        Box::pin(async move {
            let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
            let inputs = spec.inputs.iter().map(|(_, s)| (s.clone(), vec![]));
            let schema_file = dir.path().join("schema.parquet");
            let job = write_job(dir.path(), spec, inputs.collect(), &schema_file).await?;
            python(&job, "schema", &[]).await?;
            let (schema, _) = read_parquet(vec![schema_file]).await?;
            let window =
                std::fs::read(dir.path().join("schema.parquet.json")).map_err(|e| e.to_string())?;
            let window: WindowFn =
                serde_json::from_slice(&window).map_err(|e| format!("Beam's window fn: {e}"))?;
            Ok(PyOutput {
                schema: from_beam(&schema),
                window,
            })
        })
    }

    fn apply<'a>(
        &'a self,
        spec: &'a PyTransformSpec,
        inputs: Vec<Vec<RecordBatch>>,
        output: SchemaRef,
    ) -> BoxFuture<'a, Result<Vec<RecordBatch>, String>> {
        Box::pin(async move {
            let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
            let inputs = spec
                .inputs
                .iter()
                .zip(inputs)
                .map(|((_, s), batches)| (s.clone(), batches))
                .collect();
            let out = dir.path().join("out");
            std::fs::create_dir(&out).map_err(|e| e.to_string())?;
            let job = write_job(dir.path(), spec, inputs, &out).await?;
            let server = crate::beam_sdk::job_server(1, false, JOB_MEMORY_MB)
                .await
                .map_err(|e| format!("starting a job server: {e:#}"))?;
            let runner = [
                "--runner=PortableRunner".to_string(),
                format!("--job_endpoint={}", server.addr),
                "--environment_type=LOOPBACK".to_string(),
            ];
            python(&job, "run", &runner).await?;
            let mut files: Vec<PathBuf> = std::fs::read_dir(&out)
                .map_err(|e| e.to_string())?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
                .collect();
            files.sort();
            let (_, batches) = read_parquet(files).await?;
            batches.iter().map(|b| conform(b, &output)).collect()
        })
    }
}

/// Writes each input to a Parquet file and the job for `python_sdk.py` beside them in `dir`;
/// `output` is where the script writes (the schema's file, or the folder of the output's).
async fn write_job(
    dir: &Path,
    spec: &PyTransformSpec,
    inputs: Vec<(SchemaRef, Vec<RecordBatch>)>,
    output: &Path,
) -> Result<PathBuf, String> {
    let mut tagged = vec![];
    for (i, ((tag, _), (schema, batches))) in spec.inputs.iter().zip(inputs).enumerate() {
        let path = dir.join(format!("input-{i}.parquet"));
        let file = path.clone();
        let batches = batches.iter().map(to_beam).collect::<Result<Vec<_>, _>>()?;
        let schema = to_beam_schema(&schema);
        tokio::task::spawn_blocking(move || write_parquet(&file, schema, &batches))
            .await
            .map_err(|e| e.to_string())??;
        tagged.push(serde_json::json!([tag, path]));
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
    Ok(job)
}

fn write_parquet(path: &Path, schema: SchemaRef, batches: &[RecordBatch]) -> Result<(), String> {
    let file = std::fs::File::create(path).map_err(|e| e.to_string())?;
    let mut w = ArrowWriter::try_new(file, schema, None).map_err(|e| e.to_string())?;
    for b in batches {
        w.write(b).map_err(|e| e.to_string())?;
    }
    w.close().map_err(|e| e.to_string())?;
    Ok(())
}

/// The schema of the first file and the batches of all.
async fn read_parquet(files: Vec<PathBuf>) -> Result<(SchemaRef, Vec<RecordBatch>), String> {
    tokio::task::spawn_blocking(move || {
        let mut schema = None;
        let mut batches = vec![];
        for path in files {
            let file = std::fs::File::open(&path).map_err(|e| e.to_string())?;
            let reader = ParquetRecordBatchReaderBuilder::try_new(file)
                .and_then(|b| b.build())
                .map_err(|e| format!("reading {}: {e}", path.display()))?;
            schema.get_or_insert_with(|| reader.schema());
            for b in reader {
                batches.push(b.map_err(|e| e.to_string())?);
            }
        }
        let schema = schema.ok_or("Beam's SDK wrote no output file")?;
        Ok((schema, batches))
    })
    .await
    .map_err(|e| e.to_string())?
}

/// `schema` with its hidden columns as `python_sdk.py` reads them.
fn to_beam_schema(schema: &Schema) -> SchemaRef {
    renamed(schema, |name| {
        let (_, beam) = BEAM_NAMES.iter().find(|(ours, _)| *ours == name)?;
        Some(Field::new(*beam, DataType::Int64, false))
    })
}

/// A schema `python_sdk.py` wrote, its timestamp and window fields as the engine's hidden
/// columns.
fn from_beam(schema: &Schema) -> SchemaRef {
    renamed(schema, |name| {
        let (ours, _) = BEAM_NAMES.iter().find(|(_, beam)| *beam == name)?;
        Some(Field::new(*ours, ts_type(), false))
    })
}

/// `schema` with the fields `rename` gives in place of those it names.
fn renamed(schema: &Schema, rename: impl Fn(&str) -> Option<Field>) -> SchemaRef {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| rename(f.name()).unwrap_or_else(|| f.as_ref().clone()))
        .collect();
    Arc::new(Schema::new(fields))
}

/// `batch` with its hidden columns as `python_sdk.py` reads them.
fn to_beam(batch: &RecordBatch) -> Result<RecordBatch, String> {
    let schema = to_beam_schema(batch.schema_ref());
    batch_in(schema, batch.columns().to_vec(), batch.num_rows())
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
    riverbank_engine::python_sdk::install(Arc::new(BeamPython));
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
