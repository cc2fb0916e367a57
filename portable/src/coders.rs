//! Beam's standard coders, as far as the runner needs them: enough to find where one encoded
//! element ends, to split a KV into key and value, and to read and write the windowed-value
//! envelope. Any coder the runner does not know crosses stage boundaries inside a
//! `length_prefix` (see [`length_prefix_unknown`]), as in every Beam portable runner, so the
//! runner never needs the SDK's coders.
use std::collections::HashMap;

use crate::error::PortableError;
use crate::runner_api::{Coder, Components, FunctionSpec};
use crate::urns;

/// A coder the runner can walk, resolved from a coder id.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// Bytes and UTF-8 strings: a varint length and the bytes.
    Bytes,
    VarInt,
    Bool,
    Double,
    Kv(Box<Shape>, Box<Shape>),
    Iterable(Box<Shape>),
    /// A varint length and bytes the runner does not look into.
    LengthPrefix,
    GlobalWindow,
    IntervalWindow,
    Nullable(Box<Shape>),
    WindowedValue {
        value: Box<Shape>,
        window: Box<Shape>,
    },
    /// A timer a stateful DoFn set: key, tag, windows, clear bit, then (unless cleared) fire
    /// and hold timestamps and a pane.
    Timer {
        key: Box<Shape>,
        window: Box<Shape>,
    },
}

const WALKABLE: &[&str] = &[
    urns::BYTES,
    urns::STRING_UTF8,
    urns::VARINT,
    urns::BOOL,
    urns::DOUBLE,
    urns::KV,
    urns::ITERABLE,
    urns::LENGTH_PREFIX,
    urns::GLOBAL_WINDOW,
    urns::INTERVAL_WINDOW,
    urns::NULLABLE,
    urns::WINDOWED_VALUE,
    urns::TIMER,
];

fn urn_of(coder: &Coder) -> &str {
    coder.spec.as_ref().map(|s| s.urn.as_str()).unwrap_or("")
}

fn coding(coder: &str, reason: impl Into<String>) -> PortableError {
    PortableError::Coding {
        coder: coder.to_string(),
        reason: reason.into(),
    }
}

impl Shape {
    /// Resolves `id` in `coders`; an unknown coder (not wrapped in a length prefix) is an error.
    pub fn of(coders: &HashMap<String, Coder>, id: &str) -> Result<Shape, PortableError> {
        let coder = coders.get(id).ok_or_else(|| coding(id, "no such coder"))?;
        let part = |i: usize| -> Result<Box<Shape>, PortableError> {
            let c = coder
                .component_coder_ids
                .get(i)
                .ok_or_else(|| coding(id, format!("component {i} missing")))?;
            Ok(Box::new(Shape::of(coders, c)?))
        };
        Ok(match urn_of(coder) {
            urns::BYTES | urns::STRING_UTF8 => Shape::Bytes,
            urns::VARINT => Shape::VarInt,
            urns::BOOL => Shape::Bool,
            urns::DOUBLE => Shape::Double,
            urns::KV => Shape::Kv(part(0)?, part(1)?),
            urns::ITERABLE => Shape::Iterable(part(0)?),
            urns::LENGTH_PREFIX => Shape::LengthPrefix,
            urns::GLOBAL_WINDOW => Shape::GlobalWindow,
            urns::INTERVAL_WINDOW => Shape::IntervalWindow,
            urns::NULLABLE => Shape::Nullable(part(0)?),
            urns::WINDOWED_VALUE => Shape::WindowedValue {
                value: part(0)?,
                window: part(1)?,
            },
            urns::TIMER => Shape::Timer {
                key: part(0)?,
                window: part(1)?,
            },
            other => {
                return Err(coding(
                    id,
                    format!("'{other}' is not a coder the runner can read"),
                ));
            }
        })
    }

