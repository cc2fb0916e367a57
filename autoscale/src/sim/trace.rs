//! Load traces: a small CSV of how much arrives and what it costs, over time.
//!
//! ```text
//! # comments and blank lines are ignored; the header names the columns, in any order
//! time_s,input_rate,cost_ms,keys,element_bytes
//! 0,8000,2,,
//! 600,8000,2,,
//! 600,20000,2,,     <- a row at the same time makes a step
//! 3600,20000,2,,    <- the last row's time ends the trace
//! ```
//! - `time_s` (required): seconds from the start, non-decreasing.
//! - `input_rate` (required): elements arriving per second; linear between rows.
//! - `cost_ms` (required): CPU milliseconds one element takes on one core; held until the next row.
//! - `keys` (optional, empty = unlimited): active keys; a key runs on one core at a time, so they
//!   cap the cores that can work. Held.
//! - `element_bytes` (optional, default 1000): size of an element, for byte backlogs. Held.
use crate::error::AutoscaleError;
use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TracePoint {
    pub time_s: f64,
    pub input_rate: f64,
    pub cost_ms: f64,
    pub keys: Option<u64>,
    pub element_bytes: f64,
}

/// A parsed trace: at least two points, times non-decreasing.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    pub name: String,
    pub points: Vec<TracePoint>,
}

/// The load at one instant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Load {
    pub input_rate: f64,
    pub cost_ms: f64,
    pub keys: Option<u64>,
    pub element_bytes: f64,
}

pub const DEFAULT_ELEMENT_BYTES: f64 = 1000.0;

impl Trace {
    pub fn parse(name: &str, text: &str) -> Result<Trace, AutoscaleError> {
        let err = |line: usize, message: String| AutoscaleError::Trace {
            path: name.to_string(),
            line,
            message,
        };
        let mut rows = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.trim()))
            .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
        let (header_line, header) = rows.next().ok_or_else(|| err(1, "empty trace".into()))?;
        let columns: Vec<&str> = header.split(',').map(str::trim).collect();
        let find = |name: &str| columns.iter().position(|c| *c == name);
        let required = |name: &str| {
            find(name).ok_or_else(|| err(header_line, format!("no '{name}' column in the header")))
        };
        let (time, rate, cost) = (
            required("time_s")?,
            required("input_rate")?,
            required("cost_ms")?,
        );
        let (keys, bytes) = (find("keys"), find("element_bytes"));
        if let Some(unknown) = columns
            .iter()
            .find(|c| !["time_s", "input_rate", "cost_ms", "keys", "element_bytes"].contains(c))
        {
            return Err(err(header_line, format!("unknown column '{unknown}'")));
        }
        let mut points: Vec<TracePoint> = Vec::new();
        for (line, row) in rows {
            let cells: Vec<&str> = row.split(',').map(str::trim).collect();
            if cells.len() != columns.len() {
                return Err(err(
                    line,
                    format!("{} cells, the header has {}", cells.len(), columns.len()),
                ));
            }
            let number = |i: usize, what: &str| -> Result<f64, AutoscaleError> {
                cells[i]
                    .parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite())
                    .ok_or_else(|| err(line, format!("{what} '{}' is not a number", cells[i])))
            };
            let optional = |i: Option<usize>| i.map(|i| cells[i]).filter(|c| !c.is_empty());
            let p = TracePoint {
                time_s: number(time, "time_s")?,
                input_rate: number(rate, "input_rate")?,
                cost_ms: number(cost, "cost_ms")?,
                keys: match optional(keys) {
                    None => None,
                    Some(k) => Some(k.parse::<u64>().ok().filter(|&k| k > 0).ok_or_else(|| {
                        err(line, format!("keys '{k}' is not a positive integer"))
                    })?),
                },
                element_bytes: match optional(bytes) {
                    None => DEFAULT_ELEMENT_BYTES,
                    Some(_) => number(bytes.unwrap_or_default(), "element_bytes")?,
                },
            };
            if p.input_rate <= 0.0 || p.cost_ms <= 0.0 || p.element_bytes <= 0.0 {
                return Err(err(
                    line,
                    "input_rate, cost_ms and element_bytes must be positive".into(),
                ));
            }
            if points.last().is_some_and(|prev| p.time_s < prev.time_s) {
                return Err(err(line, format!("time_s {} goes backwards", p.time_s)));
            }
            points.push(p);
        }
        if points.len() < 2 || points[0].time_s == points[points.len() - 1].time_s {
            return Err(err(
                header_line,
                "a trace needs rows spanning some time".into(),
            ));
        }
        Ok(Trace {
            name: name.to_string(),
            points,
        })
    }

    pub fn start(&self) -> f64 {
        self.points[0].time_s
    }

    pub fn end(&self) -> f64 {
        self.points[self.points.len() - 1].time_s
    }

    /// The load at `t`: rate interpolated, the rest from the last row at or before `t`.
    pub fn at(&self, t: f64) -> Load {
        // The last row at or before t (later rows win at equal times, so steps take effect).
        let i = self.points.iter().rposition(|p| p.time_s <= t).unwrap_or(0);
        let p = &self.points[i];
        let input_rate = match self.points.get(i + 1) {
            Some(next) if next.time_s > p.time_s => {
                let f = (t - p.time_s) / (next.time_s - p.time_s);
                p.input_rate + (next.input_rate - p.input_rate) * f.clamp(0.0, 1.0)
            }
            _ => p.input_rate,
        };
        Load {
            input_rate,
            cost_ms: p.cost_ms,
            keys: p.keys,
            element_bytes: p.element_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_interpolates_rates_and_holds_the_rest() {
        let t = Trace::parse(
            "t.csv",
            "# a ramp then a step\ncost_ms,time_s,input_rate,keys\n2,0,100,\n2,100,300,\n4,100,1000,8\n4,200,1000,8\n",
        )
        .unwrap();
        assert_eq!((t.start(), t.end()), (0.0, 200.0));
        assert_eq!(t.at(50.0).input_rate, 200.0);
        assert_eq!(t.at(50.0).keys, None);
        let after = t.at(100.0);
        assert_eq!(
            (after.input_rate, after.cost_ms, after.keys),
            (1000.0, 4.0, Some(8))
        );
        assert_eq!(after.element_bytes, DEFAULT_ELEMENT_BYTES);
    }

    #[test]
    fn rejects_bad_rows_with_their_line() {
        let cases = [
            ("time_s,input_rate\n0,1\n", "no 'cost_ms' column"),
            ("time_s,input_rate,cost_ms,zzz\n", "unknown column 'zzz'"),
            (
                "time_s,input_rate,cost_ms\n0,1,1\n5,x,1\n",
                ":3: input_rate 'x'",
            ),
            (
                "time_s,input_rate,cost_ms\n5,1,1\n0,1,1\n",
                ":3: time_s 0 goes backwards",
            ),
            (
                "time_s,input_rate,cost_ms\n0,0,1\n5,1,1\n",
                "must be positive",
            ),
            ("time_s,input_rate,cost_ms\n0,1,1\n", "spanning some time"),
            (
                "time_s,input_rate,cost_ms,keys\n0,1,1,0\n",
                "positive integer",
            ),
        ];
        for (text, want) in cases {
            let e = Trace::parse("t.csv", text).unwrap_err().to_string();
            assert!(e.contains(want), "{e} (wanted {want})");
        }
    }
}
