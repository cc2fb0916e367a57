//! Shuffle data at rest. A producer item writes, for each (consumer stage, input, partition) it
//! feeds, one Arrow IPC stream; the streams are buffered and written back to back into one file
//! of the attempt (`{job}/s{stage}-i{item}-a{attempt}.arrows`), each found by its byte range, so
//! an item makes one file however many partitions it feeds (and no directory: on ext4 a new
//! inode costs ~0.3 ms of CPU). Past [`MEMORY_LIMIT`] of buffered output, every stream goes to a
//! file of its own instead (the same name, `-c{consumer}-i{input}-p{partition}` added), so
//! memory stays bounded. A consumer reads the ranges of its
//! partition in the producers' canonical order, from the local disk or over HTTP from the worker
//! that wrote them. Files of an attempt that did not win are never read.
use crate::error::RunError;
use arrow::buffer::Buffer;
use arrow::ipc::reader::StreamDecoder;
use arrow::ipc::writer::StreamWriter;
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, Stream, StreamExt};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Where one shuffle file goes: (consumer stage, index of the consumer's input, partition).
pub type ShuffleKey = (usize, usize, u32);

/// Buffered shuffle output per item before its streams go to files of their own.
pub const MEMORY_LIMIT: usize = 64 << 20;

/// How Arrow IPC that is written once and read once is written (shuffle streams, checkpointed
/// state): its buffers in LZ4 frames, as Spark compresses its shuffle. Readers need nothing:
/// each message says how it is compressed, and older uncompressed files read as before.
pub fn ipc_write_options() -> arrow::ipc::writer::IpcWriteOptions {
    arrow::ipc::writer::IpcWriteOptions::default()
        .try_with_compression(Some(arrow::ipc::CompressionType::LZ4_FRAME))
        .expect("LZ4 frames are supported at the default IPC version")
}

/// A shuffle stream an item wrote, as reported to the coordinator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShuffleFile {
    pub consumer: usize,
    pub input: usize,
    pub partition: u32,
    /// Path relative to the shuffle root of the worker that wrote it.
    pub path: String,
    /// Where the stream is in the file.
    pub offset: u64,
    pub rows: u64,
    /// Length of the stream.
    pub bytes: u64,
}

/// A shuffle stream a consumer item must read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShuffleRef {
    /// The producing item (recomputed if this stream cannot be read).
    pub producer: u64,
    /// `host:port` of the worker holding it; empty when it is on this machine's shuffle root.
    pub address: String,
    pub path: String,
    pub offset: u64,
    pub len: u64,
    /// The partition it belongs to (an item of coalesced partitions reads several).
    #[serde(default)]
    pub partition: u32,
}

/// The name its files start with, for one attempt of one item, relative to the shuffle root.
pub fn attempt_prefix(job: &str, stage: usize, item: u64, attempt: u32) -> String {
    format!("{job}/s{stage}-i{item}-a{attempt}")
}

/// Where one stream's bytes go: memory until the item's buffers grow too large, then a file.
enum Spill {
    Mem(Vec<u8>),
    File(BufWriter<File>),
}

impl Write for Spill {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Spill::Mem(v) => v.write(buf),
            Spill::File(f) => f.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Spill::Mem(_) => Ok(()),
            Spill::File(f) => f.flush(),
        }
    }
}

/// Writes an item's shuffle output, one IPC stream per destination.
pub struct ShuffleWriter {
    root: PathBuf,
    /// [`attempt_prefix`].
    prefix: String,
    streams: BTreeMap<ShuffleKey, (StreamWriter<Spill>, u64)>,
    buffered: usize,
    spilled: bool,
    /// Files made so far (removed if the attempt fails).
    created: Vec<PathBuf>,
    /// Buffers in LZ4 frames ([`ipc_write_options`]), or as they are.
    compress: bool,
}

fn internal(e: impl std::fmt::Display) -> RunError {
    RunError::Internal(format!("writing shuffle data: {e}"))
}

