//! Event-time watermarks. A source keeps one per partition — the largest event time seen, less
//! the out-of-orderness it allows (Flink's bounded out-of-orderness) — and its watermark is the
//! smallest of its partitions', so no partition's data is called late because another ran
//! ahead. A partition silent for longer than the idle timeout stops holding the others back
//! until it speaks again. A stage's input watermark is the smallest of its inputs'. Watermarks
//! never go back.
/// The watermark of data that will not come: every window fires.
pub const END_OF_TIME: i64 = i64::MAX;
/// Before any data: nothing is on time yet.
pub const BEFORE_TIME: i64 = i64::MIN;

#[derive(Debug, Clone)]
struct Partition {
    /// Largest event time seen.
    max_event: Option<i64>,
    /// Processing time of the last record, or of the start.
    last_active: i64,
    finished: bool,
}

/// A source's partitions and the watermark they allow.
#[derive(Debug, Clone)]
pub struct PartitionWatermarks {
    parts: Vec<Partition>,
    out_of_orderness: i64,
    idle_timeout: i64,
    current: i64,
}

impl PartitionWatermarks {
    /// `partitions` partitions, first heard of at processing time `now`.
    pub fn new(partitions: usize, out_of_orderness: i64, idle_timeout: i64, now: i64) -> Self {
        PartitionWatermarks {
            parts: vec![
                Partition {
                    max_event: None,
                    last_active: now,
                    finished: false,
                };
                partitions
            ],
            out_of_orderness,
            idle_timeout,
            current: BEFORE_TIME,
        }
    }

    /// A record of `partition` with event time `ts` was read at `now`.
    pub fn record(&mut self, partition: usize, ts: i64, now: i64) {
        if let Some(p) = self.parts.get_mut(partition) {
            p.max_event = Some(p.max_event.map_or(ts, |m| m.max(ts)));
            p.last_active = now;
        }
    }

    /// The partition has no more data (a bounded source read to its end, or a drain).
    pub fn finish(&mut self, partition: usize) {
        if let Some(p) = self.parts.get_mut(partition) {
            p.finished = true;
        }
    }

    /// Whether `partition` is idle at `now`: it holds nobody back.
    pub fn is_idle(&self, partition: usize, now: i64) -> bool {
        self.parts
            .get(partition)
            .is_some_and(|p| !p.finished && now.saturating_sub(p.last_active) >= self.idle_timeout)
    }

    /// The source's watermark at `now`.
    pub fn watermark(&mut self, now: i64) -> i64 {
        let mut active = self
            .parts
            .iter()
            .enumerate()
            .filter(|(i, p)| !p.finished && !self.is_idle(*i, now))
            .map(|(_, p)| {
                p.max_event
                    .map_or(BEFORE_TIME, |m| m.saturating_sub(self.out_of_orderness))
            })
            .peekable();
        let candidate = if active.peek().is_none() {
            if self.parts.iter().all(|p| p.finished) {
                END_OF_TIME
            } else {
                // Every live partition is idle: hold where the data got to, do not jump ahead.
                self.current
            }
        } else {
            active.min().unwrap_or(BEFORE_TIME)
        };
        self.current = self.current.max(candidate);
        self.current
    }
}

/// A stage's input watermark: the earliest of its inputs'.
pub fn combine(inputs: impl IntoIterator<Item = i64>) -> i64 {
    inputs.into_iter().min().unwrap_or(END_OF_TIME)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;

    #[test]
    fn the_slowest_partition_holds_the_watermark_less_the_out_of_orderness() {
        let mut w = PartitionWatermarks::new(2, 5 * S, 60 * S, 0);
        assert_eq!(w.watermark(0), BEFORE_TIME, "nothing read yet");
        w.record(0, 100 * S, S);
        assert_eq!(
            w.watermark(S),
            BEFORE_TIME,
            "partition 1 has said nothing and is not idle yet"
        );
        w.record(1, 40 * S, 2 * S);
        assert_eq!(w.watermark(2 * S), 35 * S);
        // An out-of-order record does not move it back.
        w.record(1, 20 * S, 3 * S);
        assert_eq!(w.watermark(3 * S), 35 * S);
        w.record(1, 200 * S, 4 * S);
        assert_eq!(w.watermark(4 * S), 95 * S, "now partition 0 is the slowest");
    }

    #[test]
    fn an_idle_partition_stops_holding_the_others_back_until_it_speaks() {
        let mut w = PartitionWatermarks::new(2, 0, 10 * S, 0);
        w.record(0, 50 * S, S);
        w.record(1, 10 * S, S);
        assert_eq!(w.watermark(S), 10 * S);
        // Partition 1 goes quiet; partition 0 goes on.
        w.record(0, 80 * S, 12 * S);
        assert!(w.is_idle(1, 12 * S));
        assert_eq!(w.watermark(12 * S), 80 * S);
        // It speaks again, behind: the watermark does not go back (its data is late).
        w.record(1, 30 * S, 13 * S);
        assert_eq!(w.watermark(13 * S), 80 * S);
        // Everyone idle: the watermark holds.
        assert_eq!(w.watermark(100 * S), 80 * S);
    }

    #[test]
    fn finished_partitions_release_the_watermark_to_the_end_of_time() {
        let mut w = PartitionWatermarks::new(2, 0, 10 * S, 0);
        w.record(0, 50 * S, S);
        w.record(1, 70 * S, S);
        w.finish(0);
        assert_eq!(w.watermark(S), 70 * S);
        w.finish(1);
        assert_eq!(w.watermark(S), END_OF_TIME);
        assert_eq!(combine([END_OF_TIME, 5]), 5);
        assert_eq!(combine([]), END_OF_TIME);
    }
}
