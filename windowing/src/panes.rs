//! The panes of one window of one key: which elements are taken or dropped as late, when the
//! trigger fires, what each pane is (`PaneInfo`: index, timing, first/last), and when the
//! window's state may go. The caller holds the data (a buffer or a combiner's accumulator)
//! and does what a [`Firing`] says: emit it, then clear it (discarding) or keep it
//! (accumulating); drop it all after the last pane.
mod codec;

use super::trigger::{Clock, TriggerState};
use riverbank_pipeline::trigger::{AccumulationMode, OnTimeBehavior, Triggering};
use serde::{Deserialize, Serialize};

/// When a pane fired relative to the watermark, as Beam's `PaneInfo.timing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Timing {
    /// Before the watermark passed the window's end (speculative).
    Early,
    /// The first pane once the watermark passed the end.
    OnTime,
    /// After the on-time pane (late data).
    Late,
}

/// Beam's `PaneInfo`: which pane of its window an output is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaneInfo {
    /// 0 for the window's first pane, counting every pane emitted.
    pub index: u64,
    /// Among the on-time and late panes only; -1 for early panes.
    pub nonspeculative_index: i64,
    pub timing: Timing,
    pub is_first: bool,
    pub is_last: bool,
}

/// What the caller does with the window's data now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Firing {
    pub pane: PaneInfo,
    /// Clear the data after emitting it (discarding mode, or the last pane).
    pub clear: bool,
}

/// What became of an arriving element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    Taken,
    /// Later than the allowed lateness behind the watermark: dropped and counted.
    TooLate,
    /// The window's trigger had finished (its last pane was emitted): dropped and counted.
    Closed,
}

/// The trigger of one key's window and the bookkeeping of its panes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Panes {
    trigger: TriggerState,
    end: i64,
    lateness: i64,
    accumulation: AccumulationMode,
    /// Panes emitted so far, and of them the non-speculative ones.
    emitted: u64,
    nonspeculative: u64,
    on_time_emitted: bool,
    /// Elements taken since the last pane.
    pending: u64,
    /// Elements taken at all (an empty window never fires).
    taken: u64,
    closed: bool,
    #[serde(default)]
    on_time: OnTimeBehavior,
}

impl Panes {
    /// The window `[start, end)`'s panes under `t`.
    pub fn new(t: &Triggering, end: i64) -> Panes {
        Panes {
            trigger: TriggerState::new(&t.trigger, end),
            end,
            lateness: t.allowed_lateness_us,
            accumulation: t.accumulation,
            emitted: 0,
            nonspeculative: 0,
            on_time_emitted: false,
            pending: 0,
            taken: 0,
            closed: false,
            on_time: t.on_time,
        }
    }

    /// The panes of a session that absorbed the sessions `parts` (windows merge when an
    /// element bridges them). Its trigger starts over for the merged window's end, fed the
    /// elements not yet in any pane (as Beam returns a merged watermark trigger to its early
    /// phase while the end is ahead); pane indexes go on from the part furthest along, and a
    /// timing never goes back: once a part's on-time pane is out, later panes are late.
    /// Closed parts are the caller's to refuse: their data is gone.
    pub fn merged(parts: &[Panes], t: &Triggering, end: i64, now: i64) -> Panes {
        let mut p = Panes::new(t, end);
        for part in parts {
            p.emitted = p.emitted.max(part.emitted);
            p.nonspeculative = p.nonspeculative.max(part.nonspeculative);
            p.on_time_emitted |= part.on_time_emitted;
            p.pending += part.pending;
            p.taken += part.taken;
        }
        for _ in 0..p.pending {
            p.trigger.on_element(now);
        }
        p
    }

    /// The window's end (exclusive).
    pub fn end(&self) -> i64 {
        self.end
    }

    /// The watermark at which the window expires: its last pane is due and its state goes
    /// (Beam: the window's max timestamp plus the allowed lateness is behind the watermark).
    pub fn expiry(&self) -> i64 {
        self.end.saturating_add(self.lateness)
    }