    /// Where the element encoded (nested) at `buf[pos..]` ends.
    pub fn skip(&self, buf: &[u8], pos: usize) -> Result<usize, PortableError> {
        let need = |n: usize| -> Result<usize, PortableError> {
            let end = pos.checked_add(n).filter(|e| *e <= buf.len());
            end.ok_or_else(|| coding(&format!("{self:?}"), "element cut short"))
        };
        match self {
            Shape::Bytes | Shape::LengthPrefix => {
                let (len, at) = read_varint(buf, pos)?;
                let end = at.checked_add(len as usize).filter(|e| *e <= buf.len());
                end.ok_or_else(|| coding("length_prefix", "element cut short"))
            }
            Shape::VarInt => Ok(read_varint(buf, pos)?.1),
            Shape::Bool => need(1),
            Shape::Double => need(8),
            Shape::Kv(k, v) => v.skip(buf, k.skip(buf, pos)?),
            Shape::Iterable(e) => skip_iterable(e, buf, pos),
            Shape::GlobalWindow => Ok(pos),
            Shape::IntervalWindow => Ok(read_varint(buf, need(8)?)?.1),
            Shape::Nullable(inner) => match buf.get(pos) {
                Some(0) => Ok(pos + 1),
                Some(_) => inner.skip(buf, pos + 1),
                None => Err(coding("nullable", "element cut short")),
            },
            Shape::WindowedValue { .. } => Ok(Windowed::read(self, buf, pos)?.end),
            Shape::Timer { .. } => Ok(TimerBytes::read(self, buf, pos)?.end),
        }
    }

    /// The key's and the window's shapes, when this is a windowed key-value pair (what a
    /// GroupByKey, a stateful DoFn and a multimap side input read).
    pub fn windowed_kv(&self) -> Option<(&Shape, &Shape)> {
        match self {
            Shape::WindowedValue { value, window } => match value.as_ref() {
                Shape::Kv(key, _) => Some((key, window)),
                _ => None,
            },
            _ => None,
        }
    }

    /// Splits one encoded element into its elements: `buf` must hold whole elements.
    pub fn split<'a>(&self, buf: &'a [u8]) -> Result<Vec<&'a [u8]>, PortableError> {
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < buf.len() {
            let end = self.skip(buf, pos)?;
            out.push(&buf[pos..end]);
            pos = end;
        }
        Ok(out)
    }
}

fn skip_iterable(element: &Shape, buf: &[u8], pos: usize) -> Result<usize, PortableError> {
    walk_iterable(element, buf, pos, |_| ())
}

/// The elements of the iterable encoded (nested) at `buf[pos..]`, and where it ends.
pub fn iterable_items<'a>(
    element: &Shape,
    buf: &'a [u8],
    pos: usize,
) -> Result<(Vec<&'a [u8]>, usize), PortableError> {
    let mut items = Vec::new();
    let end = walk_iterable(element, buf, pos, |range| items.push(&buf[range]))?;
    Ok((items, end))
}

/// Walks an iterable's elements, telling `each` where each one is; returns where it ends.
fn walk_iterable(
    element: &Shape,
    buf: &[u8],
    pos: usize,
    mut each: impl FnMut(std::ops::Range<usize>),
) -> Result<usize, PortableError> {
    let head = buf
        .get(pos..pos + 4)
        .ok_or_else(|| coding("iterable", "element cut short"))?;
    let count = i32::from_be_bytes(head.try_into().expect("4 bytes"));
    let mut at = pos + 4;
    let mut next = |at: usize| -> Result<usize, PortableError> {
        let end = element.skip(buf, at)?;
        each(at..end);
        Ok(end)
    };
    if count >= 0 {
        for _ in 0..count {
            at = next(at)?;
        }
        return Ok(at);
    }
    // Count -1: blocks of (varint count, elements) ended by a zero count.
    loop {
        let (n, after) = read_varint(buf, at)?;
        at = after;
        if n == 0 {
            return Ok(at);
        }
        for _ in 0..n {
            at = next(at)?;
        }
    }
}

/// Reads a Beam varint (unsigned LEB128 of a 64-bit value) at `pos`: (value, end).
pub fn read_varint(buf: &[u8], mut pos: usize) -> Result<(u64, usize), PortableError> {
    let mut value = 0u64;
    let mut shift = 0;
    loop {
        let byte = *buf.get(pos).ok_or_else(|| coding("varint", "cut short"))?;
        pos += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok((value, pos));
        }
        shift += 7;
        if shift > 63 {
            return Err(coding("varint", "longer than 10 bytes"));
        }
    }
}

pub fn write_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A Beam timestamp in milliseconds, encoded big-endian with the sign bit flipped so that the
/// bytes sort as the times do.
pub fn write_timestamp(out: &mut Vec<u8>, millis: i64) {
    out.extend_from_slice(&((millis as u64) ^ (1 << 63)).to_be_bytes());
}

pub fn read_timestamp(bytes: &[u8]) -> i64 {
    let raw = u64::from_be_bytes(bytes[..8].try_into().expect("8 bytes"));
    (raw ^ (1 << 63)) as i64
}

