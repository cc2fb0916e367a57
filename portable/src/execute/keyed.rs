//! A stateful DoFn's timers and state between the bundles of a chain, and, in a streaming run,
//! from round to round. Timers are kept by (family, key + tag + windows): a later setting of
//! the same timer replaces the earlier one, a cleared one removes it. A timer fires when the
//! clock passes it: an event-time timer once the watermark is past its time, a processing-time
//! one once the wall clock reaches it; a batch run (and a streaming one whose sources ended)
//! is at the end of time, where every timer fires.
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use prost::bytes::Bytes;

use crate::coders::{Interval, Shape, TimerBytes};
use crate::error::PortableError;
use crate::fnapi::{TimerFamily, UserState};
use crate::plan::Keyed;

use super::checkpoint::{BucketState, TimerState};

/// The time timers are compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Clock {
    /// Millis; `i64::MAX` once the input is complete.
    pub watermark: i64,
    /// The wall clock, millis since the epoch.
    pub now: i64,
}

impl Clock {
    /// A batch run's: every timer fires.
    pub const END: Clock = Clock {
        watermark: i64::MAX,
        now: i64::MAX,
    };

    /// The clock at `watermark`, now.
    pub fn at(watermark: i64) -> Clock {
        Clock {
            watermark,
            now: now_millis(),
        }
    }

    fn fires(&self, processing_time: bool, fire: i64) -> bool {
        if self.watermark == i64::MAX {
            return true;
        }
        match processing_time {
            true => fire <= self.now,
            false => fire < self.watermark,
        }
    }
}

/// The wall clock: millis since the epoch.
pub(crate) fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

/// Timers set and not fired yet: by (family, identity), each's firing time, output-watermark
/// hold and encoding.
#[derive(Debug, Clone, Default)]
pub(crate) struct TimerSet {
    set: HashMap<(TimerFamily, Vec<u8>), (i64, i64, Bytes)>,
}

impl TimerSet {
    /// Applies what a bundle wrote to `family` (timers of `shape`), in order.
    pub fn apply(
        &mut self,
        family: &TimerFamily,
        blocks: &[Bytes],
        shape: &Shape,
    ) -> Result<(), PortableError> {
        for block in blocks {
            let mut pos = 0;
            while pos < block.len() {
                let t = TimerBytes::read(shape, block, pos)?;
                let id = (family.clone(), t.identity.to_vec());
                match t.cleared {
                    true => self.set.remove(&id),
                    false => self
                        .set
                        .insert(id, (t.fire, t.hold, block.slice(pos..t.end))),
                };
                pos = t.end;
            }
        }
        Ok(())
    }

    /// Takes the timers `clock` fires: one entry per family of `keyed`, each in firing order;
    /// `None` when none fires.
    pub fn take_due(
        &mut self,
        keyed: &Keyed,
        clock: Clock,
    ) -> Option<Vec<(TimerFamily, Vec<Bytes>)>> {
        let due: Vec<(TimerFamily, Vec<u8>)> = self
            .set
            .iter()
            .filter(|((family, _), (fire, _, _))| {
                clock.fires(in_processing_time(keyed, family), *fire)
            })
            .map(|(id, _)| id.clone())
            .collect();
        if due.is_empty() {
            return None;
        }
        let mut by_family: HashMap<TimerFamily, Vec<(i64, Bytes)>> = HashMap::new();
        for id in due {
            let (fire, _, bytes) = self.set.remove(&id).expect("listed");
            by_family.entry(id.0).or_default().push((fire, bytes));
        }
        let fired = keyed
            .timer_families
            .iter()
            .map(|(t, f, _)| {
                let family = (t.clone(), f.clone());
                let mut timers = by_family.remove(&family).unwrap_or_default();
                timers.sort_by_key(|(fire, _)| *fire);
                (family, timers.into_iter().map(|(_, b)| b).collect())
            })
            .collect();
        Some(fired)
    }

    fn any_due(&self, keyed: &Keyed, clock: Clock) -> bool {
        self.set.iter().any(|((family, _), (fire, _, _))| {
            clock.fires(in_processing_time(keyed, family), *fire)
        })
    }

    /// The earliest processing-time timer (millis).
    fn next_processing(&self, keyed: &Keyed) -> Option<i64> {
        self.set
            .iter()
            .filter(|((family, _), _)| in_processing_time(keyed, family))
            .map(|(_, (fire, _, _))| *fire)
            .min()
    }

