//! Whether a pipeline streams (it has an unbounded PCollection), and what a streaming run
//! cannot do yet: said at Prepare, naming the transform.
use crate::coders::proto_millis;
use crate::error::PortableError;
use crate::runner_api::trigger::{AfterEndOfWindow, Trigger as T};
use crate::runner_api::{
    Components, Trigger, WindowingStrategy, accumulation_mode, merge_status, on_time_behavior,
    timestamp_transform,
};

use super::{Plan, StageKind};

/// A pipeline streams when any of its PCollections is unbounded (an unbounded splittable
/// DoFn's output and everything downstream, as the SDK marks them).
pub(super) fn is_streaming(components: &Components) -> bool {
    components
        .pcollections
        .keys()
        .any(|p| super::is_unbounded(components, p))
}

/// What a streaming run refuses: a side input that never ends in windows other than fixed ones,
/// and a GroupByKey whose windows it cannot fire as its strategy says ([`Firing`]).
pub(super) fn check(plan: &Plan) -> Result<(), PortableError> {
    let components = &plan.components;
    for stage in &plan.stages {
        match &stage.kind {
            StageKind::Sdk(s) => {
                for side in &s.side_inputs {
                    if super::is_unbounded(components, &side.pcollection)
                        && fixed_windows(components, &side.pcollection).is_none()
                    {
                        return Err(PortableError::unsupported(
                            plan.name_of(&side.transform),
                            format!(
                                "side input '{}' is unbounded and not in fixed windows: a streaming run takes a side input that never ends in fixed windows only",
                                side.tag
                            ),
                        ));
                    }
                }
            }
            StageKind::GroupByKey {
                transform, input, ..
            } => {
                if let Some(strategy) = super::strategy_of(components, input) {
                    Firing::of(strategy).map_err(|reason| {
                        PortableError::unsupported(plan.name_of(transform), reason)
                    })?;
                }
            }
            StageKind::Impulse { .. } | StageKind::Concat { .. } => {}
        }
    }
    Ok(())
}

/// The size and offset (millis) of `pcollection`'s fixed windows, if it is in fixed windows.
pub(crate) fn fixed_windows(components: &Components, pcollection: &str) -> Option<(i64, i64)> {
    use prost::Message;
    let window_fn = super::strategy_of(components, pcollection)?
        .window_fn
        .as_ref()?;
    if window_fn.urn != crate::urns::FIXED_WINDOWS {
        return None;
    }
    let payload = crate::runner_api::FixedWindowsPayload::decode(&window_fn.payload[..]).ok()?;
    let size = payload.size.map(|d| proto_millis(d.seconds, d.nanos))?;
    let offset = payload
        .offset
        .map_or(0, |t| proto_millis(t.seconds, t.nanos));
    (size > 0).then_some((size, offset))
}

/// How a streaming GroupByKey fires a window, from its windowing strategy: early panes while
/// the window is open (AfterWatermark's early firings, or a repeated element-count or
/// processing-time trigger), once on time, when the watermark passes the window's end (for a
/// repeated trigger, the pane that closes the window); then, within the allowed lateness, a
/// late pane for the late elements of each round (Beam's default trigger,
/// `Repeatedly(AfterWatermark())`, or AfterWatermark with late firings of every element), or
/// none (AfterWatermark alone: late elements are dropped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Firing {
    /// Millis past a window's end during which its late elements are taken.
    pub lateness: i64,
    /// Late elements fire late panes; else they are dropped.
    pub late_panes: bool,
    /// A pane holds the window's elements of earlier panes too.
    pub accumulating: bool,
    pub early: Option<Early>,
    /// The on-time pane is fired even when it holds nothing (after early panes).
    pub on_time_always: bool,
}

/// When an open window fires an early pane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Early {
    /// Once this many elements arrived since its last pane.
    Count(u64),
    /// This many millis of processing time after the first element since its last pane.
    Delay(i64),
    /// AfterAny: once any of these would.
    Any(Vec<Early>),
    /// AfterAll: once all of these would.
    All(Vec<Early>),
}

impl Early {
    /// Whether a window fires, `fresh` elements having come since its last pane, the first
    /// at `since` (processing time, millis), at `now`.
    pub(crate) fn due(&self, fresh: u64, since: Option<i64>, now: i64) -> bool {
        match self {
            Early::Count(n) => fresh >= *n,
            Early::Delay(d) => since.is_some_and(|t| now.saturating_sub(t) >= *d),
            Early::Any(all) => all.iter().any(|e| e.due(fresh, since, now)),
            Early::All(all) => all.iter().all(|e| e.due(fresh, since, now)),
        }
    }

