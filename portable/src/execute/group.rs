//! GroupByKey in the runner: elements grouped by encoded key and window (sessions merged per
//! key first; the windows of another merging WindowFn merged as the SDK says, [`SdkMerge`]),
//! each group written as `KV(key, Iterable(values))` in its window, stamped as the windowing
//! strategy's timestamp combiner says, in the one on-time pane of a batch run.
use std::collections::HashMap;

use prost::bytes::Bytes;

use crate::coders::{
    GLOBAL_WINDOW_MAX_MILLIS, Interval, PANE_ON_TIME_ONLY, Shape, Windowed, write_windowed,
};
use crate::error::PortableError;
use crate::runner_api::{WindowingStrategy, output_time};
use crate::urns;

use super::BLOCK_BYTES;
use super::merge_windows::{Merged, SdkMerge};
use super::spill::{Block, Spill};

/// Groups by (encoded key, encoded window).
pub(super) type Groups = HashMap<(Vec<u8>, Vec<u8>), Group>;

#[derive(Default, Clone)]
pub(super) struct Group {
    pub(super) count: u32,
    /// The values' encodings, concatenated; the earliest and latest timestamps among them.
    pub(super) values: Vec<u8>,
    pub(super) earliest: i64,
    pub(super) latest: i64,
}

impl Group {
    pub(super) fn add(&mut self, value: &[u8], timestamp: i64) {
        if self.count == 0 {
            self.earliest = timestamp;
            self.latest = timestamp;
        }
        self.count += 1;
        self.values.extend_from_slice(value);
        self.earliest = self.earliest.min(timestamp);
        self.latest = self.latest.max(timestamp);
    }

    pub(super) fn merge(&mut self, other: Group) {
        if other.count == 0 {
            return;
        }
        if self.count == 0 {
            *self = other;
            return;
        }
        self.count += other.count;
        self.values.extend_from_slice(&other.values);
        self.earliest = self.earliest.min(other.earliest);
        self.latest = self.latest.max(other.latest);
    }
}

/// GroupByKey over a materialized input that may not fit in memory: one that takes more than
/// half the job's memory budget is first cut into hash partitions of its keys (through the
/// spill store, so they wait on disk), and each partition is grouped on its own; a key's
/// elements, all its windows among them, are in one partition. `sdk_merge` merges the windows
/// of a merging WindowFn other than sessions.
pub(crate) fn group_by_key_in(
    spill: &Spill,
    blocks: &[Block],
    input: &Shape,
    strategy: &WindowingStrategy,
    transform: &str,
    sdk_merge: Option<&SdkMerge>,
) -> Result<Vec<Block>, PortableError> {
    let grouped = |bytes: Vec<Bytes>| -> Result<Vec<Block>, PortableError> {
        group_by_key(&bytes, input, strategy, transform, sdk_merge)?
            .into_iter()
            .map(|b| spill.keep(b))
            .collect()
    };
    let total: usize = blocks.iter().map(Block::len).sum();
    let parts = total.div_ceil((spill.budget() / 2).max(1)).max(1);
    if parts == 1 {
        return grouped(spill.load_all(blocks)?);
    }
    let not_kv =
        || PortableError::unsupported(transform, "GroupByKey needs windowed key-value pairs");
    let partitions = by_key_into(spill, blocks, input, parts, not_kv)?;
    let mut out = Vec::new();
    for partition in partitions {
        let bytes = spill.load_all(&partition)?;
        spill.release(&partition);
        out.extend(grouped(bytes)?);
    }
    Ok(out)
}

