//! Keyed state on the worker's disk, in shards. Keys hash into a fixed number of state shards
//! (`maxNumWorkers` of them: a shard is what Dataflow calls a persistent disk, spread evenly
//! over the workers). A shard's state (window buffers, accumulators, timers) lives in an
//! embedded store (redb) in the worker's data directory — the pod's PVC — with a bounded cache,
//! so state larger than memory spills to disk by construction.
//!
//! Checkpoints go to `tempLocation` (any object store) so a shard can be restored on another
//! worker. They are incremental: a full copy of the store now and then, and between them only
//! the keys changed since the previous checkpoint (an Arrow IPC file of key, value-or-null).
//! A checkpoint's manifest names the full copy and the deltas to replay on it.
//!
//! The first full copy is the store's file, taken by the checkpoint. Later ones are dumps of
//! the live entries (the delta format, every key) written in the background from a read
//! transaction, while checkpoints go on with deltas: copying a store of hundreds of MB (a
//! window's buffered rows; redb files never shrink) took most of a second on the checkpoint's
//! critical path. A checkpoint after the dump is written bases its manifest on it.
//!
//! Layout under the shard's prefix: `full-{id}.redb` or `full-{id}.arrows`,
//! `delta-{id}.arrows`, `manifest-{id}.json`.
use arrow::array::{Array, BinaryArray, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use futures::StreamExt;
use object_store::{ObjectStoreExt, PutPayload, WriteMultipart};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use riverbank_io::IoError;
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const STATE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("state");
/// The store's own keys (its version); transform names never start with NUL.
const META: &str = "\u{1}meta";
/// A new full copy after this many deltas (and once they weigh a quarter of the last full
/// copy), so a restore replays a bounded chain.
const DELTAS_PER_FULL: usize = 8;
/// Entries per batch of a background dump.
const DUMP_BATCH: usize = 16_384;
/// Background dumps run one at a time in a process: each is a pass over a whole store, and
/// the shards' chains come due together (they start together), so all at once they took the
/// cores from the checkpoints' own work (Nexmark Q4's checkpoints ran 2-3x longer each time).
static DUMPS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);
pub use riverbank_engine::shards::shard_of;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("state store {path}: {message}")]
    Store { path: String, message: String },
    #[error("checkpoint {checkpoint} of shard {shard}: {message}")]
    Checkpoint {
        shard: u32,
        checkpoint: u64,
        message: String,
    },
    #[error(transparent)]
    Io(#[from] IoError),
}

/// What a checkpoint of one shard consists of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub shard: u32,
    pub checkpoint: u64,
    /// The checkpoint whose full copy is the base.
    pub full: u64,
    /// Checkpoints whose deltas are replayed on it, in order.
    pub deltas: Vec<u64>,
    /// Bytes uploaded by this checkpoint (the full copy, or the delta).
    pub uploaded_bytes: u64,
    /// How the full copy is stored (manifests before dumps have none: a redb file).
    #[serde(default, skip_serializing_if = "FullFormat::is_redb")]
    pub full_format: FullFormat,
}

/// A full copy: the store's file, or a dump of its entries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FullFormat {
    #[default]
    Redb,
    /// An Arrow IPC stream of (key, value), like a delta without deletions.
    Arrows,
}

impl FullFormat {
    fn is_redb(&self) -> bool {
        *self == FullFormat::Redb
    }

    fn file(self, id: u64) -> String {
        match self {
            FullFormat::Redb => format!("full-{id}.redb"),
            FullFormat::Arrows => format!("full-{id}.arrows"),
        }
    }
}

impl Manifest {
    /// The name of the full copy this checkpoint is based on.
    pub fn full_file(&self) -> String {
        self.full_format.file(self.full)
    }

    /// Every file a restore of this checkpoint reads, manifest aside.
    pub fn files(&self) -> Vec<String> {
        let mut files = vec![self.full_file()];
        files.extend(self.deltas.iter().map(|d| format!("delta-{d}.arrows")));
        files
    }
}

/// The chain the next checkpoint extends: its full copy and the deltas since.
#[derive(Debug, Clone)]
struct Chain {
    full: u64,
    format: FullFormat,
    deltas: Vec<u64>,
    /// The full copy's bytes and the deltas' since it, to decide when a new one pays.
    full_bytes: u64,
    delta_bytes: u64,
}

/// A full copy being written in the background, as of checkpoint `id`.
struct Dump {
    id: u64,
    task: tokio::task::JoinHandle<Result<u64, String>>,
    /// Deltas taken since `id`: the chain on the dump once it is written.
    deltas: Vec<u64>,
    delta_bytes: u64,
}

/// One state shard, open on this worker.
pub struct ShardStore {
    shard: u32,
    file: PathBuf,
    db: Database,
    /// Keys written (with their value) or deleted, and ranges deleted, since the last
    /// checkpoint, in the order made: the next delta, replayed in that order (the last write of
    /// a key wins). Kept here so it is not read back from the store.
    dirty: Vec<Dirty>,
    /// Checkpoints taken by this handle (when to commit durably).
    checkpoints: u64,
    /// The chain the next checkpoint extends (none before the first).
    chain: Option<Chain>,
    dump: Option<Dump>,
    /// What the store's user derived from its contents and keeps with the open handle (an
    /// index of them): a store opened again or restored starts without it, so it never
    /// outlives the contents it was made from.
    memo: Option<Box<dyn std::any::Any + Send + Sync>>,
}

/// A change since the last checkpoint (full keys).
enum Dirty {
    /// A key written (`Some`) or deleted.
    Key(Vec<u8>, Option<Vec<u8>>),
    /// Every key in `[lo, hi)` deleted: one entry in the delta, however many keys it held (a
    /// fired window's).
    Range(Vec<u8>, Vec<u8>),
}

