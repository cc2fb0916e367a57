//! Windowed file sinks: one set of shards per window and pane.
//!
//! A streaming file sink's rows in an interval window are committed, at each checkpoint that
//! wrote any, as one set of shards named like Beam Java's `DefaultFilenamePolicy` windowed
//! template (`W-P-SSSSS-of-NNNNN`), with a dash after the prefix:
//! `{prefix}-{start}-{end}-pane-{index}[-late][-last]-SSSSS-of-NNNNN{suffix}`, the bounds in
//! ISO 8601 UTC with milliseconds (`2024-01-01T00:00:10.000Z`; microseconds when the bound has
//! them). The pane is the *sink's* firing of that window: its n-th checkpoint with output for
//! it; `-late` once the on-time firing (the first at a watermark past the window's end) is
//! done; `-last` when the watermark passed the window's end plus the allowed lateness (or the
//! job drains), so nothing more can come for it. Rows of a window already closed at an earlier
//! checkpoint are late beyond the lateness: dropped and counted, as Beam's grouping does.
//!
//! The pane counts of open windows travel in the checkpoint record, so a replayed checkpoint
//! names its files exactly as the interrupted attempt did, and the commit's rename overwrites
//! them rather than adding more.
use riverbank_io::TempPart;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A window's bounds in µs.
pub type Window = (i64, i64);

/// The panes windowed file sinks committed so far, kept in each checkpoint record.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct WindowPanes {
    /// Open windows: (sink, start, end, panes committed, on-time pane done).
    pub open: Vec<(String, i64, i64, u64, bool)>,
    /// A window whose end plus lateness is at or before this watermark is closed (every
    /// sink's; records written before `closed` was kept per sink).
    pub closed_before: Option<i64>,
    /// The same per sink: each sink's windows close at the watermark of its own sources.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub closed: BTreeMap<String, i64>,
}

/// One window's parts of a checkpoint, and the shard name template to commit them under.
#[derive(Debug)]
pub struct WindowCommit {
    pub window: Window,
    pub template: String,
    pub parts: Vec<TempPart>,
}

/// What one sink commits this checkpoint.
#[derive(Debug, Default)]
pub struct SinkPlan {
    /// Global-window parts: the per-checkpoint naming.
    pub global: Vec<TempPart>,
    pub windows: Vec<WindowCommit>,
    /// Parts of closed windows: to delete, their rows counted as late.
    pub late: Vec<TempPart>,
}

impl WindowPanes {
    /// Sorts `parts` of `sink` by window and names each window's pane, given the watermark
    /// before this checkpoint (`None` when draining) and the allowed lateness; the counts
    /// advance in `self`. `shard_template` is the sink's own (`-SSSSS-of-NNNNN`).
    pub fn plan(
        &mut self,
        sink: &str,
        parts: Vec<TempPart>,
        watermark: Option<i64>,
        lateness: i64,
        shard_template: &str,
    ) -> SinkPlan {
        let mut by_window: BTreeMap<Window, Vec<TempPart>> = BTreeMap::new();
        let mut out = SinkPlan::default();
        for p in parts {
            match p.window {
                Some(w) => by_window.entry(w).or_default().push(p),
                None => out.global.push(p),
            }
        }
        for (w, parts) in by_window {
            let expiry = w.1.saturating_add(lateness);
            let closed = self.closed.get(sink).copied().max(self.closed_before);
            if closed.is_some_and(|c| expiry <= c) {
                out.late.extend(parts);
                continue;
            }
            let entry = match self
                .open
                .iter_mut()
                .find(|o| o.0 == sink && (o.1, o.2) == w)
            {
                Some(e) => e,
                None => {
                    self.open.push((sink.to_string(), w.0, w.1, 0, false));
                    self.open.last_mut().expect("pushed")
                }
            };
            let past_end = watermark.is_none_or(|wm| wm >= w.1);
            let late = past_end && entry.4;
            let last = watermark.is_none_or(|wm| wm >= expiry);
            let pane = format!(
                "pane-{}{}{}",
                entry.3,
                if late { "-late" } else { "" },
                if last { "-last" } else { "" }
            );
            entry.3 += 1;
            entry.4 |= past_end;
            out.windows.push(WindowCommit {
                window: w,
                template: format!("-{}-{}-{pane}{shard_template}", instant(w.0), instant(w.1)),
                parts,
            });
        }
        out
    }

    /// After `sink` was planned: its windows its watermark closed are forgotten (their later
    /// rows are late).
    pub fn close_sink(&mut self, sink: &str, watermark: Option<i64>, lateness: i64) {
        let wm = watermark.unwrap_or(i64::MAX);
        self.open
            .retain(|o| o.0 != sink || o.2.saturating_add(lateness) > wm);
        let c = self.closed.entry(sink.to_string()).or_insert(wm);
        *c = (*c).max(wm);
    }