/// Beam's minimum timestamp (`-2^63` µs, in ms): Impulse's element's, and the runner's own
/// elements' in the global window.
pub const MIN_TIMESTAMP_MILLIS: i64 = -9_223_372_036_854_775;

/// The global window's last timestamp (Beam's `GLOBAL_WINDOW_MAX_TIMESTAMP_MILLIS` minus 1 ms).
pub const GLOBAL_WINDOW_MAX_MILLIS: i64 = 9_223_371_950_454_774;

/// An interval window `[start, end)` in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Interval {
    pub start: i64,
    pub end: i64,
}

impl Interval {
    pub fn decode(bytes: &[u8]) -> Result<Interval, PortableError> {
        if bytes.len() < 9 {
            return Err(coding("interval_window", "shorter than 9 bytes"));
        }
        let end = read_timestamp(bytes);
        let (span, _) = read_varint(bytes, 8)?;
        Ok(Interval {
            start: end - span as i64,
            end,
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(12);
        write_timestamp(&mut out, self.end);
        write_varint(&mut out, (self.end - self.start) as u64);
        out
    }
}

/// A protobuf Timestamp's or Duration's seconds and nanos as millis.
pub fn proto_millis(seconds: i64, nanos: i32) -> i64 {
    seconds
        .saturating_mul(1000)
        .saturating_add(i64::from(nanos) / 1_000_000)
}

/// The pane of a runner-grouped result: the one on-time firing (first and last).
pub const PANE_ON_TIME_ONLY: u8 = 0x07;

/// A pane's timing, as Beam numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timing {
    Early = 0,
    OnTime = 1,
    Late = 2,
}

/// A pane as Beam's PaneInfoCoder writes it: a byte (first, last, timing; the encoding in its
/// high nibble), then the pane's index and its index among on-time and late panes when they
/// are not both 0 (one varint when they are equal, or for an early pane).
pub fn pane(first: bool, last: bool, timing: Timing, index: u64, on_time_index: u64) -> Vec<u8> {
    let byte = u8::from(first) | (u8::from(last) << 1) | ((timing as u8) << 2);
    let mut out = Vec::with_capacity(3);
    if timing == Timing::Early {
        // An early pane has no on-time index (-1 in Beam's PaneInfo): the index alone.
        out.push(byte | 0x10);
        write_varint(&mut out, index);
    } else if index == 0 && on_time_index == 0 {
        out.push(byte);
    } else if index == on_time_index {
        out.push(byte | 0x10);
        write_varint(&mut out, index);
    } else {
        out.push(byte | 0x20);
        write_varint(&mut out, index);
        write_varint(&mut out, on_time_index);
    }
    out
}
/// The pane of an element not produced by a trigger (Impulse).
pub const PANE_NO_FIRING: u8 = 0x0f;

/// One element's windowed-value envelope, borrowed from the encoded bytes.
#[derive(Debug)]
pub struct Windowed<'a> {
    pub timestamp: i64,
    pub windows: Vec<&'a [u8]>,
    pub pane: &'a [u8],
    pub value: &'a [u8],
    pub end: usize,
}

impl<'a> Windowed<'a> {
    /// Reads the windowed value at `buf[pos..]`; `shape` must be a [`Shape::WindowedValue`].
    pub fn read(shape: &Shape, buf: &'a [u8], pos: usize) -> Result<Windowed<'a>, PortableError> {
        let Shape::WindowedValue { value, window } = shape else {
            return Err(coding(
                "windowed_value",
                format!("{shape:?} is not a windowed value"),
            ));
        };
        let short = || coding("windowed_value", "element cut short");
        let ts = buf.get(pos..pos + 8).ok_or_else(short)?;
        let count = buf.get(pos + 8..pos + 12).ok_or_else(short)?;
        let count = i32::from_be_bytes(count.try_into().expect("4 bytes"));
        let mut at = pos + 12;
        let mut windows = Vec::with_capacity(count.max(0) as usize);
        for _ in 0..count {
            let end = window.skip(buf, at)?;
            windows.push(&buf[at..end]);
            at = end;
        }
        // Pane: one byte, whose high nibble says how many varint indices follow.
        let first = *buf.get(at).ok_or_else(short)?;
        let mut pane_end = at + 1;
        for _ in 0..(first >> 4) {
            pane_end = read_varint(buf, pane_end)?.1;
        }
        let pane = &buf[at..pane_end];
        let end = value.skip(buf, pane_end)?;
        Ok(Windowed {
            timestamp: read_timestamp(ts),
            windows,
            pane,
            value: &buf[pane_end..end],
            end,
        })
    }
}

/// One timer, borrowed from its encoding: what identifies it (key, tag, windows), whether it
/// was cleared, and when it fires.
#[derive(Debug)]
pub struct TimerBytes<'a> {
    /// Key, tag and windows: a later timer with the same ones replaces this one.
    pub identity: &'a [u8],
    pub cleared: bool,
    pub fire: i64,
    /// The output timestamp it holds the stage's output watermark at until it fires (Beam's
    /// hold: an event-time timer's own time; a processing-time one's, the element's that set
    /// it, in the Python SDK).
    pub hold: i64,
    pub end: usize,
}

