//! Reading a byte range of a line-oriented file (CSV, JSON lines, text).
//!
//! Rule that makes splits exact: a line belongs to the split holding its first
//! byte. So a reader of `[start, end)` skips the partial line at `start` (unless
//! `start == 0`) and reads through the line that crosses `end`. Concretely the
//! effective range is `[f(start), f(end))` with `f(0) = 0` and `f(x)` = one past
//! the first `\n` at or after `x - 1` (or EOF); `f` is monotone, so ranges that
//! tile the file give line sets that tile it too.
//!
//! Chunks are handed out aligned to line ends (every chunk but possibly the last,
//! at EOF, ends with `\n`), so decoders can attribute errors to lines.
//!
//! Planning cuts each file into such ranges ([`line_splits`]).

use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};
use tokio::sync::mpsc;

use super::super::IoError;
use super::super::location::Resolved;
use super::{CsvLayout, Split, SplitKind};

/// Bytes fetched per request while inside the split.
pub(super) const BLOCK_BYTES: u64 = 8 << 20;
/// Bytes fetched per request when looking past `end` for the end of the last line.
pub(super) const LOOKAHEAD_BYTES: u64 = 64 << 10;

fn find_newline(data: &[u8]) -> Option<usize> {
    data.iter().position(|&b| b == b'\n')
}

pub(super) fn count_newlines(data: &[u8]) -> usize {
    data.iter().filter(|&&b| b == b'\n').count()
}

/// Byte-range splits of about `target` bytes for each non-empty file.
pub(super) fn line_splits(
    resolved: &Resolved,
    files: &[ObjectMeta],
    target: u64,
    csv: Option<CsvLayout>,
) -> Vec<Split> {
    let mut splits = Vec::new();
    for file in files.iter().filter(|f| f.size > 0) {
        let location = resolved.display_path(&file.location);
        let n = file.size.div_ceil(target).max(1);
        let chunk = file.size.div_ceil(n);
        let mut start = 0;
        while start < file.size {
            let end = (start + chunk).min(file.size);
            splits.push(Split {
                location: location.clone(),
                kind: SplitKind::Lines { start, end },
                estimated_bytes: end - start,
                file_size: file.size,
                estimated_rows: None,
                csv: csv.clone(),
            });
            start = end;
        }
    }
    splits
}

/// Where one file range is read from.
pub(super) struct LineRange {
    pub store: Arc<dyn ObjectStore>,
    pub path: Path,
    /// The location as shown to users, for errors.
    pub shown: String,
    pub file_size: u64,
    pub start: u64,
    pub end: u64,
    /// Request size inside the range ([`BLOCK_BYTES`]; small in tests).
    pub block: u64,
    /// Request size past the range ([`LOOKAHEAD_BYTES`]; small in tests).
    pub lookahead: u64,
}

/// Starts a task that fetches the range and sends line-aligned chunks. The task
/// stops early when the receiver is dropped. Fetching runs ahead of decoding by
/// up to two chunks so I/O overlaps CPU work.
pub(super) fn spawn_line_reader(range: LineRange) -> mpsc::Receiver<Result<Bytes, IoError>> {
    let (tx, rx) = mpsc::channel(2);
    tokio::spawn(async move {
        if let Err(e) = read_range(&range, &tx).await {
            // The receiver may be gone; then nobody cares about the error either.
            let _ = tx.send(Err(e)).await;
        }
    });
    rx
}

/// Re-cuts arbitrary pieces into chunks ending with `\n`, holding back the tail.
struct Aligner<'a> {
    tx: &'a mpsc::Sender<Result<Bytes, IoError>>,
    carry: Vec<u8>,
}

impl Aligner<'_> {
    /// Returns false when the receiver has gone away.
    async fn push(&mut self, piece: Bytes) -> bool {
        let Some(last) = piece.iter().rposition(|&b| b == b'\n') else {
            self.carry.extend_from_slice(&piece);
            return true;
        };
        let mut body_from = 0;
        if !self.carry.is_empty() {
            // Stitch the held-back partial line to the start of this piece; copy
            // only that one line, not the whole piece.
            let first = find_newline(&piece).unwrap_or(last);
            self.carry.extend_from_slice(&piece[..=first]);
            let stitched = Bytes::from(std::mem::take(&mut self.carry));
            if self.tx.send(Ok(stitched)).await.is_err() {
                return false;
            }
            body_from = first + 1;
        }
        if body_from <= last
            && self
                .tx
                .send(Ok(piece.slice(body_from..=last)))
                .await
                .is_err()
        {
            return false;
        }
        self.carry.extend_from_slice(&piece[last + 1..]);
        true
    }

    async fn finish(self) {
        if !self.carry.is_empty() {
            let _ = self.tx.send(Ok(Bytes::from(self.carry))).await;
        }
    }
}

