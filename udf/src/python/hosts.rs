//! Python UDFs on every core despite the GIL: the process's own interpreter runs one batch at
//! a time; a batch that finds it busy goes to a `riverbank udf-host` process (the same binary,
//! re-executed, embedding its own CPython), fed over pipes. Up to `slots - 1` hosts, started on
//! first need and kept for the process's life.
//!
//! The protocol, both ways length-prefixed (u32, little-endian) frames:
//! request — a JSON header (`Request`), then an Arrow IPC stream of one batch: the argument
//! columns, then a column of the output type (nulls; it carries the type and the row count);
//! answer — a status byte, then for 0 an Arrow IPC stream of the result column, for 1 a JSON
//! `PyUdfError` (the record's failure).
use super::{Program, PyUdfError, run_local};
use crate::values::Output;
use arrow::array::{ArrayRef, RecordBatch, new_null_array};
use arrow::datatypes::{Field, Schema};
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use serde::{Deserialize, Serialize};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};

/// The subcommand of the binary that serves as a host.
pub const SUBCOMMAND: &str = "udf-host";

#[derive(Serialize, Deserialize)]
struct Request {
    program: Program,
    /// `predicate`, `name`, or `value` (the type is the last column's).
    role: String,
    declared: bool,
    label: String,
}

struct Pool {
    exe: PathBuf,
    max: usize,
    /// Never run in this process (tests of the host path).
    always: bool,
    idle: Mutex<Vec<Host>>,
    started: Mutex<usize>,
}

static POOL: OnceLock<Pool> = OnceLock::new();
/// The process's own interpreter, held while it runs a batch.
static LOCAL: Mutex<()> = Mutex::new(());

/// Lets batches beyond the first run in up to `max` host processes of `exe` (this binary).
/// `RIVERBANK_UDF_HOSTS=always` sends every batch to a host (for tests).
pub fn enable(exe: PathBuf, max: usize) {
    let always = std::env::var("RIVERBANK_UDF_HOSTS").is_ok_and(|v| v == "always");
    let _ = POOL.set(Pool {
        exe,
        max: if always { max.max(1) } else { max },
        always,
        idle: Mutex::new(vec![]),
        started: Mutex::new(0),
    });
}

/// Stops the idle hosts and reaps them (so that their CPU time counts as the process's
/// children's, as `time` reports it). Called when a run ends.
pub fn shutdown() {
    if let Some(pool) = POOL.get() {
        // Dropping a host kills and reaps it: it is idle, with nothing left to answer.
        drop(
            pool.idle
                .lock()
                .expect("not poisoned")
                .drain(..)
                .collect::<Vec<Host>>(),
        );
    }
}

/// Host processes started so far.
pub fn started() -> usize {
    POOL.get()
        .map(|p| *p.started.lock().expect("not poisoned"))
        .unwrap_or(0)
}

/// Runs a batch here, or in a host when this process's interpreter is busy.
pub fn run(
    program: &Program,
    output: &Output,
    label: &str,
    columns: &[ArrayRef],
    rows: usize,
) -> Result<ArrayRef, PyUdfError> {
    let pool = POOL.get();
    if !pool.is_some_and(|p| p.always)
        && let Ok(_here) = LOCAL.try_lock()
    {
        return run_local(program, output, label, columns, rows);
    }
    if let Some(pool) = pool
        && let Some(mut host) = pool.take()
    {
        match host.call(program, output, label, columns, rows) {
            Ok(answer) => {
                pool.idle.lock().expect("not poisoned").push(host);
                return answer;
            }
            // A host that failed (not a record: the process) is dropped; this batch runs here.
            Err(e) => {
                tracing::warn!("a Python UDF host failed ({e}); running the batch in process");
                *pool.started.lock().expect("not poisoned") -= 1;
            }
        }
    }
    let _here = LOCAL.lock().unwrap_or_else(|p| p.into_inner());
    run_local(program, output, label, columns, rows)
}

impl Pool {
    /// An idle host, or a new one while fewer than `max` run.
    fn take(&self) -> Option<Host> {
        if let Some(h) = self.idle.lock().expect("not poisoned").pop() {
            return Some(h);
        }
        let mut started = self.started.lock().expect("not poisoned");
        if *started >= self.max {
            return None;
        }
        match Host::start(&self.exe) {
            Ok(h) => {
                *started += 1;
                tracing::debug!("started Python UDF host {}", h.child.id());
                Some(h)
            }
            Err(e) => {
                tracing::warn!("cannot start a Python UDF host: {e}");
                None
            }
        }
    }
}

