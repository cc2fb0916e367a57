//! Decoding the line-aligned chunks of a byte range into batches: the decoder trait each
//! line format implements, the stream that drives it, and line positions for errors.

use std::collections::VecDeque;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::{self, BoxStream};
use tokio::sync::mpsc;

use super::super::IoError;
use super::conform;

/// Where in a file a decoder is, to name lines in errors.
pub(super) struct Position {
    pub shown: String,
    pub start: u64,
    /// Lines fully consumed so far in this split.
    pub lines: u64,
}

impl Position {
    pub fn new(shown: &str, start: u64) -> Self {
        Position {
            shown: shown.to_string(),
            start,
            lines: 0,
        }
    }

    /// " line N" (1-based); relative to the split when it does not start the file.
    pub fn line(&self, line: u64) -> String {
        if self.start == 0 {
            format!(" line {line}")
        } else {
            format!(" line {line} of the split starting at byte {}", self.start)
        }
    }

    pub fn lines(&self, first: u64, last: u64) -> String {
        if first >= last {
            return self.line(first);
        }
        if self.start == 0 {
            format!(" lines {first}-{last}")
        } else {
            format!(
                " lines {first}-{last} of the split starting at byte {}",
                self.start
            )
        }
    }
}

/// Turns line-aligned chunks into batches.
pub(super) trait ChunkDecoder: Send + 'static {
    fn push(&mut self, chunk: &[u8], out: &mut VecDeque<RecordBatch>) -> Result<(), IoError>;
    fn finish(&mut self, out: &mut VecDeque<RecordBatch>) -> Result<(), IoError>;
}

/// Drives a [`ChunkDecoder`] from the chunk channel. Batches decoded before an
/// error are still yielded, then the error, then the stream ends.
pub(super) fn decode_stream<D: ChunkDecoder>(
    rx: mpsc::Receiver<Result<Bytes, IoError>>,
    decoder: D,
    schema: SchemaRef,
    shown: String,
) -> BoxStream<'static, Result<RecordBatch, IoError>> {
    struct State<D> {
        rx: mpsc::Receiver<Result<Bytes, IoError>>,
        decoder: D,
        out: VecDeque<RecordBatch>,
        error: Option<IoError>,
        done: bool,
        schema: SchemaRef,
        shown: String,
    }
    let state = State {
        rx,
        decoder,
        out: VecDeque::new(),
        error: None,
        done: false,
        schema,
        shown,
    };
    stream::unfold(state, |mut st| async move {
        loop {
            if let Some(batch) = st.out.pop_front() {
                let batch = conform(batch, &st.schema, &st.shown);
                return Some((batch, st));
            }
            if let Some(e) = st.error.take() {
                st.done = true;
                return Some((Err(e), st));
            }
            if st.done {
                return None;
            }
            match st.rx.recv().await {
                Some(Ok(chunk)) => {
                    if let Err(e) = st.decoder.push(&chunk, &mut st.out) {
                        st.error = Some(e);
                    }
                }
                Some(Err(e)) => st.error = Some(e),
                None => {
                    st.done = true;
                    if let Err(e) = st.decoder.finish(&mut st.out) {
                        st.error = Some(e);
                    }
                }
            }
        }
    })
    .boxed()
}
