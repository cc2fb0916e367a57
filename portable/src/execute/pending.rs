//! A streaming GroupByKey's windows, kept from round to round ([`Pending`]): each round adds
//! what arrived, merges windows (sessions), fires the early panes its trigger says are due,
//! and every window the watermark has passed, once, on time. With allowed lateness, a fired
//! window is kept until the watermark passes its end and that lateness: its late elements fire
//! a late pane each round (holding the earlier elements too when the strategy accumulates), or
//! are dropped when the trigger fires on time only; an element of a window past its lateness is
//! dropped. Dropped elements are counted.
use std::collections::HashMap;

use prost::bytes::Bytes;

use crate::coders::{Shape, Timing, pane};
use crate::error::PortableError;
use crate::plan::{Early, Firing};
use crate::runner_api::WindowingStrategy;

use super::group::{Group, Groups, How, max_timestamp};
use super::merge_windows::SdkMerge;

#[derive(Default)]
pub(crate) struct Pending {
    /// Windows that have not fired.
    groups: Groups,
    /// Open windows' early panes so far, and what arrived since the last (non-merging
    /// windows, with early firings).
    early: HashMap<(Vec<u8>, Vec<u8>), Opened>,
    /// Windows fired on time and still within their allowed lateness (non-merging windows).
    fired: HashMap<(Vec<u8>, Vec<u8>), Fired>,
    /// The watermark of the last firing: windows that end at or before it have fired.
    fired_to: Option<i64>,
    /// Elements dropped: late past the allowed lateness, or with no late pane to go in.
    pub late: u64,
}

/// A pane to write: (key, window), its elements, its pane.
type Fire = ((Vec<u8>, Vec<u8>), Group, Vec<u8>);

/// An open window with early firings.
#[derive(Default)]
struct Opened {
    /// Early panes fired.
    panes: u64,
    /// Elements since the last pane, and when (processing time, millis) the first came.
    fresh: u64,
    since: Option<i64>,
}

impl Opened {
    fn due(&self, early: &Early, now: i64) -> bool {
        early.due(self.fresh, self.since, now)
    }
}

/// A fired window within its allowed lateness.
#[derive(Default)]
struct Fired {
    /// Panes fired so far (early, on time and late): the next one's index.
    panes: u64,
    /// On-time and late panes fired so far.
    non_early: u64,
    /// What the panes held, when the strategy accumulates.
    accumulated: Group,
    /// Late elements since the last pane.
    fresh: Group,
}

