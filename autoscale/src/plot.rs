//! An SVG of load, backlog and workers over time, one panel each, every policy overlaid.
//! Hand-written rather than `plotters`: three polylines with axes are ~150 lines, while plotters
//! (even SVG-only) adds a dozen crates to a build machine shared with DataFusion builds.
use crate::engine::Policy;
use crate::sim::PolicyRun;
use std::fmt::Write;

const WIDTH: f64 = 960.0;
const PANEL: f64 = 190.0;
const GAP: f64 = 40.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 50.0;

fn colour(p: Policy) -> &'static str {
    match p {
        Policy::Fixed => "#888888",
        Policy::Documented => "#e07b00",
        Policy::Riverbank => "#1f5fbf",
    }
}

/// A "nice" tick step (1, 2 or 5 × 10^n) giving about five ticks up to `max`.
fn tick_step(max: f64) -> f64 {
    let raw = (max / 5.0).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag)
}

struct Panel {
    top: f64,
    y_max: f64,
    t0: f64,
    t1: f64,
}

impl Panel {
    fn x(&self, t: f64) -> f64 {
        LEFT + (t - self.t0) / (self.t1 - self.t0).max(1.0) * (WIDTH - LEFT - RIGHT)
    }

    fn y(&self, v: f64) -> f64 {
        self.top + PANEL - (v / self.y_max).clamp(0.0, 1.0) * PANEL
    }

    fn axes(&self, out: &mut String, title: &str) {
        let step = tick_step(self.y_max);
        let mut v = 0.0;
        while v <= self.y_max + 1e-9 {
            let y = self.y(v);
            let _ = write!(
                out,
                r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#eeeeee"/><text x="{:.1}" y="{:.1}" text-anchor="end" font-size="11">{}</text>"##,
                WIDTH - RIGHT,
                LEFT - 6.0,
                y + 4.0,
                short(v)
            );
            v += step;
        }
        let minutes = (self.t1 - self.t0) / 60.0;
        let tstep = tick_step(minutes);
        let mut m = 0.0;
        while m <= minutes + 1e-9 {
            let x = self.x(self.t0 + m * 60.0);
            let _ = write!(
                out,
                r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle" font-size="11">{m}</text>"#,
                self.top + PANEL + 14.0
            );
            m += tstep;
        }
        let _ = write!(
            out,
            r##"<rect x="{LEFT}" y="{:.1}" width="{:.1}" height="{PANEL}" fill="none" stroke="#444444"/><text x="{LEFT}" y="{:.1}" font-size="13" font-weight="bold">{title}</text>"##,
            self.top,
            WIDTH - LEFT - RIGHT,
            self.top - 6.0
        );
    }

    fn line(&self, out: &mut String, points: &[(f64, f64)], colour: &str, step: bool) {
        let mut d = String::new();
        let mut prev: Option<f64> = None;
        for &(t, v) in points {
            if let (true, Some(p)) = (step, prev) {
                let _ = write!(d, "{:.1},{:.1} ", self.x(t), self.y(p));
            }
            let _ = write!(d, "{:.1},{:.1} ", self.x(t), self.y(v));
            prev = Some(v);
        }
        let _ = write!(
            out,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="1.5"/>"#,
            d.trim_end()
        );
    }
}

fn short(v: f64) -> String {
    if v >= 1000.0 && (v / 1000.0).fract() == 0.0 {
        format!("{}k", v / 1000.0)
    } else {
        format!("{v}")
    }
}

/// Renders the runs of one trace (same timeline times for every run).
pub fn svg(title: &str, runs: &[PolicyRun]) -> String {
    let rows = runs.first().map_or(&[][..], |r| &r.timeline[..]);
    let (t0, t1) = (
        rows.first().map_or(0.0, |r| r.time_s - 10.0),
        rows.last().map_or(1.0, |r| r.time_s),
    );
    let max_of = |f: &dyn Fn(&crate::sim::TimelineRow) -> f64| {
        runs.iter()
            .flat_map(|r| r.timeline.iter().map(f))
            .fold(0.0, f64::max)
    };
    let height = TOP + 3.0 * (PANEL + GAP) + 10.0;
    let mut out = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif"><rect width="100%" height="100%" fill="white"/><text x="{LEFT}" y="22" font-size="15" font-weight="bold">{}</text>"#,
        escape(title)
    );
    let mut x = LEFT + 360.0;
    for r in runs {
        let p = r.totals.policy;
        let _ = write!(
            out,
            r#"<rect x="{x}" y="12" width="14" height="4" fill="{}"/><text x="{:.0}" y="20" font-size="12">{}</text>"#,
            colour(p),
            x + 18.0,
            p.name()
        );
        x += 110.0;
    }
    let panels = [
        ("input (elements/s)", max_of(&|r| r.input_rate)),
        ("backlog (s)", max_of(&|r| r.backlog_secs)),
        ("workers", max_of(&|r| f64::from(r.workers))),
    ];
    for (i, (name, max)) in panels.iter().enumerate() {
        let panel = Panel {
            top: TOP + i as f64 * (PANEL + GAP),
            y_max: tick_step(*max) * (max / tick_step(*max)).ceil().max(1.0),
            t0,
            t1,
        };
        panel.axes(&mut out, name);
        match i {
            0 => {
                let pts: Vec<_> = rows.iter().map(|r| (r.time_s, r.input_rate)).collect();
                panel.line(&mut out, &pts, "#2a9d3a", false);
            }
            _ => {
                for r in runs {
                    let pts: Vec<_> = r
                        .timeline
                        .iter()
                        .map(|row| {
                            (
                                row.time_s,
                                if i == 1 {
                                    row.backlog_secs
                                } else {
                                    f64::from(row.workers)
                                },
                            )
                        })
                        .collect();
                    panel.line(&mut out, &pts, colour(r.totals.policy), i == 2);
                }
            }
        }
    }
    let _ = write!(
        out,
        r#"<text x="{:.0}" y="{:.0}" text-anchor="middle" font-size="11">minutes</text></svg>"#,
        WIDTH / 2.0,
        height - 2.0
    );
    out.push('\n');
    out
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_ticks() {
        assert_eq!(tick_step(100.0), 20.0);
        assert_eq!(tick_step(60.0), 20.0);
        assert_eq!(tick_step(7.0), 2.0);
        assert_eq!(tick_step(40_000.0), 10_000.0);
    }
}