    /// The earliest output timestamp a timer holds.
    fn hold(&self) -> Option<i64> {
        self.set.values().map(|(_, hold, _)| *hold).min()
    }

    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// The timers, for a checkpoint.
    fn save(&self) -> Vec<TimerState> {
        self.set
            .iter()
            .map(|((family, identity), (fire, _, timer))| TimerState {
                transform: family.0.clone(),
                family: family.1.clone(),
                identity: identity.clone(),
                fire: *fire,
                timer: timer.to_vec(),
            })
            .collect()
    }

    fn restore(timers: Vec<TimerState>) -> TimerSet {
        let set = timers
            .into_iter()
            .map(|t| {
                let hold = TimerBytes::hold_in(&t.timer, t.identity.len()).unwrap_or(t.fire);
                let id = ((t.transform, t.family), t.identity);
                (id, (t.fire, hold, Bytes::from(t.timer)))
            })
            .collect();
        TimerSet { set }
    }
}

fn in_processing_time(keyed: &Keyed, family: &TimerFamily) -> bool {
    keyed
        .processing_time
        .iter()
        .any(|(t, f)| *t == family.0 && *f == family.1)
}

/// A streaming run's stateful stage: its keys cut into a fixed number of buckets (the input is
/// cut by key hash into as many), each with its user state and the timers it left set, kept
/// from round to round. A bucket's bundle runs on a copy of them, which replaces them when it
/// succeeds: a failed attempt's writes are dropped with it.
pub(crate) struct KeyedRounds {
    keyed: Arc<Keyed>,
    buckets: Vec<Mutex<Bucket>>,
    clock: Mutex<Clock>,
    /// For interval windows: the input's allowed lateness (millis); a window's state goes
    /// once the watermark is past its end and that lateness (Beam's garbage collection).
    expiry: Option<i64>,
}

struct Bucket {
    user: Arc<UserState>,
    timers: TimerSet,
    /// Changed since the last checkpoint written (a bundle ran on it, state expired, it was
    /// restored): saved again at the next.
    changed: bool,
}

/// Buckets of a streaming stateful stage: enough for every harness to have bundles.
pub(crate) const BUCKETS: usize = 16;

impl KeyedRounds {
    /// `expiry`: the allowed lateness of the input's windows when they are interval windows
    /// (a global window's state is kept).
    pub fn new(keyed: &Keyed, expiry: Option<i64>) -> KeyedRounds {
        KeyedRounds {
            keyed: Arc::new(keyed.clone()),
            buckets: (0..BUCKETS)
                .map(|_| {
                    Mutex::new(Bucket {
                        user: Arc::new(UserState::with_bags(&keyed.bags)),
                        timers: TimerSet::default(),
                        // The first checkpoint writes every bucket: a restore takes them all.
                        changed: true,
                    })
                })
                .collect(),
            clock: Mutex::new(Clock::at(i64::MIN)),
            expiry,
        }
    }

    /// Drops the state of windows the round's watermark has expired, once the round's timers
    /// have fired (they may read it); how many states went.
    pub fn expire(&self) -> usize {
        let Some(lateness) = self.expiry else {
            return 0;
        };
        let watermark = self.clock().watermark;
        let expired = |window: &[u8]| {
            Interval::decode(window).is_ok_and(|w| (w.end - 1).saturating_add(lateness) < watermark)
        };
        self.buckets
            .iter()
            .map(|b| {
                let mut b = b.lock().expect("bucket");
                let dropped = b.user.drop_windows(expired);
                b.changed |= dropped > 0;
                dropped
            })
            .sum()
    }

    pub fn set_clock(&self, clock: Clock) {
        *self.clock.lock().expect("clock") = clock;
    }

    pub fn clock(&self) -> Clock {
        *self.clock.lock().expect("clock")
    }

    /// Which buckets have a timer the clock fires.
    pub fn due(&self) -> Vec<bool> {
        let clock = self.clock();
        self.buckets
            .iter()
            .map(|b| b.lock().expect("bucket").timers.any_due(&self.keyed, clock))
            .collect()
    }

    /// The earliest processing-time timer of any bucket (millis).
    pub fn next_processing(&self) -> Option<i64> {
        self.buckets
            .iter()
            .filter_map(|b| {
                b.lock()
                    .expect("bucket")
                    .timers
                    .next_processing(&self.keyed)
            })
            .min()
    }

    /// The earliest output timestamp the stage's timers hold (Beam's watermark hold): the
    /// stages after it see no watermark past it until that timer fires, so what the timer
    /// outputs then is not late for them.
    pub fn hold(&self) -> Option<i64> {
        self.buckets
            .iter()
            .filter_map(|b| b.lock().expect("bucket").timers.hold())
            .min()
    }

