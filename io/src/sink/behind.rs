//! A local temp part written behind its encoder: each encoded chunk goes to the file on a
//! blocking thread while the next batch is encoded, at most one chunk in flight.
//!
//! Why: a sink's bytes are copied into the page cache by `write(2)`, which costs as much as
//! encoding them when the output is large (Nexmark Q0: ~170 bytes a row). Through
//! `object_store`'s buffered writer a part under its 10 MiB buffer is written whole when it is
//! closed, on the encoder's own time. Remote stores keep that writer (their parts are uploaded
//! concurrently once large); this is for local paths only.
//!
//! A part is a temp file until the sink's commit renames it, so it need not appear atomically:
//! a part whose writer fails or is dropped is never reported, and is removed with its job's
//! temp directory.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;

use bytes::Bytes;
use tokio::task::JoinHandle;

/// The file, or the write under way that hands it back, or how a write failed (every later
/// call fails with it: a part with a hole is never finished).
enum Slot {
    Idle(Option<File>),
    Writing(JoinHandle<std::io::Result<File>>),
    Failed(std::io::ErrorKind, String),
}

pub(super) struct BehindWriter {
    path: PathBuf,
    slot: Slot,
}

impl BehindWriter {
    /// Nothing is created until the first chunk.
    pub(super) fn new(path: PathBuf) -> Self {
        BehindWriter {
            path,
            slot: Slot::Idle(None),
        }
    }

    /// Hands `chunk` to a blocking thread once the previous chunk is written.
    pub(super) async fn put(&mut self, chunk: Bytes) -> std::io::Result<()> {
        let file = self.settle().await?;
        let path = self.path.clone();
        self.slot = Slot::Writing(tokio::task::spawn_blocking(move || {
            let mut file = match file {
                Some(file) => file,
                None => create(&path)?,
            };
            file.write_all(&chunk)?;
            Ok(file)
        }));
        Ok(())
    }

    /// Waits for the last chunk; the file is complete when this returns.
    pub(super) async fn finish(mut self) -> std::io::Result<()> {
        self.settle().await.map(drop)
    }

    /// Waits for any write under way, then removes the file.
    pub(super) async fn abort(mut self) {
        let _ = self.settle().await;
        let _ = tokio::fs::remove_file(&self.path).await;
    }

    async fn settle(&mut self) -> std::io::Result<Option<File>> {
        let written = match std::mem::replace(&mut self.slot, Slot::Idle(None)) {
            Slot::Idle(file) => return Ok(file),
            Slot::Failed(kind, message) => Err(std::io::Error::new(kind, message)),
            Slot::Writing(write) => write.await.map_err(std::io::Error::other).and_then(|r| r),
        };
        written.map(Some).inspect_err(|e| {
            self.slot = Slot::Failed(e.kind(), e.to_string());
        })
    }
}

fn create(path: &std::path::Path) -> std::io::Result<File> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    File::create(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn chunks_arrive_in_order_and_abort_removes_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/part");
        let mut out = BehindWriter::new(path.clone());
        assert!(!path.exists(), "nothing is created before the first chunk");
        for i in 0..100 {
            out.put(Bytes::from(format!("{i}\n"))).await.unwrap();
        }
        out.finish().await.unwrap();
        let expected: String = (0..100).map(|i| format!("{i}\n")).collect();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), expected);

        let mut out = BehindWriter::new(path.clone());
        out.put(Bytes::from_static(b"x\n")).await.unwrap();
        out.abort().await;
        assert!(!path.exists());
    }

    #[tokio::test]
    async fn a_failed_write_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        // A plain file where the part's directory should be: creating the part fails.
        std::fs::write(dir.path().join("plain"), b"").unwrap();
        let mut out = BehindWriter::new(dir.path().join("plain/part"));
        out.put(Bytes::from_static(b"x\n")).await.unwrap();
        assert!(out.finish().await.is_err());

        // Reported by the next chunk, and again when the part is finished.
        let mut out = BehindWriter::new(dir.path().join("plain/part"));
        out.put(Bytes::from_static(b"x\n")).await.unwrap();
        let first = out.put(Bytes::from_static(b"y\n")).await.unwrap_err();
        let again = out.finish().await.unwrap_err();
        assert_eq!(
            (again.kind(), again.to_string()),
            (first.kind(), first.to_string())
        );
    }
}
