//! Whether a pipeline streams (it has an unbounded PCollection), and what a streaming run
//! cannot do yet: said at Prepare, naming the transform.
use crate::coders::{Shape, proto_millis};
use crate::error::PortableError;
use crate::runner_api::trigger::{AfterProcessingTime, Trigger as T};
use crate::runner_api::{
    Components, Trigger, WindowingStrategy, accumulation_mode, on_time_behavior,
    timestamp_transform,
};
use riverbank_pipeline::trigger::{
    AccumulationMode, OnTimeBehavior, TimeShift, Trigger as Spec, Triggering,
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
/// and a GroupByKey whose windows it cannot fire as its strategy says ([`triggering_of`]).
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
                let window = plan
                    .materialized
                    .get(input)
                    .and_then(|m| m.shape.windowed_kv())
                    .map(|(_, window)| window);
                let readable = matches!(
                    window,
                    None | Some(Shape::GlobalWindow | Shape::IntervalWindow)
                );
                if !readable && super::is_unbounded(components, input) {
                    return Err(PortableError::unsupported(
                        plan.name_of(transform),
                        "its windows are of a type only the SDK can read, so a streaming run cannot tell when they end (global and interval windows only)",
                    ));
                }
                if let Some(strategy) = super::strategy_of(components, input) {
                    triggering_of(strategy).map_err(|reason| {
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

/// How a streaming GroupByKey fires its windows: the strategy's trigger, allowed lateness,
/// accumulation and on-time behaviour in the terms of the event-time core the YAML streaming
/// runtime fires its windows by (`riverbank-windowing`; durations in microseconds), or why a
/// streaming run cannot.
pub(crate) fn triggering_of(strategy: &WindowingStrategy) -> Result<Triggering, String> {
    let trigger = match &strategy.trigger {
        Some(t) => trigger_of(t)?,
        None => Spec::Default,
    };
    let accumulation = match strategy.accumulation_mode {
        m if m == accumulation_mode::Enum::Accumulating as i32 => AccumulationMode::Accumulating,
        _ => AccumulationMode::Discarding,
    };
    let on_time = match strategy.on_time_behavior {
        b if b == on_time_behavior::Enum::FireIfNonempty as i32 => OnTimeBehavior::FireIfNonEmpty,
        _ => OnTimeBehavior::FireAlways,
    };
    Ok(Triggering {
        trigger,
        allowed_lateness_us: strategy.allowed_lateness.max(0).saturating_mul(1000),
        accumulation,
        state_ttl_us: None,
        on_time,
    })
}

/// A trigger of the runner API as the event-time core's spec.
fn trigger_of(t: &Trigger) -> Result<Spec, String> {
    let sub = |t: &Option<Box<Trigger>>, what: &str| match t.as_deref() {
        Some(t) => trigger_of(t),
        None => Err(format!("a {what} trigger without its subtrigger")),
    };
    let all = |ts: &[Trigger], what: &str| {
        if ts.is_empty() {
            return Err(format!("an {what} trigger without subtriggers"));
        }
        ts.iter().map(trigger_of).collect::<Result<Vec<_>, _>>()
    };
    let optional = |t: &Option<Box<Trigger>>| {
        t.as_deref()
            .map(|t| trigger_of(t).map(Box::new))
            .transpose()
    };
    Ok(match &t.trigger {
        None | Some(T::Default(_)) => Spec::Default,
        Some(T::AfterEndOfWindow(w)) => Spec::AfterWatermark {
            early: optional(&w.early_firings)?,
            late: optional(&w.late_firings)?,
        },
        Some(T::AfterProcessingTime(p)) => {
            let (delay_us, then) = processing_time(p)?;
            Spec::AfterProcessingTime { delay_us, then }
        }
        // The continuation of a processing-time trigger upstream: fires as soon as it can.
        Some(T::AfterSynchronizedProcessingTime(_)) => Spec::AfterProcessingTime {
            delay_us: 0,
            then: vec![],
        },
        Some(T::ElementCount(c)) => Spec::AfterCount {
            count: c.element_count.max(1) as u64,
        },
        Some(T::Always(_)) => Spec::Repeatedly(Box::new(Spec::AfterCount { count: 1 })),
        Some(T::Never(_)) => Spec::Never,
        Some(T::Repeat(r)) => Spec::Repeatedly(Box::new(sub(&r.subtrigger, "Repeat")?)),
        Some(T::AfterAny(a)) => Spec::AfterAny(all(&a.subtriggers, "AfterAny")?),
        Some(T::AfterAll(a)) => Spec::AfterAll(all(&a.subtriggers, "AfterAll")?),
        Some(T::AfterEach(a)) => Spec::AfterEach(all(&a.subtriggers, "AfterEach")?),
        Some(T::OrFinally(o)) => Spec::OrFinally {
            main: Box::new(sub(&o.main, "OrFinally")?),
            until: Box::new(sub(&o.finally, "OrFinally")?),
        },
    })
}

/// AfterProcessingTime's deadline after a pane's first element, in microseconds: its leading
/// delays summed, then its other timestamp transforms in order (an alignment to a period,
/// delays after it), as Beam applies them.
fn processing_time(p: &AfterProcessingTime) -> Result<(i64, Vec<TimeShift>), String> {
    use timestamp_transform::TimestampTransform as Tt;
    let us = |ms: i64| ms.saturating_mul(1000);
    let (mut delay, mut then) = (0i64, vec![]);
    for t in &p.timestamp_transforms {
        match &t.timestamp_transform {
            Some(Tt::Delay(d)) if then.is_empty() => {
                delay = delay.saturating_add(us(d.delay_millis))
            }
            Some(Tt::Delay(d)) => then.push(TimeShift::Delay {
                us: us(d.delay_millis),
            }),
            Some(Tt::AlignTo(a)) if a.period <= 0 => {
                return Err(format!(
                    "AfterProcessingTime aligned to a period of {} ms: it must be positive",
                    a.period
                ));
            }
            Some(Tt::AlignTo(a)) => then.push(TimeShift::AlignTo {
                period_us: us(a.period),
                offset_us: us(a.offset),
            }),
            None => return Err("AfterProcessingTime with an empty timestamp transform".into()),
        }
    }
    // A negative delay fires at the first element, as no delay does.
    Ok((delay.max(0), then))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner_api::TimestampTransform;
    use crate::runner_api::trigger::{
        AfterEach, AfterEndOfWindow, Default, ElementCount, Never, OrFinally, Repeat,
    };

    fn strategy(trigger: T, allowed_lateness: i64) -> WindowingStrategy {
        WindowingStrategy {
            trigger: Some(wrap(trigger)),
            allowed_lateness,
            ..WindowingStrategy::default()
        }
    }

    fn wrap(t: T) -> Trigger {
        Trigger { trigger: Some(t) }
    }

    fn count(n: i32) -> T {
        T::ElementCount(ElementCount { element_count: n })
    }

    fn delay(millis: i64) -> T {
        T::AfterProcessingTime(AfterProcessingTime {
            timestamp_transforms: vec![TimestampTransform {
                timestamp_transform: Some(timestamp_transform::TimestampTransform::Delay(
                    timestamp_transform::Delay {
                        delay_millis: millis,
                    },
                )),
            }],
        })
    }

    #[test]
    fn a_windowing_strategy_becomes_the_event_time_cores_triggering() {
        let default = triggering_of(&strategy(T::Default(Default {}), 60_000)).unwrap();
        assert_eq!(default.trigger, Spec::Default);
        assert_eq!(default.allowed_lateness_us, 60_000_000);
        assert_eq!(default.on_time, OnTimeBehavior::FireAlways);
        let watermark = T::AfterEndOfWindow(Box::new(AfterEndOfWindow {
            early_firings: Some(Box::new(wrap(delay(10_000)))),
            late_firings: Some(Box::new(wrap(count(3)))),
        }));
        let mut s = strategy(watermark, 0);
        s.accumulation_mode = accumulation_mode::Enum::Accumulating as i32;
        s.on_time_behavior = on_time_behavior::Enum::FireIfNonempty as i32;
        let t = triggering_of(&s).unwrap();
        assert_eq!(
            t.trigger.describe(),
            "AfterWatermark(early=AfterProcessingTime(10s), late=AfterCount(3))"
        );
        assert_eq!(t.accumulation, AccumulationMode::Accumulating);
        assert_eq!(t.on_time, OnTimeBehavior::FireIfNonEmpty);
        let until = T::OrFinally(Box::new(OrFinally {
            main: Some(Box::new(wrap(T::Repeat(Box::new(Repeat {
                subtrigger: Some(Box::new(wrap(count(2)))),
            }))))),
            finally: Some(Box::new(wrap(T::Never(Never {})))),
        }));
        assert_eq!(
            triggering_of(&strategy(until, 0))
                .unwrap()
                .trigger
                .describe(),
            "Repeatedly(AfterCount(2)).orFinally(Never)"
        );
        let each = T::AfterEach(AfterEach {
            subtriggers: vec![wrap(count(2)), wrap(delay(500))],
        });
        assert_eq!(
            triggering_of(&strategy(each, 0)).unwrap().trigger,
            Spec::AfterEach(vec![
                Spec::AfterCount { count: 2 },
                Spec::AfterProcessingTime {
                    delay_us: 500_000,
                    then: vec![]
                }
            ])
        );
    }

    fn aligned(transforms: &[(i64, i64)]) -> T {
        use timestamp_transform::TimestampTransform as Tt;
        let transforms = transforms.iter().map(|&(period, n)| TimestampTransform {
            timestamp_transform: Some(match period {
                0 => Tt::Delay(timestamp_transform::Delay { delay_millis: n }),
                _ => Tt::AlignTo(timestamp_transform::AlignTo { period, offset: n }),
            }),
        });
        T::AfterProcessingTime(AfterProcessingTime {
            timestamp_transforms: transforms.collect(),
        })
    }

    /// Java's `pastFirstElementInPane().plusDelayOf(1 s).alignedTo(1 min, 5 s).plusDelayOf(2
    /// s)`: the leading delay, then the alignment and the delay after it, in order.
    #[test]
    fn an_aligned_processing_time_trigger_keeps_its_steps_in_order() {
        let t = triggering_of(&strategy(
            aligned(&[(0, 1_000), (60_000, 5_000), (0, 2_000)]),
            0,
        ))
        .unwrap()
        .trigger;
        assert_eq!(
            t,
            Spec::AfterProcessingTime {
                delay_us: 1_000_000,
                then: vec![
                    TimeShift::AlignTo {
                        period_us: 60_000_000,
                        offset_us: 5_000_000
                    },
                    TimeShift::Delay { us: 2_000_000 }
                ]
            }
        );
        assert_eq!(
            t.describe(),
            "AfterProcessingTime(1s, aligned to 60s + 5s, plus 2s)"
        );
    }

    #[test]
    fn what_the_core_cannot_fire_is_refused_by_name() {
        let e = triggering_of(&strategy(aligned(&[(-5, 0)]), 0)).unwrap_err();
        assert!(e.contains("aligned to a period of -5 ms"), "{e}");
        let empty = T::AfterEach(AfterEach {
            subtriggers: vec![],
        });
        let e = triggering_of(&strategy(empty, 0)).unwrap_err();
        assert!(e.contains("AfterEach trigger without subtriggers"), "{e}");
    }
}
