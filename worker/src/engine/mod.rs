//! The work-item engine, shared by the in-process runner and the distributed runtime: stages
//! cut into items (`items`), one item run by `exec`, shuffle files (`shuffle`), and the
//! coordinator's bookkeeping (`tracker`). `local` runs it all in one process.
pub mod exec;
pub mod items;
pub mod local;
pub mod shuffle;
pub mod tracker;
