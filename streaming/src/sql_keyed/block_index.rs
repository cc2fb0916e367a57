//! Which kept blocks hold a key: each key hash's blocks, made from the blocks' key lists (the
//! `k` namespace) and kept up to date with every change to them. A firing looks up its keys
//! here instead of testing every kept block's list, which grew with the state: a join over
//! the global window kept a block per checkpoint and input, and each firing went through
//! every one of them (Nexmark Q4's join and kept aggregates spent about a third of their
//! time there after a minute and a half).
//!
//! It lives in memory beside the open store (`ShardStore::keep_memo`) and is made again from
//! the key lists when the store is opened or restored.
use super::{Block, KEYS, key_list};
use crate::sql_shard::Change;
use crate::state::{ShardStore, StateError};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::HashSet;

/// A block, as the index names it: its input in the top 16 bits, its checkpoint below (a
/// checkpoint past 2^48 shares its name with another block: the index then finds both, which
/// only makes a firing read one block needlessly).
type BlockId = u64;

fn id_of(input: usize, checkpoint: u64) -> BlockId {
    ((input as u64) << 48) | (checkpoint & ((1 << 48) - 1))
}

/// A block's store key (`Block::key`: input, checkpoint), as an id.
fn id_of_key(key: &[u8]) -> Option<BlockId> {
    let input = u16::from_be_bytes(key.get(..2)?.try_into().ok()?);
    let checkpoint = u64::from_be_bytes(key.get(2..10)?.try_into().ok()?);
    Some(id_of(input as usize, checkpoint))
}

#[derive(Default)]
pub(super) struct BlockIndex {
    /// The block of each key hash in one block (almost every key: an auction's row is in
    /// one block). Keys are hashes already, so a multiply is hash enough (FxHash).
    one: FxHashMap<u64, BlockId>,
    /// All blocks of each key hash in more than one.
    many: FxHashMap<u64, Vec<BlockId>>,
    /// The blocks indexed: one without a key list may hold any key.
    listed: FxHashSet<BlockId>,
}

impl BlockIndex {
    /// The index of the store's key lists: the one kept with the open store, else made from
    /// them.
    pub(super) fn of(store: &mut ShardStore) -> Result<BlockIndex, StateError> {
        if let Some(index) = store.take_memo::<BlockIndex>() {
            return Ok(index);
        }
        let mut index = BlockIndex::default();
        for (key, list) in store.scan(KEYS)? {
            if let Some(id) = id_of_key(&key) {
                index.insert(id, &list);
            }
        }
        Ok(index)
    }

    /// Follows `changes`, about to be applied to `store` (which still holds the lists they
    /// replace): each block's key list written or deleted, in the order given. The lists are
    /// not kept here (they are on disk, and as large as the index), so the one a change
    /// replaces is read back: from the store, or from an earlier change of the same block.
    pub(super) fn follow(
        &mut self,
        store: &ShardStore,
        changes: &[Change],
    ) -> Result<(), StateError> {
        let mut written: FxHashMap<BlockId, Option<&[u8]>> = FxHashMap::default();
        for (ns, key, value) in changes {
            if *ns != KEYS {
                continue;
            }
            let Some(id) = id_of_key(key) else { continue };
            match written.get(&id) {
                Some(Some(old)) => self.remove(id, old),
                Some(None) => {}
                None if self.listed.contains(&id) => {
                    if let Some(old) = store.get(KEYS, key)? {
                        self.remove(id, &old);
                    }
                }
                None => {}
            }
            self.listed.remove(&id);
            if let Some(list) = value {
                self.insert(id, list);
            }
            written.insert(id, value.as_deref());
        }
        Ok(())
    }

    /// The blocks holding any of `keys`.
    pub(super) fn holding(&self, keys: &HashSet<u64>) -> Holding<'_> {
        let mut found = FxHashSet::default();
        for h in keys {
            if let Some(id) = self.one.get(h) {
                found.insert(*id);
            } else if let Some(ids) = self.many.get(h) {
                found.extend(ids.iter().copied());
            }
        }
        Holding { index: self, found }
    }

    fn insert(&mut self, id: BlockId, list: &[u8]) {
        for h in key_list(list) {
            if let Some(ids) = self.many.get_mut(&h) {
                ids.push(id);
            } else if let Some(other) = self.one.insert(h, id) {
                self.one.remove(&h);
                self.many.insert(h, vec![other, id]);
            }
        }
        self.listed.insert(id);
    }

    fn remove(&mut self, id: BlockId, list: &[u8]) {
        for h in key_list(list) {
            if self.one.get(&h) == Some(&id) {
                self.one.remove(&h);
            } else if let Some(ids) = self.many.get_mut(&h) {
                ids.retain(|i| *i != id);
                match ids[..] {
                    [] => {
                        self.many.remove(&h);
                    }
                    [last] => {
                        self.many.remove(&h);
                        self.one.insert(h, last);
                    }
                    _ => {}
                }
            }
        }
        self.listed.remove(&id);
    }
}

