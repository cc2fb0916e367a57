//! The event-time core of the streaming runtime (issue 13, in progress): source watermarks
//! (`watermark`), Beam's triggers (`trigger`), the panes of a window (`panes`: lateness,
//! accumulation, `PaneInfo`). Pure and clock-driven, so Beam's worked examples are its tests;
//! the unbounded sources, keyed state store and checkpoints build on it.
pub mod checkpoints;
mod commit;
mod commit_connector;
pub mod connectors;
pub mod driver;
pub mod gc;
pub mod panes;
mod session_merge;
pub mod shard;
mod shard_open;
pub mod snapshot;
pub mod sources;
pub mod sql_shard;
pub mod state;
pub mod trigger;
pub mod watermark;
pub mod window_files;

#[cfg(test)]
mod tests;
