//! Beam's worked trigger examples (the programming guide's "Triggers" section), played through
//! the panes of one key's fixed windows: which panes fire, when, and with what values.
use super::panes::{Arrival, PaneInfo, Panes, Timing};
use super::trigger::{Clock, TriggerState};
use riverbank_pipeline::trigger::{
    AccumulationMode, OnTimeBehavior, TimeShift, Trigger, Triggering,
};
use serde_json::json;
use std::collections::BTreeMap;

const S: i64 = 1_000_000;
const MIN: i64 = 60 * S;

/// One key's fixed windows of `size`, the data of each, and what came out.
struct Harness {
    triggering: Triggering,
    size: i64,
    windows: BTreeMap<i64, (Panes, Vec<i64>)>,
    clock: Clock,
    /// (window start, values, pane), in emission order.
    out: Vec<(i64, Vec<i64>, PaneInfo)>,
    dropped: Vec<(i64, Arrival)>,
}

impl Harness {
    fn new(triggering: serde_json::Value, size: i64) -> Harness {
        Harness {
            triggering: Triggering::parse(triggering.as_object().unwrap()).unwrap(),
            size,
            windows: BTreeMap::new(),
            clock: Clock {
                watermark: i64::MIN,
                now: 0,
            },
            out: vec![],
            dropped: vec![],
        }
    }

    /// An element with event time `ts` and value `v` arrives at processing time `now`.
    fn element(&mut self, ts: i64, v: i64, now: i64) {
        self.clock.now = now;
        let start = ts - ts.rem_euclid(self.size);
        let (t, size) = (&self.triggering, self.size);
        let (panes, data) = self
            .windows
            .entry(start)
            .or_insert_with(|| (Panes::new(t, start + size), vec![]));
        let (arrival, firing) = panes.on_element(&self.clock);
        match arrival {
            Arrival::Taken => data.push(v),
            other => self.dropped.push((v, other)),
        }
        if let Some(f) = firing {
            self.out.push((start, data.clone(), f.pane));
            if f.clear {
                data.clear();
            }
        }
    }

    /// The watermark and processing time move to `watermark`, `now`.
    fn advance(&mut self, watermark: i64, now: i64) {
        self.clock = Clock { watermark, now };
        for (start, (panes, data)) in self.windows.iter_mut() {
            if let Some(f) = panes.on_clock(&self.clock) {
                self.out.push((*start, data.clone(), f.pane));
                if f.clear {
                    data.clear();
                }
            }
        }
        self.windows.retain(|_, (p, _)| !p.is_expired(watermark));
    }

    /// (values, timing) of the panes out so far.
    fn panes(&self) -> Vec<(Vec<i64>, Timing)> {
        self.out
            .iter()
            .map(|(_, v, p)| (v.clone(), p.timing))
            .collect()
    }
}

/// Guide, "Window accumulation modes": a trigger firing at every three elements of one window
/// that receives 5, 8, 3, 15, 19, 23, 9, 13, 10.
#[test]
fn accumulating_and_discarding_panes_of_the_guides_example() {
    let values = [5, 8, 3, 15, 19, 23, 9, 13, 10];
    let run = |mode: &str| {
        let mut h = Harness::new(
            json!({"trigger": {"repeatedly": {"after_count": 3}}, "accumulation_mode": mode}),
            10 * MIN,
        );
        for (i, v) in values.iter().enumerate() {
            h.element(S * i as i64, *v, S * i as i64);
        }
        h.out.iter().map(|(_, v, _)| v.clone()).collect::<Vec<_>>()
    };
    assert_eq!(
        run("accumulating"),
        [
            vec![5, 8, 3],
            vec![5, 8, 3, 15, 19, 23],
            vec![5, 8, 3, 15, 19, 23, 9, 13, 10]
        ]
    );
    assert_eq!(
        run("discarding"),
        [vec![5, 8, 3], vec![15, 19, 23], vec![9, 13, 10]]
    );
}

/// The default trigger: one on-time pane when the watermark passes the window's end; data
/// arriving later but within the allowed lateness fires a late pane each; data later still
/// is dropped and counted.
#[test]
fn default_trigger_with_allowed_lateness() {
    let mut h = Harness::new(json!({"allowed_lateness": "30s"}), MIN);
    h.element(10 * S, 1, 10 * S);
    h.element(20 * S, 2, 21 * S);
    h.advance(59 * S, 62 * S);
    assert!(h.out.is_empty(), "nothing before the watermark passes");
    h.advance(60 * S, 63 * S);
    assert_eq!(h.panes(), [(vec![1, 2], Timing::OnTime)]);
    let on_time = h.out[0].2;
    assert_eq!(
        (
            on_time.index,
            on_time.nonspeculative_index,
            on_time.is_first,
            on_time.is_last
        ),
        (0, 0, true, false)
    );
    // Late, within 30 s: its own pane (discarding: just the late element).
    h.element(30 * S, 3, 80 * S);
    h.advance(75 * S, 81 * S);
    assert_eq!(h.panes()[1], (vec![3], Timing::Late));
    assert_eq!(h.out[1].2.index, 1);
    // The window expires at 60 s + 30 s: nothing unsent, no pane; it is gone.
    h.advance(90 * S, 95 * S);
    assert_eq!(h.out.len(), 2);
    assert!(h.windows.is_empty(), "an expired window's state goes");
    h.element(40 * S, 4, 96 * S);
    assert_eq!(h.dropped, [(4, Arrival::TooLate)]);
}