    /// After every sink of the checkpoint was planned: windows the watermark closed are
    /// forgotten (their later rows are late).
    pub fn close(&mut self, watermark: Option<i64>, lateness: i64) {
        let wm = watermark.unwrap_or(i64::MAX);
        self.open.retain(|o| o.2.saturating_add(lateness) > wm);
        self.closed_before = Some(self.closed_before.map_or(wm, |c| c.max(wm)));
    }
}

/// An instant as Joda prints it (ISO 8601, UTC, milliseconds), or with microseconds when it
/// has them (two windows never share a name).
pub fn instant(us: i64) -> String {
    let Some(t) = chrono::DateTime::from_timestamp_micros(us) else {
        return us.to_string();
    };
    if us.rem_euclid(1000) == 0 {
        t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
    } else {
        t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(w: Option<Window>) -> TempPart {
        TempPart {
            location: "t".into(),
            part: 0,
            rows: 1,
            bytes: 1,
            header_bytes: 0,
            window: w,
        }
    }

    const T: &str = "-SSSSS-of-NNNNN";
    const S: i64 = 1_704_067_200_000_000;
    const W: Window = (S, S + 10_000_000);

    #[test]
    fn panes_count_per_window_and_mark_late_and_last() {
        let mut p = WindowPanes::default();
        // Early: the watermark is before the window's end.
        let a = p.plan(
            "out",
            vec![part(Some(W)), part(None)],
            Some(S),
            5_000_000,
            T,
        );
        assert_eq!(a.global.len(), 1);
        assert_eq!(
            a.windows[0].template,
            "-2024-01-01T00:00:00.000Z-2024-01-01T00:00:10.000Z-pane-0-SSSSS-of-NNNNN"
        );
        p.close(Some(S), 5_000_000);
        // On time, then late, then the last pane once the lateness passed.
        let names: Vec<String> = [W.1, W.1 + 1, W.1 + 5_000_000]
            .iter()
            .map(|wm| {
                let c = p.plan("out", vec![part(Some(W))], Some(*wm), 5_000_000, T);
                p.close(Some(*wm), 5_000_000);
                c.windows[0]
                    .template
                    .split("Z-")
                    .last()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(
            names,
            [
                "pane-1-SSSSS-of-NNNNN",
                "pane-2-late-SSSSS-of-NNNNN",
                "pane-3-late-last-SSSSS-of-NNNNN"
            ]
        );
        assert!(p.open.is_empty());
        // The window is closed: more rows for it are late.
        let late = p.plan(
            "out",
            vec![part(Some(W))],
            Some(W.1 + 6_000_000),
            5_000_000,
            T,
        );
        assert_eq!((late.windows.len(), late.late.len()), (0, 1));
    }

    #[test]
    fn a_drain_fires_the_last_pane_and_sinks_count_apart() {
        let mut p = WindowPanes::default();
        p.plan("a", vec![part(Some(W))], Some(S), 0, T);
        let b = p.plan("b", vec![part(Some(W))], Some(S), 0, T);
        assert!(b.windows[0].template.contains("-pane-0-"));
        let a = p.plan("a", vec![part(Some(W))], None, 0, T);
        assert!(
            a.windows[0]
                .template
                .ends_with("-pane-1-last-SSSSS-of-NNNNN")
        );
        assert_eq!(instant(S + 1), "2024-01-01T00:00:00.000001Z");
    }

    /// Each sink's windows close at its own watermark: a sink far ahead closes its windows
    /// without closing a slower sink's.
    #[test]
    fn a_sink_closes_its_windows_at_its_own_watermark() {
        let mut panes = WindowPanes::default();
        let w = (S, S + 10_000_000);
        let fast = panes.plan("fast", vec![part(Some(w))], Some(w.1), 0, T);
        assert!(fast.windows[0].template.contains("pane-0-last"));
        panes.close_sink("fast", Some(w.1), 0);
        let slow = panes.plan("slow", vec![part(Some(w))], Some(S), 0, T);
        assert!(slow.late.is_empty() && slow.windows[0].template.contains("pane-0-"));
        panes.close_sink("slow", Some(S), 0);
        // More rows of that window: late for the fast sink, a new pane for the slow one.
        assert_eq!(
            panes
                .plan("fast", vec![part(Some(w))], Some(w.1), 0, T)
                .late
                .len(),
            1
        );
        let again = panes.plan("slow", vec![part(Some(w))], Some(S), 0, T);
        assert!(again.late.is_empty() && again.windows[0].template.contains("pane-1"));
    }
}