async fn read_range(
    r: &LineRange,
    tx: &mpsc::Sender<Result<Bytes, IoError>>,
) -> Result<(), IoError> {
    let end = r.end.min(r.file_size);
    if r.start >= end {
        return Ok(());
    }
    // Look at the byte before `start` too: if it is '\n', `start` begins a line.
    let mut pos = r.start.saturating_sub(1);
    let mut skipping = r.start > 0;
    let last_byte_of_range = end - 1;
    let mut aligner = Aligner {
        tx,
        carry: Vec::new(),
    };
    while pos < r.file_size {
        let to = if pos < end {
            (pos + r.block.max(1)).min(end)
        } else {
            (pos + r.lookahead.max(1)).min(r.file_size)
        };
        let data = r
            .store
            .get_range(&r.path, pos..to)
            .await
            .map_err(|e| IoError::store("read", r.shown.clone(), e))?;
        if data.len() as u64 != to - pos {
            return Err(IoError::Parse {
                format: "file",
                location: r.shown.clone(),
                position: format!(" byte {pos}"),
                message: format!(
                    "expected {} bytes, got {} (file changed while reading?)",
                    to - pos,
                    data.len()
                ),
            });
        }
        let mut from = 0usize;
        if skipping {
            match find_newline(&data) {
                Some(i) => {
                    from = i + 1;
                    skipping = false;
                    if pos + from as u64 > last_byte_of_range {
                        // The first line starting in the range starts at or after `end`.
                        return Ok(());
                    }
                }
                None => {
                    pos = to;
                    continue;
                }
            }
        }
        // Stop after the first '\n' at or after the range's last byte.
        let mut upto = data.len();
        let mut done = false;
        if last_byte_of_range < to {
            let search_from = (last_byte_of_range.saturating_sub(pos) as usize).max(from);
            if let Some(i) = find_newline(&data[search_from..]) {
                upto = search_from + i + 1;
                done = true;
            }
        }
        if from < upto && !aligner.push(data.slice(from..upto)).await {
            return Ok(());
        }
        if done {
            break;
        }
        pos = to;
    }
    aligner.finish().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;

    async fn read_all(
        store: Arc<dyn ObjectStore>,
        size: u64,
        start: u64,
        end: u64,
        block: u64,
    ) -> Vec<u8> {
        let mut rx = spawn_line_reader(LineRange {
            store,
            path: Path::from("f"),
            shown: "f".into(),
            file_size: size,
            start,
            end,
            block,
            lookahead: block.div_ceil(2),
        });
        let mut out = Vec::new();
        let mut chunks = Vec::new();
        while let Some(chunk) = rx.recv().await {
            let chunk = chunk.expect("chunk");
            chunks.push(chunk.clone());
            out.extend_from_slice(&chunk);
        }
        // every chunk but the last ends with a newline
        for c in chunks.iter().rev().skip(1) {
            assert_eq!(c.last(), Some(&b'\n'));
        }
        out
    }

    #[tokio::test]
    async fn ranges_tile_lines_exactly() {
        let cases: [&[u8]; 5] = [
            b"aaa\nbb\n\nc\ndddddddd\ne",
            b"aaa\nbb\n\nc\ndddddddd\ne\n",
            b"\n\n\n",
            b"x",
            b"one long line without newline at all",
        ];
        for content in cases {
            let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
            store
                .put(&Path::from("f"), content.to_vec().into())
                .await
                .expect("put");
            let size = content.len() as u64;
            for block in [1, 2, 3, 5, 64] {
                for step in 1..=size + 1 {
                    let mut all = Vec::new();
                    let mut start = 0;
                    while start < size {
                        let end = (start + step).min(size);
                        all.extend(read_all(Arc::clone(&store), size, start, end, block).await);
                        start = end;
                    }
                    assert_eq!(all, content, "step {step} block {block}");
                }
            }
        }
    }
}
