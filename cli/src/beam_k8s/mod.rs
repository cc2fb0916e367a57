//! Beam SDK pipelines as DataflowJobs: the job service's side (`launcher`: a submitted job
//! written to object storage and created as a DataflowJob), the runner pod's (`runner`: the job
//! read back and run, its SDK harnesses in the SDK container beside it), and the folder between
//! them (`stored`).
pub mod launcher;
pub mod runner;
pub mod stored;
