//! A trigger's state for one pane sequence (one key and window), with Beam's semantics: fed
//! elements and asked, as the watermark and processing time advance, whether the window should
//! fire. `on_fire` moves it on; a finished trigger closes its window.
use riverbank_pipeline::trigger::{TimeShift, Trigger};

/// The clocks a trigger is evaluated against, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clock {
    /// The input watermark (event time).
    pub watermark: i64,
    /// Processing (wall) time.
    pub now: i64,
}

/// One node of the trigger tree and its state.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum TriggerState {
    Watermark {
        /// The window's end (exclusive): the watermark reaching it is the on-time firing.
        end: i64,
        on_time_fired: bool,
        early: Option<Box<TriggerState>>,
        late: Option<Box<TriggerState>>,
        finished: bool,
    },
    ProcessingTime {
        delay: i64,
        /// Steps after the delay (an alignment), in order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        then: Vec<TimeShift>,
        first: Option<i64>,
        finished: bool,
    },
    Count {
        count: u64,
        seen: u64,
        finished: bool,
    },
    Repeatedly(Box<TriggerState>),
    Any {
        children: Vec<TriggerState>,
        finished: bool,
    },
    All {
        children: Vec<TriggerState>,
        finished: bool,
    },
    Each {
        children: Vec<TriggerState>,
        current: usize,
    },
    OrFinally {
        main: Box<TriggerState>,
        until: Box<TriggerState>,
        finished: bool,
    },
    Never,
}

/// When a processing-time trigger whose pane's first element came at `first` fires.
fn deadline(first: i64, delay: i64, then: &[TimeShift]) -> i64 {
    then.iter()
        .fold(first.saturating_add(delay), |t, shift| shift.apply(t))
}

impl TriggerState {
    /// A fresh state of `spec` for the window ending (exclusively) at `end`.
    pub fn new(spec: &Trigger, end: i64) -> TriggerState {
        let all = |ts: &[Trigger]| ts.iter().map(|t| TriggerState::new(t, end)).collect();
        match spec {
            // Beam's DefaultTrigger: Repeatedly(AfterWatermark()): on time, then once per
            // late element (the reset watermark trigger is immediately due again).
            Trigger::Default => TriggerState::Repeatedly(Box::new(TriggerState::Watermark {
                end,
                on_time_fired: false,
                early: None,
                late: None,
                finished: false,
            })),
            Trigger::AfterWatermark { early, late } => TriggerState::Watermark {
                end,
                on_time_fired: false,
                early: early.as_ref().map(|t| Box::new(TriggerState::new(t, end))),
                late: late.as_ref().map(|t| Box::new(TriggerState::new(t, end))),
                finished: false,
            },
            Trigger::AfterProcessingTime { delay_us, then } => TriggerState::ProcessingTime {
                delay: *delay_us,
                then: then.clone(),
                first: None,
                finished: false,
            },
            Trigger::AfterCount { count } => TriggerState::Count {
                count: *count,
                seen: 0,
                finished: false,
            },
            Trigger::Repeatedly(t) => TriggerState::Repeatedly(Box::new(TriggerState::new(t, end))),
            Trigger::AfterAny(ts) => TriggerState::Any {
                children: all(ts),
                finished: false,
            },
            Trigger::AfterAll(ts) => TriggerState::All {
                children: all(ts),
                finished: false,
            },
            Trigger::AfterEach(ts) => TriggerState::Each {
                children: all(ts),
                current: 0,
            },
            Trigger::OrFinally { main, until } => TriggerState::OrFinally {
                main: Box::new(TriggerState::new(main, end)),
                until: Box::new(TriggerState::new(until, end)),
                finished: false,
            },
            Trigger::Never => TriggerState::Never,
        }
    }

    pub fn on_element(&mut self, now: i64) {
        match self {
            TriggerState::Watermark {
                on_time_fired,
                early,
                late,
                ..
            } => {
                let sub = if *on_time_fired { late } else { early };
                if let Some(t) = sub {
                    t.on_element(now);
                }
            }
            TriggerState::ProcessingTime { first, .. } => {
                first.get_or_insert(now);
            }
            TriggerState::Count { seen, .. } => *seen += 1,
            TriggerState::Repeatedly(t) => t.on_element(now),
            TriggerState::Any { children, .. } | TriggerState::All { children, .. } => {
                for c in children {
                    c.on_element(now);
                }
            }
            TriggerState::Each { children, current } => {
                if let Some(c) = children.get_mut(*current) {
                    c.on_element(now);
                }
            }
            TriggerState::OrFinally { main, until, .. } => {
                main.on_element(now);
                until.on_element(now);
            }
            TriggerState::Never => {}
        }
    }

    pub fn should_fire(&self, c: &Clock) -> bool {
        if self.is_finished() {
            return false;
        }
        match self {
            TriggerState::Watermark {
                end,
                on_time_fired,
                early,
                late,
                ..
            } => {
                if *on_time_fired {
                    late.as_ref().is_some_and(|t| t.should_fire(c))
                } else {
                    c.watermark >= *end || early.as_ref().is_some_and(|t| t.should_fire(c))
                }
            }
            TriggerState::ProcessingTime {
                delay, then, first, ..
            } => first.is_some_and(|f| c.now >= deadline(f, *delay, then)),
            TriggerState::Count { count, seen, .. } => seen >= count,
            TriggerState::Repeatedly(t) => t.should_fire(c),
            TriggerState::Any { children, .. } => children.iter().any(|t| t.should_fire(c)),
            TriggerState::All { children, .. } => {
                children.iter().all(|t| t.is_finished() || t.should_fire(c))
            }
            TriggerState::Each { children, current } => {
                children.get(*current).is_some_and(|t| t.should_fire(c))
            }
            TriggerState::OrFinally { main, until, .. } => {
                main.should_fire(c) || until.should_fire(c)
            }
            TriggerState::Never => false,
        }
    }

