//! The seam to Beam's Python SDK, for Beam YAML's `PyTransform`: a Beam Python `PTransform`
//! applied to whole inputs, which only Beam's SDK can build and run. The engine gives it a stage
//! of its own (its inputs gathered, as Beam gives a PTransform whole PCollections) and asks the
//! SDK twice: at compile time for the output's schema, and at run time for the output's rows.
//! The binary installs the SDK (`riverbank`'s runs the PTransform on Riverbank's portable runner);
//! a process without one refuses the transform, naming it. Rows go with their event timestamps
//! and windows (the hidden columns of `riverbank_elements::columns`), and come back with the
//! ones Beam gave them.
use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use riverbank_pipeline::windowing::WindowFn;
use serde_json::{Map, Value};
use std::sync::{Arc, OnceLock};

use crate::error::RunError;

/// One PyTransform as the SDK sees it.
#[derive(Debug, Clone)]
pub struct PyTransformSpec {
    /// The transform's name in the pipeline.
    pub name: String,
    /// Its Beam YAML config (`constructor`, `args`, `kwargs`).
    pub config: Map<String, Value>,
    /// Its inputs by tag (`input` for a single one), with their schemas (hidden timestamp and
    /// window columns included, panes not); none when it is applied to the pipeline's start.
    pub inputs: Vec<(String, SchemaRef)>,
    /// The window fn of its windowed inputs (sessions merge in Beam as they would here).
    pub window: WindowFn,
}

/// What Beam makes of the transform's output.
#[derive(Debug, Clone)]
pub struct PyOutput {
    /// Its rows' schema, with the hidden timestamp and window columns when Beam gives them.
    pub schema: SchemaRef,
    /// Its window fn as Beam leaves it (the inputs' when the PTransform keeps their windows).
    pub window: WindowFn,
}

/// Beam's Python SDK, as the binary provides it.
pub trait PythonSdk: Send + Sync {
    /// The transform's output, as Beam infers its element type and windowing.
    fn output<'a>(&'a self, spec: &'a PyTransformSpec) -> BoxFuture<'a, Result<PyOutput, String>>;

    /// The transform applied to all of each input's rows (in `spec.inputs`' order): its
    /// output's rows, in `output` (the schema `output` gave). Rows stream both ways, a batch
    /// at a time; an input's error (a lost shuffle file, say) comes back as it was.
    fn apply<'a>(
        &'a self,
        spec: &'a PyTransformSpec,
        inputs: Vec<Rows>,
        output: SchemaRef,
    ) -> BoxFuture<'a, Result<Rows, RunError>>;
}

/// Rows a batch at a time.
pub type Rows = BoxStream<'static, Result<RecordBatch, RunError>>;

static SDK: OnceLock<Arc<dyn PythonSdk>> = OnceLock::new();

/// Installs the process's Python SDK (once; later calls are ignored).
pub fn install(sdk: Arc<dyn PythonSdk>) {
    let _ = SDK.set(sdk);
}

/// The installed SDK, or why a PyTransform cannot run here.
pub fn sdk() -> Result<&'static Arc<dyn PythonSdk>, String> {
    SDK.get().ok_or_else(|| {
        "a PyTransform runs on Apache Beam's Python SDK, which this process does not provide \
         (`riverbank run` does, given a Python with apache-beam in RIVERBANK_BEAM_PYTHON)"
            .to_string()
    })
}
