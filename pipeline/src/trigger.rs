//! Triggers, allowed lateness and accumulation: when a window's results are emitted, as Beam's
//! Python `trigger` module defines them. Beam YAML has no syntax for them; Riverbank's is an
//! extension of `windowing:` shaped like that module:
//!
//! ```yaml
//! windowing:
//!   type: fixed
//!   size: 60s
//!   trigger:                      # default: at the watermark, then once per late element
//!     after_watermark:
//!       early: {after_processing_time: 10s}   # repeated until the watermark passes
//!       late: {after_count: 1}                # repeated for late data
//!   allowed_lateness: 5m          # default 0
//!   accumulation_mode: discarding # or accumulating
//! ```
//!
//! Other triggers: `{after_count: N}`, `{after_processing_time: DURATION}` (after the pane's
//! first element), `{repeatedly: T}`, `{after_any: [T, ...]}`, `{after_all: [T, ...]}`,
//! `{after_each: [T, ...]}`, `{or_finally: {main: T, until: T}}` (as `main`, until `until`
//! fires), `never` (only when the window expires), `default`. This module is the specification; the streaming runtime
//! evaluates it
//! (`riverbank_windowing`).
use crate::duration::parse_duration;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// When a pane fires. Durations in microseconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// Beam's default: at the watermark, then at every late element (within the lateness).
    Default,
    /// At the watermark passing the window's end; `early` repeats before, `late` after.
    AfterWatermark {
        early: Option<Box<Trigger>>,
        late: Option<Box<Trigger>>,
    },
    /// Once processing time is `delay_us` past the pane's first element, moved on by `then`
    /// in order (Beam's timestamp transforms after its leading delays: `alignedTo`, a delay
    /// after it).
    AfterProcessingTime {
        delay_us: i64,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        then: Vec<TimeShift>,
    },
    /// Once the pane holds `count` elements.
    AfterCount { count: u64 },
    /// Whenever the inner trigger fires, forever.
    Repeatedly(Box<Trigger>),
    /// Once any of them fires.
    AfterAny(Vec<Trigger>),
    /// Once all of them have fired.
    AfterAll(Vec<Trigger>),
    /// Each in turn: the first until it finishes, then the next.
    AfterEach(Vec<Trigger>),
    /// As `main`, until `until` fires: that pane is the last (Beam's `orFinally`).
    OrFinally {
        main: Box<Trigger>,
        until: Box<Trigger>,
    },
    /// Never fires: the window's one pane comes when it expires (end plus allowed lateness).
    Never,
}

/// A step of an AfterProcessingTime's deadline after its delay (Beam's `TimestampTransform`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeShift {
    /// Later by this much.
    Delay { us: i64 },
    /// Up to the next instant `offset_us` past a multiple of `period_us` (itself if it is one):
    /// panes of every key fire together, once a period.
    AlignTo { period_us: i64, offset_us: i64 },
}

impl TimeShift {
    /// `t` (microseconds) moved by this step.
    pub fn apply(&self, t: i64) -> i64 {
        match *self {
            TimeShift::Delay { us } => t.saturating_add(us),
            TimeShift::AlignTo {
                period_us,
                offset_us,
            } if period_us > 0 => {
                let since = t.saturating_sub(offset_us).rem_euclid(period_us);
                match since {
                    0 => t,
                    _ => t.saturating_add(period_us - since),
                }
            }
            TimeShift::AlignTo { .. } => t,
        }
    }

    fn describe(&self) -> String {
        match *self {
            TimeShift::Delay { us } => format!("plus {}s", us as f64 / 1e6),
            TimeShift::AlignTo {
                period_us,
                offset_us: 0,
            } => {
                format!("aligned to {}s", period_us as f64 / 1e6)
            }
            TimeShift::AlignTo {
                period_us,
                offset_us,
            } => format!(
                "aligned to {}s + {}s",
                period_us as f64 / 1e6,
                offset_us as f64 / 1e6
            ),
        }
    }
}

