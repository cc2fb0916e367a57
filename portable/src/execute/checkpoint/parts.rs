//! Incremental checkpoints: a checkpoint is written as a small manifest (`checkpoint.pb`: the
//! rounds' counters, held residuals, waiting elements, side inputs, and the names of its parts)
//! and parts: each GroupByKey's windows in [`PARTS`] parts by key, each stateful stage's
//! buckets one part each. A part is named by the hash of its content, so one unchanged since
//! the last checkpoint (windows waiting out their lateness, keys that saw nothing new) is not
//! written again; parts the new manifest no longer names are removed once it is written.
//! The rounds know what changed ([`Changed`]): a checkpoint encodes and hashes only those
//! parts, and names the last checkpoint's for the others, so its cost follows what changed,
//! not the whole state.
use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};

use prost::Message;
use sha2::{Digest, Sha256};

use super::{BucketState, Checkpoint, GroupState, KeyedState, WindowState};

/// Parts a GroupByKey's windows are spread over, by key: enough that a checkpoint after a
/// few keys got elements encodes a small share of the state (their parts are written
/// concurrently).
pub(super) const PARTS: usize = 64;

/// One part: some of a GroupByKey's windows, or one bucket of a stateful stage.
#[derive(Clone, PartialEq, Message)]
pub struct PartState {
    #[prost(uint64, tag = "1")]
    pub stage: u64,
    #[prost(uint32, tag = "2")]
    pub index: u32,
    #[prost(message, repeated, tag = "3")]
    pub windows: Vec<WindowState>,
    #[prost(message, optional, tag = "4")]
    pub bucket: Option<BucketState>,
}

/// Where a part belongs: (stage, index, whether it is a stateful stage's bucket).
pub(super) type Place = (u64, u32, bool);

/// What changed since the last checkpoint written: per GroupByKey stage, the parts whose
/// windows changed; per stateful stage, the buckets. A checkpoint holds only those, and the
/// last checkpoint's parts stand for the others. A stage not named is taken whole.
#[derive(Debug, Default)]
pub(crate) struct Changed {
    pub groups: HashMap<u64, HashSet<u32>>,
    pub keyed: HashMap<u64, HashSet<u32>>,
}

impl Changed {
    /// Whether the part at `place` is as the last checkpoint wrote it.
    pub(super) fn unchanged(&self, (stage, index, bucket): Place) -> bool {
        let stages = if bucket { &self.keyed } else { &self.groups };
        stages.get(&stage).is_some_and(|c| !c.contains(&index))
    }
}

/// `checkpoint` as its manifest and its parts, each (place, name, bytes): every part, or
/// with `changed` only those it says changed (the checkpoint holds no windows of the others,
/// and empty buckets for them). The manifest names none: the writer names them. Each part's
/// content is put in a fixed order first, so that the same state gives the same bytes.
pub(super) fn split(
    mut checkpoint: Checkpoint,
    changed: Option<&Changed>,
) -> (Checkpoint, Vec<(Place, String, Vec<u8>)>) {
    let unchanged = |place: Place| changed.is_some_and(|c| c.unchanged(place));
    let mut parts = Vec::new();
    for group in &mut checkpoint.groups {
        let mut by_part: Vec<Vec<WindowState>> = vec![Vec::new(); PARTS];
        for w in group.windows.drain(..) {
            by_part[part_of(&w.key) as usize].push(w);
        }
        for (index, mut windows) in by_part.into_iter().enumerate() {
            if windows.is_empty() {
                continue;
            }
            windows.sort_by(|a, b| (&a.key, &a.window).cmp(&(&b.key, &b.window)));
            parts.push(PartState {
                stage: group.stage,
                index: index as u32,
                windows,
                bucket: None,
            });
        }
    }
    for keyed in &mut checkpoint.keyed {
        for (index, mut bucket) in keyed.buckets.drain(..).enumerate() {
            if unchanged((keyed.stage, index as u32, true)) {
                continue;
            }
            let id = |s: &Option<super::StateId>| s.as_ref().map(Message::encode_to_vec);
            bucket.bags.sort_by_key(|b| id(&b.id));
            bucket.lists.sort_by_key(|l| id(&l.id));
            bucket.timers.sort_by(|a, b| {
                (&a.transform, &a.family, &a.identity).cmp(&(&b.transform, &b.family, &b.identity))
            });
            parts.push(PartState {
                stage: keyed.stage,
                index: index as u32,
                windows: Vec::new(),
                bucket: Some(bucket),
            });
        }
    }
    let parts = parts
        .into_iter()
        .map(|p| {
            let place = (p.stage, p.index, p.bucket.is_some());
            let bytes = p.encode_to_vec();
            let name = format!("part-{}.pb", &hex::encode(Sha256::digest(&bytes))[..32]);
            (place, name, bytes)
        })
        .collect();
    checkpoint.parts.clear();
    (checkpoint, parts)
}

/// Whether a file of the checkpoint folder is a part (by its name).
pub(super) fn is_part(name: &str) -> bool {
    name.strip_prefix("part-")
        .and_then(|rest| rest.strip_suffix(".pb"))
        .is_some_and(|hash| hash.len() == 32 && hash.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The checkpoint `manifest` and its `parts` make.
pub(super) fn join(mut manifest: Checkpoint, parts: Vec<PartState>) -> Checkpoint {
    for part in parts {
        match part.bucket {
            Some(bucket) => {
                let keyed = match manifest.keyed.iter_mut().find(|k| k.stage == part.stage) {
                    Some(k) => k,
                    None => {
                        manifest.keyed.push(KeyedState {
                            stage: part.stage,
                            buckets: Vec::new(),
                        });
                        manifest.keyed.last_mut().expect("pushed")
                    }
                };
                let index = part.index as usize;
                if keyed.buckets.len() <= index {
                    keyed.buckets.resize(index + 1, BucketState::default());
                }
                keyed.buckets[index] = bucket;
            }
            None => {
                let group = match manifest.groups.iter_mut().find(|g| g.stage == part.stage) {
                    Some(g) => g,
                    None => {
                        manifest.groups.push(GroupState {
                            stage: part.stage,
                            ..GroupState::default()
                        });
                        manifest.groups.last_mut().expect("pushed")
                    }
                };
                group.windows.extend(part.windows);
            }
        }
    }
    manifest.parts.clear();
    manifest
}

/// The part a key's windows go to (the same in every process: SipHash with fixed keys).
pub(crate) fn part_of(key: &[u8]) -> u32 {
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    (h.finish() % PARTS as u64) as u32
}
