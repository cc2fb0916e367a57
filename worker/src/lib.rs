//! Riverbank's worker runtime: runs a fused plan on Arrow record batches.
//!
//! `compile` binds a plan to its data (schemas, expressions); `engine` executes it, work item
//! by work item, bundle by bundle, in process (`engine::local`) or across processes
//! (`cluster`); `ops`, `combine`, `sql` and `io` are what the stages are made of; `config`
//! says how a run is carried out.
pub mod assert;
pub mod cluster;
pub mod columns;
pub mod combine;
pub mod compile;
pub mod config;
pub mod elements;
pub mod engine;
pub mod error;
pub mod expr;
pub mod generic;
pub mod io;
pub mod metrics;
pub mod ops;
pub mod pushdown;
pub mod sessions;
pub mod sql;
pub mod streaming;
pub mod udf;
pub mod widen;

pub use compile::{CompiledPlan, compile};
pub use config::{BundleChaos, RunConfig, RunSummary};
pub use engine::local::{ProgressObserver, run, run_observed};
pub use error::RunError;
pub use metrics::Metrics;