    /// An element of this window arrives. If taken, the caller adds it to the window's data
    /// *before* acting on the firing returned.
    pub fn on_element(&mut self, c: &Clock) -> (Arrival, Option<Firing>) {
        if self.closed {
            return (Arrival::Closed, None);
        }
        if c.watermark >= self.expiry() {
            return (Arrival::TooLate, None);
        }
        self.pending += 1;
        self.taken += 1;
        self.trigger.on_element(c.now);
        (Arrival::Taken, self.evaluate(c))
    }

    /// `n` elements of this window arrive at once (a checkpoint's worth), without evaluating
    /// the trigger: the caller asks [`Self::on_clock`] next, so one evaluation fires at most one
    /// pane for all of them (the elements of a bundle share a pane, as in Beam).
    pub fn add_elements(&mut self, n: u64, c: &Clock) -> Arrival {
        if self.closed {
            return Arrival::Closed;
        }
        if c.watermark >= self.expiry() {
            return Arrival::TooLate;
        }
        self.pending += n;
        self.taken += n;
        for _ in 0..n {
            self.trigger.on_element(c.now);
        }
        Arrival::Taken
    }

    /// The watermark or processing time moved: a pane may be due, or the window expired.
    pub fn on_clock(&mut self, c: &Clock) -> Option<Firing> {
        if self.closed {
            return None;
        }
        if c.watermark >= self.expiry() {
            return self.expire(c);
        }
        self.evaluate(c)
    }

    /// Whether [`Self::on_clock`] at `c` would change this state (fire, or close it), so that
    /// an incremental checkpoint knows what to write again.
    pub fn moves_on(&self, c: &Clock) -> bool {
        !self.closed && (c.watermark >= self.expiry() || self.trigger.should_fire(c))
    }

    /// No more panes will come (its trigger finished or it expired). Its state stays, as a
    /// tombstone that drops late data, until [`Self::is_expired`].
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// The window's state may be deleted: the watermark passed its expiry, so no element of
    /// it can be taken any more.
    pub fn is_expired(&self, watermark: i64) -> bool {
        watermark >= self.expiry()
    }

    /// When to look again without new elements or watermark (a processing-time trigger).
    pub fn next_deadline(&self) -> Option<i64> {
        (!self.closed)
            .then(|| self.trigger.next_deadline())
            .flatten()
    }

    fn evaluate(&mut self, c: &Clock) -> Option<Firing> {
        if !self.trigger.should_fire(c) {
            return None;
        }
        self.trigger.on_fire(c);
        let finished = self.trigger.is_finished();
        let pane = self.emit(c, finished);
        if finished {
            self.closed = true;
        }
        pane
    }

    /// The window expires: a last pane if anything is unsent (or the on-time pane never fired
    /// for a window that had data), then it closes.
    fn expire(&mut self, c: &Clock) -> Option<Firing> {
        self.closed = true;
        self.emit(c, true)
    }

    /// A pane for what the window holds, if there is one to emit: new data, or the on-time
    /// pane of a window that has had data (Beam fires it even when early panes took everything,
    /// unless told to fire it only when not empty).
    fn emit(&mut self, c: &Clock, last: bool) -> Option<Firing> {
        let timing = if c.watermark < self.end {
            Timing::Early
        } else if !self.on_time_emitted {
            Timing::OnTime
        } else {
            Timing::Late
        };
        let holds_data = self.on_time == OnTimeBehavior::FireAlways
            || self.accumulation == AccumulationMode::Accumulating;
        let due = self.pending > 0 || (timing == Timing::OnTime && self.taken > 0 && holds_data);
        if !due {
            return None;
        }
        let pane = PaneInfo {
            index: self.emitted,
            nonspeculative_index: if timing == Timing::Early {
                -1
            } else {
                self.nonspeculative as i64
            },
            timing,
            is_first: self.emitted == 0,
            is_last: last,
        };
        self.emitted += 1;
        if timing != Timing::Early {
            self.nonspeculative += 1;
        }
        if timing == Timing::OnTime {
            self.on_time_emitted = true;
        }
        self.pending = 0;
        Some(Firing {
            pane,
            clear: last || self.accumulation == AccumulationMode::Discarding,
        })
    }
}