struct Host {
    child: Child,
    stdin: BufWriter<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Host {
    fn start(exe: &PathBuf) -> io::Result<Host> {
        let mut child = Command::new(exe)
            .arg(SUBCOMMAND)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdin = BufWriter::new(child.stdin.take().expect("piped"));
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        Ok(Host {
            child,
            stdin,
            stdout,
        })
    }

    /// The host's answer for one batch (outer error: the host itself failed).
    fn call(
        &mut self,
        program: &Program,
        output: &Output,
        label: &str,
        columns: &[ArrayRef],
        rows: usize,
    ) -> io::Result<Result<ArrayRef, PyUdfError>> {
        let (role, declared) = match output {
            Output::Predicate => ("predicate", false),
            Output::Name => ("name", false),
            Output::Value { declared, .. } => ("value", *declared),
        };
        let header = serde_json::to_vec(&Request {
            program: program.clone(),
            role: role.into(),
            declared,
            label: label.into(),
        })?;
        let mut fields: Vec<Field> = columns
            .iter()
            .enumerate()
            .map(|(i, c)| Field::new(format!("a{i}"), c.data_type().clone(), true))
            .collect();
        fields.push(Field::new("out", output.data_type(), true));
        let mut all = columns.to_vec();
        all.push(new_null_array(&output.data_type(), rows));
        let batch =
            RecordBatch::try_new(Arc::new(Schema::new(fields)), all).map_err(io::Error::other)?;
        write_frame(&mut self.stdin, &header)?;
        write_frame(&mut self.stdin, &ipc(&batch)?)?;
        self.stdin.flush()?;
        let mut status = [0u8];
        self.stdout.read_exact(&mut status)?;
        let body = read_frame(&mut self.stdout)?;
        Ok(match status[0] {
            0 => Ok(from_ipc(&body)?.column(0).clone()),
            _ => Err(serde_json::from_slice(&body)?),
        })
    }
}

fn write_frame(w: &mut impl Write, bytes: &[u8]) -> io::Result<()> {
    let len = u32::try_from(bytes.len()).map_err(io::Error::other)?;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(bytes)
}

/// A frame, or `None` at the end of the stream.
fn read_frame_or_end(r: &mut impl Read) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
    r.read_exact(&mut body)?;
    Ok(Some(body))
}

fn read_frame(r: &mut impl Read) -> io::Result<Vec<u8>> {
    read_frame_or_end(r)?.ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "host closed"))
}

fn ipc(batch: &RecordBatch) -> io::Result<Vec<u8>> {
    let mut w = StreamWriter::try_new(Vec::new(), &batch.schema()).map_err(io::Error::other)?;
    w.write(batch).map_err(io::Error::other)?;
    w.into_inner().map_err(io::Error::other)
}

fn from_ipc(bytes: &[u8]) -> io::Result<RecordBatch> {
    let mut r = StreamReader::try_new(bytes, None).map_err(io::Error::other)?;
    r.next()
        .ok_or_else(|| io::Error::other("an empty answer"))?
        .map_err(io::Error::other)
}

/// `riverbank udf-host`: answers batches on stdin/stdout until stdin closes.
pub fn serve() -> io::Result<()> {
    let mut input = BufReader::new(io::stdin().lock());
    let mut out = BufWriter::new(io::stdout().lock());
    while let Some(header) = read_frame_or_end(&mut input)? {
        let req: Request = serde_json::from_slice(&header)?;
        let batch = from_ipc(&read_frame(&mut input)?)?;
        let n = batch.num_columns();
        let data_type = batch.schema().field(n - 1).data_type().clone();
        let output = match req.role.as_str() {
            "predicate" => Output::Predicate,
            "name" => Output::Name,
            _ => Output::Value {
                data_type,
                declared: req.declared,
            },
        };
        let columns = &batch.columns()[..n - 1];
        match run_local(&req.program, &output, &req.label, columns, batch.num_rows()) {
            Ok(a) => {
                let b = RecordBatch::try_new(
                    Arc::new(Schema::new(vec![Field::new(
                        "out",
                        a.data_type().clone(),
                        true,
                    )])),
                    vec![a],
                )
                .map_err(io::Error::other)?;
                out.write_all(&[0])?;
                write_frame(&mut out, &ipc(&b)?)?;
            }
            Err(e) => {
                out.write_all(&[1])?;
                write_frame(&mut out, &serde_json::to_vec(&e)?)?;
            }
        }
        out.flush()?;
    }
    Ok(())
}
