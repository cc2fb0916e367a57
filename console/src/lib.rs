//! Riverbank's web console: a job list and a job page (the fused stage graph coloured by state
//! with each stage's counters, charts of workers with the autoscaler's decisions, throughput,
//! backlog, CPU and memory per worker, Events, insights and the autoscaling rationale).
//!
//! One implementation for both hosts: the operator feeds it from the DataflowJobs it
//! reconciles, `riverbank run --ui` from its local coordinator. Feeders write [`Observation`]s
//! and [`Event`]s into a [`Console`]; [`router`] serves it read-only, with the page's HTML,
//! vanilla JavaScript (SVG charts and graph) and CSS built into the binary.
pub mod http;
pub mod model;
pub mod store;

pub use http::{router, serve};
pub use model::{Evaluation, Event, Graph, Insight, JobDetail, JobSummary, Observation};
pub use store::Console;
