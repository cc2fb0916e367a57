//! An endless keyed event stream for streaming demos, tests, autoscaling and benchmarks: one
//! element per sequence number, with a key drawn from a distribution (uniform, Zipf, or one hot
//! key), a value, and an event time that lags the element's nominal time by a random skew.
//!
//! Everything depends only on the options and the sequence number: element `n` is the same
//! whoever generates it and however the stream is cut into batches, so a source can be rewound
//! to a checkpointed sequence number and replay exactly. The nominal time of element `n` is
//! `start + n / rate`; a runtime paces emission to it in wall time.
use crate::rng::{Rng, mix64};
use arrow::array::{Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use std::sync::Arc;

/// How keys are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KeyDistribution {
    Uniform,
    /// Key `k` (0-based) with probability proportional to `1 / (k + 1)^exponent`.
    Zipf {
        exponent: f64,
    },
    /// Key 0 takes `fraction` of the elements; the rest are uniform over the other keys.
    HotKey {
        fraction: f64,
    },
}

/// The stream's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticOptions {
    /// Elements per second of nominal time.
    pub rate: f64,
    /// Distinct keys (`key-0` … `key-{keys-1}`).
    pub keys: u64,
    pub distribution: KeyDistribution,
    /// Event times lag nominal times by up to this much (uniformly): out-of-order data.
    pub event_time_skew_us: i64,
    /// Nominal time of element 0, microseconds since the epoch.
    pub start_us: i64,
    pub seed: u64,
    /// This fraction of the elements is late: its event time lags by `late_by_us` more than
    /// the skew, behind the watermark the source promises (late data, for lateness tests).
    pub late_fraction: f64,
    pub late_by_us: i64,
}

impl Default for SyntheticOptions {
    fn default() -> Self {
        SyntheticOptions {
            rate: 1000.0,
            keys: 100,
            distribution: KeyDistribution::Uniform,
            event_time_skew_us: 0,
            // 2024-01-01T00:00:00Z.
            start_us: 1_704_067_200_000_000,
            seed: crate::DEFAULT_SEED,
            late_fraction: 0.0,
            late_by_us: 0,
        }
    }
}

/// The elements' columns: `key`, `value`, `seq`, `event_time`.
pub fn synthetic_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("value", DataType::Int64, false),
        Field::new("seq", DataType::Int64, false),
        Field::new(
            "event_time",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
    ]))
}

/// Draws keys; the Zipf table is built once.
#[derive(Debug, Clone)]
pub struct SyntheticStream {
    opts: SyntheticOptions,
    /// Cumulative probabilities of the keys (Zipf only).
    cdf: Vec<f64>,
    /// The rate's segments: (nominal start time, first element, rate), the first at
    /// `start_us` with `rate` (see [`SyntheticStream::with_rate_steps`]).
    segments: Vec<(i64, f64, f64)>,
}

impl SyntheticStream {
    pub fn new(opts: SyntheticOptions) -> SyntheticStream {
        let cdf = match opts.distribution {
            KeyDistribution::Zipf { exponent } => {
                let weights: Vec<f64> = (0..opts.keys.max(1))
                    .map(|k| 1.0 / ((k + 1) as f64).powf(exponent))
                    .collect();
                let total: f64 = weights.iter().sum();
                let mut acc = 0.0;
                weights
                    .iter()
                    .map(|w| {
                        acc += w / total;
                        acc
                    })
                    .collect()
            }
            _ => vec![],
        };
        let segments = vec![(opts.start_us, 0.0, opts.rate.max(1e-9))];
        SyntheticStream {
            opts,
            cdf,
            segments,
        }
    }

    /// A rate that changes: from `after_us` past the start on, `rate` elements per second (a
    /// load step, for autoscaling). Steps in increasing `after_us`; ones out of order are
    /// ignored.
    pub fn with_rate_steps(mut self, steps: &[(i64, f64)]) -> SyntheticStream {
        for &(after_us, rate) in steps {
            let &(t, first, r) = self.segments.last().expect("one segment at least");
            let at = self.opts.start_us + after_us;
            if at <= t {
                continue;
            }
            let first = first + (at - t) as f64 * r / 1e6;
            self.segments.push((at, first, rate.max(1e-9)));
        }
        self
    }

    /// Elements whose nominal time is at or before `now_us`.
    pub fn available_at(&self, now_us: i64) -> u64 {
        if now_us < self.opts.start_us {
            return 0;
        }
        let &(t, first, r) = self
            .segments
            .iter()
            .rev()
            .find(|s| s.0 <= now_us)
            .expect("now is past the start");
        (first + (now_us - t) as f64 * r / 1e6).floor() as u64 + 1
    }

    pub fn options(&self) -> &SyntheticOptions {
        &self.opts
    }

    /// Nominal time of element `seq`.
    pub fn nominal_us(&self, seq: u64) -> i64 {
        let n = seq as f64;
        let &(t, first, r) = self
            .segments
            .iter()
            .rev()
            .find(|s| s.1 <= n)
            .unwrap_or(&self.segments[0]);
        t + ((n - first) * 1e6 / r) as i64
    }

    /// The event-time watermark a source may promise once it has emitted every element before
    /// `next_seq`: no later element has an earlier event time.
    pub fn watermark_us(&self, next_seq: u64) -> i64 {
        self.nominal_us(next_seq) - self.opts.event_time_skew_us
    }

    /// The key of element `seq` (0-based index).
    pub fn key_of(&self, seq: u64) -> u64 {
        let mut rng = Rng::new(mix64(self.opts.seed ^ seq.wrapping_mul(0x9E37_79B9)));
        let keys = self.opts.keys.max(1);
        match self.opts.distribution {
            KeyDistribution::Uniform => rng.below(keys),
            KeyDistribution::Zipf { .. } => {
                let u = rng.f64();
                (self.cdf.partition_point(|c| *c < u) as u64).min(keys - 1)
            }
            KeyDistribution::HotKey { fraction } => {
                if keys == 1 || rng.chance(fraction) {
                    0
                } else {
                    1 + rng.below(keys - 1)
                }
            }
        }
    }