/// The blocks found by [`BlockIndex::holding`].
pub(super) struct Holding<'i> {
    index: &'i BlockIndex,
    found: FxHashSet<BlockId>,
}

impl Holding<'_> {
    /// Whether `b` may hold one of the keys: found, or without a key list (so unknown).
    pub(super) fn holds(&self, b: &Block) -> bool {
        let id = id_of(b.input, b.checkpoint);
        self.found.contains(&id) || !self.index.listed.contains(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(input: usize, checkpoint: u64) -> Block {
        Block {
            input,
            checkpoint,
            oldest: 0,
            newest: 0,
            rows: 1,
        }
    }

    fn list(hashes: &[u64]) -> Option<Vec<u8>> {
        Some(hashes.iter().flat_map(|h| h.to_be_bytes()).collect())
    }

    fn keys(hashes: &[u64]) -> HashSet<u64> {
        hashes.iter().copied().collect()
    }

    /// The index follows `changes` and the store takes them, as a shard's checkpoint does.
    fn apply(index: &mut BlockIndex, store: &mut ShardStore, changes: Vec<Change>) {
        index.follow(store, &changes).unwrap();
        store.apply_owned(changes).unwrap();
    }

    #[test]
    fn a_block_is_found_by_its_keys_until_it_is_rewritten_or_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = ShardStore::open(dir.path(), 0, 1 << 20).unwrap();
        let (a, b, c) = (block(0, 1), block(1, 1), block(1, 2));
        let mut index = BlockIndex::default();
        apply(
            &mut index,
            &mut store,
            vec![
                (KEYS, a.key(), list(&[1, 2])),
                (KEYS, b.key(), list(&[2, 3])),
                (KEYS, c.key(), list(&[2])),
            ],
        );
        let found = index.holding(&keys(&[1]));
        assert!(found.holds(&a) && !found.holds(&b) && !found.holds(&c));
        let found = index.holding(&keys(&[2]));
        assert!(found.holds(&a) && found.holds(&b) && found.holds(&c));
        assert!(!index.holding(&keys(&[4])).holds(&a));

        // a rewritten without key 2 (deleted, then written again in the same changes), b
        // and c dropped: key 2 is nowhere, and blocks without a key list may hold anything.
        apply(
            &mut index,
            &mut store,
            vec![
                (KEYS, a.key(), None),
                (KEYS, a.key(), list(&[1])),
                (KEYS, b.key(), None),
                (KEYS, c.key(), list(&[5])),
                (KEYS, c.key(), None),
            ],
        );
        let found = index.holding(&keys(&[2, 3]));
        assert!(!found.holds(&a));
        assert!(!index.one.contains_key(&2) && !index.many.contains_key(&2));
        assert!(index.one.is_empty() || index.one.keys().all(|h| *h == 1));
        assert!(index.holding(&keys(&[1])).holds(&a));
        assert!(found.holds(&b) && found.holds(&c));

        // Made again from the store's lists (a store opened again), it finds the same.
        let again = BlockIndex::of(&mut store).unwrap();
        assert_eq!(again.one, index.one);
        assert_eq!(again.listed, index.listed);
        assert!(again.many.is_empty());
    }

    #[test]
    fn other_namespaces_leave_the_index_alone() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = ShardStore::open(dir.path(), 0, 1 << 20).unwrap();
        let a = block(0, 7);
        let mut index = BlockIndex::default();
        let changes = vec![(KEYS, a.key(), list(&[9])), ("r", a.key(), None)];
        apply(&mut index, &mut store, changes);
        assert!(index.holding(&keys(&[9])).holds(&a));
        assert!(!index.holding(&keys(&[8])).holds(&a));
    }

    #[test]
    fn the_index_kept_with_the_store_is_the_one_taken_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = ShardStore::open(dir.path(), 0, 1 << 20).unwrap();
        let mut index = BlockIndex::of(&mut store).unwrap();
        // Followed but not applied: only the kept index knows the block.
        index
            .follow(&store, &[(KEYS, block(0, 3).key(), list(&[4]))])
            .unwrap();
        store.keep_memo(index);
        let kept = BlockIndex::of(&mut store).unwrap();
        assert_eq!(kept.one.get(&4), Some(&id_of(0, 3)));
        // Taken, so the next one is made from the store again.
        assert!(BlockIndex::of(&mut store).unwrap().one.is_empty());
    }
}