#[test]
fn without_allowed_lateness_late_data_is_dropped() {
    let mut h = Harness::new(json!({}), MIN);
    h.element(10 * S, 1, 10 * S);
    h.advance(60 * S, 61 * S);
    assert_eq!(h.panes(), [(vec![1], Timing::OnTime)]);
    assert!(h.out[0].2.is_last, "expired as it fired");
    h.element(30 * S, 2, 62 * S);
    assert_eq!(h.dropped, [(2, Arrival::TooLate)]);
}

/// Guide, "Composite triggers": AfterWatermark with early firings one minute (processing
/// time) after the first element of each pane, and late firings at every late element.
#[test]
fn early_on_time_and_late_firings() {
    let mut h = Harness::new(
        json!({
            "trigger": {"after_watermark": {
                "early": {"after_processing_time": "1m"},
                "late": {"after_count": 1}
            }},
            "allowed_lateness": "10m",
            "accumulation_mode": "accumulating"
        }),
        10 * MIN,
    );
    h.element(MIN, 1, 0);
    h.element(2 * MIN, 2, 30 * S);
    assert_eq!(h.panes(), [], "a minute has not passed");
    h.advance(2 * MIN, MIN);
    assert_eq!(h.panes(), [(vec![1, 2], Timing::Early)]);
    assert_eq!(h.out[0].2.nonspeculative_index, -1);
    // Nothing new: the early trigger waits for the next pane's first element.
    h.advance(3 * MIN, 3 * MIN);
    assert_eq!(h.out.len(), 1);
    h.element(4 * MIN, 3, 3 * MIN + 10 * S);
    h.advance(4 * MIN, 4 * MIN + 10 * S);
    assert_eq!(h.panes()[1], (vec![1, 2, 3], Timing::Early));
    // The watermark passes the end (10 min): the on-time pane, accumulating everything.
    h.advance(10 * MIN, 11 * MIN);
    assert_eq!(h.panes()[2], (vec![1, 2, 3], Timing::OnTime));
    // Late elements each fire at once.
    h.element(5 * MIN, 4, 12 * MIN);
    h.element(6 * MIN, 5, 13 * MIN);
    assert_eq!(
        h.panes()[3..],
        [
            (vec![1, 2, 3, 4], Timing::Late),
            (vec![1, 2, 3, 4, 5], Timing::Late)
        ]
    );
    let indexes: Vec<(u64, i64)> = h
        .out
        .iter()
        .map(|(_, _, p)| (p.index, p.nonspeculative_index))
        .collect();
    assert_eq!(indexes, [(0, -1), (1, -1), (2, 0), (3, 1), (4, 2)]);
    // Expiry at 10 + 10 min: nothing unsent, the window goes without another pane.
    h.advance(20 * MIN, 21 * MIN);
    assert_eq!(h.out.len(), 5);
    assert!(h.windows.is_empty());
}

/// The on-time pane fires even when early panes took everything (discarding): Beam's
/// FIRE_ALWAYS on-time behaviour, so a consumer always sees the on-time pane.
#[test]
fn the_on_time_pane_fires_even_when_empty_after_early_panes() {
    let mut h = Harness::new(
        json!({"trigger": {"after_watermark": {"early": {"after_count": 2}}}}),
        MIN,
    );
    h.element(S, 1, S);
    h.element(2 * S, 2, 2 * S);
    h.advance(60 * S, 61 * S);
    assert_eq!(
        h.panes(),
        [(vec![1, 2], Timing::Early), (vec![], Timing::OnTime)]
    );
    assert!(h.out[1].2.is_last);
}

