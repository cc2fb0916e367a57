//! Riverbank's worker runtime: runs a fused plan on Arrow record batches.
//!
//! `compile` binds a plan to its data (schemas, expressions); `runner` executes it, stage by
//! stage, bundle by bundle; `ops`, `combine`, `sql` and `io` are what the stages are made of.
pub mod assert;
pub mod cluster;
pub mod columns;
pub mod combine;
pub mod compile;
pub mod elements;
pub mod engine;
pub mod error;
pub mod expr;
pub mod io;
pub mod metrics;
pub mod ops;
pub mod pushdown;
pub mod runner;
pub mod sessions;
pub mod sql;

pub use compile::{CompiledPlan, compile};
pub use error::RunError;
pub use metrics::Metrics;
pub use runner::{BundleChaos, RunConfig, RunSummary, run};