/// A key and its value, as scans return them.
pub type Entry = (Vec<u8>, Vec<u8>);

/// A change to apply: `None` deletes.
pub type Change<'a> = (&'a str, &'a [u8], Option<&'a [u8]>);

/// A change collected before it is applied: (namespace, key, value or `None` to delete).
pub type OwnedChange = (&'static str, Vec<u8>, Option<Vec<u8>>);

impl ShardStore {
    /// Opens (or creates) shard `shard` under `dir`, caching at most `cache_bytes` in memory.
    pub fn open(dir: &Path, shard: u32, cache_bytes: usize) -> Result<ShardStore, StateError> {
        std::fs::create_dir_all(dir).map_err(|e| store_err(dir, e))?;
        let file = dir.join(format!("shard-{shard}.redb"));
        let db = Database::builder()
            .set_cache_size(cache_bytes)
            .create(&file)
            .map_err(|e| store_err(&file, e))?;
        let store = ShardStore {
            shard,
            file,
            db,
            dirty: vec![],
            checkpoints: 0,
            chain: None,
            dump: None,
            memo: None,
        };
        // The table exists from the start, so reads never meet a missing table.
        store.write(|_| Ok(()))?;
        Ok(store)
    }

    pub fn shard(&self) -> u32 {
        self.shard
    }

    /// Takes the memo of type `T` left by [`Self::keep_memo`] (none after an open or a
    /// restore). Taken, not borrowed: a user that fails between taking it and keeping it
    /// again leaves none behind, rather than one its changes half updated.
    pub fn take_memo<T: std::any::Any + Send + Sync>(&mut self) -> Option<T> {
        let memo = self.memo.take()?.downcast::<T>().ok()?;
        Some(*memo)
    }

    /// Keeps `memo` with the open store until [`Self::take_memo`].
    pub fn keep_memo<T: std::any::Any + Send + Sync>(&mut self, memo: T) {
        self.memo = Some(Box::new(memo));
    }

    /// The value of `key` in namespace `ns` (a transform's name).
    pub fn get(&self, ns: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        let read = self.db.begin_read().map_err(|e| self.err(e))?;
        let table = read.open_table(STATE).map_err(|e| self.err(e))?;
        let value = table
            .get(full_key(ns, key).as_slice())
            .map_err(|e| self.err(e))?;
        Ok(value.map(|v| v.value().to_vec()))
    }

    /// The values of many keys of namespace `ns`, in one read transaction.
    pub fn get_many(&self, ns: &str, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, StateError> {
        let read = self.db.begin_read().map_err(|e| self.err(e))?;
        let table = read.open_table(STATE).map_err(|e| self.err(e))?;
        let mut out = Vec::with_capacity(keys.len());
        let mut k = full_key(ns, &[]);
        let prefix = k.len();
        for key in keys {
            k.truncate(prefix);
            k.extend_from_slice(key);
            let v = table.get(k.as_slice()).map_err(|e| self.err(e))?;
            out.push(v.map(|v| v.value().to_vec()));
        }
        Ok(out)
    }

    /// Applies changes in one transaction (durable at the next checkpoint, not before: a
    /// crash between checkpoints restores from the checkpoint anyway).
    pub fn apply<'a>(
        &mut self,
        changes: impl IntoIterator<Item = Change<'a>>,
    ) -> Result<(), StateError> {
        self.apply_each(changes)
    }

    /// [`Self::apply`] of collected changes. Its values move into the next delta rather than
    /// being copied (a Sql shard's blocks of rows are megabytes).
    pub fn apply_owned(&mut self, changes: Vec<OwnedChange>) -> Result<(), StateError> {
        self.apply_each(changes)
    }

    /// Both of the above: each (namespace, key, value or deletion) in one transaction, and
    /// into the next delta.
    fn apply_each<'a, K: AsRef<[u8]>, V: AsRef<[u8]> + Into<Vec<u8>>>(
        &mut self,
        changes: impl IntoIterator<Item = (&'a str, K, Option<V>)>,
    ) -> Result<(), StateError> {
        let mut touched = vec![];
        self.write(|table| {
            for (ns, key, value) in changes {
                let k = full_key(ns, key.as_ref());
                match &value {
                    Some(v) => table.insert(k.as_slice(), v.as_ref())?,
                    None => table.remove(k.as_slice())?,
                };
                touched.push(Dirty::Key(k, value.map(Into::into)));
            }
            Ok(())
        })?;
        self.dirty.extend(touched);
        Ok(())
    }

    /// Deletes every key of namespace `ns` in `[lo, hi)`, in one pass over the range rather
    /// than a lookup per key (a fired window's keys). The number deleted.
    pub fn delete_range(&mut self, ns: &str, lo: &[u8], hi: &[u8]) -> Result<usize, StateError> {
        let (lo, hi) = (full_key(ns, lo), full_key(ns, hi));
        let mut n = 0;
        self.write(|table| {
            table.retain_in(lo.as_slice()..hi.as_slice(), |_, _| {
                n += 1;
                false
            })
        })?;
        // Earlier changes in the range are void: the range's deletion replaces them.
        let range = lo.as_slice()..hi.as_slice();
        self.dirty
            .retain(|d| !matches!(d, Dirty::Key(k, _) if range.contains(&k.as_slice())));
        self.dirty.push(Dirty::Range(lo, hi));
        Ok(n)
    }

    /// Every (key, value) of namespace `ns`, in key order.
    pub fn scan(&self, ns: &str) -> Result<Vec<Entry>, StateError> {
        let read = self.db.begin_read().map_err(|e| self.err(e))?;
        let table = read.open_table(STATE).map_err(|e| self.err(e))?;
        let (lo, hi) = (full_key(ns, &[]), namespace_end(ns));
        let mut out = vec![];
        for entry in table
            .range(lo.as_slice()..hi.as_slice())
            .map_err(|e| self.err(e))?
        {
            let (k, v) = entry.map_err(|e| self.err(e))?;
            out.push((k.value()[lo.len()..].to_vec(), v.value().to_vec()));
        }
        Ok(out)
    }

    /// Whether namespace `ns` holds no key.
    pub fn is_empty(&self, ns: &str) -> Result<bool, StateError> {
        let read = self.db.begin_read().map_err(|e| self.err(e))?;
        let table = read.open_table(STATE).map_err(|e| self.err(e))?;
        let (lo, hi) = (full_key(ns, &[]), namespace_end(ns));
        let mut range = table
            .range(lo.as_slice()..hi.as_slice())
            .map_err(|e| self.err(e))?;
        Ok(range.next().is_none())
    }

    /// Entries of namespace `ns` whose keys are in `[lo, hi)`, in key order.
    pub fn scan_range(&self, ns: &str, lo: &[u8], hi: &[u8]) -> Result<Vec<Entry>, StateError> {
        let read = self.db.begin_read().map_err(|e| self.err(e))?;
        let table = read.open_table(STATE).map_err(|e| self.err(e))?;
        let prefix = full_key(ns, &[]).len();
        let (lo, hi) = (full_key(ns, lo), full_key(ns, hi));
        let mut out = vec![];
        for entry in table
            .range(lo.as_slice()..hi.as_slice())
            .map_err(|e| self.err(e))?
        {
            let (k, v) = entry.map_err(|e| self.err(e))?;
            out.push((k.value()[prefix..].to_vec(), v.value().to_vec()));
        }
        Ok(out)
    }

    /// Entries of namespace `ns` whose keys start with `prefix`, in key order.
    pub fn scan_prefix(&self, ns: &str, prefix: &[u8]) -> Result<Vec<Entry>, StateError> {
        // The first key after every key that starts with `prefix`: the prefix with its last
        // byte below 0xff raised by one (none: the namespace's end).
        let mut hi = prefix.to_vec();
        while hi.last() == Some(&0xff) {
            hi.pop();
        }
        match hi.last_mut() {
            Some(b) => {
                *b += 1;
                self.scan_range(ns, prefix, &hi)
            }
            None if prefix.is_empty() => self.scan(ns),
            None => {
                let read = self.db.begin_read().map_err(|e| self.err(e))?;
                let table = read.open_table(STATE).map_err(|e| self.err(e))?;
                let lo = full_key(ns, prefix);
                let skip = full_key(ns, &[]).len();
                let mut out = vec![];
                for entry in table
                    .range(lo.as_slice()..namespace_end(ns).as_slice())
                    .map_err(|e| self.err(e))?
                {
                    let (k, v) = entry.map_err(|e| self.err(e))?;
                    out.push((k.value()[skip..].to_vec(), v.value().to_vec()));
                }
                Ok(out)
            }
        }
    }

    /// Calls `f` with every entry of namespace `ns` whose key is in `[lo, hi)`, in key order,
    /// without copying them out (a window's keys when it fires); stops at `f`'s first error.
    pub fn for_each_in_range<E>(
        &self,
        ns: &str,
        lo: &[u8],
        hi: &[u8],
        mut f: impl FnMut(&[u8], &[u8]) -> Result<(), E>,
    ) -> Result<Result<(), E>, StateError> {
        let read = self.db.begin_read().map_err(|e| self.err(e))?;
        let table = read.open_table(STATE).map_err(|e| self.err(e))?;
        let prefix = full_key(ns, &[]).len();
        let (lo, hi) = (full_key(ns, lo), full_key(ns, hi));
        for entry in table
            .range(lo.as_slice()..hi.as_slice())
            .map_err(|e| self.err(e))?
        {
            let (k, v) = entry.map_err(|e| self.err(e))?;
            if let Err(e) = f(&k.value()[prefix..], v.value()) {
                return Ok(Err(e));
            }
        }
        Ok(Ok(()))
    }

    /// The checkpoint the store's contents are as of (0: none yet).
    pub fn version(&self) -> Result<u64, StateError> {
        Ok(self
            .get(META, b"version")?
            .and_then(|v| v.try_into().ok())
            .map_or(0, u64::from_be_bytes))
    }

    /// A counter kept in the store's own keys (0 when never set).
    pub fn count(&self, name: &str) -> Result<u64, StateError> {
        Ok(self
            .get(META, name.as_bytes())?
            .and_then(|v| v.try_into().ok())
            .map_or(0, u64::from_be_bytes))
    }

    pub fn set_count(&mut self, name: &str, n: u64) -> Result<(), StateError> {
        let v = n.to_be_bytes();
        self.apply([(META, name.as_bytes(), Some(v.as_slice()))])
    }

    /// Records that the contents are now as of checkpoint `id`.
    pub fn set_version(&mut self, id: u64) -> Result<(), StateError> {
        let v = id.to_be_bytes();
        self.apply([(META, b"version".as_slice(), Some(v.as_slice()))])
    }

    /// Bytes of the store on disk.
    pub fn disk_bytes(&self) -> u64 {
        std::fs::metadata(&self.file).map_or(0, |m| m.len())
    }

    /// Takes checkpoint `id` of this shard into `prefix` (this shard's location in
    /// `tempLocation`): the changed keys on the chain's full copy, or a full copy of the file
    /// when there is no chain yet. A background dump written since becomes the chain's base;
    /// a long chain starts one.
    pub async fn checkpoint(&mut self, id: u64, prefix: &str) -> Result<Manifest, StateError> {
        // On disk for good before the file is copied, and every few checkpoints (staggered
        // over the shards) so redb can reuse the pages freed since: it keeps them until a
        // durable commit. Not every checkpoint: an fsync while other files are being written
        // (shuffle, dumps) stalled a shard for up to 100 ms, and a checkpoint restores from
        // its upload anyway (a store left on disk by a crash is used only if its version is
        // the checkpoint's, else restored).
        self.checkpoints += 1;
        if self.chain.is_none()
            || (self.checkpoints + u64::from(self.shard)).is_multiple_of(DELTAS_PER_FULL as u64)
        {
            self.write_with(Durability::Immediate, |_| Ok(()))?;
        }
        let target = riverbank_io::location::resolve(prefix)?;
        if self.dump.as_ref().is_some_and(|d| d.task.is_finished()) {
            self.settle().await;
        }
        let (chain, uploaded) = match self.chain.clone() {
            Some(mut chain) => {
                let bytes = self.delta_file()?;
                let n = bytes.len() as u64;
                put(
                    &target,
                    &format!("delta-{id}.arrows"),
                    bytes,
                    self.shard,
                    id,
                )
                .await?;
                chain.deltas.push(id);
                chain.delta_bytes += n;
                if let Some(d) = &mut self.dump {
                    d.deltas.push(id);
                    d.delta_bytes += n;
                }
                (chain, n)
            }
            None => {
                let uploaded = put_file(&target, &FullFormat::Redb.file(id), &self.file)
                    .await
                    .map_err(|message| self.checkpoint_err(id, message))?;
                let chain = Chain {
                    full: id,
                    format: FullFormat::Redb,
                    deltas: vec![],
                    full_bytes: uploaded,
                    delta_bytes: 0,
                };
                (chain, uploaded)
            }
        };
        let manifest = Manifest {
            shard: self.shard,
            checkpoint: id,
            full: chain.full,
            deltas: chain.deltas.clone(),
            uploaded_bytes: uploaded,
            full_format: chain.format,
        };
        let json = serde_json::to_vec_pretty(&manifest).map_err(|e| self.checkpoint_err(id, e))?;
        put(
            &target,
            &format!("manifest-{id}.json"),
            json,
            self.shard,
            id,
        )
        .await?;
        let due = chain.deltas.len() >= DELTAS_PER_FULL
            && (chain.delta_bytes.saturating_mul(4) >= chain.full_bytes
                || chain.deltas.len() >= 8 * DELTAS_PER_FULL);
        self.chain = Some(chain);
        self.dirty.clear();
        if due && self.dump.is_none() {
            self.start_dump(id, target)?;
        }
        Ok(manifest)
    }

    /// Waits for a background dump, if one is under way: the next checkpoint bases its
    /// manifest on it (a drain leaves no dump that no manifest names).
    pub async fn settle(&mut self) {
        let Some(d) = self.dump.take() else { return };
        match d.task.await {
            Ok(Ok(bytes)) => {
                self.chain = Some(Chain {
                    full: d.id,
                    format: FullFormat::Arrows,
                    deltas: d.deltas,
                    full_bytes: bytes,
                    delta_bytes: d.delta_bytes,
                });
            }
            // The chain goes on from the old full copy; a later checkpoint dumps again.
            Ok(Err(e)) => {
                tracing::warn!(shard = self.shard, checkpoint = d.id, error = %e, "a full copy of a state shard failed")
            }
            Err(e) => {
                tracing::warn!(shard = self.shard, checkpoint = d.id, error = %e, "a full copy of a state shard did not finish")
            }
        }
    }

    /// Starts writing `full-{id}.arrows`: every entry as of now (checkpoint `id`), read from
    /// a read transaction on a blocking thread and uploaded in parts as it goes.
    fn start_dump(
        &mut self,
        id: u64,
        target: riverbank_io::location::Resolved,
    ) -> Result<(), StateError> {
        let read = self.db.begin_read().map_err(|e| self.err(e))?;
        let path = object_path(&target, &FullFormat::Arrows.file(id))?;
        let task = tokio::spawn(async move {
            let _turn = DUMPS.acquire().await.map_err(|e| e.to_string())?;
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, String>>(2);
            tokio::task::spawn_blocking(move || {
                if let Err(e) = dump_entries(&read, &tx) {
                    let _ = tx.blocking_send(Err(e));
                }
            });
            upload_parts(&target, &path, rx).await
        });
        self.dump = Some(Dump {
            id,
            task,
            deltas: vec![],
            delta_bytes: 0,
        });
        Ok(())
    }

    /// Restores shard `shard` as of checkpoint `id` from `prefix` into `dir` (replacing what
    /// is there): its full copy, then its deltas in order.
    pub async fn restore(
        dir: &Path,
        shard: u32,
        cache_bytes: usize,
        prefix: &str,
        id: u64,
    ) -> Result<ShardStore, StateError> {
        let source = riverbank_io::location::resolve(prefix)?;
        let cerr = |message: String| StateError::Checkpoint {
            shard,
            checkpoint: id,
            message,
        };
        let manifest: Manifest = serde_json::from_slice(
            &get(&source, &format!("manifest-{id}.json"))
                .await
                .map_err(cerr)?,
        )
        .map_err(|e| cerr(e.to_string()))?;
        std::fs::create_dir_all(dir).map_err(|e| store_err(dir, e))?;
        let file = dir.join(format!("shard-{shard}.redb"));
        let mut store = match manifest.full_format {
            FullFormat::Redb => {
                let tmp = file.with_extension("redb.restoring");
                get_file(&source, &manifest.full_file(), &tmp)
                    .await
                    .map_err(cerr)?;
                std::fs::rename(&tmp, &file).map_err(|e| store_err(&file, e))?;
                ShardStore::open(dir, shard, cache_bytes)?
            }
            FullFormat::Arrows => {
                let _ = std::fs::remove_file(&file);
                let mut store = ShardStore::open(dir, shard, cache_bytes)?;
                let bytes = get(&source, &manifest.full_file()).await.map_err(cerr)?;
                store
                    .replay_delta(&bytes)
                    .map_err(|e| cerr(e.to_string()))?;
                store
            }
        };
        for d in &manifest.deltas {
            let bytes = get(&source, &format!("delta-{d}.arrows"))
                .await
                .map_err(cerr)?;
            store
                .replay_delta(&bytes)
                .map_err(|e| cerr(e.to_string()))?;
        }
        store.dirty.clear();
        store.chain = Some(Chain {
            full: manifest.full,
            format: manifest.full_format,
            deltas: manifest.deltas,
            // Unknown here: the next new full copy is decided by the number of deltas.
            full_bytes: 0,
            delta_bytes: 0,
        });
        Ok(store)
    }

    /// The changes as an Arrow IPC stream of (key, value, range end), in the order made: the
    /// last write of each key (value null: deleted; a window's rows buffered and fired in one
    /// checkpoint are not uploaded, only their deletion), and each range deleted (key to
    /// range end).
    fn delta_file(&self) -> Result<Vec<u8>, StateError> {
        let mut last: std::collections::HashMap<&[u8], usize> =
            std::collections::HashMap::with_capacity(self.dirty.len());
        for (i, d) in self.dirty.iter().enumerate() {
            if let Dirty::Key(k, _) = d {
                last.insert(k, i);
            }
        }
        let kept = || {
            self.dirty.iter().enumerate().filter_map(|(i, d)| match d {
                Dirty::Key(k, v) => (last[k.as_slice()] == i).then_some((k, v.as_deref(), None)),
                Dirty::Range(lo, hi) => Some((lo, None, Some(hi))),
            })
        };
        let batch = RecordBatch::try_new(
            delta_schema(),
            vec![
                Arc::new(BinaryArray::from_iter_values(kept().map(|(k, _, _)| k))),
                Arc::new(BinaryArray::from_iter(kept().map(|(_, v, _)| v))),
                Arc::new(BinaryArray::from_iter(kept().map(|(_, _, r)| r))),
            ],
        )
        .map_err(|e| self.err(e))?;
        let mut w = arrow::ipc::writer::StreamWriter::try_new_with_options(
            Vec::new(),
            &delta_schema(),
            riverbank_engine::shuffle::ipc_write_options(),
        )
        .map_err(|e| self.err(e))?;
        w.write(&batch).map_err(|e| self.err(e))?;
        w.into_inner().map_err(|e| self.err(e))
    }

    fn replay_delta(&mut self, bytes: &[u8]) -> Result<(), StateError> {
        let reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None)
            .map_err(|e| self.err(e))?;
        for batch in reader {
            let batch = batch.map_err(|e| self.err(e))?;
            let (keys, values) = (binary(&batch, 0)?, binary(&batch, 1)?);
            // Deltas written before range deletions have no third column.
            let ranges = match batch.num_columns() > 2 {
                true => Some(binary(&batch, 2)?),
                false => None,
            };
            self.write(|table| {
                for i in 0..keys.len() {
                    if let Some(hi) = ranges.filter(|r| r.is_valid(i)) {
                        table.retain_in(keys.value(i)..hi.value(i), |_, _| false)?;
                    } else if values.is_null(i) {
                        table.remove(keys.value(i))?;
                    } else {
                        table.insert(keys.value(i), values.value(i))?;
                    }
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    fn write(
        &self,
        f: impl FnOnce(&mut redb::Table<&[u8], &[u8]>) -> Result<(), redb::StorageError>,
    ) -> Result<(), StateError> {
        self.write_with(Durability::None, f)
    }

    fn write_with(
        &self,
        durability: Durability,
        f: impl FnOnce(&mut redb::Table<&[u8], &[u8]>) -> Result<(), redb::StorageError>,
    ) -> Result<(), StateError> {
        let mut txn = self.db.begin_write().map_err(|e| self.err(e))?;
        txn.set_durability(durability).map_err(|e| self.err(e))?;
        {
            let mut table = txn.open_table(STATE).map_err(|e| self.err(e))?;
            f(&mut table).map_err(|e| self.err(e))?;
        }
        txn.commit().map_err(|e| self.err(e))
    }

    fn err(&self, e: impl std::fmt::Display) -> StateError {
        store_err(&self.file, e)
    }

    fn checkpoint_err(&self, checkpoint: u64, e: impl std::fmt::Display) -> StateError {
        StateError::Checkpoint {
            shard: self.shard,
            checkpoint,
            message: e.to_string(),
        }
    }
}

fn store_err(path: &Path, e: impl std::fmt::Display) -> StateError {
    StateError::Store {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

/// `ns` NUL `key`: namespaces never contain NUL (they are transform names).
fn full_key(ns: &str, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(ns.len() + 1 + key.len());
    k.extend_from_slice(ns.as_bytes());
    k.push(0);
    k.extend_from_slice(key);
    k
}

/// The first key after namespace `ns`.
fn namespace_end(ns: &str) -> Vec<u8> {
    let mut k = ns.as_bytes().to_vec();
    k.push(1);
    k
}

/// Every entry the read transaction sees, as the chunks of one Arrow IPC stream.
fn dump_entries(
    read: &redb::ReadTransaction,
    tx: &tokio::sync::mpsc::Sender<Result<Vec<u8>, String>>,
) -> Result<(), String> {
    let table = read.open_table(STATE).map_err(|e| e.to_string())?;
    let mut w = arrow::ipc::writer::StreamWriter::try_new_with_options(
        Vec::new(),
        &dump_schema(),
        riverbank_engine::shuffle::ipc_write_options(),
    )
    .map_err(|e| e.to_string())?;
    let send = |w: &mut arrow::ipc::writer::StreamWriter<Vec<u8>>| {
        let chunk = std::mem::take(w.get_mut());
        tx.blocking_send(Ok(chunk))
            .map_err(|_| "the upload stopped".to_string())
    };
    let (mut keys, mut values) = (vec![], vec![]);
    let flush = |w: &mut arrow::ipc::writer::StreamWriter<Vec<u8>>,
                 keys: &mut Vec<Vec<u8>>,
                 values: &mut Vec<Vec<u8>>|
     -> Result<(), String> {
        let batch = RecordBatch::try_new(
            dump_schema(),
            vec![
                Arc::new(BinaryArray::from_iter_values(keys.drain(..))),
                Arc::new(BinaryArray::from_iter_values(values.drain(..))),
            ],
        )
        .map_err(|e| e.to_string())?;
        w.write(&batch).map_err(|e| e.to_string())?;
        send(w)
    };
    for entry in table.iter().map_err(|e| e.to_string())? {
        let (k, v) = entry.map_err(|e| e.to_string())?;
        keys.push(k.value().to_vec());
        values.push(v.value().to_vec());
        if keys.len() == DUMP_BATCH {
            flush(&mut w, &mut keys, &mut values)?;
        }
    }
    if !keys.is_empty() {
        flush(&mut w, &mut keys, &mut values)?;
    }
    w.finish().map_err(|e| e.to_string())?;
    send(&mut w)
}

/// A full copy's entries.
fn dump_schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("key", DataType::Binary, false),
        Field::new("value", DataType::Binary, true),
    ]))
}

/// A delta's changes: a key and its value (null: deleted), or a range deleted (key to
/// `range_end`).
fn delta_schema() -> Arc<Schema> {
    let mut fields = dump_schema().fields().to_vec();
    fields.push(Arc::new(Field::new("range_end", DataType::Binary, true)));
    Arc::new(Schema::new(fields))
}

fn binary(batch: &RecordBatch, i: usize) -> Result<&BinaryArray, StateError> {
    batch
        .column(i)
        .as_any()
        .downcast_ref::<BinaryArray>()
        .ok_or_else(|| StateError::Store {
            path: "delta".into(),
            message: "not a state delta".into(),
        })
}

async fn put(
    target: &riverbank_io::location::Resolved,
    name: &str,
    bytes: Vec<u8>,
    shard: u32,
    checkpoint: u64,
) -> Result<(), StateError> {
    let path = object_path(target, name)?;
    target
        .store
        .put(&path, PutPayload::from(bytes))
        .await
        .map(|_| ())
        .map_err(|e| StateError::Checkpoint {
            shard,
            checkpoint,
            message: format!("writing {}: {e}", target.display_path(&path)),
        })
}

/// Uploads a local file in parts, never holding all of it in memory.
async fn put_file(
    target: &riverbank_io::location::Resolved,
    name: &str,
    file: &Path,
) -> Result<u64, String> {
    let path = object_path(target, name).map_err(|e| e.to_string())?;
    let mut f = std::fs::File::open(file).map_err(|e| e.to_string())?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, String>>(2);
    tokio::task::spawn_blocking(move || {
        loop {
            let mut buf = vec![0u8; 8 << 20];
            let chunk = match f.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    buf.truncate(n);
                    Ok(buf)
                }
                Err(e) => Err(e.to_string()),
            };
            let failed = chunk.is_err();
            if tx.blocking_send(chunk).is_err() || failed {
                return;
            }
        }
    });
    upload_parts(target, &path, rx).await
}

/// Uploads the chunks `rx` brings as one object, in parts; an error chunk aborts it.
async fn upload_parts(
    target: &riverbank_io::location::Resolved,
    path: &object_store::path::Path,
    mut rx: tokio::sync::mpsc::Receiver<Result<Vec<u8>, String>>,
) -> Result<u64, String> {
    let upload = target
        .store
        .put_multipart(path)
        .await
        .map_err(|e| e.to_string())?;
    let mut w = WriteMultipart::new(upload);
    let mut total = 0u64;
    while let Some(chunk) = rx.recv().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                let _ = w.abort().await;
                return Err(e);
            }
        };
        w.wait_for_capacity(4).await.map_err(|e| e.to_string())?;
        total += chunk.len() as u64;
        w.write(&chunk);
    }
    w.finish().await.map_err(|e| e.to_string())?;
    Ok(total)
}