/// `blocks` (windowed key-value pairs of `shape`) cut into `parts` hash partitions of their
/// encoded keys, a block at a time, each partition's blocks kept through the spill store (its
/// buffers together within half the budget, blocks of 64 KiB at least); `not_kv` when the
/// elements are not key-value pairs.
pub(crate) fn by_key_into(
    spill: &Spill,
    blocks: &[Block],
    shape: &Shape,
    parts: usize,
    not_kv: impl FnOnce() -> PortableError,
) -> Result<Vec<Vec<Block>>, PortableError> {
    let (key_shape, _) = shape.windowed_kv().ok_or_else(not_kv)?;
    let parts = parts.max(1);
    let flush_at = (spill.budget() / 2 / parts).clamp(64 << 10, BLOCK_BYTES);
    let mut partitions: Vec<Vec<Block>> = vec![Vec::new(); parts];
    let mut buffers: Vec<Vec<u8>> = vec![Vec::new(); parts];
    for block in blocks {
        let bytes = spill.load(block)?;
        let mut pos = 0;
        while pos < bytes.len() {
            let wv = Windowed::read(shape, &bytes, pos)?;
            let key = &wv.value[..key_shape.skip(wv.value, 0)?];
            let p = partition_of(key, parts);
            buffers[p].extend_from_slice(&bytes[pos..wv.end]);
            if buffers[p].len() >= flush_at {
                let full = Bytes::from(std::mem::take(&mut buffers[p]));
                partitions[p].push(spill.keep(full)?);
            }
            pos = wv.end;
        }
    }
    for (partition, rest) in partitions.iter_mut().zip(buffers) {
        if !rest.is_empty() {
            partition.push(spill.keep(Bytes::from(rest))?);
        }
    }
    Ok(partitions)
}

fn partition_of(key: &[u8], parts: usize) -> usize {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    (h.finish() % parts as u64) as usize
}

pub(crate) fn group_by_key(
    blocks: &[Bytes],
    input: &Shape,
    strategy: &WindowingStrategy,
    transform: &str,
    sdk_merge: Option<&SdkMerge>,
) -> Result<Vec<Bytes>, PortableError> {
    let how = How::of(input, strategy, transform)?;
    // (key, window) -> values, in arrival order.
    let mut groups: Groups = HashMap::new();
    for block in blocks {
        how.add(&mut groups, block)?;
    }
    let groups = how.merge(groups, transform, sdk_merge)?;
    let on_time = [PANE_ON_TIME_ONLY];
    how.write(groups.iter().map(|(k, g)| (k, g, &on_time[..])), strategy)
}

/// How a GroupByKey reads its input and merges its windows.
pub(super) struct How<'a> {
    input: &'a Shape,
    key: &'a Shape,
    pub(super) window: &'a Shape,
    pub(super) sessions: bool,
    pub(super) by_sdk: bool,
}