    /// After how much processing time from a pane's first element it may fire without more
    /// elements coming (none: only elements make it fire).
    pub(crate) fn delay(&self) -> Option<i64> {
        match self {
            Early::Count(_) => None,
            Early::Delay(d) => Some(*d),
            Early::Any(all) => all.iter().filter_map(Early::delay).min(),
            Early::All(all) => all.iter().filter_map(Early::delay).max(),
        }
    }
}

impl Firing {
    /// The firing of `strategy`, or why a streaming run cannot fire it.
    pub(crate) fn of(strategy: &WindowingStrategy) -> Result<Firing, String> {
        let trigger = strategy.trigger.as_ref().and_then(|t| t.trigger.as_ref());
        let after_watermark = |t: &AfterEndOfWindow, repeated: bool| {
            let early = t.early_firings.as_deref().map(early_of).transpose()?;
            let late_panes = match t.late_firings.as_deref() {
                None => repeated,
                Some(late) if every_element(late) => true,
                Some(_) => return Err(not_yet()),
            };
            Ok((early, late_panes))
        };
        let (early, late_panes) = match trigger {
            None | Some(T::Default(_)) => (None, true),
            Some(T::AfterEndOfWindow(t)) => after_watermark(t, false)?,
            Some(T::Repeat(r)) => match r.subtrigger.as_deref() {
                Some(Trigger {
                    trigger: Some(T::AfterEndOfWindow(t)),
                }) => after_watermark(t, true)?,
                // Repeatedly(AfterCount(n)), Repeatedly(AfterProcessingTime(d)): panes as
                // early ones while the window is open, the rest when it closes.
                Some(sub) => {
                    if strategy.allowed_lateness > 0 {
                        return Err(format!(
                            "allowed lateness ({} ms) with a repeated count or processing-time trigger in a streaming pipeline is not supported yet",
                            strategy.allowed_lateness
                        ));
                    }
                    (Some(early_of(sub)?), false)
                }
                None => return Err(not_yet()),
            },
            Some(_) => return Err(not_yet()),
        };
        let merging = strategy.merge_status == merge_status::Enum::NeedsMerge as i32
            || strategy
                .window_fn
                .as_ref()
                .is_some_and(|f| f.urn == crate::urns::SESSION_WINDOWS);
        if merging && strategy.allowed_lateness > 0 {
            return Err(format!(
                "allowed lateness ({} ms) with merging windows (sessions) in a streaming pipeline is not supported yet",
                strategy.allowed_lateness
            ));
        }
        if merging && early.is_some() {
            return Err(
                "early firings with merging windows (sessions) in a streaming pipeline are not supported yet".into(),
            );
        }
        Ok(Firing {
            lateness: strategy.allowed_lateness.max(0),
            late_panes,
            accumulating: strategy.accumulation_mode
                == accumulation_mode::Enum::Accumulating as i32,
            early,
            on_time_always: strategy.on_time_behavior
                != on_time_behavior::Enum::FireIfNonempty as i32,
        })
    }
}

fn not_yet() -> String {
    "a trigger other than the default or AfterWatermark (early firings by element count, processing time, or AfterAny/AfterAll of those; late firings of every element), or one of those repeated, in a streaming pipeline is not supported yet".into()
}

/// Early firings: by element count or processing-time delay, or any or all of those (repeated
/// or not: an early trigger is evaluated again after each pane).
fn early_of(trigger: &Trigger) -> Result<Early, String> {
    match &trigger.trigger {
        Some(T::ElementCount(c)) if c.element_count >= 1 => {
            Ok(Early::Count(c.element_count as u64))
        }
        Some(T::Always(_)) => Ok(Early::Count(1)),
        Some(T::AfterProcessingTime(p)) => {
            let mut delay = 0i64;
            for t in &p.timestamp_transforms {
                match &t.timestamp_transform {
                    Some(timestamp_transform::TimestampTransform::Delay(d)) => {
                        delay = delay.saturating_add(d.delay_millis)
                    }
                    _ => {
                        return Err(
                            "AfterProcessingTime aligned to a period in a streaming pipeline is not supported yet".into(),
                        );
                    }
                }
            }
            Ok(Early::Delay(delay.max(0)))
        }
        Some(T::Repeat(r)) => r
            .subtrigger
            .as_deref()
            .map_or_else(|| Err(not_yet()), early_of),
        Some(T::AfterAny(any)) if !any.subtriggers.is_empty() => Ok(Early::Any(
            any.subtriggers
                .iter()
                .map(early_of)
                .collect::<Result<_, _>>()?,
        )),
        Some(T::AfterAll(all)) if !all.subtriggers.is_empty() => Ok(Early::All(
            all.subtriggers
                .iter()
                .map(early_of)
                .collect::<Result<_, _>>()?,
        )),
        _ => Err(not_yet()),
    }
}