/// Whether the on-time pane fires when it would hold nothing new (Beam's `OnTimeBehavior`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeBehavior {
    /// Always, once the window has had data (Beam's default).
    #[default]
    FireAlways,
    /// Only when it holds something: new elements, or the earlier ones when accumulating.
    FireIfNonEmpty,
}

/// Whether a pane carries what earlier panes of its window emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AccumulationMode {
    /// Each pane holds only what arrived since the previous one (Beam's default).
    #[default]
    Discarding,
    /// Each pane holds everything of the window so far.
    Accumulating,
}

/// The triggering of a windowing: the three extension fields together.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Triggering {
    pub trigger: Trigger,
    /// Data later than this behind the watermark is dropped (and counted).
    pub allowed_lateness_us: i64,
    pub accumulation: AccumulationMode,
    /// The global window only: how long a streaming Sql/Join keeps a row of this input in its
    /// state, in event time (a row whose timestamp is this far behind the watermark goes, as
    /// Flink's state TTL). `None`: kept until the job ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_ttl_us: Option<i64>,
    /// Beam YAML has no syntax for it; SDK pipelines say it in their windowing strategy.
    #[serde(default, skip_serializing_if = "is_default")]
    pub on_time: OnTimeBehavior,
}

fn is_default(b: &OnTimeBehavior) -> bool {
    *b == OnTimeBehavior::default()
}

impl Default for Triggering {
    fn default() -> Self {
        Triggering {
            trigger: Trigger::Default,
            allowed_lateness_us: 0,
            accumulation: AccumulationMode::Discarding,
            state_ttl_us: None,
            on_time: OnTimeBehavior::FireAlways,
        }
    }
}

/// The extension's field names inside `windowing:`.
pub const TRIGGERING_FIELDS: [&str; 4] = [
    "trigger",
    "allowed_lateness",
    "accumulation_mode",
    "state_ttl",
];

impl Triggering {
    /// Reads the extension fields of a `windowing:` mapping (absent: Beam's defaults). Errors
    /// name the field, as `windowing.trigger.after_any[1]: ...`.
    pub fn parse(windowing: &serde_json::Map<String, Value>) -> Result<Triggering, String> {
        let mut t = Triggering::default();
        if let Some(v) = windowing.get("trigger") {
            t.trigger = Trigger::parse(v, "windowing.trigger")?;
        }
        if let Some(v) = windowing.get("allowed_lateness") {
            t.allowed_lateness_us =
                parse_duration(v).map_err(|e| format!("windowing.allowed_lateness: {e}"))?;
            if t.allowed_lateness_us < 0 {
                return Err("windowing.allowed_lateness must not be negative".into());
            }
        }
        if let Some(v) = windowing.get("state_ttl") {
            let global = windowing
                .get("type")
                .is_none_or(|t| t.as_str() == Some("global"));
            if !global {
                return Err(
                    "windowing.state_ttl applies to the global window only (a window's \
                            state goes when the window expires, after its allowed_lateness)"
                        .into(),
                );
            }
            let ttl = parse_duration(v).map_err(|e| format!("windowing.state_ttl: {e}"))?;
            if ttl <= 0 {
                return Err("windowing.state_ttl must be positive".into());
            }
            t.state_ttl_us = Some(ttl);
        }
        if let Some(v) = windowing.get("accumulation_mode") {
            t.accumulation = match v.as_str().map(str::to_ascii_lowercase).as_deref() {
                Some("discarding") => AccumulationMode::Discarding,
                Some("accumulating") => AccumulationMode::Accumulating,
                _ => {
                    return Err(format!(
                        "windowing.accumulation_mode: {v} is not 'discarding' or 'accumulating'"
                    ));
                }
            };
        }
        Ok(t)
    }
}