    /// Elements `first .. first + n`.
    pub fn batch(&self, first: u64, n: usize) -> RecordBatch {
        self.batch_of(first..first + n as u64)
    }

    /// The elements with these sequence numbers, in this order (a partition's share).
    pub fn batch_of(&self, seqs_in: impl Iterator<Item = u64>) -> RecordBatch {
        let n = seqs_in.size_hint().0;
        let mut keys = Vec::with_capacity(n);
        let mut values = Vec::with_capacity(n);
        let mut seqs = Vec::with_capacity(n);
        let mut times = Vec::with_capacity(n);
        for seq in seqs_in {
            let mut rng = Rng::new(mix64(!self.opts.seed ^ seq));
            keys.push(format!("key-{}", self.key_of(seq)));
            values.push(1 + rng.below(100) as i64);
            seqs.push(seq as i64);
            let skew = if self.opts.event_time_skew_us > 0 {
                rng.below(self.opts.event_time_skew_us as u64 + 1) as i64
            } else {
                0
            };
            // Drawn last, and only when asked for: the other columns never change with it.
            let late = if self.opts.late_fraction > 0.0 && rng.chance(self.opts.late_fraction) {
                self.opts.late_by_us
            } else {
                0
            };
            times.push(self.nominal_us(seq) - skew - late);
        }
        RecordBatch::try_new(
            synthetic_schema(),
            vec![
                Arc::new(StringArray::from(keys)),
                Arc::new(Int64Array::from(values)),
                Arc::new(Int64Array::from(seqs)),
                Arc::new(TimestampMicrosecondArray::from(times).with_timezone("UTC")),
            ],
        )
        .expect("columns match the schema")
    }
}

#[cfg(test)]
mod rate_step_tests {
    use super::*;

    #[test]
    fn a_rate_step_changes_the_pace_and_keeps_element_times_in_order() {
        let s = SyntheticStream::new(SyntheticOptions {
            rate: 100.0,
            start_us: 0,
            ..Default::default()
        })
        .with_rate_steps(&[(10_000_000, 400.0), (20_000_000, 100.0)]);
        // 100/s for 10 s, 400/s for 10 s, then 100/s again.
        assert_eq!(s.available_at(5_000_000), 501);
        assert_eq!(s.available_at(15_000_000), 1000 + 2000 + 1);
        assert_eq!(s.available_at(25_000_000), 1000 + 4000 + 500 + 1);
        assert_eq!(s.nominal_us(1000), 10_000_000);
        assert_eq!(s.nominal_us(3000), 15_000_000);
        assert_eq!(s.nominal_us(5500), 25_000_000);
        for seq in [0, 999, 1000, 4999, 5000, 7000] {
            let t = s.nominal_us(seq);
            assert!(
                s.available_at(t) > seq,
                "element {seq} is out by its own time"
            );
            assert!(s.nominal_us(seq + 1) >= t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::AsArray;
    use arrow::datatypes::TimestampMicrosecondType;

    fn keys(s: &SyntheticStream, n: u64) -> Vec<u64> {
        let mut counts = vec![0u64; s.options().keys as usize];
        for seq in 0..n {
            counts[s.key_of(seq) as usize] += 1;
        }
        counts
    }

    #[test]
    fn elements_depend_only_on_their_sequence_number() {
        let s = SyntheticStream::new(SyntheticOptions {
            event_time_skew_us: 5_000_000,
            ..Default::default()
        });
        let whole = s.batch(0, 100);
        let parts = [s.batch(0, 40), s.batch(40, 60)];
        let joined = arrow::compute::concat_batches(&synthetic_schema(), &parts).unwrap();
        assert_eq!(whole, joined);
        // Event times lag nominal times by at most the skew, and the watermark holds.
        let times = whole.column(3).as_primitive::<TimestampMicrosecondType>();
        for (seq, t) in times.values().iter().enumerate() {
            let nominal = s.nominal_us(seq as u64);
            assert!((nominal - 5_000_000..=nominal).contains(t));
            assert!(
                *t >= s.watermark_us(seq as u64),
                "element {seq} behind the watermark"
            );
        }
        assert_eq!(s.nominal_us(1000), s.options().start_us + 1_000_000);
    }

    #[test]
    fn key_distributions_have_their_shapes() {
        let n = 200_000;
        let uniform = keys(&SyntheticStream::new(SyntheticOptions::default()), n);
        assert!(
            uniform.iter().all(|c| (1_600..2_400).contains(c)),
            "{uniform:?}"
        );
        let zipf = keys(
            &SyntheticStream::new(SyntheticOptions {
                distribution: KeyDistribution::Zipf { exponent: 1.0 },
                ..Default::default()
            }),
            n,
        );
        // Key 0 about twice key 1, ten times key 9 (harmonic weights over 100 keys: ~19 %).
        assert!((35_000..42_000).contains(&zipf[0]), "{}", zipf[0]);
        let ratio = zipf[0] as f64 / zipf[9] as f64;
        assert!((8.5..11.5).contains(&ratio), "{ratio}");
        let hot = keys(
            &SyntheticStream::new(SyntheticOptions {
                distribution: KeyDistribution::HotKey { fraction: 0.5 },
                ..Default::default()
            }),
            n,
        );
        assert!((98_000..102_000).contains(&hot[0]), "{}", hot[0]);
        assert!(hot[1..].iter().all(|c| *c < 1_500));
    }
}