/// Guide: `Repeatedly(AfterAny(AfterCount(100), AfterProcessingTime(1 min)))` — a pane at 100
/// elements or a minute after a pane's first element, whichever comes first.
#[test]
fn repeatedly_after_any_fires_on_count_or_time() {
    let mut h = Harness::new(
        json!({"trigger": {"repeatedly": {"after_any": [
            {"after_count": 3}, {"after_processing_time": "1m"}
        ]}}}),
        60 * MIN,
    );
    for i in 0..3 {
        h.element(i * S, i, i * S);
    }
    assert_eq!(
        h.panes(),
        [(vec![0, 1, 2], Timing::Early)],
        "three elements"
    );
    h.element(10 * S, 10, 10 * S);
    h.advance(MIN, 10 * S + MIN - 1);
    assert_eq!(h.out.len(), 1, "59.999999 s after the pane's first element");
    h.advance(MIN, 10 * S + MIN);
    assert_eq!(h.panes()[1], (vec![10], Timing::Early), "a minute");
}

#[test]
fn after_all_waits_for_every_part_and_after_each_takes_them_in_turn() {
    let mut all = Harness::new(
        json!({"trigger": {"after_all": [{"after_count": 2}, {"after_processing_time": "10s"}]},
               "allowed_lateness": "1h"}),
        10 * MIN,
    );
    all.element(S, 1, 0);
    all.element(2 * S, 2, S);
    assert!(all.out.is_empty(), "two elements, but not yet ten seconds");
    all.advance(3 * S, 10 * S);
    assert_eq!(all.panes(), [(vec![1, 2], Timing::Early)]);
    assert!(all.out[0].2.is_last, "AfterAll fires once");
    all.element(4 * S, 3, 11 * S);
    assert_eq!(all.dropped, [(3, Arrival::Closed)]);

    let mut each = Harness::new(
        json!({"trigger": {"after_each": [{"after_count": 2}, {"after_count": 3}]}}),
        10 * MIN,
    );
    for i in 0..6 {
        each.element(i * S, i, i * S);
    }
    assert_eq!(
        each.out
            .iter()
            .map(|(_, v, _)| v.clone())
            .collect::<Vec<_>>(),
        [vec![0, 1], vec![2, 3, 4]]
    );
    assert!(each.out[1].2.is_last);
    assert_eq!(each.dropped, [(5, Arrival::Closed)]);
}

/// AfterWatermark without late firings finishes at the on-time pane: the window closes, and
/// late data is dropped even within the allowed lateness (Beam's behaviour).
#[test]
fn a_finished_trigger_closes_its_window() {
    let mut h = Harness::new(
        json!({"trigger": "after_watermark", "allowed_lateness": "5m"}),
        MIN,
    );
    h.element(S, 1, S);
    h.advance(MIN, MIN);
    assert_eq!(h.panes(), [(vec![1], Timing::OnTime)]);
    assert!(h.out[0].2.is_last);
    h.element(2 * S, 2, MIN + S);
    assert_eq!(h.dropped, [(2, Arrival::Closed)]);
}

/// Each window of the key has its own panes; processing-time deadlines tell the runtime when
/// to look again.
#[test]
fn windows_fire_independently_and_report_their_deadlines() {
    let mut h = Harness::new(
        json!({"trigger": {"after_watermark": {"early": {"after_processing_time": "30s"}}}}),
        MIN,
    );
    h.element(10 * S, 1, 5 * S);
    h.element(70 * S, 2, 6 * S);
    let deadlines: Vec<Option<i64>> = h.windows.values().map(|(p, _)| p.next_deadline()).collect();
    assert_eq!(deadlines, [Some(35 * S), Some(36 * S)]);
    h.advance(60 * S, 20 * S);
    assert_eq!(h.out.len(), 1);
    assert_eq!(h.out[0].0, 0, "the first window, on time");
    assert_eq!(h.out[0].2.timing, Timing::OnTime);
    h.advance(60 * S, 36 * S);
    assert_eq!((h.out[1].0, h.out[1].2.timing), (MIN, Timing::Early));
}