impl<'a> TimerBytes<'a> {
    /// The hold of a set timer's encoding `timer` whose identity is `identity_len` bytes:
    /// after the identity, the cleared flag and the firing time.
    pub fn hold_in(timer: &[u8], identity_len: usize) -> Option<i64> {
        let at = identity_len + 9;
        timer.get(at..at + 8).map(read_timestamp)
    }

    pub fn read(shape: &Shape, buf: &'a [u8], pos: usize) -> Result<TimerBytes<'a>, PortableError> {
        let Shape::Timer { key, window } = shape else {
            return Err(coding("timer", format!("{shape:?} is not a timer")));
        };
        let short = || coding("timer", "timer cut short");
        let mut at = key.skip(buf, pos)?;
        at = Shape::Bytes.skip(buf, at)?; // the dynamic timer tag
        at = Shape::Iterable(window.clone()).skip(buf, at)?;
        let identity = &buf[pos..at];
        let cleared = *buf.get(at).ok_or_else(short)? != 0;
        at += 1;
        if cleared {
            return Ok(TimerBytes {
                identity,
                cleared,
                fire: 0,
                hold: 0,
                end: at,
            });
        }
        let fire = read_timestamp(buf.get(at..at + 8).ok_or_else(short)?);
        let hold = Self::hold_in(&buf[pos..], identity.len()).ok_or_else(short)?;
        at += 16;
        let first = *buf.get(at).ok_or_else(short)?;
        at += 1;
        for _ in 0..(first >> 4) {
            at = read_varint(buf, at)?.1;
        }
        if at > buf.len() {
            return Err(short());
        }
        Ok(TimerBytes {
            identity,
            cleared,
            fire,
            hold,
            end: at,
        })
    }
}

/// Appends a windowed value whose value is `parts` concatenated (already encoded, nested).
pub fn write_windowed(
    out: &mut Vec<u8>,
    timestamp: i64,
    windows: &[&[u8]],
    pane: &[u8],
    parts: &[&[u8]],
) {
    write_timestamp(out, timestamp);
    out.extend_from_slice(&(windows.len() as i32).to_be_bytes());
    for w in windows {
        out.extend_from_slice(w);
    }
    out.extend_from_slice(pane);
    for p in parts {
        out.extend_from_slice(p);
    }
}

/// Appends `value` (encoded, nested) as an element of the global window at Beam's minimum
/// timestamp, in no pane: the runner's own elements (Impulse's, its requests to the SDK).
pub fn in_the_global_window(out: &mut Vec<u8>, value: &[u8]) {
    // The global window encodes as nothing.
    write_windowed(
        out,
        MIN_TIMESTAMP_MILLIS,
        &[&[]],
        &[PANE_NO_FIRING],
        &[value],
    );
}

/// Rewrites `id` so that every coder the runner cannot walk sits inside a `length_prefix`,
/// adding new coders to `components` as needed; returns the id to use (`id` when nothing
/// changed). Producer and consumer stages both see the rewritten coder, so the bytes agree.
pub fn length_prefix_unknown(
    components: &mut Components,
    id: &str,
) -> Result<String, PortableError> {
    let coder = components
        .coders
        .get(id)
        .cloned()
        .ok_or_else(|| coding(id, "no such coder"))?;
    let urn = urn_of(&coder).to_string();
    if urn == urns::LENGTH_PREFIX {
        return Ok(id.to_string());
    }
    if !WALKABLE.contains(&urn.as_str()) {
        return Ok(add_coder(
            components,
            &format!("{id}_lp"),
            urns::LENGTH_PREFIX,
            vec![id.to_string()],
        ));
    }
    let mut parts = Vec::with_capacity(coder.component_coder_ids.len());
    for c in &coder.component_coder_ids {
        parts.push(length_prefix_unknown(components, c)?);
    }
    if parts == coder.component_coder_ids {
        return Ok(id.to_string());
    }
    let mut rewritten = coder;
    rewritten.component_coder_ids = parts;
    let new_id = format!("{id}_lp");
    components.coders.insert(new_id.clone(), rewritten);
    Ok(new_id)
}

/// Adds (or finds) a coder with the given URN and components; returns its id.
pub fn add_coder(components: &mut Components, id: &str, urn: &str, parts: Vec<String>) -> String {
    let coder = Coder {
        spec: Some(FunctionSpec {
            urn: urn.to_string(),
            payload: Vec::new(),
        }),
        component_coder_ids: parts,
    };
    if let Some((existing, _)) = components.coders.iter().find(|(_, c)| **c == coder) {
        return existing.clone();
    }
    let mut new_id = id.to_string();
    let mut n = 1;
    while components.coders.contains_key(&new_id) {
        new_id = format!("{id}_{n}");
        n += 1;
    }
    components.coders.insert(new_id.clone(), coder);
    new_id
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn reads_what_the_python_sdk_writes() {
        // WindowedValueCoder(BytesCoder, GlobalWindowCoder).encode_nested(impulse), by apache-beam 2.77.
        let impulse = bytes("7fdf3b645a1cac09000000010f00");
        let shape = Shape::WindowedValue {
            value: Box::new(Shape::Bytes),
            window: Box::new(Shape::GlobalWindow),
        };
        let wv = Windowed::read(&shape, &impulse, 0).unwrap();
        assert_eq!(wv.timestamp, -9_223_372_036_854_775);
        assert_eq!(wv.windows, vec![&[0u8; 0][..]]);
        assert_eq!(wv.pane, &[PANE_NO_FIRING]);
        assert_eq!(wv.value, &[0]);
        assert_eq!(wv.end, impulse.len());
        let mut again = Vec::new();
        write_windowed(&mut again, wv.timestamp, &wv.windows, wv.pane, &[wv.value]);
        assert_eq!(again, impulse);

        // IntervalWindowCoder().encode(IntervalWindow(10, 70)).
        let window = bytes("8000000000011170e0d403");
        assert_eq!(
            Interval::decode(&window).unwrap(),
            Interval {
                start: 10_000,
                end: 70_000
            }
        );
        assert_eq!(
            Interval {
                start: 10_000,
                end: 70_000
            }
            .encode(),
            window
        );

        // IterableCoder(VarIntCoder()).encode_nested([1, 2]), then a truncated copy.
        let it = Shape::Iterable(Box::new(Shape::VarInt));
        assert_eq!(it.skip(&bytes("000000020102"), 0).unwrap(), 6);
        assert!(it.skip(&bytes("0000000201"), 0).is_err());
    }

    #[test]
    fn reads_timers_as_the_python_sdk_writes_them() {
        let shape = Shape::Timer {
            key: Box::new(Shape::Bytes),
            window: Box::new(Shape::GlobalWindow),
        };
        // _TimerCoder(StrUtf8Coder, GlobalWindowCoder): 'k' firing at 5 ms, then the same cleared.
        let set = bytes("016b000000000100800000000000000580000000000000050f");
        let t = TimerBytes::read(&shape, &set, 0).unwrap();
        assert_eq!(
            (t.identity, t.cleared, t.fire, t.hold, t.end),
            (&set[..7], false, 5, 5, set.len())
        );
        let cleared = bytes("016b000000000101");
        let t = TimerBytes::read(&shape, &cleared, 0).unwrap();
        assert_eq!(
            (t.identity, t.cleared, t.end),
            (&cleared[..7], true, cleared.len())
        );
    }

    #[test]
    fn unknown_coders_are_wrapped_and_known_ones_walked() {
        let mut c = Components::default();
        let pickled = add_coder(&mut c, "pickled", "beam:coders:python:pickled", vec![]);
        let bytes_id = add_coder(&mut c, "bytes", urns::BYTES, vec![]);
        let kv = add_coder(&mut c, "kv", urns::KV, vec![bytes_id.clone(), pickled]);
        let lp = length_prefix_unknown(&mut c, &kv).unwrap();
        assert_ne!(lp, kv);
        assert_eq!(
            Shape::of(&c.coders, &lp).unwrap(),
            Shape::Kv(Box::new(Shape::Bytes), Box::new(Shape::LengthPrefix))
        );
        assert_eq!(length_prefix_unknown(&mut c, &bytes_id).unwrap(), bytes_id);
        assert!(Shape::of(&c.coders, &kv).is_err());
    }
}