    /// Timers set and not fired, over all buckets.
    pub fn timers(&self) -> usize {
        self.buckets
            .iter()
            .map(|b| b.lock().expect("bucket").timers.len())
            .sum()
    }

    /// Every bucket's state and timers, for a checkpoint; with `only_changed`, those of the
    /// buckets changed since [`Self::saved`] (the others empty), and which those are.
    pub fn save(&self, only_changed: bool) -> (Vec<BucketState>, HashSet<u32>) {
        let mut changed = HashSet::new();
        let buckets = self
            .buckets
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let b = b.lock().expect("bucket");
                if b.changed {
                    changed.insert(i as u32);
                } else if only_changed {
                    return BucketState::default();
                }
                let (bags, lists) = b.user.save();
                BucketState {
                    bags,
                    lists,
                    timers: b.timers.save(),
                }
            })
            .collect();
        (buckets, changed)
    }

    /// A checkpoint with what [`Self::save`] gave was written: no bucket changed since.
    pub fn saved(&self) {
        for b in &self.buckets {
            b.lock().expect("bucket").changed = false;
        }
    }

    /// The buckets a checkpoint saved, in place of these (fresh) ones.
    pub fn restore(&self, buckets: Vec<BucketState>) -> Result<(), PortableError> {
        if buckets.len() != self.buckets.len() {
            return Err(PortableError::Checkpoint(format!(
                "{} buckets of keyed state, where this runner keeps {}",
                buckets.len(),
                self.buckets.len()
            )));
        }
        for (mine, saved) in self.buckets.iter().zip(buckets) {
            let mut mine = mine.lock().expect("bucket");
            let user = UserState::with_bags(&self.keyed.bags);
            user.restore(saved.bags, saved.lists)
                .map_err(PortableError::Checkpoint)?;
            mine.user = Arc::new(user);
            mine.timers = TimerSet::restore(saved.timers);
            mine.changed = true;
        }
        Ok(())
    }

    /// A copy of bucket `b`'s state and timers for a bundle to run on.
    pub fn checkout(&self, b: usize) -> (Arc<UserState>, TimerSet) {
        let bucket = self.buckets[b].lock().expect("bucket");
        (Arc::new(bucket.user.snapshot()), bucket.timers.clone())
    }

    /// What a bundle of bucket `b` left, which succeeded.
    pub fn commit(&self, b: usize, user: Arc<UserState>, timers: TimerSet) {
        let mut bucket = self.buckets[b].lock().expect("bucket");
        bucket.user = user;
        bucket.timers = timers;
        bucket.changed = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_time_timers_wait_for_the_watermark_and_processing_time_ones_for_the_clock() {
        let clock = Clock {
            watermark: 10_000,
            now: 50_000,
        };
        assert!(clock.fires(false, 9_999));
        assert!(!clock.fires(false, 10_000));
        assert!(clock.fires(true, 50_000));
        assert!(!clock.fires(true, 50_001));
        assert!(Clock::END.fires(true, i64::MAX - 1));
        assert!(Clock::END.fires(false, i64::MAX - 1));
    }

    /// As the Python SDK encodes a timer of key `k` (a str) in the global window, firing at
    /// `fire` and holding at `hold` (millis).
    fn timer(key: &str, fire: u64, hold: u64) -> Bytes {
        let mut b = vec![key.len() as u8];
        b.extend(key.as_bytes());
        b.extend([0, 0, 0, 0, 1, 0]); // no tag, one global window, set
        b.extend((fire ^ (1 << 63)).to_be_bytes());
        b.extend((hold ^ (1 << 63)).to_be_bytes());
        b.push(0x0f); // pane: unknown
        Bytes::from(b)
    }

    #[test]
    fn the_earliest_hold_of_the_timers_set_is_kept_through_a_checkpoint() {
        let shape = Shape::Timer {
            key: Box::new(Shape::Bytes),
            window: Box::new(Shape::GlobalWindow),
        };
        let family: TimerFamily = ("t".into(), "flush".into());
        let mut set = TimerSet::default();
        assert_eq!(set.hold(), None);
        // A processing-time timer far ahead holding at an element's time, and an event-time
        // one holding at its own; a later setting of the first replaces its hold.
        let blocks = [timer("a", 90_000, 2_000), timer("b", 7_000, 7_000)];
        set.apply(&family, &blocks, &shape).unwrap();
        assert_eq!(set.hold(), Some(2_000));
        set.apply(&family, &[timer("a", 95_000, 8_000)], &shape)
            .unwrap();
        assert_eq!(set.hold(), Some(7_000));
        let restored = TimerSet::restore(set.save());
        assert_eq!(restored.hold(), Some(7_000));
        assert_eq!(restored.len(), 2);
    }
}