impl<'a> How<'a> {
    pub(super) fn of(
        input: &'a Shape,
        strategy: &WindowingStrategy,
        transform: &str,
    ) -> Result<How<'a>, PortableError> {
        let Some((key, window)) = input.windowed_kv() else {
            return Err(PortableError::unsupported(
                transform,
                "GroupByKey needs windowed key-value pairs",
            ));
        };
        let sessions = strategy
            .window_fn
            .as_ref()
            .is_some_and(|f| f.urn == urns::SESSION_WINDOWS);
        let by_sdk = crate::plan::merges_on_sdk(strategy);
        if (sessions || by_sdk) && *window != Shape::IntervalWindow {
            return Err(PortableError::unsupported(
                transform,
                "merging windows other than interval windows",
            ));
        }
        Ok(How {
            input,
            key,
            window,
            sessions,
            by_sdk,
        })
    }

    /// Adds a block's elements to their (key, window) groups.
    fn add(&self, groups: &mut Groups, block: &[u8]) -> Result<(), PortableError> {
        self.each(block, |key, window, value, timestamp| {
            groups
                .entry((key.to_vec(), window.to_vec()))
                .or_default()
                .add(value, timestamp);
            Ok(())
        })
    }

    /// Calls `f(key, window, value, timestamp)` for each element of a block in each of its
    /// windows.
    pub(super) fn each(
        &self,
        block: &[u8],
        mut f: impl FnMut(&[u8], &[u8], &[u8], i64) -> Result<(), PortableError>,
    ) -> Result<(), PortableError> {
        let mut pos = 0;
        while pos < block.len() {
            let wv = Windowed::read(self.input, block, pos)?;
            pos = wv.end;
            let split = self.key.skip(wv.value, 0)?;
            let (key, value) = wv.value.split_at(split);
            for w in &wv.windows {
                f(key, w, value, wv.timestamp)?;
            }
        }
        Ok(())
    }

    /// Merges each key's windows, with their values (sessions, or as the SDK's WindowFn says).
    pub(super) fn merge(
        &self,
        groups: Groups,
        transform: &str,
        sdk_merge: Option<&SdkMerge>,
    ) -> Result<Groups, PortableError> {
        let mut per_key: PerKey = HashMap::new();
        for (key, window) in groups.keys() {
            per_key.entry(key).or_default().push(window);
        }
        let Some(merged) = self.merges(per_key, transform, sdk_merge)? else {
            return Ok(groups);
        };
        let mut out: Groups = HashMap::with_capacity(groups.len());
        for ((key, window), group) in groups {
            let into = merged.get(&(key.clone(), window.clone())).cloned();
            out.entry((key, into.unwrap_or(window)))
                .or_default()
                .merge(group);
        }
        Ok(out)
    }

    /// Which of each key's windows merge into which, for a merging WindowFn (none otherwise).
    pub(super) fn merges(
        &self,
        per_key: PerKey,
        transform: &str,
        sdk_merge: Option<&SdkMerge>,
    ) -> Result<Option<Merged>, PortableError> {
        if self.sessions {
            session_merges(per_key).map(Some)
        } else if self.by_sdk {
            let sdk = sdk_merge.ok_or_else(|| {
                PortableError::unsupported(transform, "its windows need the SDK to merge them")
            })?;
            let per_key: Vec<(&[u8], Vec<&[u8]>)> = per_key.into_iter().collect();
            sdk.merge(&per_key).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Each group as `KV(key, Iterable(values))` in its window, in the pane given with it.
    pub(super) fn write<'g>(
        &self,
        groups: impl IntoIterator<Item = (&'g (Vec<u8>, Vec<u8>), &'g Group, &'g [u8])>,
        strategy: &WindowingStrategy,
    ) -> Result<Vec<Bytes>, PortableError> {
        let output_time = output_time::Enum::try_from(strategy.output_time)
            .unwrap_or(output_time::Enum::EndOfWindow);
        let mut out = Vec::new();
        let mut block = Vec::new();
        let mut count = [0u8; 4];
        for ((key, window_bytes), group, pane) in groups {
            let timestamp = match output_time {
                output_time::Enum::EarliestInPane => group.earliest,
                output_time::Enum::LatestInPane => group.latest,
                _ => max_timestamp(self.window, window_bytes)?,
            };
            count.copy_from_slice(&(group.count as i32).to_be_bytes());
            write_windowed(
                &mut block,
                timestamp,
                &[window_bytes],
                pane,
                &[key, &count, &group.values],
            );
            if block.len() >= BLOCK_BYTES {
                out.push(Bytes::from(std::mem::take(&mut block)));
            }
        }
        if !block.is_empty() {
            out.push(Bytes::from(block));
        }
        Ok(out)
    }
}

/// The last instant of a window: global, or an interval's end less a millisecond. A window of
/// a coder only its SDK reads (a custom window type) is taken to last as long as the global
/// window: it fires when the input ends (a streaming run refuses such windows on an unbounded
/// input, `plan::unbounded::check`).
pub(super) fn max_timestamp(window: &Shape, bytes: &[u8]) -> Result<i64, PortableError> {
    match window {
        Shape::IntervalWindow => Ok(Interval::decode(bytes)?.end - 1),
        _ => Ok(GLOBAL_WINDOW_MAX_MILLIS),
    }
}

/// Each key's encoded windows.
pub(super) type PerKey<'a> = HashMap<&'a [u8], Vec<&'a [u8]>>;

/// Which of each key's session windows merge into which: overlapping ones into their union.
fn session_merges(per_key: PerKey) -> Result<Merged, PortableError> {
    let mut merged = Merged::new();
    for (key, windows) in per_key {
        let mut windows = windows
            .into_iter()
            .map(|w| Ok((Interval::decode(w)?, w)))
            .collect::<Result<Vec<_>, PortableError>>()?;
        windows.sort_by_key(|(w, _)| (w.start, w.end));
        let mut i = 0;
        while i < windows.len() {
            let mut union = windows[i].0;
            let mut j = i + 1;
            while j < windows.len() && windows[j].0.start < union.end {
                union.end = union.end.max(windows[j].0.end);
                j += 1;
            }
            let encoded = union.encode();
            for (_, w) in &windows[i..j] {
                if *w != encoded.as_slice() {
                    merged.insert((key.to_vec(), w.to_vec()), encoded.clone());
                }
            }
            i = j;
        }
    }
    Ok(merged)
}
