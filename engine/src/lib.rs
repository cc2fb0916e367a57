//! Riverbank's engine: runs a fused plan on Arrow record batches.
//!
//! `compile` binds a plan to its data (schemas, expressions, `pushdown`); the stages are made
//! of `ops`, `combine` (lifted combine), `sql`, `sessions`, `assert` and `python_sdk` (the seam
//! through which a `PyTransform` runs on Beam's Python SDK), reading and writing
//! through `riverbank-io`. The work-item engine, shared by the in-process run and the
//! distributed runtime: stages cut into items (`items`), the work types everyone shares
//! (`work`), one item run by `exec`, shuffle files (`shuffle`), the coordinator's bookkeeping
//! (`tracker`), the work slot loop over a [`slot::WorkSource`] (`slot`), and the sinks' commit
//! or abort at the end (`finish`). `local` runs it all in one process; `riverbank-cluster`
//! runs it over HTTP, and `riverbank-streaming` once per checkpoint, its state shards behind
//! [`shards::StateShards`]. `config` says how a run is carried out.
pub mod assert;
pub mod combine;
pub mod compile;
pub mod compiled;
pub mod config;
pub mod error;
pub mod exec;
pub mod finish;
pub mod items;
pub mod local;
pub mod match_all;
pub mod metrics;
pub mod ops;
pub mod pushdown;
pub mod python_sdk;
pub mod query_cache;
pub mod sessions;
pub mod shards;
pub mod shuffle;
pub mod slot;
pub mod sql;
pub mod tracker;
pub mod work;
pub mod written_files;

pub use compile::{CompiledPlan, compile};
pub use config::{BundleChaos, RunConfig, RunSummary};
pub use error::RunError;
pub use local::{ProgressObserver, run, run_observed};
pub use metrics::Metrics;
