//! Shuffle data at rest. A producer item writes, for each (consumer stage, input, partition) it
//! feeds, one Arrow IPC stream file in a directory of its own attempt; a consumer reads the
//! files of its partition in the producers' canonical order, from the local disk or over HTTP
//! from the worker that wrote them. Files of an attempt that did not win are never read.
use crate::error::RunError;
use arrow::buffer::Buffer;
use arrow::ipc::reader::StreamDecoder;
use arrow::ipc::writer::StreamWriter;
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

/// Where one shuffle file goes: (consumer stage, index of the consumer's input, partition).
pub type ShuffleKey = (usize, usize, u32);

/// A shuffle file an item wrote, as reported to the coordinator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShuffleFile {
    pub consumer: usize,
    pub input: usize,
    pub partition: u32,
    /// Path relative to the shuffle root of the worker that wrote it.
    pub path: String,
    pub rows: u64,
    pub bytes: u64,
}

/// A shuffle file a consumer item must read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShuffleRef {
    /// The producing item (recomputed if this file cannot be read).
    pub producer: u64,
    /// `host:port` of the worker holding it; empty when it is on this machine's shuffle root.
    pub address: String,
    pub path: String,
}

/// The directory of one attempt of one item, relative to the shuffle root.
pub fn attempt_dir(job: &str, stage: usize, item: u64, attempt: u32) -> String {
    format!("{job}/s{stage}-i{item}-a{attempt}")
}

/// Writes an item's shuffle output, one IPC stream file per destination.
pub struct ShuffleWriter {
    root: PathBuf,
    dir: String,
    files: BTreeMap<ShuffleKey, (StreamWriter<BufWriter<File>>, u64)>,
}

impl ShuffleWriter {
    pub fn new(root: &Path, dir: String) -> Self {
        ShuffleWriter {
            root: root.to_path_buf(),
            dir,
            files: BTreeMap::new(),
        }
    }

    pub fn write(&mut self, key: ShuffleKey, batch: &RecordBatch) -> Result<(), RunError> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let io = |e: std::io::Error| RunError::Internal(format!("writing shuffle data: {e}"));
        if !self.files.contains_key(&key) {
            let dir = self.root.join(&self.dir);
            std::fs::create_dir_all(&dir).map_err(io)?;
            let file = File::create(dir.join(file_name(key))).map_err(io)?;
            let w = StreamWriter::try_new(BufWriter::new(file), &batch.schema())
                .map_err(|e| RunError::Internal(format!("writing shuffle data: {e}")))?;
            self.files.insert(key, (w, 0));
        }
        let (w, rows) = self.files.get_mut(&key).expect("inserted");
        w.write(batch)
            .map_err(|e| RunError::Internal(format!("writing shuffle data: {e}")))?;
        *rows += batch.num_rows() as u64;
        Ok(())
    }

    /// Closes every file and describes them.
    pub fn finish(self) -> Result<Vec<ShuffleFile>, RunError> {
        let mut out = vec![];
        for ((consumer, input, partition), (mut w, rows)) in self.files {
            w.finish()
                .map_err(|e| RunError::Internal(format!("writing shuffle data: {e}")))?;
            let path = format!("{}/{}", self.dir, file_name((consumer, input, partition)));
            let bytes = std::fs::metadata(self.root.join(&path))
                .map(|m| m.len())
                .unwrap_or(0);
            out.push(ShuffleFile {
                consumer,
                input,
                partition,
                path,
                rows,
                bytes,
            });
        }
        Ok(out)
    }

    /// Drops a failed attempt's files.
    pub fn abort(self) {
        let dir = self.root.join(&self.dir);
        drop(self.files);
        let _ = std::fs::remove_dir_all(dir);
    }
}

fn file_name((consumer, input, partition): ShuffleKey) -> String {
    format!("c{consumer}-i{input}-p{partition}.arrows")
}

/// Rejects paths that could leave the shuffle root (they come from the network).
pub fn safe_relative(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('\\'))
}

