//! The work-item engine, shared by the in-process run and the distributed runtime: stages cut
//! into items (`items`), the work types everyone shares (`work`), one item run by `exec`,
//! shuffle files (`shuffle`), the coordinator's bookkeeping (`tracker`), the work slot loop
//! over a [`slot::WorkSource`] (`slot`), and the sinks' commit or abort at the end (`finish`).
//! `local` runs it all in one process; `crate::cluster` runs it over HTTP.
pub mod exec;
pub mod finish;
pub mod items;
pub mod local;
pub mod shuffle;
pub mod slot;
pub mod tracker;
pub mod work;
