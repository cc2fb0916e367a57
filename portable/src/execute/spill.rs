//! Where a job's materialized PCollections live: blocks of encoded elements in memory while the
//! job holds less than its memory budget, past it appended to the job's spill file and read
//! back when a stage takes them. A stage then holds the bundles it is running, not its whole
//! input; a GroupByKey larger than the budget groups one hash partition of keys at a time.
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use prost::bytes::Bytes;

use crate::error::PortableError;

/// A block of whole encoded elements, in memory or in the spill file.
#[derive(Debug, Clone)]
pub(crate) enum Block {
    Memory(Bytes),
    Disk { at: u64, len: usize },
}

impl Block {
    pub(crate) fn len(&self) -> usize {
        match self {
            Block::Memory(b) => b.len(),
            Block::Disk { len, .. } => *len,
        }
    }
}

pub(crate) struct Spill {
    budget: usize,
    held: AtomicUsize,
    spilled: AtomicU64,
    /// The spill file (unlinked: gone with the job, even a killed one) and its length, opened
    /// at the first block past the budget.
    file: Mutex<Option<(File, u64)>>,
}

fn failed(e: impl std::fmt::Display) -> PortableError {
    PortableError::Spill(e.to_string())
}

impl Spill {
    /// A store keeping up to `budget` bytes in memory, the rest in a temporary file.
    pub(crate) fn new(budget: usize) -> Spill {
        Spill {
            budget,
            held: AtomicUsize::new(0),
            spilled: AtomicU64::new(0),
            file: Mutex::new(None),
        }
    }

    pub(crate) fn budget(&self) -> usize {
        self.budget
    }

    /// Bytes written to disk so far.
    pub(crate) fn spilled(&self) -> u64 {
        self.spilled.load(Ordering::Relaxed)
    }

    /// Keeps `bytes`: in memory while under the budget, else in the spill file.
    pub(crate) fn keep(&self, bytes: Bytes) -> Result<Block, PortableError> {
        let len = bytes.len();
        let held = self.held.fetch_add(len, Ordering::Relaxed);
        if held + len <= self.budget {
            return Ok(Block::Memory(bytes));
        }
        self.held.fetch_sub(len, Ordering::Relaxed);
        let mut file = self.file.lock().expect("spill file");
        if file.is_none() {
            *file = Some((tempfile::tempfile().map_err(failed)?, 0));
        }
        let (f, end) = file.as_mut().expect("opened");
        f.write_all(&bytes).map_err(failed)?;
        let at = *end;
        *end += len as u64;
        self.spilled.fetch_add(len as u64, Ordering::Relaxed);
        Ok(Block::Disk { at, len })
    }

    /// The block's bytes (read back from the spill file when it is there).
    pub(crate) fn load(&self, block: &Block) -> Result<Bytes, PortableError> {
        match block {
            Block::Memory(b) => Ok(b.clone()),
            Block::Disk { at, len } => {
                let file = self.file.lock().expect("spill file");
                let (f, _) = file.as_ref().ok_or_else(|| failed("no spill file"))?;
                let mut buf = vec![0u8; *len];
                f.read_exact_at(&mut buf, *at).map_err(failed)?;
                Ok(Bytes::from(buf))
            }
        }
    }

    pub(crate) fn load_all(&self, blocks: &[Block]) -> Result<Vec<Bytes>, PortableError> {
        blocks.iter().map(|b| self.load(b)).collect()
    }

    /// Gives back the memory of blocks no stage reads any more (the file's space stays until
    /// the job's store is dropped).
    pub(crate) fn release(&self, blocks: &[Block]) {
        let freed: usize = blocks
            .iter()
            .map(|b| match b {
                Block::Memory(b) => b.len(),
                Block::Disk { .. } => 0,
            })
            .sum();
        self.held.fetch_sub(
            freed.min(self.held.load(Ordering::Relaxed)),
            Ordering::Relaxed,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_past_the_budget_go_to_disk_and_come_back_whole() {
        let spill = Spill::new(10);
        let a = spill.keep(Bytes::from_static(b"0123456")).unwrap();
        let b = spill.keep(Bytes::from_static(b"abcdef")).unwrap();
        let c = spill.keep(Bytes::from_static(b"xyz")).unwrap();
        assert!(matches!(a, Block::Memory(_)));
        assert!(matches!(b, Block::Disk { at: 0, len: 6 }));
        assert!(matches!(c, Block::Memory(_)), "still room for 3 bytes");
        assert_eq!(spill.load(&b).unwrap(), Bytes::from_static(b"abcdef"));
        assert_eq!(spill.spilled(), 6);
        spill.release(&[a, b]);
        let d = spill.keep(Bytes::from_static(b"0123456")).unwrap();
        assert!(
            matches!(d, Block::Memory(_)),
            "released memory is used again"
        );
    }
}