impl Trigger {
    /// Whether it counts elements (the runtime then keeps an element count per window).
    pub fn counts_elements(&self) -> bool {
        match self {
            Trigger::AfterCount { .. } => true,
            Trigger::Default | Trigger::AfterProcessingTime { .. } | Trigger::Never => false,
            Trigger::AfterWatermark { early, late } => {
                early.as_ref().is_some_and(|t| t.counts_elements())
                    || late.as_ref().is_some_and(|t| t.counts_elements())
            }
            Trigger::Repeatedly(t) => t.counts_elements(),
            Trigger::AfterAny(ts) | Trigger::AfterAll(ts) | Trigger::AfterEach(ts) => {
                ts.iter().any(Trigger::counts_elements)
            }
            Trigger::OrFinally { main, until } => main.counts_elements() || until.counts_elements(),
        }
    }

    /// Whether it can fire before the watermark passes the end of the window (in the global
    /// window: before the job drains).
    pub fn fires_before_end(&self) -> bool {
        match self {
            Trigger::Default | Trigger::Never => false,
            Trigger::AfterWatermark { early, .. } => early.is_some(),
            Trigger::AfterProcessingTime { .. } | Trigger::AfterCount { .. } => true,
            Trigger::Repeatedly(t) => t.fires_before_end(),
            Trigger::AfterAny(ts) => ts.iter().any(Trigger::fires_before_end),
            Trigger::AfterAll(ts) => ts.iter().all(Trigger::fires_before_end),
            Trigger::AfterEach(ts) => ts.first().is_some_and(Trigger::fires_before_end),
            Trigger::OrFinally { main, until } => {
                main.fires_before_end() || until.fires_before_end()
            }
        }
    }

    /// Parses one trigger at `path` (for error messages).
    pub fn parse(v: &Value, path: &str) -> Result<Trigger, String> {
        if let Some(name) = v.as_str() {
            return match name {
                "default" => Ok(Trigger::Default),
                "never" => Ok(Trigger::Never),
                "after_watermark" => Ok(Trigger::AfterWatermark {
                    early: None,
                    late: None,
                }),
                other => Err(format!(
                    "{path}: unknown trigger '{other}' (expected default, after_watermark, never, or a mapping such as {{after_count: 10}})"
                )),
            };
        }
        let obj = v
            .as_object()
            .filter(|o| o.len() == 1)
            .ok_or_else(|| format!("{path}: a trigger is a name or a mapping with one key"))?;
        let (kind, arg) = obj.iter().next().expect("one key");
        let at = format!("{path}.{kind}");
        let list = |arg: &Value| -> Result<Vec<Trigger>, String> {
            let items = arg
                .as_array()
                .filter(|a| !a.is_empty())
                .ok_or_else(|| format!("{at}: a non-empty list of triggers"))?;
            items
                .iter()
                .enumerate()
                .map(|(i, t)| Trigger::parse(t, &format!("{at}[{i}]")))
                .collect()
        };
        match kind.as_str() {
            "after_watermark" => {
                let fields = match arg {
                    Value::Null => serde_json::Map::new(),
                    Value::Object(o) => o.clone(),
                    _ => return Err(format!("{at}: a mapping with optional 'early' and 'late'")),
                };
                if let Some(k) = fields
                    .keys()
                    .find(|k| !["early", "late"].contains(&k.as_str()))
                {
                    return Err(format!("{at}: unknown field '{k}' (expected early, late)"));
                }
                let sub = |name: &str| -> Result<Option<Box<Trigger>>, String> {
                    fields
                        .get(name)
                        .map(|t| Trigger::parse(t, &format!("{at}.{name}")).map(Box::new))
                        .transpose()
                };
                Ok(Trigger::AfterWatermark {
                    early: sub("early")?,
                    late: sub("late")?,
                })
            }
            "after_processing_time" => {
                let delay_us = parse_duration(arg).map_err(|e| format!("{at}: {e}"))?;
                if delay_us < 0 {
                    return Err(format!("{at}: the delay must not be negative"));
                }
                Ok(Trigger::AfterProcessingTime {
                    delay_us,
                    then: vec![],
                })
            }
            "after_count" => match arg.as_u64() {
                Some(count) if count > 0 => Ok(Trigger::AfterCount { count }),
                _ => Err(format!("{at}: a positive number of elements")),
            },
            "repeatedly" => Ok(Trigger::Repeatedly(Box::new(Trigger::parse(arg, &at)?))),
            "after_any" => Ok(Trigger::AfterAny(list(arg)?)),
            "after_all" => Ok(Trigger::AfterAll(list(arg)?)),
            "after_each" => Ok(Trigger::AfterEach(list(arg)?)),
            "or_finally" => {
                let fields = arg
                    .as_object()
                    .ok_or_else(|| format!("{at}: a mapping with 'main' and 'until'"))?;
                if let Some(k) = fields
                    .keys()
                    .find(|k| !["main", "until"].contains(&k.as_str()))
                {
                    return Err(format!("{at}: unknown field '{k}' (expected main, until)"));
                }
                let sub = |name: &str| -> Result<Box<Trigger>, String> {
                    let t = fields
                        .get(name)
                        .ok_or_else(|| format!("{at}: missing '{name}'"))?;
                    Trigger::parse(t, &format!("{at}.{name}")).map(Box::new)
                };
                Ok(Trigger::OrFinally {
                    main: sub("main")?,
                    until: sub("until")?,
                })
            }
            other => Err(format!(
                "{path}: unknown trigger '{other}' (expected after_watermark, after_processing_time, after_count, repeatedly, after_any, after_all, after_each, or_finally)"
            )),
        }
    }

