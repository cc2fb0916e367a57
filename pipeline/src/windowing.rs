//! Beam YAML `windowing:` specs: fixed, sliding, sessions, global.
use crate::duration::parse_duration;
use serde::{Deserialize, Serialize};

/// A window function. Durations are in microseconds, the resolution of element timestamps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WindowFn {
    #[default]
    Global,
    Fixed {
        size_us: i64,
        offset_us: i64,
    },
    Sliding {
        size_us: i64,
        period_us: i64,
        offset_us: i64,
    },
    Sessions {
        gap_us: i64,
    },
}

impl WindowFn {
    /// Sessions merge windows, so they can only be resolved by a grouping step.
    pub fn is_merging(&self) -> bool {
        matches!(self, WindowFn::Sessions { .. })
    }

    pub fn describe(&self) -> String {
        match self {
            WindowFn::Global => "global".into(),
            WindowFn::Fixed { size_us, .. } => format!("fixed({})", fmt_dur(*size_us)),
            WindowFn::Sliding {
                size_us, period_us, ..
            } => {
                format!(
                    "sliding({}, every {})",
                    fmt_dur(*size_us),
                    fmt_dur(*period_us)
                )
            }
            WindowFn::Sessions { gap_us } => format!("sessions(gap {})", fmt_dur(*gap_us)),
        }
    }

    /// Parses a `windowing:` mapping (its window fn; [`parse_windowing`] adds the triggering). Errors are plain messages; the caller adds the transform.
    pub fn parse(v: &serde_json::Value) -> Result<WindowFn, String> {
        let obj = v
            .as_object()
            .ok_or("windowing must be a mapping with a 'type'")?;
        let ty = obj
            .get("type")
            .and_then(|t| t.as_str())
            .ok_or("windowing needs a 'type' (fixed, sliding, sessions or global)")?;
        let allowed: &[&str] = match ty {
            "global" => &["type"],
            "fixed" => &["type", "size", "offset"],
            "sliding" => &["type", "size", "period", "offset"],
            "sessions" => &["type", "gap"],
            other => {
                return Err(format!(
                    "unknown windowing type '{other}' (expected fixed, sliding, sessions or global)"
                ));
            }
        };
        let triggering = crate::trigger::TRIGGERING_FIELDS;
        if let Some(k) = obj
            .keys()
            .find(|k| !allowed.contains(&k.as_str()) && !triggering.contains(&k.as_str()))
        {
            return Err(format!(
                "unknown windowing field '{k}' for {ty} windows (allowed: {})",
                allowed.join(", ")
            ));
        }
        let dur = |name: &str| -> Result<i64, String> {
            let raw = obj
                .get(name)
                .ok_or_else(|| format!("{ty} windows need '{name}'"))?;
            let d = parse_duration(raw).map_err(|e| format!("windowing.{name}: {e}"))?;
            if d <= 0 {
                return Err(format!("windowing.{name} must be positive"));
            }
            Ok(d)
        };
        let offset = match obj.get("offset") {
            Some(raw) => parse_duration(raw).map_err(|e| format!("windowing.offset: {e}"))?,
            None => 0,
        };
        Ok(match ty {
            "global" => WindowFn::Global,
            "fixed" => WindowFn::Fixed {
                size_us: dur("size")?,
                offset_us: offset,
            },
            "sliding" => {
                let (size_us, period_us) = (dur("size")?, dur("period")?);
                if period_us > size_us {
                    return Err("sliding windows need period <= size".into());
                }
                WindowFn::Sliding {
                    size_us,
                    period_us,
                    offset_us: offset,
                }
            }
            _ => WindowFn::Sessions {
                gap_us: dur("gap")?,
            },
        })
    }
}

/// Durations as Beam YAML writes them: a number of seconds, or a string with a unit
/// (`500ms`, `60s`, `5m`, `1h`, `1d`).
/// A `windowing:` mapping whole: the window fn and Riverbank's triggering extension.
pub fn parse_windowing(
    v: &serde_json::Value,
) -> Result<(WindowFn, crate::trigger::Triggering), String> {
    let window = WindowFn::parse(v)?;
    let triggering = match v.as_object() {
        Some(obj) => crate::trigger::Triggering::parse(obj)?,
        None => crate::trigger::Triggering::default(),
    };
    Ok((window, triggering))
}

fn fmt_dur(us: i64) -> String {
    if us % 3_600_000_000 == 0 {
        format!("{}h", us / 3_600_000_000)
    } else if us % 60_000_000 == 0 {
        format!("{}m", us / 60_000_000)
    } else if us % 1_000_000 == 0 {
        format!("{}s", us / 1_000_000)
    } else {
        format!("{}us", us)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn durations() {
        assert_eq!(parse_duration(&json!(60)).unwrap(), 60_000_000);
        assert_eq!(parse_duration(&json!("1h")).unwrap(), 3_600_000_000);
        assert_eq!(parse_duration(&json!("500ms")).unwrap(), 500_000);
        let e = parse_duration(&json!("5 parsecs")).unwrap_err();
        assert!(e.contains("unknown duration unit 'parsecs'"), "{e}");
        let e = parse_duration(&json!("five minutes")).unwrap_err();
        assert_eq!(e, "cannot read duration 'five minutes'");
    }

    #[test]
    fn window_specs() {
        assert_eq!(
            WindowFn::parse(&json!({"type": "fixed", "size": "1h"})).unwrap(),
            WindowFn::Fixed {
                size_us: 3_600_000_000,
                offset_us: 0
            }
        );
        assert!(
            WindowFn::parse(&json!({"type": "fixed"}))
                .unwrap_err()
                .contains("size")
        );
        assert!(
            WindowFn::parse(&json!({"type": "tumbling", "size": 1}))
                .unwrap_err()
                .contains("tumbling")
        );
        assert_eq!(
            WindowFn::parse(&json!({"type": "sliding", "size": 10, "period": 20})).unwrap_err(),
            "sliding windows need period <= size"
        );
        assert!(
            WindowFn::parse(&json!({"type": "sessions", "gap": "10m"}))
                .unwrap()
                .is_merging()
        );
    }
}
