//! State shards kept open between checkpoints on the worker that owns them. Opening a redb
//! store every checkpoint costs its open and, worse, forgets the chain of incremental
//! checkpoints, so every checkpoint uploaded a full copy of the store. A shard stays open
//! while its checkpoints keep coming here in order; one that moved away and back, or whose
//! checkpoint failed, is reopened (or restored) by its version.
use super::state::ShardStore;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

fn open() -> &'static Mutex<HashMap<(PathBuf, u32), ShardStore>> {
    static OPEN: OnceLock<Mutex<HashMap<(PathBuf, u32), ShardStore>>> = OnceLock::new();
    OPEN.get_or_init(Default::default)
}

/// The open store of shard `shard` under `dir` if it is at checkpoint `version`; an open
/// store at another version is closed (the caller opens the file or restores it).
pub fn take(dir: &Path, shard: u32, version: u64) -> Option<ShardStore> {
    let store = open()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&(dir.to_path_buf(), shard))?;
    match store.version() {
        Ok(v) if v == version && version > 0 => Some(store),
        _ => None,
    }
}

/// Keeps `store` open for the shard's next checkpoint.
pub fn keep(dir: &Path, store: ShardStore) {
    let key = (dir.to_path_buf(), store.shard());
    open()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, store);
}