impl ShuffleWriter {
    pub fn new(root: &Path, prefix: String) -> Self {
        ShuffleWriter {
            root: root.to_path_buf(),
            prefix,
            streams: BTreeMap::new(),
            buffered: 0,
            spilled: false,
            created: vec![],
            compress: true,
        }
    }

    /// Whether its streams' buffers are compressed (they are unless told otherwise).
    pub fn compressed(mut self, compress: bool) -> Self {
        self.compress = compress;
        self
    }

    /// Creates the file `path` (relative to the root), in the job's directory.
    fn create(&mut self, path: &str) -> Result<BufWriter<File>, RunError> {
        let full = self.root.join(path);
        let file = match File::create(&full) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // The job's first file here: its directory is made once.
                if let Some(dir) = full.parent() {
                    std::fs::create_dir_all(dir).map_err(internal)?;
                }
                File::create(&full)
            }
            r => r,
        }
        .map_err(internal)?;
        self.created.push(full);
        Ok(BufWriter::new(file))
    }

    fn spill_file(&mut self, key: ShuffleKey) -> Result<BufWriter<File>, RunError> {
        self.create(&spill_name(&self.prefix, key))
    }

    pub fn write(&mut self, key: ShuffleKey, batch: &RecordBatch) -> Result<(), RunError> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        if !self.streams.contains_key(&key) {
            let sink = if self.spilled {
                Spill::File(self.spill_file(key)?)
            } else {
                Spill::Mem(Vec::new())
            };
            let options = match self.compress {
                true => ipc_write_options(),
                false => Default::default(),
            };
            let w = StreamWriter::try_new_with_options(sink, &batch.schema(), options)
                .map_err(internal)?;
            self.streams.insert(key, (w, 0));
        }
        let (w, rows) = self.streams.get_mut(&key).expect("inserted");
        let before = match w.get_mut() {
            Spill::Mem(v) => v.len(),
            Spill::File(_) => 0,
        };
        w.write(batch).map_err(internal)?;
        *rows += batch.num_rows() as u64;
        if let Spill::Mem(v) = w.get_mut() {
            self.buffered += v.len() - before;
        }
        if !self.spilled && self.buffered > MEMORY_LIMIT {
            self.spill_all()?;
        }
        Ok(())
    }

    /// Moves every buffered stream to a file of its own; later streams start there.
    fn spill_all(&mut self) -> Result<(), RunError> {
        self.spilled = true;
        let keys: Vec<ShuffleKey> = self.streams.keys().copied().collect();
        for key in keys {
            let mut file = self.spill_file(key)?;
            let (w, _) = self.streams.get_mut(&key).expect("listed");
            if let Spill::Mem(v) = w.get_mut() {
                file.write_all(v).map_err(internal)?;
                *w.get_mut() = Spill::File(file);
            }
        }
        self.buffered = 0;
        Ok(())
    }

    /// Closes every stream, writes the buffered ones into the attempt's data file, and
    /// describes them all.
    pub fn finish(mut self) -> Result<Vec<ShuffleFile>, RunError> {
        let mut out = vec![];
        let mut data: Option<BufWriter<File>> = None;
        let mut offset = 0u64;
        let data_path = format!("{}.arrows", self.prefix);
        for ((consumer, input, partition), (mut w, rows)) in std::mem::take(&mut self.streams) {
            w.finish().map_err(internal)?;
            let (path, start, bytes) = match w.into_inner().map_err(internal)? {
                Spill::Mem(v) => {
                    if data.is_none() {
                        data = Some(self.create(&data_path)?);
                    }
                    data.as_mut()
                        .expect("created")
                        .write_all(&v)
                        .map_err(internal)?;
                    let start = offset;
                    offset += v.len() as u64;
                    (data_path.clone(), start, v.len() as u64)
                }
                Spill::File(mut f) => {
                    f.flush().map_err(internal)?;
                    let path = spill_name(&self.prefix, (consumer, input, partition));
                    let bytes = std::fs::metadata(self.root.join(&path))
                        .map(|m| m.len())
                        .unwrap_or(0);
                    (path, 0, bytes)
                }
            };
            out.push(ShuffleFile {
                consumer,
                input,
                partition,
                path,
                offset: start,
                rows,
                bytes,
            });
        }
        if let Some(mut d) = data {
            d.flush().map_err(internal)?;
        }
        Ok(out)
    }

    /// Drops a failed attempt's files.
    pub fn abort(self) {
        drop(self.streams);
        for f in self.created {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// A stream's own file, once the attempt's output no longer fits in memory.
fn spill_name(prefix: &str, (consumer, input, partition): ShuffleKey) -> String {
    format!("{prefix}-c{consumer}-i{input}-p{partition}.arrows")
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

/// Reads a stream stored at `offset..offset + len` of a local file. Small streams (the common
/// case) are read in one blocking call; large ones in chunks.
pub fn read_local(
    path: PathBuf,
    offset: u64,
    len: u64,
) -> BoxStream<'static, Result<RecordBatch, String>> {
    if len <= 8 << 20 {
        let bytes = futures::stream::once(read_range(path, offset, len));
        return decode(Box::pin(bytes)).boxed();
    }
    decode(file_chunks(path, offset, len)).boxed()
}

/// `offset..offset + len` of a local file, in memory.
pub async fn read_range(path: PathBuf, offset: u64, len: u64) -> Result<Bytes, String> {
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = File::open(&path)?;
        f.seek(SeekFrom::Start(offset))?;
        let mut buf = vec![0u8; len as usize];
        f.read_exact(&mut buf)?;
        Ok::<_, std::io::Error>(Bytes::from(buf))
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r.map_err(|e| e.to_string()))
}

/// Decodes streams already in memory, one after another.
pub fn decode_all(streams: Vec<Bytes>) -> BoxStream<'static, Result<RecordBatch, String>> {
    futures::stream::iter(streams)
        .flat_map(|b| {
            decode(futures::stream::once(futures::future::ready(
                Ok::<_, String>(b),
            )))
        })
        .boxed()
}

