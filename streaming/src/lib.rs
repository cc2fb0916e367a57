//! The streaming runtime: a job is a loop of checkpoints on the engine (`driver`), each
//! planned and recorded in a log (`checkpoints`), its sink output committed once (`commit`),
//! old entries collected (`gc`); Combine and Sql/Join state kept in shards on the workers'
//! disks (`shard`, `sql_shard`, `state`), which the engine runs through
//! [`riverbank_engine::shards::StateShards`] (`StreamingShards`); named snapshots and
//! updates (`snapshot`); source watermarks (`watermark`). Windows fire through the
//! pure event-time core of `riverbank-windowing` (triggers, panes), shared with the portable
//! runner.
pub mod checkpoints;
mod commit;
mod commit_connector;
pub mod driver;
pub mod gc;
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
pub mod watermark;
pub mod window_files;