impl Pending {
    /// Adds `blocks`, then fires the early panes that are due (`now`: processing time,
    /// millis), the windows that end at or before `watermark` (millis; `i64::MAX` once the
    /// input is complete) and the late panes of fired ones: their groups, written, and how many
    /// panes.
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
        let firing =
            Firing::of(strategy).map_err(|reason| PortableError::unsupported(transform, reason))?;
        let fired_to = self.fired_to;
        for block in blocks {
            let (groups, fired, late) = (&mut self.groups, &mut self.fired, &mut self.late);
            let early = &mut self.early;
            how.each(block, |key, window, value, timestamp| {
                let on_time = match fired_to {
                    None => true,
                    Some(w) => max_timestamp(how.window, window)? >= w,
                };
                if on_time {
                    let id = (key.to_vec(), window.to_vec());
                    if firing.early.is_some() {
                        let opened = early.entry(id.clone()).or_default();
                        opened.fresh += 1;
                        opened.since.get_or_insert(now);
                    }
                    groups.entry(id).or_default().add(value, timestamp);
                    return Ok(());
                }
                let max = max_timestamp(how.window, window)?;
                let within = max.saturating_add(firing.lateness) >= fired_to.unwrap_or(i64::MIN);
                if firing.late_panes && firing.lateness > 0 && within {
                    let id = (key.to_vec(), window.to_vec());
                    fired.entry(id).or_default().fresh.add(value, timestamp);
                } else {
                    *late += 1;
                }
                Ok(())
            })?;
        }
        let groups = how.merge(std::mem::take(&mut self.groups), transform, sdk_merge)?;
        let mut out: Vec<Fire> = Vec::new();
        let kept = firing.late_panes && firing.lateness > 0;
        for (id, mut group) in groups {
            if max_timestamp(how.window, &id.1)? >= watermark {
                // Open: an early pane when its trigger says; discarding, the window then
                // holds only what comes after it.
                if let Some(early) = &firing.early
                    && let Some(opened) = self.early.get_mut(&id)
                    && opened.due(early, now)
                {
                    let index = opened.panes;
                    out.push((
                        id.clone(),
                        group.clone(),
                        pane(index == 0, false, Timing::Early, index, 0),
                    ));
                    opened.panes += 1;
                    opened.fresh = 0;
                    opened.since = None;
                    if !firing.accumulating {
                        group = Group::default();
                    }
                }
                self.groups.insert(id, group);
                continue;
            }
            let early_panes = self.early.remove(&id).map_or(0, |o| o.panes);
            let expires = max_timestamp(how.window, &id.1)?.saturating_add(firing.lateness);
            let last = !kept || expires < watermark;
            if group.count > 0 || early_panes == 0 || firing.on_time_always {
                let on_time = pane(early_panes == 0, last, Timing::OnTime, early_panes, 0);
                out.push((id.clone(), group.clone(), on_time));
            }
            if !last {
                let accumulated = if firing.accumulating {
                    group
                } else {
                    Group::default()
                };
                self.fired.insert(
                    id,
                    Fired {
                        panes: early_panes + 1,
                        non_early: 1,
                        accumulated,
                        fresh: Group::default(),
                    },
                );
            }
        }
        // Late panes, and the windows whose lateness the watermark has passed.
        let mut expired = Vec::new();
        for (id, fired) in &mut self.fired {
            let max = max_timestamp(how.window, &id.1)?;
            let gone = max.saturating_add(firing.lateness) < watermark;
            if fired.fresh.count > 0 {
                let fresh = std::mem::take(&mut fired.fresh);
                let values = match firing.accumulating {
                    true => {
                        fired.accumulated.merge(fresh);
                        fired.accumulated.clone()
                    }
                    false => fresh,
                };
                let index = fired.panes;
                out.push((
                    id.clone(),
                    values,
                    pane(index == 0, gone, Timing::Late, index, fired.non_early),
                ));
                fired.panes += 1;
                fired.non_early += 1;
            }
            if gone {
                expired.push(id.clone());
            }
        }
        for id in expired {
            self.fired.remove(&id);
        }
        self.fired_to = Some(fired_to.map_or(watermark, |w| w.max(watermark)));
        let panes = out.len();
        let written = how.write(out.iter().map(|(id, g, p)| (id, g, &p[..])), strategy)?;
        Ok((written, panes))
    }

    /// Windows waiting for the watermark, or for late elements.
    pub(crate) fn windows(&self) -> usize {
        self.groups.len() + self.fired.len()
    }

    /// When (processing time, millis) the next early pane by delay is due, if any waits.
    pub(crate) fn next_early(&self, strategy: &WindowingStrategy) -> Option<i64> {
        let d = Firing::of(strategy).ok()?.early?.delay()?;
        self.early
            .values()
            .filter_map(|o| o.since)
            .min()
            .map(|t| t.saturating_add(d))
    }
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
        assert_eq!(pending.next_early(&strategy), Some(15_000));
        let second = [("a", 200, 0, 60_000)];
        let early = round_at(&mut pending, &strategy, &second, 2_000, 15_000);
        assert_eq!(early, vec![("a".into(), 0, 60_000, 2, 59_999, 0x11)]);
        assert_eq!(pending.next_early(&strategy), None);
        let third = [("a", 300, 0, 60_000)];
        let on_time = round_at(&mut pending, &strategy, &third, 60_000, 16_000);
        assert_eq!(on_time, vec![("a".into(), 0, 60_000, 1, 59_999, 0x26)]);
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
        assert_eq!(pending.next_early(&strategy), Some(16_000));
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