/// A trigger that fires for every element: AfterCount(1), Always, or either repeated.
fn every_element(trigger: &Trigger) -> bool {
    match &trigger.trigger {
        Some(T::ElementCount(c)) => c.element_count == 1,
        Some(T::Always(_)) => true,
        Some(T::Repeat(r)) => r.subtrigger.as_deref().is_some_and(every_element),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner_api::TimestampTransform;
    use crate::runner_api::trigger::{AfterProcessingTime, Default, ElementCount, Repeat};

    fn strategy(trigger: T, allowed_lateness: i64) -> WindowingStrategy {
        WindowingStrategy {
            trigger: Some(Trigger {
                trigger: Some(trigger),
            }),
            allowed_lateness,
            ..WindowingStrategy::default()
        }
    }

    fn after_watermark(late: Option<T>) -> T {
        T::AfterEndOfWindow(Box::new(AfterEndOfWindow {
            early_firings: None,
            late_firings: late.map(|t| Box::new(Trigger { trigger: Some(t) })),
        }))
    }

    fn count(n: i32) -> T {
        T::ElementCount(ElementCount { element_count: n })
    }

    #[test]
    fn a_streaming_group_by_key_fires_on_time_then_late_panes_as_its_trigger_says() {
        let default = Firing::of(&strategy(T::Default(Default {}), 60_000)).unwrap();
        assert_eq!(
            default,
            Firing {
                lateness: 60_000,
                late_panes: true,
                accumulating: false,
                early: None,
                on_time_always: true,
            }
        );
        let alone = Firing::of(&strategy(after_watermark(None), 0)).unwrap();
        assert!(!alone.late_panes);
        let every = Firing::of(&strategy(after_watermark(Some(count(1))), 5_000)).unwrap();
        assert!(every.late_panes);
        let repeated = T::Repeat(Box::new(Repeat {
            subtrigger: Some(Box::new(Trigger {
                trigger: Some(after_watermark(None)),
            })),
        }));
        assert!(Firing::of(&strategy(repeated, 0)).unwrap().late_panes);
        // A bare AfterCount closes its window at its first firing: not run.
        let counted = Firing::of(&strategy(count(2), 0)).unwrap_err();
        assert!(
            counted.contains("trigger other than the default"),
            "{counted}"
        );
        let repeated_count = T::Repeat(Box::new(Repeat {
            subtrigger: Some(Box::new(Trigger {
                trigger: Some(count(2)),
            })),
        }));
        let firing = Firing::of(&strategy(repeated_count, 0)).unwrap();
        assert_eq!(firing.early, Some(Early::Count(2)));
        let early = T::AfterEndOfWindow(Box::new(AfterEndOfWindow {
            early_firings: Some(Box::new(Trigger {
                trigger: Some(T::AfterProcessingTime(AfterProcessingTime {
                    timestamp_transforms: vec![TimestampTransform {
                        timestamp_transform: Some(timestamp_transform::TimestampTransform::Delay(
                            timestamp_transform::Delay {
                                delay_millis: 10_000,
                            },
                        )),
                    }],
                })),
            })),
            late_firings: None,
        }));
        assert_eq!(
            Firing::of(&strategy(early, 0)).unwrap().early,
            Some(Early::Delay(10_000))
        );
        let late_counted = Firing::of(&strategy(after_watermark(Some(count(3))), 0));
        assert!(late_counted.is_err());
        let mut sessions = strategy(T::Default(Default {}), 1_000);
        sessions.merge_status = merge_status::Enum::NeedsMerge as i32;
        assert!(
            Firing::of(&sessions)
                .unwrap_err()
                .contains("merging windows")
        );
    }
}