/// `len` bytes of a file from `offset`, as chunks of at most 1 MiB (served to other workers, or
/// decoded here).
pub fn file_chunks(
    path: PathBuf,
    offset: u64,
    len: u64,
) -> BoxStream<'static, Result<Bytes, String>> {
    futures::stream::unfold(
        (None, len),
        move |(file, left): (Option<tokio::fs::File>, u64)| {
            let path = path.clone();
            async move {
                use tokio::io::{AsyncReadExt, AsyncSeekExt};
                if left == 0 {
                    return None;
                }
                let mut file = match file {
                    Some(f) => f,
                    None => {
                        let opened = async {
                            let mut f = tokio::fs::File::open(&path).await?;
                            f.seek(std::io::SeekFrom::Start(offset)).await?;
                            Ok::<_, std::io::Error>(f)
                        };
                        match opened.await {
                            Ok(f) => f,
                            Err(e) => {
                                return Some((Err(format!("{}: {e}", path.display())), (None, 0)));
                            }
                        }
                    }
                };
                let mut buf = vec![0u8; left.min(1 << 20) as usize];
                match file.read(&mut buf).await {
                    Ok(0) => Some((
                        Err(format!("{}: ends {left} bytes early", path.display())),
                        (None, 0),
                    )),
                    Ok(n) => {
                        buf.truncate(n);
                        Some((Ok(Bytes::from(buf)), (Some(file), left - n as u64)))
                    }
                    Err(e) => Some((Err(format!("{}: {e}", path.display())), (None, 0))),
                }
            }
        },
    )
    .boxed()
}

/// How a consumer opens the shuffle files it reads.
pub trait Fetch: Send + Sync {
    /// Decodes one stream as it arrives.
    fn open(&self, file: &ShuffleRef) -> BoxStream<'static, Result<RecordBatch, String>>;
    /// The bytes of `file`'s range, whole (streams lying back to back, read at once).
    fn read(&self, file: &ShuffleRef) -> BoxFuture<'static, Result<Bytes, String>>;
}