#[test]
fn the_spec_parses_as_documented_for_the_runtime() {
    let t = Triggering::parse(
        json!({"accumulation_mode": "accumulating"})
            .as_object()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(t.trigger, Trigger::Default);
    assert_eq!(t.accumulation, AccumulationMode::Accumulating);
}

/// Sessions that merge (an element bridges them): the merged session's panes go on from the
/// part furthest along, its elements not yet in a pane are pending, and once a part's
/// on-time pane is out the merged session's next panes are late.
#[test]
fn merged_sessions_continue_their_panes() {
    let t = Triggering::parse(json!({"allowed_lateness": "60s"}).as_object().unwrap()).unwrap();
    let at = |watermark, now| Clock { watermark, now };
    // Session A [0, 10 s) fired on time with 2 elements; session B [20 s, 30 s) holds one.
    let mut a = Panes::new(&t, 10 * S);
    a.add_elements(2, &at(0, 0));
    let on_time = a.on_clock(&at(10 * S, S)).unwrap().pane;
    assert_eq!((on_time.index, on_time.timing), (0, Timing::OnTime));
    let mut b = Panes::new(&t, 30 * S);
    b.add_elements(1, &at(10 * S, S));
    // A late element at 9 s bridges them into [0, 30 s).
    let mut m = Panes::merged(&[a, b], &t, 30 * S, 2 * S);
    assert_eq!(m.end(), 30 * S);
    assert!(matches!(
        m.add_elements(1, &at(12 * S, 2 * S)),
        Arrival::Taken
    ));
    assert_eq!(
        m.on_clock(&at(29 * S, 3 * S)),
        None,
        "before the merged end"
    );
    let next = m.on_clock(&at(30 * S, 4 * S)).unwrap().pane;
    assert_eq!(
        (
            next.index,
            next.timing,
            next.is_first,
            next.nonspeculative_index
        ),
        (1, Timing::Late, false, 1)
    );
}

/// `Repeatedly(AfterCount(2)).orFinally(AfterCount(5))`: a pane every two elements until the
/// fifth, whose pane is the last; the window then drops what comes.
#[test]
fn or_finally_fires_as_its_main_trigger_until_the_other_fires() {
    let mut h = Harness::new(
        json!({"trigger": {"or_finally": {
            "main": {"repeatedly": {"after_count": 2}}, "until": {"after_count": 5}}}}),
        10 * MIN,
    );
    for i in 0..6 {
        h.element(i * S, i, i * S);
    }
    let values: Vec<Vec<i64>> = h.out.iter().map(|(_, v, _)| v.clone()).collect();
    assert_eq!(values, [vec![0, 1], vec![2, 3], vec![4]]);
    assert!(!h.out[1].2.is_last);
    assert!(h.out[2].2.is_last);
    assert_eq!(h.dropped, [(5, Arrival::Closed)]);
}

/// `Never`: nothing fires until the window expires (its end plus the allowed lateness); then
/// one last pane holds everything, late elements included (the window's first pane past its
/// end: on time).
#[test]
fn never_fires_once_when_the_window_expires() {
    let mut h = Harness::new(json!({"trigger": "never", "allowed_lateness": "30s"}), MIN);
    h.element(S, 1, S);
    h.advance(MIN, MIN);
    h.element(2 * S, 2, MIN + S);
    assert!(h.out.is_empty());
    h.advance(MIN + 30 * S, 2 * MIN);
    assert_eq!(h.panes(), [(vec![1, 2], Timing::OnTime)]);
    assert!(h.out[0].2.is_last);
}

/// Beam's FIRE_IF_NONEMPTY: after early panes took everything (discarding), no empty on-time
/// pane; accumulating, the on-time pane holds the earlier elements, so it fires.
#[test]
fn an_on_time_pane_fired_only_if_nonempty_is_skipped_when_it_holds_nothing() {
    for (mode, expected) in [
        ("discarding", vec![(vec![1, 2], Timing::Early)]),
        (
            "accumulating",
            vec![(vec![1, 2], Timing::Early), (vec![1, 2], Timing::OnTime)],
        ),
    ] {
        let mut h = Harness::new(
            json!({"trigger": {"after_watermark": {"early": {"after_count": 2}}},
                   "accumulation_mode": mode}),
            MIN,
        );
        h.triggering.on_time = OnTimeBehavior::FireIfNonEmpty;
        h.element(S, 1, S);
        h.element(2 * S, 2, 2 * S);
        h.advance(60 * S, 61 * S);
        assert_eq!(h.panes(), expected, "{mode}");
    }
}

/// Java's `AfterProcessingTime.pastFirstElementInPane().plusDelayOf(1 s).alignedTo(1 min, 5
/// s)`: a pane whose first element came at 62 s fires at 65 s (63 s, up to 5 s past a
/// minute), one whose first came at 63.5 s at 65 s too: panes of every key fire together.
#[test]
fn an_aligned_processing_time_trigger_fires_at_the_next_aligned_instant() {
    let spec = Trigger::AfterProcessingTime {
        delay_us: S,
        then: vec![TimeShift::AlignTo {
            period_us: MIN,
            offset_us: 5 * S,
        }],
    };
    for first in [62 * S, 63 * S + S / 2] {
        let mut t = TriggerState::new(&spec, i64::MAX);
        assert_eq!(t.next_deadline(), None);
        t.on_element(first);
        assert_eq!(t.next_deadline(), Some(65 * S), "first at {first}");
        let at = |now| Clock { watermark: 0, now };
        assert!(!t.should_fire(&at(65 * S - 1)));
        assert!(t.should_fire(&at(65 * S)));
    }
    // On an aligned instant already: that instant.
    let mut t = TriggerState::new(&spec, i64::MAX);
    t.on_element(124 * S);
    assert_eq!(t.next_deadline(), Some(125 * S));
}
