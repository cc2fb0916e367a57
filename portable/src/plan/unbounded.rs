//! Whether a pipeline streams (it has an unbounded PCollection), and what a streaming run
//! cannot do yet: said at Prepare, naming the transform.
use crate::error::PortableError;
use crate::runner_api::trigger::Trigger as T;
use crate::runner_api::{Components, WindowingStrategy, is_bounded};

use super::{Plan, StageKind};

/// A pipeline streams when any of its PCollections is unbounded (an unbounded splittable
/// DoFn's output and everything downstream, as the SDK marks them).
pub(super) fn is_streaming(components: &Components) -> bool {
    components
        .pcollections
        .values()
        .any(|p| p.is_bounded == is_bounded::Enum::Unbounded as i32)
}

/// What a streaming run refuses: a side input that never ends, and a GroupByKey that fires
/// other than once per window at the watermark.
pub(super) fn check(plan: &Plan) -> Result<(), PortableError> {
    let components = &plan.components;
    for stage in &plan.stages {
        match &stage.kind {
            StageKind::Sdk(s) => {
                for side in &s.side_inputs {
                    let unbounded = components
                        .pcollections
                        .get(&side.pcollection)
                        .is_some_and(|p| p.is_bounded == is_bounded::Enum::Unbounded as i32);
                    if unbounded {
                        return Err(PortableError::unsupported(
                            plan.name_of(&side.transform),
                            format!(
                                "side input '{}' is unbounded: a streaming run takes side inputs from bounded PCollections only",
                                side.tag
                            ),
                        ));
                    }
                }
            }
            StageKind::GroupByKey {
                transform, input, ..
            } => {
                let strategy = components.pcollections.get(input).and_then(|p| {
                    components
                        .windowing_strategies
                        .get(&p.windowing_strategy_id)
                });
                if let Some(strategy) = strategy {
                    fires_once_on_time(strategy).map_err(|reason| {
                        PortableError::unsupported(plan.name_of(transform), reason)
                    })?;
                }
            }
            StageKind::Impulse { .. } | StageKind::Concat { .. } => {}
        }
    }
    Ok(())
}

/// The default trigger (or AfterWatermark alone) with no allowed lateness: each window fires
/// once, when the watermark passes its end, which is what a streaming run does.
fn fires_once_on_time(strategy: &WindowingStrategy) -> Result<(), String> {
    let trigger = strategy.trigger.as_ref().and_then(|t| t.trigger.as_ref());
    let on_time = match trigger {
        None | Some(T::Default(_)) => true,
        Some(T::AfterEndOfWindow(t)) => t.early_firings.is_none() && t.late_firings.is_none(),
        Some(_) => false,
    };
    if !on_time {
        return Err(
            "a trigger other than the default (AfterWatermark, once per window) in a streaming pipeline is not supported yet".into(),
        );
    }
    if strategy.allowed_lateness > 0 {
        return Err(format!(
            "allowed lateness ({} ms) in a streaming pipeline is not supported yet: late data would be dropped, not fired in late panes",
            strategy.allowed_lateness
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner_api::Trigger;
    use crate::runner_api::trigger::{AfterEndOfWindow, Default, ElementCount};

    fn strategy(trigger: T, allowed_lateness: i64) -> WindowingStrategy {
        WindowingStrategy {
            trigger: Some(Trigger {
                trigger: Some(trigger),
            }),
            allowed_lateness,
            ..WindowingStrategy::default()
        }
    }

    #[test]
    fn a_streaming_group_by_key_fires_once_per_window_at_the_watermark_only() {
        assert!(fires_once_on_time(&strategy(T::Default(Default {}), 0)).is_ok());
        let after_watermark = AfterEndOfWindow {
            early_firings: None,
            late_firings: None,
        };
        assert!(
            fires_once_on_time(&strategy(T::AfterEndOfWindow(Box::new(after_watermark)), 0))
                .is_ok()
        );
        let counted = fires_once_on_time(&strategy(
            T::ElementCount(ElementCount { element_count: 2 }),
            0,
        ));
        assert!(
            counted
                .unwrap_err()
                .contains("trigger other than the default")
        );
        let late = fires_once_on_time(&strategy(T::Default(Default {}), 60_000));
        assert!(late.unwrap_err().contains("allowed lateness (60000 ms)"));
    }
}