/// Reads every file from one local shuffle root (the in-process runner).
pub struct LocalFetch(pub PathBuf);

impl Fetch for LocalFetch {
    fn open(&self, file: &ShuffleRef) -> BoxStream<'static, Result<RecordBatch, String>> {
        read_local(self.0.join(&file.path), file.offset, file.len)
    }

    fn read(&self, file: &ShuffleRef) -> BoxFuture<'static, Result<Bytes, String>> {
        read_range(self.0.join(&file.path), file.offset, file.len).boxed()
    }
}

/// Cuts `refs` into runs of streams that lie back to back in one producer's file, so a
/// consumer of several partitions reads each run at once: `(the run's range, the indexes of
/// its streams in refs)`.
pub fn back_to_back(refs: &[ShuffleRef]) -> Vec<(ShuffleRef, Vec<usize>)> {
    let mut order: Vec<usize> = (0..refs.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (&refs[a], &refs[b]);
        (x.producer, &x.address, &x.path, x.offset)
            .cmp(&(y.producer, &y.address, &y.path, y.offset))
    });
    let mut runs: Vec<(ShuffleRef, Vec<usize>)> = vec![];
    for i in order {
        let r = &refs[i];
        match runs.last_mut() {
            Some((run, members))
                if (run.producer, &run.address, &run.path) == (r.producer, &r.address, &r.path)
                    && run.offset + run.len == r.offset =>
            {
                run.len += r.len;
                members.push(i);
            }
            _ => runs.push((r.clone(), vec![i])),
        }
    }
    runs
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
        let mut w = ShuffleWriter::new(dir.path(), attempt_prefix("job", 1, 7, 2));
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
        assert_eq!(files[0].path, "job/s1-i7-a2.arrows");
        assert_eq!(files[0].rows, 6);
        let whole = std::fs::read(dir.path().join(&files[0].path)).unwrap();
        assert_eq!(whole.len() as u64, files[0].bytes);
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
                offset: 0,
                len: files[0].bytes,
                partition: 5,
            })
            .collect()
            .await;
        assert_eq!(local.len(), 3);
        // A truncated file is an error, not a silent short read.
        let cut: Vec<Result<Bytes, String>> =
            vec![Ok(Bytes::copy_from_slice(&whole[..whole.len() / 2]))];
        let got: Vec<_> = decode(futures::stream::iter(cut)).collect().await;
        let errs: Vec<&String> = got.iter().filter_map(|r| r.as_ref().err()).collect();
        assert_eq!(errs.len(), 1, "{got:?}");
        assert!(errs[0].contains("Unexpected End of Stream"), "{}", errs[0]);
        assert!(
            got.last().is_some_and(|r| r.is_err()),
            "the error ends the stream"
        );
    }

    #[test]
    fn streams_back_to_back_in_one_producers_file_are_read_as_one_run() {
        let r = |producer, path: &str, offset, len, partition| ShuffleRef {
            producer,
            address: "h:1".into(),
            path: path.into(),
            offset,
            len,
            partition,
        };
        // Partition-major, as a coalesced item gets them.
        let refs = vec![
            r(1, "a", 0, 10, 0),
            r(2, "b", 5, 7, 0),
            r(1, "a", 10, 4, 1),
            r(2, "b", 20, 3, 1), // a gap: a run of its own
            r(1, "a", 14, 6, 2),
        ];
        let runs: Vec<(u64, u64, u64, Vec<usize>)> = back_to_back(&refs)
            .into_iter()
            .map(|(run, members)| (run.producer, run.offset, run.len, members))
            .collect();
        assert_eq!(
            runs,
            vec![
                (1, 0, 20, vec![0, 2, 4]),
                (2, 5, 7, vec![1]),
                (2, 20, 3, vec![3]),
            ]
        );
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

#[cfg(test)]
mod layout_tests {
    use super::*;
    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    fn batch(n: usize) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        RecordBatch::try_new(
            schema,
            vec![Arc::new(Int64Array::from_iter_values(0..n as i64))],
        )
        .unwrap()
    }

    /// `n` pseudo-random values: what LZ4 cannot shrink, so its bytes count fully.
    fn noise(n: usize) -> RecordBatch {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let values = (0..n).map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as i64
        });
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from_iter_values(values))]).unwrap()
    }

    #[test]
    fn shuffle_streams_are_compressed() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = ShuffleWriter::new(dir.path(), "j/s0-i1-a1".into());
        w.write((1, 0, 0), &batch(1 << 16)).unwrap();
        let files = w.finish().unwrap();
        // 512 KiB of counting Int64s (their high bytes zeros), in LZ4 frames.
        assert!(files[0].bytes < 384 << 10, "{files:?}");
    }

    /// Uncompressed (a run whose shuffle never leaves this process), streams read back alike.
    #[tokio::test]
    async fn uncompressed_shuffle_streams_read_back_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = ShuffleWriter::new(dir.path(), "j/s0-i1-a1".into()).compressed(false);
        w.write((1, 0, 0), &batch(1 << 16)).unwrap();
        let files = w.finish().unwrap();
        assert!(files[0].bytes >= 512 << 10, "{files:?}");
        assert_eq!(rows(dir.path(), &files[0]).await, 1 << 16);
    }

    async fn rows(root: &Path, f: &ShuffleFile) -> usize {
        read_local(root.join(&f.path), f.offset, f.bytes)
            .map(|b| b.unwrap().num_rows())
            .collect::<Vec<_>>()
            .await
            .iter()
            .sum()
    }

    #[tokio::test]
    async fn many_partitions_share_one_file_and_large_output_spills_to_files() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = ShuffleWriter::new(dir.path(), "j/s0-i1-a1".into());
        for p in 0..8 {
            w.write((1, 0, p), &batch(10 + p as usize)).unwrap();
        }
        let files = w.finish().unwrap();
        assert_eq!(files.len(), 8);
        assert!(files.iter().all(|f| f.path == "j/s0-i1-a1.arrows"));
        for (p, f) in files.iter().enumerate() {
            assert_eq!(rows(dir.path(), f).await, 10 + p, "partition {p}");
        }
        // Past the memory limit every stream moves to a file of its own, and nothing is lost.
        let mut w = ShuffleWriter::new(dir.path(), "j/s0-i2-a1".into());
        let big = noise(1 << 20); // 8 MiB of Int64 that do not compress
        let mut expect = [0usize; 3];
        for round in 0..12 {
            let p = round % 3;
            w.write((1, 0, p as u32), &big).unwrap();
            expect[p] += big.num_rows();
        }
        w.write((2, 0, 0), &batch(5)).unwrap();
        let files = w.finish().unwrap();
        let own: Vec<_> = files
            .iter()
            .filter(|f| {
                f.path.ends_with("p0.arrows")
                    || f.path.ends_with("p1.arrows")
                    || f.path.ends_with("p2.arrows")
            })
            .collect();
        assert_eq!(own.len(), 4, "{files:?}");
        for f in &files {
            let want = if f.consumer == 2 {
                5
            } else {
                expect[f.partition as usize]
            };
            assert_eq!(rows(dir.path(), f).await, want, "{f:?}");
        }
        // A failed attempt that spilled leaves none of its files behind.
        let listing = || {
            let mut names: Vec<String> = std::fs::read_dir(dir.path().join("j"))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
                .collect();
            names.sort();
            names
        };
        let before = listing();
        let mut w = ShuffleWriter::new(dir.path(), "j/s0-i3-a1".into());
        for round in 0..9 {
            w.write((1, 0, round % 3), &big).unwrap();
        }
        assert!(listing().len() > before.len(), "it spilled");
        w.abort();
        assert_eq!(listing(), before);
    }
}
