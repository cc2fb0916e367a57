//! State shards kept open between checkpoints on the worker that owns them. Opening a redb
//! store every checkpoint costs its open and, worse, forgets the chain of incremental
//! checkpoints, so every checkpoint uploaded a full copy of the store. A shard stays open
//! while its checkpoints keep coming here in order; one that moved away and back, or whose
//! checkpoint failed, is reopened (or restored) by its version. A shard that moved away for
//! good (a rescale, a drained job) is closed once it has been idle for [`IDLE`], so its cache
//! and file handle do not outlive its ownership.
use super::state::ShardStore;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long an open shard may go without a checkpoint before it is closed: far longer than
/// any checkpoint interval, so a shard in use is never closed between two of its checkpoints.
pub const IDLE: Duration = Duration::from_secs(120);

type Open = HashMap<(PathBuf, u32), (ShardStore, Instant)>;

fn open() -> &'static Mutex<Open> {
    static OPEN: OnceLock<Mutex<Open>> = OnceLock::new();
    OPEN.get_or_init(Default::default)
}

/// The open store of shard `shard` under `dir` if it is at checkpoint `version`; an open
/// store at another version is closed (the caller opens the file or restores it).
pub fn take(dir: &Path, shard: u32, version: u64) -> Option<ShardStore> {
    let (store, _) = open()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&(dir.to_path_buf(), shard))?;
    match store.version() {
        Ok(v) if v == version && version > 0 => Some(store),
        _ => None,
    }
}

/// Keeps `store` open for the shard's next checkpoint, and closes the shards idle too long.
pub fn keep(dir: &Path, store: ShardStore) {
    let now = Instant::now();
    let key = (dir.to_path_buf(), store.shard());
    let mut open = open().lock().unwrap_or_else(|p| p.into_inner());
    close_idle(&mut open, now);
    open.insert(key, (store, now));
}

/// Drops (closes) every store last kept more than [`IDLE`] before `now`.
fn close_idle(open: &mut Open, now: Instant) {
    open.retain(|(dir, shard), (_, kept)| {
        let idle = now.saturating_duration_since(*kept) > IDLE;
        if idle {
            tracing::debug!(dir = %dir.display(), shard, "closing a state shard idle since its last checkpoint here");
        }
        !idle
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_idle_past_the_limit_is_closed_and_one_in_use_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let mut open = Open::new();
        let now = Instant::now();
        for shard in [0, 1] {
            let store = ShardStore::open(dir.path(), shard, 1 << 20).unwrap();
            open.insert((dir.path().to_path_buf(), shard), (store, now));
        }
        let later = now + IDLE + Duration::from_secs(1);
        // Shard 1 had a checkpoint recently; shard 0 moved away.
        open.get_mut(&(dir.path().to_path_buf(), 1)).unwrap().1 = later;
        close_idle(&mut open, later);
        let left: Vec<u32> = open.keys().map(|(_, s)| *s).collect();
        assert_eq!(left, [1]);
        // The closed shard's file can be opened again (its handle was released).
        ShardStore::open(dir.path(), 0, 1 << 20).unwrap();
    }
}