async fn get(source: &riverbank_io::location::Resolved, name: &str) -> Result<Vec<u8>, String> {
    let path = object_path(source, name).map_err(|e| e.to_string())?;
    let r = source.store.get(&path).await.map_err(|e| e.to_string())?;
    Ok(r.bytes().await.map_err(|e| e.to_string())?.to_vec())
}

/// Downloads an object into a local file, streamed.
async fn get_file(
    source: &riverbank_io::location::Resolved,
    name: &str,
    file: &Path,
) -> Result<(), String> {
    let path = object_path(source, name).map_err(|e| e.to_string())?;
    let r = source.store.get(&path).await.map_err(|e| e.to_string())?;
    let mut out = std::fs::File::create(file).map_err(|e| e.to_string())?;
    let mut stream = r.into_stream();
    while let Some(chunk) = stream.next().await {
        out.write_all(&chunk.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    out.sync_all().map_err(|e| e.to_string())
}

fn object_path(
    base: &riverbank_io::location::Resolved,
    name: &str,
) -> Result<object_store::path::Path, StateError> {
    let key = if base.key.is_empty() {
        name.to_string()
    } else {
        format!("{}/{name}", base.key.trim_end_matches('/'))
    };
    Ok(base.with_key(key).path()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(i: u32) -> (Vec<u8>, Vec<u8>) {
        (
            format!("key-{i:08}").into_bytes(),
            format!("value-{i}-{}", "x".repeat(40)).into_bytes(),
        )
    }

    #[test]
    fn keys_spread_evenly_and_stably_over_the_shards() {
        let mut counts = [0u32; 12];
        for i in 0..120_000u32 {
            counts[shard_of(&i.to_le_bytes(), 12) as usize] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
        // Pinned: a key must stay on its shard across versions (its state lives there).
        assert_eq!(shard_of(b"user-42", 100), shard_of(b"user-42", 100));
        assert_eq!(shard_of(b"", 1), 0);
    }

    #[test]
    fn namespaces_keep_their_keys_apart() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = ShardStore::open(dir.path(), 0, 1 << 20).unwrap();
        s.apply([
            ("Count", b"a".as_slice(), Some(b"1".as_slice())),
            ("Count", b"b", Some(b"2")),
            ("Counter", b"a", Some(b"x")),
            ("Count", b"c", Some(b"3")),
        ])
        .unwrap();
        s.apply([("Count", b"c".as_slice(), None)]).unwrap();
        assert_eq!(s.get("Count", b"a").unwrap(), Some(b"1".to_vec()));
        assert_eq!(s.get("Count", b"c").unwrap(), None);
        assert_eq!(
            s.scan("Count").unwrap(),
            [
                (b"a".to_vec(), b"1".to_vec()),
                (b"b".to_vec(), b"2".to_vec())
            ]
        );
        assert_eq!(s.scan("Counter").unwrap(), [(b"a".to_vec(), b"x".to_vec())]);
        // A range deletion stays within its namespace and range.
        s.apply([("Count", b"ab".as_slice(), Some(b"3".as_slice()))])
            .unwrap();
        assert_eq!(s.delete_range("Count", b"a", b"a\xff").unwrap(), 2);
        assert_eq!(s.scan("Count").unwrap(), [(b"b".to_vec(), b"2".to_vec())]);
        assert_eq!(s.scan("Counter").unwrap().len(), 1);
    }

    #[test]
    fn a_prefix_scan_finds_exactly_the_keys_that_start_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = ShardStore::open(dir.path(), 0, 1 << 20).unwrap();
        let keys: [&[u8]; 6] = [
            b"a",
            b"ab\x00",
            b"ab\xff",
            b"ab\xff\x01",
            b"ac",
            b"\xff\xff",
        ];
        s.apply(keys.iter().map(|k| ("S", *k, Some(b"v".as_slice()))))
            .unwrap();
        s.apply([("T", b"ab".as_slice(), Some(b"other".as_slice()))])
            .unwrap();
        let found = |p: &[u8]| -> Vec<Vec<u8>> {
            s.scan_prefix("S", p)
                .unwrap()
                .into_iter()
                .map(|(k, _)| k)
                .collect()
        };
        assert_eq!(
            found(b"ab"),
            [
                b"ab\x00".to_vec(),
                b"ab\xff".to_vec(),
                b"ab\xff\x01".to_vec()
            ]
        );
        assert_eq!(
            found(b"ab\xff"),
            [b"ab\xff".to_vec(), b"ab\xff\x01".to_vec()]
        );
        assert_eq!(found(b"\xff"), [b"\xff\xff".to_vec()]);
        assert_eq!(found(b"").len(), 6);
        assert!(found(b"b").is_empty());
    }

    /// A range deletion goes into the delta as one entry, whatever it held; it voids the
    /// range's earlier writes and not the later ones, on restore as here.
    #[tokio::test]
    async fn a_deleted_range_is_one_delta_entry_and_restores_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let prefix = dir.path().join("remote").display().to_string();
        let mut s = ShardStore::open(&dir.path().join("a"), 0, 1 << 20).unwrap();
        let rows: Vec<_> = (0..20_000).map(kv).collect();
        s.apply(
            rows.iter()
                .map(|(k, v)| ("W", k.as_slice(), Some(v.as_slice()))),
        )
        .unwrap();
        s.checkpoint(1, &prefix).await.unwrap();
        // Keys 0..10,000 are one range of `kv`'s keys (zero-padded); one is written before the
        // deletion (void) and one after (kept).
        let (lo, hi) = (kv(0).0, kv(10_000).0);
        s.apply([("W", kv(5).0.as_slice(), Some(b"before".as_slice()))])
            .unwrap();
        assert_eq!(s.delete_range("W", &lo, &hi).unwrap(), 10_000);
        s.apply([("W", kv(6).0.as_slice(), Some(b"after".as_slice()))])
            .unwrap();
        let second = s.checkpoint(2, &prefix).await.unwrap();
        assert!(second.uploaded_bytes < 4096, "{second:?}");
        let r = ShardStore::restore(&dir.path().join("b"), 0, 1 << 20, &prefix, 2)
            .await
            .unwrap();
        assert_eq!(r.scan("W").unwrap(), s.scan("W").unwrap());
        assert_eq!(r.scan("W").unwrap().len(), 10_001);
        assert_eq!(r.get("W", &kv(5).0).unwrap(), None);
        assert_eq!(r.get("W", &kv(6).0).unwrap(), Some(b"after".to_vec()));
    }

    /// Far more state than the cache: written, read back, checkpointed and restored elsewhere.
    #[tokio::test]
    async fn state_larger_than_the_cache_checkpoints_incrementally_and_restores_elsewhere() {
        let dir = tempfile::tempdir().unwrap();
        let remote = dir.path().join("temp-location/job/shard-3");
        let prefix = remote.display().to_string();
        std::fs::create_dir_all(&remote).unwrap();
        // A 256 KiB cache for about 10 MB of state.
        let mut s = ShardStore::open(&dir.path().join("worker-a"), 3, 256 << 10).unwrap();
        let n = 100_000u32;
        for chunk in (0..n).collect::<Vec<_>>().chunks(10_000) {
            let rows: Vec<_> = chunk.iter().map(|&i| kv(i)).collect();
            s.apply(
                rows.iter()
                    .map(|(k, v)| ("W", k.as_slice(), Some(v.as_slice()))),
            )
            .unwrap();
        }
        assert_eq!(s.get("W", &kv(54_321).0).unwrap(), Some(kv(54_321).1));
        let first = s.checkpoint(1, &prefix).await.unwrap();
        assert_eq!((first.full, first.deltas.clone()), (1, vec![]));
        assert!(first.uploaded_bytes > 4 << 20, "{first:?}");

        // A few changes: the next checkpoint uploads only them (a value written and deleted
        // again since the last checkpoint goes as its deletion alone).
        s.apply([
            ("W", kv(7).0.as_slice(), Some(b"seven".as_slice())),
            ("W", kv(8).0.as_slice(), None),
            ("W", b"passing", Some(vec![1u8; 100_000].as_slice())),
        ])
        .unwrap();
        s.apply([("W", b"passing".as_slice(), None)]).unwrap();
        let second = s.checkpoint(2, &prefix).await.unwrap();
        assert_eq!((second.full, second.deltas.clone()), (1, vec![2]));
        assert!(second.uploaded_bytes < 4096, "{second:?}");
        s.apply([("W", kv(9).0.as_slice(), Some(b"nine".as_slice()))])
            .unwrap();

        // Another worker restores checkpoint 2: the change after it is not there.
        let r = ShardStore::restore(&dir.path().join("worker-b"), 3, 256 << 10, &prefix, 2)
            .await
            .unwrap();
        assert_eq!(r.get("W", &kv(7).0).unwrap(), Some(b"seven".to_vec()));
        assert_eq!(r.get("W", &kv(8).0).unwrap(), None);
        assert_eq!(r.get("W", b"passing").unwrap(), None);
        assert_eq!(r.get("W", &kv(9).0).unwrap(), Some(kv(9).1));
        assert_eq!(r.get("W", &kv(99_999).0).unwrap(), Some(kv(99_999).1));
        assert_eq!(r.scan("W").unwrap().len(), n as usize - 1);
        // And checkpoint 1 is still there as it was.
        let old = ShardStore::restore(&dir.path().join("worker-c"), 3, 256 << 10, &prefix, 1)
            .await
            .unwrap();
        assert_eq!(old.get("W", &kv(7).0).unwrap(), Some(kv(7).1));
        assert_eq!(old.get("W", &kv(8).0).unwrap(), Some(kv(8).1));
    }

    /// A long chain starts a dump of the store in the background; the checkpoint after it is
    /// written bases its manifest on the dump, and a restore from either kind of full copy
    /// gives the same store. A missing checkpoint is named.
    #[tokio::test]
    async fn a_long_chain_is_rebased_on_a_background_dump_and_a_missing_checkpoint_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let prefix = dir.path().join("remote").display().to_string();
        std::fs::create_dir_all(dir.path().join("remote")).unwrap();
        let mut s = ShardStore::open(&dir.path().join("w"), 0, 1 << 20).unwrap();
        // Bytes LZ4 cannot shrink, so the deltas grow as the store does.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let big: Vec<u8> = (0..32 << 10)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let mut bases = vec![];
        for id in 1..=(DELTAS_PER_FULL as u64 + 2) {
            s.apply([("N", id.to_string().as_bytes(), Some(big.as_slice()))])
                .unwrap();
            s.apply([(
                "N",
                b"gone".as_slice(),
                (id == 2).then_some(b"x".as_slice()),
            )])
            .unwrap();
            let m = s.checkpoint(id, &prefix).await.unwrap();
            bases.push((m.full, m.full_format, m.deltas.len()));
            s.settle().await;
        }
        let n = DELTAS_PER_FULL as u64;
        // Checkpoints 1..=n+1 on the file copied by the first; n+1 starts the dump; n+2 on it.
        assert_eq!(bases[0], (1, FullFormat::Redb, 0));
        assert_eq!(bases[n as usize], (1, FullFormat::Redb, n as usize));
        assert_eq!(bases[n as usize + 1], (n + 1, FullFormat::Arrows, 1));
        for id in [n, n + 1, n + 2] {
            let r =
                ShardStore::restore(&dir.path().join(format!("r{id}")), 0, 1 << 20, &prefix, id)
                    .await
                    .unwrap();
            assert_eq!(r.scan("N").unwrap().len(), id as usize, "checkpoint {id}");
            assert_eq!(
                r.get("N", id.to_string().as_bytes()).unwrap(),
                Some(big.clone())
            );
            assert_eq!(r.get("N", b"gone").unwrap(), None);
        }
        // A manifest written before dumps existed reads as based on a redb file.
        let old: Manifest = serde_json::from_str(
            r#"{"shard": 0, "checkpoint": 3, "full": 1, "deltas": [2, 3], "uploaded_bytes": 9}"#,
        )
        .unwrap();
        assert_eq!(
            old.files(),
            ["full-1.redb", "delta-2.arrows", "delta-3.arrows"]
        );
        let err = ShardStore::restore(&dir.path().join("r2"), 0, 1 << 20, &prefix, 99)
            .await
            .err()
            .unwrap();
        assert!(
            matches!(
                err,
                StateError::Checkpoint {
                    shard: 0,
                    checkpoint: 99,
                    ..
                }
            ),
            "{err}"
        );
    }
}
