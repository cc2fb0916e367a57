//! Autoscaling for Riverbank jobs: the decision engine (Dataflow's documented rules and
//! Riverbank's improvements, as a pure function), the adapter from the coordinator's progress,
//! and a simulator that replays load traces through a worker model to compare policies.
//!
//! The operator: build an [`EngineConfig`] from the job's options, keep an [`EngineState`] and a
//! [`Window`] of [`Observation`]s (from [`Observation::from_progress`]), call
//! [`Engine::decide`] every [`EngineConfig::evaluation_interval_secs`] and set the worker
//! replicas to [`Decision::workers_to_apply`]. `riverbank run --autoscale` and the simulator
//! keep the same [`Window`]. The binary: mount [`AutoscaleCommand`] and print
//! what [`run`] returns.
pub mod cli;
pub mod engine;
pub mod error;
pub mod insights;
pub mod memory;
pub mod observe;
pub mod plot;
pub mod sim;

pub use cli::{AutoscaleCommand, run};
pub use engine::window::Window;
pub use engine::{
    Decision, Engine, EngineConfig, EngineState, Insight, Policy, Reason, ShuffleHandling,
};
pub use error::AutoscaleError;
pub use insights::{Finding, InsightConfig};
pub use observe::Observation;
