//! A streaming GroupByKey's windows, kept from round to round ([`Pending`]). Each window's
//! panes are the event-time core's ([`Panes`], shared with the YAML streaming runtime): each
//! round adds what arrived (an element whose own window expired is dropped, as is one of a
//! window whose trigger finished), merges windows (sessions, or as the SDK's WindowFn says)
//! with each other and with the kept windows of their keys, then asks each window whether a
//! pane is due at the round's watermark and processing time: early, on time or late, as the
//! strategy's trigger, allowed lateness and accumulation say. A window goes once the watermark
//! passes its end and lateness. Dropped elements are counted.
use std::collections::{HashMap, HashSet};

use prost::bytes::Bytes;
use riverbank_pipeline::trigger::Triggering;
use riverbank_windowing::panes::{Arrival, PaneInfo, Panes, Timing};
use riverbank_windowing::trigger::Clock;

use crate::coders::{self, Shape};
use crate::error::PortableError;
use crate::plan::triggering_of;
use crate::runner_api::WindowingStrategy;

use super::checkpoint::{GroupState, WindowState, part_of};
use super::group::{Group, Groups, How, PerKey, max_timestamp};
use super::merge_windows::SdkMerge;

/// (encoded key, encoded window).
type Id = (Vec<u8>, Vec<u8>);

#[derive(Default)]
pub(crate) struct Pending {
    windows: HashMap<Id, Window>,
    /// The watermark (millis) of the last round: an element whose window expired by then is
    /// late.
    watermark: Option<i64>,
    /// Elements dropped: late past the allowed lateness, or their window's trigger finished.
    pub late: u64,
    /// The checkpoint parts (`part_of` their keys) whose windows changed since the last
    /// checkpoint written: only those are saved again.
    changed: HashSet<u32>,
}

/// One key's window: its panes, and what the next pane holds (since the last pane, or all of
/// the window's elements when the strategy accumulates).
struct Window {
    panes: Panes,
    data: Group,
}

/// Millis as the core's microseconds.
fn us(millis: i64) -> i64 {
    millis.saturating_mul(1000)
}

