//! The streaming runtime: a job is a loop of checkpoints on the engine (`driver`), each
//! planned and recorded in a log (`checkpoints`), its sink output committed once (`commit`),
//! old entries collected (`gc`); Combine and Sql/Join state kept in shards on the workers'
//! disks (`shard`, `sql_shard`, `state`), which the engine runs through
//! [`riverbank_engine::shards::StateShards`] (`StreamingShards`); named snapshots and
//! updates (`snapshot`). Its event-time core is pure and clock-driven, so Beam's worked
//! examples are its tests: source watermarks (`watermark`), Beam's triggers (`trigger`), the
//! panes of a window (`panes`: lateness, accumulation, `PaneInfo`).
pub mod checkpoints;
mod commit;
mod commit_connector;
pub mod driver;
pub mod gc;
pub mod panes;
mod session_merge;
pub mod shard;
mod shard_layout;
mod shard_open;
pub mod shards;
mod slices;
pub mod snapshot;
pub mod sql_keyed;
pub mod sql_sessions;
pub mod sql_shard;
pub mod state;
pub mod trigger;
pub mod watermark;
pub mod window_files;

#[cfg(test)]
mod tests;