    /// The trigger fired: move its state on. Call only when `should_fire` said so.
    pub fn on_fire(&mut self, c: &Clock) {
        match self {
            TriggerState::Watermark {
                end,
                on_time_fired,
                early,
                late,
                finished,
            } => {
                if !*on_time_fired {
                    if c.watermark >= *end {
                        *on_time_fired = true;
                        *finished = late.is_none();
                    } else if let Some(t) = early {
                        // Early firings repeat until the watermark passes.
                        fire_and_rearm(t, c);
                    }
                } else if let Some(t) = late {
                    // So do late ones, for as long as the window lives.
                    fire_and_rearm(t, c);
                }
            }
            TriggerState::ProcessingTime { finished, .. }
            | TriggerState::Count { finished, .. } => *finished = true,
            TriggerState::Repeatedly(t) => fire_and_rearm(t, c),
            TriggerState::Any { children, finished } | TriggerState::All { children, finished } => {
                for t in children.iter_mut().filter(|t| t.should_fire(c)) {
                    t.on_fire(c);
                }
                *finished = true;
            }
            TriggerState::Each { children, current } => {
                if let Some(t) = children.get_mut(*current) {
                    t.on_fire(c);
                    if t.is_finished() {
                        *current += 1;
                    }
                }
            }
            TriggerState::OrFinally {
                main,
                until,
                finished,
            } => {
                // `until` firing ends it, with this pane; else it is `main`'s firing.
                if until.should_fire(c) {
                    until.on_fire(c);
                    *finished = true;
                } else {
                    main.on_fire(c);
                    *finished = main.is_finished();
                }
            }
            TriggerState::Never => {}
        }
    }

    pub fn is_finished(&self) -> bool {
        match self {
            TriggerState::Watermark { finished, .. }
            | TriggerState::ProcessingTime { finished, .. }
            | TriggerState::Count { finished, .. }
            | TriggerState::Any { finished, .. }
            | TriggerState::All { finished, .. }
            | TriggerState::OrFinally { finished, .. } => *finished,
            TriggerState::Repeatedly(_) | TriggerState::Never => false,
            TriggerState::Each { children, current } => *current >= children.len(),
        }
    }

    /// Back to the state of a fresh pane (after a repeated trigger fired).
    fn reset(&mut self) {
        match self {
            TriggerState::Watermark {
                on_time_fired,
                early,
                late,
                finished,
                ..
            } => {
                *on_time_fired = false;
                *finished = false;
                for t in [early, late].into_iter().flatten() {
                    t.reset();
                }
            }
            TriggerState::ProcessingTime {
                first, finished, ..
            } => {
                *first = None;
                *finished = false;
            }
            TriggerState::Count { seen, finished, .. } => {
                *seen = 0;
                *finished = false;
            }
            TriggerState::Repeatedly(t) => t.reset(),
            TriggerState::Any { children, finished } | TriggerState::All { children, finished } => {
                children.iter_mut().for_each(TriggerState::reset);
                *finished = false;
            }
            TriggerState::Each { children, current } => {
                children.iter_mut().for_each(TriggerState::reset);
                *current = 0;
            }
            TriggerState::OrFinally {
                main,
                until,
                finished,
            } => {
                main.reset();
                until.reset();
                *finished = false;
            }
            TriggerState::Never => {}
        }
    }

    /// The earliest processing time at which a processing-time trigger inside may fire: when
    /// the runtime must look again without new elements or watermark.
    pub fn next_deadline(&self) -> Option<i64> {
        if self.is_finished() {
            return None;
        }
        match self {
            TriggerState::Watermark {
                on_time_fired,
                early,
                late,
                ..
            } => {
                let sub = if *on_time_fired { late } else { early };
                sub.as_ref().and_then(|t| t.next_deadline())
            }
            TriggerState::ProcessingTime {
                delay, then, first, ..
            } => first.map(|f| deadline(f, *delay, then)),
            TriggerState::Count { .. } | TriggerState::Never => None,
            TriggerState::Repeatedly(t) => t.next_deadline(),
            TriggerState::Any { children, .. } | TriggerState::All { children, .. } => children
                .iter()
                .filter_map(TriggerState::next_deadline)
                .min(),
            TriggerState::Each { children, current } => {
                children.get(*current).and_then(TriggerState::next_deadline)
            }
            TriggerState::OrFinally { main, until, .. } => {
                [main.next_deadline(), until.next_deadline()]
                    .into_iter()
                    .flatten()
                    .min()
            }
        }
    }
}

/// Fires a sub-trigger that repeats: once it has finished, it starts over for the next pane.
fn fire_and_rearm(t: &mut TriggerState, c: &Clock) {
    t.on_fire(c);
    if t.is_finished() {
        t.reset();
    }
}