    /// Beam's name for it, for plans and messages.
    pub fn describe(&self) -> String {
        let join = |ts: &[Trigger]| {
            ts.iter()
                .map(Trigger::describe)
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            Trigger::Default => "Default".into(),
            Trigger::AfterWatermark { early, late } => {
                let mut s = "AfterWatermark(".to_string();
                let parts: Vec<String> = [("early", early), ("late", late)]
                    .into_iter()
                    .filter_map(|(n, t)| t.as_ref().map(|t| format!("{n}={}", t.describe())))
                    .collect();
                s.push_str(&parts.join(", "));
                s.push(')');
                s
            }
            Trigger::AfterProcessingTime { delay_us, then } => {
                let mut s = format!("AfterProcessingTime({}s", *delay_us as f64 / 1e6);
                for shift in then {
                    s.push_str(", ");
                    s.push_str(&shift.describe());
                }
                s.push(')');
                s
            }
            Trigger::AfterCount { count } => format!("AfterCount({count})"),
            Trigger::Repeatedly(t) => format!("Repeatedly({})", t.describe()),
            Trigger::AfterAny(ts) => format!("AfterAny({})", join(ts)),
            Trigger::AfterAll(ts) => format!("AfterAll({})", join(ts)),
            Trigger::AfterEach(ts) => format!("AfterEach({})", join(ts)),
            Trigger::OrFinally { main, until } => {
                format!("{}.orFinally({})", main.describe(), until.describe())
            }
            Trigger::Never => "Never".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    /// Beam's AlignTo: up to the next instant `offset` past a multiple of the period, an
    /// instant on it unmoved; before the epoch too.
    #[test]
    fn a_time_aligned_to_a_period_goes_up_to_its_next_instant() {
        let align = TimeShift::AlignTo {
            period_us: 10,
            offset_us: 3,
        };
        let moved: Vec<i64> = [0, 3, 4, 13, 14, -7, -8].map(|t| align.apply(t)).to_vec();
        assert_eq!(moved, [3, 3, 13, 13, 23, -7, -7]);
        assert_eq!(TimeShift::Delay { us: 5 }.apply(10), 15);
    }

    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<Triggering, String> {
        Triggering::parse(v.as_object().unwrap())
    }

    #[test]
    fn beam_defaults_when_absent() {
        assert_eq!(
            parse(json!({"type": "fixed"})).unwrap(),
            Triggering::default()
        );
    }

    #[test]
    fn a_state_ttl_is_for_the_global_window_and_its_triggers_fire_before_the_drain() {
        let t = parse(json!({"type": "global", "state_ttl": "1h",
            "trigger": {"repeatedly": {"after_processing_time": 5}}}))
        .unwrap();
        assert_eq!(t.state_ttl_us, Some(3_600_000_000));
        assert!(t.trigger.fires_before_end());
        let e = parse(json!({"type": "fixed", "size": 10, "state_ttl": "1h"})).unwrap_err();
        assert!(
            e.contains("windowing.state_ttl applies to the global window only"),
            "{e}"
        );
        assert!(parse(json!({"state_ttl": 0})).is_err());
        assert!(!Trigger::Default.fires_before_end());
        let on_time_only =
            parse(json!({"trigger": {"after_watermark": {"late": {"after_count": 1}}}}));
        assert!(!on_time_only.unwrap().trigger.fires_before_end());
    }

    #[test]
    fn the_documented_form_parses_into_the_tree() {
        let t = parse(json!({
            "trigger": {"after_watermark": {
                "early": {"after_processing_time": "10s"},
                "late": {"after_count": 1}
            }},
            "allowed_lateness": "5m",
            "accumulation_mode": "accumulating"
        }))
        .unwrap();
        assert_eq!(
            t,
            Triggering {
                trigger: Trigger::AfterWatermark {
                    early: Some(Box::new(Trigger::AfterProcessingTime {
                        delay_us: 10_000_000,
                        then: vec![],
                    })),
                    late: Some(Box::new(Trigger::AfterCount { count: 1 })),
                },
                allowed_lateness_us: 300_000_000,
                accumulation: AccumulationMode::Accumulating,
                state_ttl_us: None,
                on_time: OnTimeBehavior::FireAlways,
            }
        );
        assert_eq!(
            t.trigger.describe(),
            "AfterWatermark(early=AfterProcessingTime(10s), late=AfterCount(1))"
        );
        let composite = parse(json!({"trigger": {"repeatedly": {"after_any": [
            {"after_count": 100}, {"after_processing_time": 60}
        ]}}}))
        .unwrap();
        assert_eq!(
            composite.trigger.describe(),
            "Repeatedly(AfterAny(AfterCount(100), AfterProcessingTime(60s)))"
        );
        let until = parse(json!({"trigger": {"or_finally": {
            "main": {"repeatedly": {"after_count": 2}}, "until": {"after_count": 5}
        }}}))
        .unwrap();
        assert_eq!(
            until.trigger.describe(),
            "Repeatedly(AfterCount(2)).orFinally(AfterCount(5))"
        );
        assert!(until.trigger.counts_elements() && until.trigger.fires_before_end());
        let never = parse(json!({"trigger": "never"})).unwrap().trigger;
        assert_eq!(never, Trigger::Never);
        assert!(!never.fires_before_end());
    }

    #[test]
    fn errors_name_the_field_within_the_tree() {
        let err = |v| parse(v).unwrap_err();
        assert_eq!(
            err(json!({"trigger": {"after_any": [{"after_count": 2}, {"after_count": 0}]}})),
            "windowing.trigger.after_any[1].after_count: a positive number of elements"
        );
        assert!(
            err(json!({"trigger": {"after_watermark": {"early": {"soon": 1}}}}))
                .starts_with("windowing.trigger.after_watermark.early: unknown trigger 'soon'")
        );
        assert!(
            err(json!({"trigger": {"after_watermark": {"eventually": {}}}}))
                .contains("unknown field 'eventually'")
        );
        assert!(
            err(json!({"accumulation_mode": "hoarding"}))
                .starts_with("windowing.accumulation_mode")
        );
        assert!(err(json!({"allowed_lateness": -5})).contains("must not be negative"));
        assert!(err(json!({"trigger": {"after_count": 1, "repeatedly": {}}})).contains("one key"));
        assert_eq!(
            err(json!({"trigger": {"or_finally": {"main": "default"}}})),
            "windowing.trigger.or_finally: missing 'until'"
        );
    }
}
