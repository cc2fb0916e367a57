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
use super::merge_windows::SdkMerge;
use super::spill::{Block, Spill};

/// Groups by (encoded key, encoded window).
type Groups = HashMap<(Vec<u8>, Vec<u8>), Group>;

#[derive(Default)]
struct Group {
    count: u32,
    values: Vec<u8>,
    earliest: i64,
    latest: i64,
}

impl Group {
    fn add(&mut self, value: &[u8], timestamp: i64) {
        if self.count == 0 {
            self.earliest = timestamp;
            self.latest = timestamp;
        }
        self.count += 1;
        self.values.extend_from_slice(value);
        self.earliest = self.earliest.min(timestamp);
        self.latest = self.latest.max(timestamp);
    }

    fn merge(&mut self, other: Group) {
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
        how.add(&mut groups, block, None)?;
    }
    let groups = how.merge(groups, transform, sdk_merge)?;
    how.write(groups, strategy)
}

/// How a GroupByKey reads its input and merges its windows.
struct How<'a> {
    input: &'a Shape,
    key: &'a Shape,
    window: &'a Shape,
    sessions: bool,
    by_sdk: bool,
}

impl<'a> How<'a> {
    fn of(
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

    /// Adds a block's elements to their (key, window) groups, leaving out those in a window
    /// that ends at or before `fired_to` (it has fired); returns how many were left out.
    fn add(
        &self,
        groups: &mut Groups,
        block: &[u8],
        fired_to: Option<i64>,
    ) -> Result<u64, PortableError> {
        let mut dropped = 0;
        let mut pos = 0;
        while pos < block.len() {
            let wv = Windowed::read(self.input, block, pos)?;
            pos = wv.end;
            let split = self.key.skip(wv.value, 0)?;
            let (key, val) = wv.value.split_at(split);
            for w in &wv.windows {
                if let Some(fired_to) = fired_to
                    && max_timestamp(self.window, w)? < fired_to
                {
                    dropped += 1;
                    continue;
                }
                groups
                    .entry((key.to_vec(), w.to_vec()))
                    .or_default()
                    .add(val, wv.timestamp);
            }
        }
        Ok(dropped)
    }

    fn merge(
        &self,
        groups: Groups,
        transform: &str,
        sdk_merge: Option<&SdkMerge>,
    ) -> Result<Groups, PortableError> {
        if self.sessions {
            merge_sessions(groups)
        } else if self.by_sdk {
            let sdk = sdk_merge.ok_or_else(|| {
                PortableError::unsupported(transform, "its windows need the SDK to merge them")
            })?;
            merge_by(sdk, groups)
        } else {
            Ok(groups)
        }
    }

    /// Each group as `KV(key, Iterable(values))` in its window, in its one on-time pane.
    fn write(
        &self,
        groups: impl IntoIterator<Item = ((Vec<u8>, Vec<u8>), Group)>,
        strategy: &WindowingStrategy,
    ) -> Result<Vec<Bytes>, PortableError> {
        let output_time = output_time::Enum::try_from(strategy.output_time)
            .unwrap_or(output_time::Enum::EndOfWindow);
        let mut out = Vec::new();
        let mut block = Vec::new();
        let mut count = [0u8; 4];
        for ((key, window_bytes), group) in groups {
            let timestamp = match output_time {
                output_time::Enum::EarliestInPane => group.earliest,
                output_time::Enum::LatestInPane => group.latest,
                _ => max_timestamp(self.window, &window_bytes)?,
            };
            count.copy_from_slice(&(group.count as i32).to_be_bytes());
            write_windowed(
                &mut block,
                timestamp,
                &[&window_bytes],
                &[PANE_ON_TIME_ONLY],
                &[&key, &count, &group.values],
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

/// The last instant of a window (global, or an interval's end less a millisecond).
fn max_timestamp(window: &Shape, bytes: &[u8]) -> Result<i64, PortableError> {
    match window {
        Shape::GlobalWindow => Ok(GLOBAL_WINDOW_MAX_MILLIS),
        _ => Ok(Interval::decode(bytes)?.end - 1),
    }
}

/// A streaming GroupByKey's windows that have not fired, kept from round to round: each
/// round adds what arrived, merges (sessions), and fires the windows the watermark passed,
/// each once, on time (the default trigger, no allowed lateness). An element whose window
/// fired already is late: dropped and counted, as Beam drops it.
#[derive(Default)]
pub(crate) struct Pending {
    groups: Groups,
    /// The watermark of the last firing: windows that end at or before it have fired.
    fired_to: Option<i64>,
    pub late: u64,
}

impl Pending {
    /// Adds `blocks`, then fires the windows that end at or before `watermark` (millis;
    /// `i64::MAX` once the input is complete): their groups, written, and how many.
    pub(crate) fn add_and_fire(
        &mut self,
        blocks: &[Bytes],
        input: &Shape,
        strategy: &WindowingStrategy,
        transform: &str,
        sdk_merge: Option<&SdkMerge>,
        watermark: i64,
    ) -> Result<(Vec<Bytes>, usize), PortableError> {
        let how = How::of(input, strategy, transform)?;
        let fired_to = self.fired_to;
        for block in blocks {
            self.late += how.add(&mut self.groups, block, fired_to)?;
        }
        let groups = how.merge(std::mem::take(&mut self.groups), transform, sdk_merge)?;
        let mut due = Vec::new();
        for ((key, window), group) in groups {
            if max_timestamp(how.window, &window)? < watermark {
                due.push(((key, window), group));
            } else {
                self.groups.insert((key, window), group);
            }
        }
        self.fired_to = Some(fired_to.map_or(watermark, |w| w.max(watermark)));
        let fired = due.len();
        Ok((how.write(due, strategy)?, fired))
    }

    /// Windows waiting for the watermark.
    pub(crate) fn windows(&self) -> usize {
        self.groups.len()
    }
}

/// Merges each key's windows as the SDK's WindowFn says, with their values.
fn merge_by(sdk: &SdkMerge, groups: Groups) -> Result<Groups, PortableError> {
    let mut per_key: HashMap<&[u8], Vec<&[u8]>> = HashMap::new();
    for (key, window) in groups.keys() {
        per_key.entry(key).or_default().push(window);
    }
    let per_key: Vec<(&[u8], Vec<&[u8]>)> = per_key.into_iter().collect();
    let merged = sdk.merge(&per_key)?;
    let mut out: Groups = HashMap::with_capacity(groups.len());
    for ((key, window), group) in groups {
        let into = merged.get(&(key.clone(), window.clone())).cloned();
        out.entry((key, into.unwrap_or(window)))
            .or_default()
            .merge(group);
    }
    Ok(out)
}

/// Merges each key's overlapping session windows into one, with their values.
fn merge_sessions(groups: Groups) -> Result<Groups, PortableError> {
    let mut per_key: HashMap<Vec<u8>, Vec<(Interval, Group)>> = HashMap::new();
    for ((key, window), group) in groups {
        per_key
            .entry(key)
            .or_default()
            .push((Interval::decode(&window)?, group));
    }
    let mut out = HashMap::new();
    for (key, mut windows) in per_key {
        windows.sort_by_key(|(w, _)| (w.start, w.end));
        let mut current: Option<(Interval, Group)> = None;
        for (w, g) in windows {
            current = Some(match current.take() {
                Some((mut cw, mut cg)) if w.start < cw.end => {
                    cw.end = cw.end.max(w.end);
                    cg.merge(g);
                    (cw, cg)
                }
                Some((cw, cg)) => {
                    out.insert((key.clone(), cw.encode()), cg);
                    (w, g)
                }
                None => (w, g),
            });
        }
        if let Some((cw, cg)) = current {
            out.insert((key.clone(), cw.encode()), cg);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner_api::FunctionSpec;

    fn input() -> Shape {
        Shape::WindowedValue {
            value: Box::new(Shape::Kv(Box::new(Shape::Bytes), Box::new(Shape::VarInt))),
            window: Box::new(Shape::IntervalWindow),
        }
    }

    /// `key` with value 1 at `ts` (millis) in the window [start, end).
    fn element(out: &mut Vec<u8>, key: &str, ts: i64, start: i64, end: i64) {
        let window = Interval { start, end }.encode();
        let mut k = vec![key.len() as u8];
        k.extend_from_slice(key.as_bytes());
        write_windowed(out, ts, &[&window], &[0x0f], &[&k, &[1]]);
    }

    /// Each fired group as (key, window start, window end, count of values, timestamp).
    fn fired(blocks: &[Bytes]) -> Vec<(String, i64, i64, i32, i64)> {
        let shape = Shape::WindowedValue {
            value: Box::new(Shape::Kv(
                Box::new(Shape::Bytes),
                Box::new(Shape::Iterable(Box::new(Shape::VarInt))),
            )),
            window: Box::new(Shape::IntervalWindow),
        };
        let mut out = Vec::new();
        for block in blocks {
            let mut pos = 0;
            while pos < block.len() {
                let wv = Windowed::read(&shape, block, pos).unwrap();
                pos = wv.end;
                let len = wv.value[0] as usize;
                let key = String::from_utf8(wv.value[1..1 + len].to_vec()).unwrap();
                let count = i32::from_be_bytes(wv.value[1 + len..5 + len].try_into().unwrap());
                let w = Interval::decode(wv.windows[0]).unwrap();
                out.push((key, w.start, w.end, count, wv.timestamp));
            }
        }
        out.sort();
        out
    }

    fn round(
        pending: &mut Pending,
        strategy: &WindowingStrategy,
        elements: &[(&str, i64, i64, i64)],
        watermark: i64,
    ) -> Vec<(String, i64, i64, i32, i64)> {
        let mut block = Vec::new();
        for (key, ts, start, end) in elements {
            element(&mut block, key, *ts, *start, *end);
        }
        let (out, n) = pending
            .add_and_fire(
                &[Bytes::from(block)],
                &input(),
                strategy,
                "GroupByKey",
                None,
                watermark,
            )
            .unwrap();
        let out = fired(&out);
        assert_eq!(out.len(), n);
        out
    }

    #[test]
    fn a_streaming_group_by_key_fires_each_window_once_the_watermark_passes_it() {
        let fixed = WindowingStrategy::default();
        let mut pending = Pending::default();
        let first = round(
            &mut pending,
            &fixed,
            &[
                ("a", 1_000, 0, 3_000),
                ("a", 4_000, 3_000, 6_000),
                ("b", 2_000, 0, 3_000),
            ],
            3_500,
        );
        assert_eq!(
            first,
            vec![
                ("a".into(), 0, 3_000, 1, 2_999),
                ("b".into(), 0, 3_000, 1, 2_999)
            ]
        );
        assert_eq!(pending.windows(), 1);
        // [0, 3 s) has fired: an element of it now is late, dropped and counted.
        let second = round(
            &mut pending,
            &fixed,
            &[("a", 500, 0, 3_000), ("a", 5_000, 3_000, 6_000)],
            5_999,
        );
        assert!(second.is_empty(), "{second:?}");
        assert_eq!(pending.late, 1);
        let last = round(&mut pending, &fixed, &[], i64::MAX);
        assert_eq!(last, vec![("a".into(), 3_000, 6_000, 2, 5_999)]);
        assert_eq!(pending.windows(), 0);
    }

    #[test]
    fn sessions_kept_across_rounds_merge_with_what_arrives_later() {
        let mut pending = Pending::default();
        // A 10-s gap: a's session [1 s, 11 s) is not closed at a watermark of 5 s ...
        let first = round(
            &mut pending,
            &sessions(),
            &[("a", 1_000, 1_000, 11_000)],
            5_000,
        );
        assert!(first.is_empty());
        // ... and an element at 8 s extends it to [1 s, 18 s), which fires whole.
        let second = round(
            &mut pending,
            &sessions(),
            &[("a", 8_000, 8_000, 18_000)],
            20_000,
        );
        assert_eq!(second, vec![("a".into(), 1_000, 18_000, 2, 17_999)]);
    }

    fn sessions() -> WindowingStrategy {
        WindowingStrategy {
            window_fn: Some(FunctionSpec {
                urn: urns::SESSION_WINDOWS.into(),
                payload: vec![],
            }),
            ..WindowingStrategy::default()
        }
    }
}
