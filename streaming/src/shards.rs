//! The engine's [`StateShards`] for a streaming job: its Combine shards (`shard`) and its
//! Sql/Join shards: per window (`sql_shard`), per key in the global window (`sql_keyed`) or
//! over sessions (`sql_sessions`); their stores under the job's state directory on this
//! process's disk.
use crate::{shard, sql_keyed, sql_sessions, sql_shard};
use futures::future::BoxFuture;
use riverbank_engine::RunConfig;
use riverbank_engine::error::RunError;
use riverbank_engine::shards::{CombineShard, ShardOutput, SqlShard, StateShards};
use riverbank_engine::work::CheckpointCtx;
use std::path::PathBuf;
use std::sync::Arc;

/// Where a process keeps its state shards: on its own disk (a worker pod's PVC).
pub fn state_dir(cfg: &RunConfig, job_name: &str) -> PathBuf {
    cfg.spill_dir.join(format!("riverbank-{job_name}-state"))
}

pub struct StreamingShards {
    state_dir: PathBuf,
}

impl StreamingShards {
    /// The shards of job `job_name` in a process run with `cfg`.
    pub fn of_job(cfg: &RunConfig, job_name: &str) -> Arc<dyn StateShards> {
        Arc::new(StreamingShards {
            state_dir: state_dir(cfg, job_name),
        })
    }
}

impl StateShards for StreamingShards {
    fn combine<'a>(
        &'a self,
        s: CombineShard<'a>,
        ctx: &'a CheckpointCtx,
    ) -> BoxFuture<'a, Result<ShardOutput, RunError>> {
        Box::pin(shard::run(
            shard::Shard {
                op: s.op,
                name: s.name,
                shard: s.shard,
                cache_bytes: s.cache_bytes,
            },
            ctx,
            s.inputs,
            &self.state_dir,
            s.batch_size,
        ))
    }

    fn sql<'a>(
        &'a self,
        s: SqlShard<'a>,
        ctx: &'a CheckpointCtx,
    ) -> BoxFuture<'a, Result<ShardOutput, RunError>> {
        Box::pin(async move {
            let (op, dir) = (s.op, &self.state_dir);
            match (&op.keyed, &op.session_keys) {
                (Some(_), Some(keys)) => sql_sessions::run(s, keys, ctx, dir).await,
                (Some(keys), None) => sql_keyed::run(s, keys, ctx, dir).await,
                (None, _) => sql_shard::run(s, ctx, dir).await,
            }
        })
    }
}