impl Pending {
    /// Adds `blocks`, then fires the panes due at `watermark` (millis; `i64::MAX` once the
    /// input is complete) and processing time `now` (millis): their groups, written, and how
    /// many panes.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn add_and_fire(
        &mut self,
        blocks: &[Bytes],
        input: &Shape,
        strategy: &WindowingStrategy,
        transform: &str,
        sdk_merge: Option<&SdkMerge>,
        watermark: i64,
        now: i64,
    ) -> Result<(Vec<Bytes>, usize), PortableError> {
        let how = How::of(input, strategy, transform)?;
        let triggering = triggering_of(strategy)
            .map_err(|reason| PortableError::unsupported(transform, reason))?;
        let arrived = Clock {
            watermark: self.watermark.map_or(i64::MIN, us),
            now: us(now),
        };
        let end_of = |window: &[u8]| -> Result<i64, PortableError> {
            Ok(us(max_timestamp(how.window, window)?.saturating_add(1)))
        };
        // This round's elements by key and window; one whose own window expired is late,
        // whatever it would merge into.
        let mut fresh: Groups = HashMap::new();
        for block in blocks {
            let late = &mut self.late;
            let changed = &mut self.changed;
            how.each(block, |key, window, value, timestamp| {
                let expiry = end_of(window)?.saturating_add(triggering.allowed_lateness_us);
                if arrived.watermark >= expiry {
                    *late += 1;
                } else {
                    // Merging touches only the windows of keys that got elements.
                    changed.insert(part_of(key));
                    let id = (key.to_vec(), window.to_vec());
                    fresh.entry(id).or_default().add(value, timestamp);
                }
                Ok(())
            })?;
        }
        if how.sessions || how.by_sdk {
            fresh = self.merge(fresh, &how, &triggering, sdk_merge, transform, arrived.now)?;
        }
        for (id, group) in fresh {
            let window = match self.windows.get_mut(&id) {
                Some(w) => w,
                None => {
                    let panes = Panes::new(&triggering, end_of(&id.1)?);
                    let data = Group::default();
                    self.windows.entry(id).or_insert(Window { panes, data })
                }
            };
            match window.panes.add_elements(u64::from(group.count), &arrived) {
                Arrival::Taken => window.data.merge(group),
                Arrival::TooLate | Arrival::Closed => self.late += u64::from(group.count),
            }
        }
        let clock = Clock {
            watermark: us(watermark),
            now: us(now),
        };
        let mut out: Vec<(Id, Group, Vec<u8>)> = Vec::new();
        for (id, window) in &mut self.windows {
            if window.panes.moves_on(&clock) {
                self.changed.insert(part_of(&id.0));
            }
            if let Some(firing) = window.panes.on_clock(&clock) {
                let data = match firing.clear {
                    true => std::mem::take(&mut window.data),
                    false => window.data.clone(),
                };
                out.push((id.clone(), data, encode(&firing.pane)));
            }
        }
        let changed = &mut self.changed;
        self.windows.retain(|(key, _), w| {
            let keep = !w.panes.is_expired(clock.watermark);
            if !keep {
                changed.insert(part_of(key));
            }
            keep
        });
        self.watermark = Some(self.watermark.map_or(watermark, |w| w.max(watermark)));
        let panes = out.len();
        let written = how.write(out.iter().map(|(id, g, p)| (id, g, &p[..])), strategy)?;
        Ok((written, panes))
    }

    /// Merges this round's windows with each other and with the kept windows of their keys:
    /// a kept window that grows or joins others is replaced by the merged one, its panes
    /// going on from the parts' ([`Panes::merged`]) with their data. Elements joining a
    /// window whose trigger finished are dropped (its data is gone). Returns this round's
    /// elements by their merged windows.
    fn merge(
        &mut self,
        fresh: Groups,
        how: &How,
        triggering: &Triggering,
        sdk_merge: Option<&SdkMerge>,
        transform: &str,
        now: i64,
    ) -> Result<Groups, PortableError> {
        // Each key's windows: this round's, and the kept ones of the same keys.
        let mut per_key: PerKey = HashMap::new();
        for (key, window) in fresh.keys() {
            per_key.entry(key).or_default().push(window);
        }
        for (key, window) in self.windows.keys() {
            if let Some(windows) = per_key.get_mut(key.as_slice()) {
                windows.push(window);
            }
        }
        let Some(merged_into) = how.merges(per_key, transform, sdk_merge)? else {
            return Ok(fresh);
        };
        // The kept windows merged away, by the window they merged into.
        let mut parts: HashMap<Id, Vec<(Id, Window)>> = HashMap::new();
        let moved: Vec<(Id, Vec<u8>)> = self
            .windows
            .keys()
            .filter_map(|id| Some((id.clone(), merged_into.get(id)?.clone())))
            .collect();
        for (id, into) in moved {
            let window = self.windows.remove(&id).expect("a kept window");
            parts
                .entry((id.0.clone(), into))
                .or_default()
                .push((id, window));
        }
        let mut out: Groups = HashMap::with_capacity(fresh.len());
        for (id, group) in fresh {
            let into = match merged_into.get(&id) {
                Some(window) => (id.0, window.clone()),
                None => id,
            };
            out.entry(into).or_default().merge(group);
        }
        for (into, mut windows) in parts {
            if let Some(same) = self.windows.remove(&into) {
                // Others joined a kept window without growing it.
                windows.push((into.clone(), same));
            }
            if windows.iter().any(|(_, w)| w.panes.is_closed()) {
                // A window whose trigger finished takes nothing more: what would join it is
                // dropped, and the kept windows stay as they were.
                if let Some(dropped) = out.remove(&into) {
                    self.late += u64::from(dropped.count);
                }
                self.windows.extend(windows);
                continue;
            }
            let end = us(max_timestamp(how.window, &into.1)?.saturating_add(1));
            let panes: Vec<Panes> = windows.iter().map(|(_, w)| w.panes.clone()).collect();
            let mut data = Group::default();
            for (_, w) in windows {
                data.merge(w.data);
            }
            let panes = Panes::merged(&panes, triggering, end, now);
            self.windows.insert(into, Window { panes, data });
        }
        Ok(out)
    }

    /// Its state for a checkpoint, as stage `stage`'s: every window, or (`only_changed`) the
    /// windows of the parts that changed since [`Self::saved`] (and which those are).
    pub(crate) fn save(&self, stage: usize, only_changed: bool) -> (GroupState, HashSet<u32>) {
        let windows = self
            .windows
            .iter()
            .filter(|((key, _), _)| !only_changed || self.changed.contains(&part_of(key)))
            .map(|((key, window), w)| {
                let mut panes = Vec::new();
                w.panes.encode(&mut panes);
                WindowState {
                    key: key.clone(),
                    window: window.clone(),
                    panes,
                    count: w.data.count,
                    values: w.data.values.clone(),
                    earliest: w.data.earliest,
                    latest: w.data.latest,
                }
            })
            .collect();
        let state = GroupState {
            stage: stage as u64,
            watermark: self.watermark,
            late: self.late,
            windows,
        };
        (state, self.changed.clone())
    }

    /// A checkpoint with what [`Self::save`] gave was written: nothing has changed since.
    pub(crate) fn saved(&mut self) {
        self.changed.clear();
    }

    /// The state a checkpoint saved.
    pub(crate) fn restore(state: GroupState) -> Result<Pending, PortableError> {
        let mut windows = HashMap::with_capacity(state.windows.len());
        for w in state.windows {
            let (panes, _) = Panes::decode(&w.panes).map_err(PortableError::Checkpoint)?;
            let data = Group {
                count: w.count,
                values: w.values,
                earliest: w.earliest,
                latest: w.latest,
            };
            windows.insert((w.key, w.window), Window { panes, data });
        }
        // Written again whole at the next checkpoint (this process has no names of its parts).
        let changed = windows.keys().map(|(key, _)| part_of(key)).collect();
        Ok(Pending {
            windows,
            watermark: state.watermark,
            late: state.late,
            changed,
        })
    }

    /// Windows waiting for the watermark, or for late elements.
    pub(crate) fn windows(&self) -> usize {
        self.windows.len()
    }

    /// When (processing time, millis) a pane by processing time is next due, if one waits.
    pub(crate) fn next_deadline(&self) -> Option<i64> {
        let us = self
            .windows
            .values()
            .filter_map(|w| w.panes.next_deadline())
            .min()?;
        Some(us.div_euclid(1000) + i64::from(us.rem_euclid(1000) != 0))
    }
}