/// Decodes an IPC stream arriving in chunks of any size.
pub fn decode<S, E>(chunks: S) -> impl Stream<Item = Result<RecordBatch, String>> + Send
where
    S: Stream<Item = Result<Bytes, E>> + Send + Unpin + 'static,
    E: std::fmt::Display,
{
    futures::stream::unfold(
        (
            chunks,
            StreamDecoder::new(),
            Buffer::from(Vec::<u8>::new()),
            false,
        ),
        |(mut chunks, mut dec, mut buf, done)| async move {
            if done {
                return None;
            }
            loop {
                if !buf.is_empty() {
                    match dec.decode(&mut buf) {
                        Ok(Some(b)) => return Some((Ok(b), (chunks, dec, buf, false))),
                        Ok(None) => {}
                        Err(e) => return Some((Err(e.to_string()), (chunks, dec, buf, true))),
                    }
                    if !buf.is_empty() {
                        continue;
                    }
                }
                match chunks.next().await {
                    Some(Ok(c)) => buf = Buffer::from(c),
                    Some(Err(e)) => return Some((Err(e.to_string()), (chunks, dec, buf, true))),
                    None => {
                        return match dec.finish() {
                            Ok(()) => None,
                            Err(e) => Some((Err(e.to_string()), (chunks, dec, buf, true))),
                        };
                    }
                }
            }
        },
    )
}

/// Reads a local shuffle file as a stream of batches.
pub fn read_local(path: PathBuf) -> BoxStream<'static, Result<RecordBatch, String>> {
    decode(file_chunks(path)).boxed()
}

/// A file as a stream of chunks of at most 1 MiB (served to other workers, or decoded here).
pub fn file_chunks(path: PathBuf) -> BoxStream<'static, Result<Bytes, String>> {
    futures::stream::unfold(None, move |file: Option<tokio::fs::File>| {
        let path = path.clone();
        async move {
            use tokio::io::AsyncReadExt;
            let mut file = match file {
                Some(f) => f,
                None => match tokio::fs::File::open(&path).await {
                    Ok(f) => f,
                    Err(e) => {
                        return Some((Err(format!("{}: {e}", path.display())), None));
                    }
                },
            };
            let mut buf = vec![0u8; 1 << 20];
            match file.read(&mut buf).await {
                Ok(0) => None,
                Ok(n) => {
                    buf.truncate(n);
                    Some((Ok(Bytes::from(buf)), Some(file)))
                }
                Err(e) => Some((Err(format!("{}: {e}", path.display())), None)),
            }
        }
    })
    .boxed()
}

/// How a consumer opens the shuffle files it reads.
pub trait Fetch: Send + Sync {
    fn open(&self, file: &ShuffleRef) -> BoxStream<'static, Result<RecordBatch, String>>;
}

/// Reads every file from one local shuffle root (the in-process runner).
pub struct LocalFetch(pub PathBuf);

impl Fetch for LocalFetch {
    fn open(&self, file: &ShuffleRef) -> BoxStream<'static, Result<RecordBatch, String>> {
        read_local(self.0.join(&file.path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    #[tokio::test]
    async fn writes_and_reads_back_in_any_chunking() {
        let dir = tempfile::tempdir().unwrap();
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        let mut w = ShuffleWriter::new(dir.path(), attempt_dir("job", 1, 7, 2));
        for i in 0..3 {
            let b = RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(Int64Array::from(vec![i, i + 10]))],
            )
            .unwrap();
            w.write((2, 0, 5), &b).unwrap();
        }
        let files = w.finish().unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].path, "job/s1-i7-a2/c2-i0-p5.arrows");
        assert_eq!(files[0].rows, 6);
        let whole = std::fs::read(dir.path().join(&files[0].path)).unwrap();
        for chunk in [1usize, 7, 100, whole.len()] {
            let chunks: Vec<Result<Bytes, String>> = whole
                .chunks(chunk)
                .map(|c| Ok(Bytes::copy_from_slice(c)))
                .collect();
            let got: Vec<RecordBatch> = decode(futures::stream::iter(chunks))
                .map(|b| b.unwrap())
                .collect()
                .await;
            let n: usize = got.iter().map(|b| b.num_rows()).sum();
            assert_eq!(n, 6, "chunk size {chunk}");
        }
        let local: Vec<_> = LocalFetch(dir.path().to_path_buf())
            .open(&ShuffleRef {
                producer: 7,
                address: String::new(),
                path: files[0].path.clone(),
            })
            .collect()
            .await;
        assert_eq!(local.len(), 3);
        // A truncated file is an error, not a silent short read.
        let cut: Vec<Result<Bytes, String>> =
            vec![Ok(Bytes::copy_from_slice(&whole[..whole.len() / 2]))];
        let got: Vec<_> = decode(futures::stream::iter(cut)).collect().await;
        assert!(got.iter().any(|r| r.is_err()), "{got:?}");
    }

    #[test]
    fn paths_from_the_network_stay_inside_the_root() {
        assert!(safe_relative("job/s1-i7-a2/c2-i0-p5.arrows"));
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a//b",
            "a/./b",
            "a\\..\\b",
        ] {
            assert!(!safe_relative(bad), "{bad}");
        }
    }
}
