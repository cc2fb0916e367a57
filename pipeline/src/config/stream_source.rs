//! Riverbank's unbounded generator sources: `ReadFromSynthetic` (a keyed stream with a rate, a
//! key distribution and event-time skew) and `ReadFromNexmark` (people, auctions or bids).
use serde_json::Value;

use super::fields::{FieldErr, Fields};
use super::{KeyDistributionConfig, StreamSourceConfig, TransformConfig};
use crate::duration::parse_duration;

type Parsed = Result<TransformConfig, FieldErr>;

/// The generators' seed when none is given (the same as `riverbank generate`'s).
const DEFAULT_SEED: u64 = 42;
/// Partitions when none are given: enough to spread over a few workers.
const DEFAULT_PARTITIONS: u32 = 4;

pub(super) fn synthetic(p: &Fields) -> Parsed {
    p.only(&[
        "rate",
        "keys",
        "distribution",
        "zipf_exponent",
        "hot_key_fraction",
        "event_time_skew",
        "partitions",
        "count",
        "start",
        "seed",
        "late_fraction",
        "late_by",
        "rate_steps",
    ])?;
    let distribution = match p.opt_str("distribution")?.as_deref() {
        None | Some("uniform") => KeyDistributionConfig::Uniform,
        Some("zipf") => KeyDistributionConfig::Zipf {
            exponent: positive(p, "zipf_exponent")?.unwrap_or(1.0),
        },
        Some("hot_key") => {
            let fraction = positive(p, "hot_key_fraction")?.unwrap_or(0.5);
            if fraction > 1.0 {
                return Err(p.err("hot_key_fraction", "must be at most 1"));
            }
            KeyDistributionConfig::HotKey { fraction }
        }
        Some(other) => {
            return Err(p.err(
                "distribution",
                &format!("'{other}' is not uniform, zipf or hot_key"),
            ));
        }
    };
    let skew_us = match p.cfg.get("event_time_skew") {
        None | Some(Value::Null) => 0,
        Some(v) => parse_duration(v).map_err(|e| p.err("event_time_skew", &e))?,
    };
    if skew_us < 0 {
        return Err(p.err("event_time_skew", "must not be negative"));
    }
    let late_fraction = positive(p, "late_fraction")?.unwrap_or(0.0);
    if late_fraction > 1.0 {
        return Err(p.err("late_fraction", "must be at most 1"));
    }
    let late_by_us = match p.cfg.get("late_by") {
        None | Some(Value::Null) => 0,
        Some(v) => parse_duration(v).map_err(|e| p.err("late_by", &e))?,
    };
    let rate_steps = rate_steps(p)?;
    Ok(TransformConfig::ReadStream(StreamSourceConfig::Synthetic {
        late_fraction,
        late_by_us,
        rate_steps,
        rate: positive(p, "rate")?.unwrap_or(1000.0),
        keys: count(p, "keys")?.unwrap_or(100).max(1),
        distribution,
        skew_us,
        partitions: partitions(p)?,
        count: count(p, "count")?,
        start_us: start(p)?,
        seed: count(p, "seed")?.unwrap_or(DEFAULT_SEED),
    }))
}

/// `rate_steps: [{after: 60s, rate: 4000}, ...]`: the rate from `after` past the start on.
fn rate_steps(p: &Fields) -> Result<Vec<(i64, f64)>, FieldErr> {
    let Some(v) = p.cfg.get("rate_steps").filter(|v| !v.is_null()) else {
        return Ok(vec![]);
    };
    let bad = |why: &str| p.err("rate_steps", why);
    let steps = v
        .as_array()
        .ok_or_else(|| bad("must be a list of {after: DURATION, rate: N}"))?;
    let mut out: Vec<(i64, f64)> = vec![];
    for (i, step) in steps.iter().enumerate() {
        let after = step
            .get("after")
            .ok_or_else(|| bad(&format!("step {i} has no 'after'")))
            .and_then(|a| parse_duration(a).map_err(|e| bad(&format!("step {i}: {e}"))))?;
        let rate = step
            .get("rate")
            .and_then(Value::as_f64)
            .filter(|r| r.is_finite() && *r > 0.0)
            .ok_or_else(|| bad(&format!("step {i}: 'rate' must be a positive number")))?;
        if out.last().is_some_and(|l| l.0 >= after) || after <= 0 {
            return Err(bad(&format!(
                "step {i}: 'after' must be later than the start and than the step before"
            )));
        }
        out.push((after, rate));
    }
    Ok(out)
}

pub(super) fn nexmark(p: &Fields) -> Parsed {
    p.only(&["kind", "rate", "partitions", "count", "start", "seed"])?;
    let kind = p.req_str("kind")?;
    if !["person", "auction", "bid"].contains(&kind.as_str()) {
        return Err(p.err("kind", "must be person, auction or bid"));
    }
    Ok(TransformConfig::ReadStream(StreamSourceConfig::Nexmark {
        kind,
        rate: positive(p, "rate")?.unwrap_or(10_000.0),
        partitions: partitions(p)?,
        count: count(p, "count")?,
        start_us: start(p)?,
        seed: count(p, "seed")?.unwrap_or(DEFAULT_SEED),
        columns: None,
    }))
}

fn positive(p: &Fields, f: &str) -> Result<Option<f64>, FieldErr> {
    match p.cfg.get(f) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) if x > 0.0 && x.is_finite() => Ok(Some(x)),
            _ => Err(p.err(f, "must be a positive number")),
        },
    }
}

fn count(p: &Fields, f: &str) -> Result<Option<u64>, FieldErr> {
    match p.cfg.get(f) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| p.err(f, "must be a whole number, 0 or more")),
    }
}

fn partitions(p: &Fields) -> Result<u32, FieldErr> {
    match count(p, "partitions")? {
        None => Ok(DEFAULT_PARTITIONS),
        Some(n @ 1..=1024) => Ok(n as u32),
        Some(_) => Err(p.err("partitions", "must be between 1 and 1024")),
    }
}

/// `start`: an RFC 3339 time or microseconds since the epoch.
fn start(p: &Fields) -> Result<Option<i64>, FieldErr> {
    match p.cfg.get("start") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_i64()
            .map(Some)
            .ok_or_else(|| p.err("start", "must be microseconds since the epoch")),
        Some(Value::String(s)) => chrono::DateTime::parse_from_rfc3339(s)
            .map(|t| Some(t.timestamp_micros()))
            .map_err(|e| p.err("start", &format!("'{s}' is not an RFC 3339 time: {e}"))),
        Some(_) => Err(p.err("start", "must be an RFC 3339 time")),
    }
}

#[cfg(test)]
mod tests {
    /// A plan goes to the workers as JSON: every generator's config must survive the trip.
    #[test]
    fn generator_plans_round_trip_through_json() {
        for source in [
            "ReadFromNexmark\n      config: {kind: bid, rate: 1000}",
            "ReadFromSynthetic\n      config: {rate: 1000, keys: 3}",
        ] {
            let yaml = format!(
                "pipeline:\n  type: chain\n  transforms:\n    - type: {source}\n    - type: WriteToJson\n      config: {{path: out.jsonl}}\n"
            );
            let plan = crate::load_plan(&yaml, &Default::default(), "job").unwrap();
            let json = serde_json::to_string(&plan).unwrap();
            let back: crate::Plan = serde_json::from_str(&json).unwrap();
            assert_eq!(back, plan);
        }
    }
}