/// A pane as Beam's PaneInfoCoder writes it.
fn encode(p: &PaneInfo) -> Vec<u8> {
    let timing = match p.timing {
        Timing::Early => coders::Timing::Early,
        Timing::OnTime => coders::Timing::OnTime,
        Timing::Late => coders::Timing::Late,
    };
    let nonspeculative = u64::try_from(p.nonspeculative_index).unwrap_or(0);
    coders::pane(p.is_first, p.is_last, timing, p.index, nonspeculative)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coders::{Interval, Windowed, write_windowed};
    use crate::runner_api::{FunctionSpec, Trigger, accumulation_mode};
    use crate::urns;

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

    /// A fired pane: key, window start and end, count of values, timestamp, pane's first byte.
    type Pane = (String, i64, i64, i32, i64, u8);

    /// Each fired pane.
    fn fired(blocks: &[Bytes]) -> Vec<Pane> {
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
                out.push((key, w.start, w.end, count, wv.timestamp, wv.pane[0]));
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
    ) -> Vec<Pane> {
        round_at(pending, strategy, elements, watermark, 0)
    }

    /// A round at processing time `now` (millis).
    fn round_at(
        pending: &mut Pending,
        strategy: &WindowingStrategy,
        elements: &[(&str, i64, i64, i64)],
        watermark: i64,
        now: i64,
    ) -> Vec<Pane> {
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
                now,
            )
            .unwrap();
        let out = fired(&out);
        assert_eq!(out.len(), n);
        out
    }

    /// A checkpoint saves again only the parts whose windows changed: after one where both
    /// keys got elements, a round where only `a` did saves `a`'s part alone; the round that
    /// fires and drops both windows changes both parts.
    #[test]
    fn only_the_parts_whose_windows_changed_are_saved_again() {
        let fixed = WindowingStrategy::default();
        let mut pending = Pending::default();
        let key_part = |p: &Pending| -> HashMap<Vec<u8>, u32> {
            let (state, _) = p.save(0, false);
            state
                .windows
                .iter()
                .map(|w| (w.key.clone(), part_of(&w.key)))
                .collect()
        };
        round(&mut pending, &fixed, &[("a", 100, 0, 60_000)], 1_000);
        let a = *key_part(&pending).values().next().unwrap();
        // A second key in another part.
        let other = (b'b'..=b'z')
            .map(|c| String::from(c as char))
            .find(|k| {
                let mut p = Pending::default();
                round(&mut p, &fixed, &[(k.as_str(), 100, 0, 60_000)], 1_000);
                key_part(&p).values().all(|part| *part != a)
            })
            .unwrap();
        round(
            &mut pending,
            &fixed,
            &[(other.as_str(), 100, 0, 60_000)],
            1_000,
        );
        assert_eq!(pending.save(0, true).1.len(), 2);
        pending.saved();
        assert!(
            pending.save(0, true).0.windows.is_empty(),
            "nothing changed"
        );
        round(&mut pending, &fixed, &[("a", 200, 0, 60_000)], 2_000);
        let (state, changed) = pending.save(0, true);
        assert_eq!(changed, HashSet::from([a]));
        assert_eq!(state.windows.len(), 1);
        assert_eq!(state.windows[0].count, 2);
        pending.saved();
        assert_eq!(round(&mut pending, &fixed, &[], 60_000).len(), 2);
        assert_eq!(
            pending.save(0, true).1.len(),
            2,
            "both windows fired and went"
        );
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
                ("a".into(), 0, 3_000, 1, 2_999, 0x07),
                ("b".into(), 0, 3_000, 1, 2_999, 0x07)
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
        assert_eq!(last, vec![("a".into(), 3_000, 6_000, 2, 5_999, 0x07)]);
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
        assert_eq!(second, vec![("a".into(), 1_000, 18_000, 2, 17_999, 0x07)]);
    }

    /// Allowed lateness of 5 s, accumulating: the on-time pane is not the last; a late element
    /// fires a late pane holding the window's earlier elements too; one past the lateness is
    /// dropped; the window goes once the watermark passes its lateness.
    #[test]
    fn late_elements_within_the_allowed_lateness_fire_late_panes() {
        let strategy = WindowingStrategy {
            allowed_lateness: 5_000,
            accumulation_mode: accumulation_mode::Enum::Accumulating as i32,
            ..WindowingStrategy::default()
        };
        let mut pending = Pending::default();
        let on_time = round(&mut pending, &strategy, &[("a", 1_000, 0, 3_000)], 3_500);
        // First, on time, not last: 0b0101.
        assert_eq!(on_time, vec![("a".into(), 0, 3_000, 1, 2_999, 0x05)]);
        let late = round(&mut pending, &strategy, &[("a", 2_000, 0, 3_000)], 4_000);
        // Late (timing 2), not first, index 1 = on-time index 1 (one varint): 0x18, then 1.
        assert_eq!(late, vec![("a".into(), 0, 3_000, 2, 2_999, 0x18)]);
        assert_eq!(pending.windows(), 1);
        // The watermark passes 3 s + 5 s: the window goes; an element of it after that is
        // dropped.
        assert!(round(&mut pending, &strategy, &[], 8_500).is_empty());
        assert_eq!(pending.windows(), 0);
        assert!(round(&mut pending, &strategy, &[("a", 2_500, 0, 3_000)], 9_000).is_empty());
        assert_eq!(pending.late, 1);
    }

    fn with_early(early: Trigger, accumulating: bool) -> WindowingStrategy {
        use crate::runner_api::trigger::{AfterEndOfWindow, Trigger as T};
        let mode = match accumulating {
            true => accumulation_mode::Enum::Accumulating,
            false => accumulation_mode::Enum::Discarding,
        };
        WindowingStrategy {
            trigger: Some(Trigger {
                trigger: Some(T::AfterEndOfWindow(Box::new(AfterEndOfWindow {
                    early_firings: Some(Box::new(early)),
                    late_firings: None,
                }))),
            }),
            accumulation_mode: mode as i32,
            ..WindowingStrategy::default()
        }
    }

    /// AfterWatermark(early=AfterCount(2)), accumulating: an early pane once two elements
    /// came, none for one more, then the on-time pane with all three (index 1, on-time index
    /// 0: Beam's two-index encoding).
    #[test]
    fn early_panes_fire_by_element_count_before_the_on_time_pane() {
        use crate::runner_api::trigger::{ElementCount, Trigger as T};
        let count = Trigger {
            trigger: Some(T::ElementCount(ElementCount { element_count: 2 })),
        };
        let strategy = with_early(count, true);
        let mut pending = Pending::default();
        let two = [("a", 100, 0, 3_000), ("a", 200, 0, 3_000)];
        let early = round(&mut pending, &strategy, &two, 1_000);
        // First, early (timing 0), index 0 alone: 0x11, then 0.
        assert_eq!(early, vec![("a".into(), 0, 3_000, 2, 2_999, 0x11)]);
        assert!(round(&mut pending, &strategy, &[("a", 300, 0, 3_000)], 2_000).is_empty());
        let on_time = round(&mut pending, &strategy, &[], 3_000);
        // Last, on time, not first: 0b0110, two indices: 0x26.
        assert_eq!(on_time, vec![("a".into(), 0, 3_000, 3, 2_999, 0x26)]);
    }

    /// AfterProcessingTime(`ms`).
    fn after_processing_time(ms: i64) -> Trigger {
        use crate::runner_api::trigger::{AfterProcessingTime, Trigger as T};
        use crate::runner_api::{TimestampTransform, timestamp_transform};
        let delay = timestamp_transform::Delay { delay_millis: ms };
        Trigger {
            trigger: Some(T::AfterProcessingTime(AfterProcessingTime {
                timestamp_transforms: vec![TimestampTransform {
                    timestamp_transform: Some(timestamp_transform::TimestampTransform::Delay(
                        delay,
                    )),
                }],
            })),
        }
    }

    /// AfterWatermark(early=AfterProcessingTime(10 s)), discarding: an early pane 10 s of
    /// processing time after the first element, the on-time pane with only what came after.
    #[test]
    fn early_panes_fire_by_processing_time_and_discard_what_they_held() {
        let delay = after_processing_time(10_000);
        let strategy = with_early(delay, false);
        let mut pending = Pending::default();
        let first = [("a", 100, 0, 60_000)];
        assert!(round_at(&mut pending, &strategy, &first, 1_000, 5_000).is_empty());
        assert_eq!(pending.next_deadline(), Some(15_000));
        let second = [("a", 200, 0, 60_000)];
        let early = round_at(&mut pending, &strategy, &second, 2_000, 15_000);
        assert_eq!(early, vec![("a".into(), 0, 60_000, 2, 59_999, 0x11)]);
        assert_eq!(pending.next_deadline(), None);
        let third = [("a", 300, 0, 60_000)];
        let on_time = round_at(&mut pending, &strategy, &third, 60_000, 16_000);
        assert_eq!(on_time, vec![("a".into(), 0, 60_000, 1, 59_999, 0x26)]);
    }

    /// AfterWatermark(early=AfterProcessingTime aligned to 10 s), discarding (Java's
    /// `alignedTo`): two keys whose first elements came at 3 s and 7 s of processing time
    /// fire their early panes together at 10 s, and the job wakes for that instant.
    #[test]
    fn early_panes_aligned_to_a_period_fire_together_at_its_next_instant() {
        use crate::runner_api::trigger::{AfterProcessingTime, Trigger as T};
        use crate::runner_api::{TimestampTransform, timestamp_transform};
        let align = timestamp_transform::AlignTo {
            period: 10_000,
            offset: 0,
        };
        let aligned = Trigger {
            trigger: Some(T::AfterProcessingTime(AfterProcessingTime {
                timestamp_transforms: vec![TimestampTransform {
                    timestamp_transform: Some(timestamp_transform::TimestampTransform::AlignTo(
                        align,
                    )),
                }],
            })),
        };
        let strategy = with_early(aligned, false);
        let mut pending = Pending::default();
        let a = [("a", 100, 0, 60_000)];
        assert!(round_at(&mut pending, &strategy, &a, 1_000, 3_000).is_empty());
        let b = [("b", 200, 0, 60_000)];
        assert!(round_at(&mut pending, &strategy, &b, 1_000, 7_000).is_empty());
        assert_eq!(pending.next_deadline(), Some(10_000));
        assert!(round_at(&mut pending, &strategy, &[], 1_000, 9_999).is_empty());
        let both = round_at(&mut pending, &strategy, &[], 1_000, 10_000);
        assert_eq!(
            both,
            vec![
                ("a".into(), 0, 60_000, 1, 59_999, 0x11),
                ("b".into(), 0, 60_000, 1, 59_999, 0x11)
            ]
        );
    }

    /// AfterWatermark(early=AfterAny(AfterCount(3), AfterProcessingTime(10 s))), discarding:
    /// an early pane by count, then one by delay; the next wake-up is the delay's.
    #[test]
    fn early_panes_fire_by_whichever_of_any_comes_first() {
        use crate::runner_api::trigger::{AfterAny, ElementCount, Trigger as T};
        let delay = after_processing_time(10_000);
        let count = Trigger {
            trigger: Some(T::ElementCount(ElementCount { element_count: 3 })),
        };
        let any = Trigger {
            trigger: Some(T::AfterAny(AfterAny {
                subtriggers: vec![count, delay],
            })),
        };
        let strategy = with_early(any, false);
        let mut pending = Pending::default();
        let three = [
            ("a", 100, 0, 60_000),
            ("a", 200, 0, 60_000),
            ("a", 300, 0, 60_000),
        ];
        let by_count = round_at(&mut pending, &strategy, &three, 1_000, 5_000);
        assert_eq!(by_count, vec![("a".into(), 0, 60_000, 3, 59_999, 0x11)]);
        let one = [("a", 400, 0, 60_000)];
        assert!(round_at(&mut pending, &strategy, &one, 2_000, 6_000).is_empty());
        assert_eq!(pending.next_deadline(), Some(16_000));
        let by_delay = round_at(&mut pending, &strategy, &[], 3_000, 16_000);
        // Early, not first, index 1: 0x10, then 1.
        assert_eq!(by_delay, vec![("a".into(), 0, 60_000, 1, 59_999, 0x10)]);
    }

    /// Discarding: a late pane holds only the late elements.
    #[test]
    fn a_discarding_late_pane_holds_only_its_late_elements() {
        let strategy = WindowingStrategy {
            allowed_lateness: 5_000,
            ..WindowingStrategy::default()
        };
        let mut pending = Pending::default();
        round(
            &mut pending,
            &strategy,
            &[("a", 1_000, 0, 3_000), ("a", 1_500, 0, 3_000)],
            3_500,
        );
        let late = round(&mut pending, &strategy, &[("a", 2_000, 0, 3_000)], 4_000);
        assert_eq!(late[0].3, 1);
    }

    fn element_count(n: i32) -> Trigger {
        use crate::runner_api::trigger::{ElementCount, Trigger as T};
        Trigger {
            trigger: Some(T::ElementCount(ElementCount { element_count: n })),
        }
    }

    /// Sessions with early firings (each element), accumulating: an early pane per round;
    /// a session that grows by a later element goes on from its panes (index 1, holding
    /// both elements), and fires on time once the watermark passes the merged end.
    #[test]
    fn merged_sessions_fire_early_panes_and_go_on_from_them() {
        let mut strategy = with_early(element_count(1), true);
        strategy.window_fn = sessions().window_fn;
        let mut pending = Pending::default();
        let first = round(&mut pending, &strategy, &[("a", 1_000, 1_000, 11_000)], 0);
        assert_eq!(first, vec![("a".into(), 1_000, 11_000, 1, 10_999, 0x11)]);
        let grown = round(
            &mut pending,
            &strategy,
            &[("a", 5_000, 5_000, 15_000)],
            2_000,
        );
        // Early, not first, index 1: 0x10, then 1.
        assert_eq!(grown, vec![("a".into(), 1_000, 15_000, 2, 14_999, 0x10)]);
        assert_eq!(pending.windows(), 1);
        let on_time = round(&mut pending, &strategy, &[], 20_000);
        // Last, on time, index 2, on-time index 0: 0x26.
        assert_eq!(on_time, vec![("a".into(), 1_000, 15_000, 2, 14_999, 0x26)]);
        assert_eq!(pending.windows(), 0);
    }

    /// Sessions with allowed lateness: a late element that bridges into a fired session
    /// merges with it, and the grown session's next pane is late (index 1).
    #[test]
    fn a_late_element_merges_into_a_fired_session_and_fires_a_late_pane() {
        let mut strategy = sessions();
        strategy.allowed_lateness = 5_000;
        let mut pending = Pending::default();
        assert!(round(&mut pending, &strategy, &[("a", 1_000, 1_000, 11_000)], 0).is_empty());
        let on_time = round(&mut pending, &strategy, &[], 12_000);
        assert_eq!(on_time, vec![("a".into(), 1_000, 11_000, 1, 10_999, 0x05)]);
        let bridged = [("a", 9_000, 9_000, 19_000)];
        assert!(round(&mut pending, &strategy, &bridged, 13_000).is_empty());
        let late = round(&mut pending, &strategy, &[], 19_000);
        assert_eq!(late, vec![("a".into(), 1_000, 19_000, 1, 18_999, 0x18)]);
        assert_eq!(pending.late, 0);
    }

    /// `Repeatedly(AfterCount(2)).orFinally(AfterCount(3))`: a pane at two elements, the last
    /// at the third; the window then drops what comes.
    #[test]
    fn or_finally_ends_a_window_when_its_until_trigger_fires() {
        use crate::runner_api::trigger::{OrFinally, Repeat, Trigger as T};
        let repeated = Trigger {
            trigger: Some(T::Repeat(Box::new(Repeat {
                subtrigger: Some(Box::new(element_count(2))),
            }))),
        };
        let strategy = WindowingStrategy {
            trigger: Some(Trigger {
                trigger: Some(T::OrFinally(Box::new(OrFinally {
                    main: Some(Box::new(repeated)),
                    finally: Some(Box::new(element_count(3))),
                }))),
            }),
            ..WindowingStrategy::default()
        };
        let mut pending = Pending::default();
        let two = [("a", 100, 0, 60_000), ("a", 200, 0, 60_000)];
        let first = round(&mut pending, &strategy, &two, 1_000);
        assert_eq!(first, vec![("a".into(), 0, 60_000, 2, 59_999, 0x11)]);
        let third = round(&mut pending, &strategy, &[("a", 300, 0, 60_000)], 2_000);
        // Early, last, index 1: 0x12, then 1.
        assert_eq!(third, vec![("a".into(), 0, 60_000, 1, 59_999, 0x12)]);
        assert!(round(&mut pending, &strategy, &[("a", 400, 0, 60_000)], 3_000).is_empty());
        assert_eq!(pending.late, 1);
    }

    /// Windows restored from a checkpoint fire what the originals would: sessions kept across
    /// the checkpoint merge with what comes after it, late counts carry over.
    #[test]
    fn windows_restored_from_a_checkpoint_fire_as_the_originals_would() {
        let mut strategy = sessions();
        strategy.allowed_lateness = 5_000;
        let mut pending = Pending::default();
        let first = [("a", 1_000, 1_000, 11_000), ("b", 500, 500, 10_500)];
        round(&mut pending, &strategy, &first, 0);
        round(&mut pending, &strategy, &[], 12_000);
        let mut restored = Pending::restore(pending.save(3, false).0).unwrap();
        let next = [("a", 9_000, 9_000, 19_000), ("b", 200, 200, 300)];
        let original = round(&mut pending, &strategy, &next, 19_000);
        let again = round(&mut restored, &strategy, &next, 19_000);
        assert_eq!(original, again);
        assert_eq!(original, vec![("a".into(), 1_000, 19_000, 1, 18_999, 0x18)]);
        assert_eq!(
            (restored.late, restored.windows()),
            (pending.late, pending.windows())
        );
        assert_eq!(restored.late, 1);
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
