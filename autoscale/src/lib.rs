//! Autoscaling for Riverbank jobs: the decision engine (Dataflow's documented rules and
//! Riverbank's improvements, as a pure function), the adapter from the coordinator's progress,
//! and a simulator that replays load traces through a worker model to compare policies.
pub mod engine;
pub mod error;
pub mod observe;

pub use engine::{
    Decision, Engine, EngineConfig, EngineState, Insight, Policy, Reason, ShuffleHandling,
};
pub use error::AutoscaleError;
pub use observe::Observation;
pub mod sim;
pub mod cli;
pub mod plot;

pub use cli::{AutoscaleCommand, run};
