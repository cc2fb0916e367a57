//! A compact binary form of [`Panes`] for the state store: a Combine's shard reads and
//! writes one per window touched every checkpoint, and JSON's text (field names, numbers
//! printed and parsed) cost more than the rest of the window's bookkeeping. Fixed-width
//! little-endian fields after a format byte; the trigger tree depth-first, a tag per node.
use super::Panes;
use crate::trigger::TriggerState;
use riverbank_pipeline::trigger::{AccumulationMode, OnTimeBehavior, TimeShift};

/// The first byte of every encoded `Panes` (JSON, the earlier form, starts with `{`).
const FORMAT: u8 = 1;

impl Panes {
    /// Appends the binary form to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(FORMAT);
        for v in [self.end, self.lateness] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in [self.emitted, self.nonspeculative, self.pending, self.taken] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.push(match self.accumulation {
            AccumulationMode::Discarding => 0,
            AccumulationMode::Accumulating => 1,
        });
        let fire_if_nonempty = self.on_time == OnTimeBehavior::FireIfNonEmpty;
        out.push(
            u8::from(self.on_time_emitted)
                | (u8::from(self.closed) << 1)
                | (u8::from(fire_if_nonempty) << 2),
        );
        encode_trigger(&self.trigger, out);
    }

    /// Reads what [`Self::encode`] wrote (or the JSON of earlier versions); the bytes used.
    pub fn decode(bytes: &[u8]) -> Result<(Panes, usize), String> {
        if bytes.first() == Some(&b'{') {
            let p = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
            return Ok((p, bytes.len()));
        }
        let mut r = Reader { bytes, at: 0 };
        if r.u8()? != FORMAT {
            return Err("pane state of an unknown format".into());
        }
        let (end, lateness) = (r.i64()?, r.i64()?);
        let (emitted, nonspeculative, pending, taken) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
        let accumulation = match r.u8()? {
            0 => AccumulationMode::Discarding,
            1 => AccumulationMode::Accumulating,
            m => return Err(format!("pane state: accumulation mode {m}")),
        };
        let flags = r.u8()?;
        let trigger = decode_trigger(&mut r, 0)?;
        let p = Panes {
            trigger,
            end,
            lateness,
            accumulation,
            emitted,
            nonspeculative,
            on_time_emitted: flags & 1 != 0,
            pending,
            taken,
            closed: flags & 2 != 0,
            on_time: match flags & 4 {
                0 => OnTimeBehavior::FireAlways,
                _ => OnTimeBehavior::FireIfNonEmpty,
            },
        };
        Ok((p, r.at))
    }
}

fn encode_trigger(t: &TriggerState, out: &mut Vec<u8>) {
    let opt = |t: &Option<Box<TriggerState>>, out: &mut Vec<u8>| match t {
        Some(t) => {
            out.push(1);
            encode_trigger(t, out);
        }
        None => out.push(0),
    };
    let all = |ts: &[TriggerState], out: &mut Vec<u8>| {
        out.extend_from_slice(&(ts.len() as u32).to_le_bytes());
        for t in ts {
            encode_trigger(t, out);
        }
    };
    match t {
        TriggerState::Watermark {
            end,
            on_time_fired,
            early,
            late,
            finished,
        } => {
            out.push(0);
            out.extend_from_slice(&end.to_le_bytes());
            out.push(u8::from(*on_time_fired) | (u8::from(*finished) << 1));
            opt(early, out);
            opt(late, out);
        }
        TriggerState::ProcessingTime {
            delay,
            then,
            first,
            finished,
        } => {
            out.push(1);
            out.extend_from_slice(&delay.to_le_bytes());
            let shifted = !then.is_empty();
            out.push(
                u8::from(first.is_some()) | (u8::from(*finished) << 1) | (u8::from(shifted) << 2),
            );
            out.extend_from_slice(&first.unwrap_or(0).to_le_bytes());
            // Steps after the delay (an alignment): only when there are some, so that what
            // was written before they existed reads the same.
            if shifted {
                out.extend_from_slice(&(then.len() as u32).to_le_bytes());
                for shift in then {
                    match *shift {
                        TimeShift::Delay { us } => {
                            out.push(0);
                            out.extend_from_slice(&us.to_le_bytes());
                        }
                        TimeShift::AlignTo {
                            period_us,
                            offset_us,
                        } => {
                            out.push(1);
                            out.extend_from_slice(&period_us.to_le_bytes());
                            out.extend_from_slice(&offset_us.to_le_bytes());
                        }
                    }
                }
            }
        }
        TriggerState::Count {
            count,
            seen,
            finished,
        } => {
            out.push(2);
            out.extend_from_slice(&count.to_le_bytes());
            out.extend_from_slice(&seen.to_le_bytes());
            out.push(u8::from(*finished));
        }
        TriggerState::Repeatedly(t) => {
            out.push(3);
            encode_trigger(t, out);
        }
        TriggerState::Any { children, finished } => {
            out.push(4);
            out.push(u8::from(*finished));
            all(children, out);
        }
        TriggerState::All { children, finished } => {
            out.push(5);
            out.push(u8::from(*finished));
            all(children, out);
        }
        TriggerState::Each { children, current } => {
            out.push(6);
            out.extend_from_slice(&(*current as u32).to_le_bytes());
            all(children, out);
        }
        TriggerState::OrFinally {
            main,
            until,
            finished,
        } => {
            out.push(7);
            out.push(u8::from(*finished));
            encode_trigger(main, out);
            encode_trigger(until, out);
        }
        TriggerState::Never => out.push(8),
    }
}

/// Deeper than any trigger a pipeline spells out: bad bytes end in an error, not a stack
/// overflow.
const MAX_DEPTH: usize = 64;

fn decode_trigger(r: &mut Reader<'_>, depth: usize) -> Result<TriggerState, String> {
    if depth > MAX_DEPTH {
        return Err("pane state: a trigger nested too deep".into());
    }
    let opt = |r: &mut Reader<'_>| -> Result<Option<Box<TriggerState>>, String> {
        Ok(match r.u8()? {
            0 => None,
            _ => Some(Box::new(decode_trigger(r, depth + 1)?)),
        })
    };
    let all = |r: &mut Reader<'_>| -> Result<Vec<TriggerState>, String> {
        let n = r.u32()? as usize;
        (0..n).map(|_| decode_trigger(r, depth + 1)).collect()
    };
    Ok(match r.u8()? {
        0 => {
            let end = r.i64()?;
            let flags = r.u8()?;
            TriggerState::Watermark {
                end,
                on_time_fired: flags & 1 != 0,
                early: opt(r)?,
                late: opt(r)?,
                finished: flags & 2 != 0,
            }
        }
        1 => {
            let delay = r.i64()?;
            let flags = r.u8()?;
            let first = r.i64()?;
            let mut then = vec![];
            if flags & 4 != 0 {
                for _ in 0..r.u32()? {
                    then.push(match r.u8()? {
                        0 => TimeShift::Delay { us: r.i64()? },
                        1 => TimeShift::AlignTo {
                            period_us: r.i64()?,
                            offset_us: r.i64()?,
                        },
                        s => return Err(format!("pane state: time shift {s}")),
                    });
                }
            }
            TriggerState::ProcessingTime {
                delay,
                then,
                first: (flags & 1 != 0).then_some(first),
                finished: flags & 2 != 0,
            }
        }
        2 => TriggerState::Count {
            count: r.u64()?,
            seen: r.u64()?,
            finished: r.u8()? != 0,
        },
        3 => TriggerState::Repeatedly(Box::new(decode_trigger(r, depth + 1)?)),
        4 => {
            let finished = r.u8()? != 0;
            TriggerState::Any {
                children: all(r)?,
                finished,
            }
        }
        5 => {
            let finished = r.u8()? != 0;
            TriggerState::All {
                children: all(r)?,
                finished,
            }
        }
        6 => {
            let current = r.u32()? as usize;
            TriggerState::Each {
                children: all(r)?,
                current,
            }
        }
        7 => {
            let finished = r.u8()? != 0;
            TriggerState::OrFinally {
                main: Box::new(decode_trigger(r, depth + 1)?),
                until: Box::new(decode_trigger(r, depth + 1)?),
                finished,
            }
        }
        8 => TriggerState::Never,
        t => return Err(format!("pane state: trigger tag {t}")),
    })
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let b = self
            .bytes
            .get(self.at..self.at + N)
            .ok_or("pane state cut short")?;
        self.at += N;
        Ok(b.try_into().expect("N bytes"))
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take()?))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take()?))
    }

    fn i64(&mut self) -> Result<i64, String> {
        Ok(i64::from_le_bytes(self.take()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trigger::Clock;
    use riverbank_pipeline::trigger::Triggering;

    fn triggering(json: serde_json::Value) -> Triggering {
        Triggering::parse(json.as_object().unwrap()).unwrap()
    }

    /// Every kind of trigger node, fresh and moved on by elements and clocks, reads back as
    /// it was written (compared through the JSON form, which prints every field); the
    /// earlier JSON form still reads; cut or unknown bytes are errors.
    #[test]
    fn panes_round_trip_through_the_binary_form_and_json_still_reads() {
        let specs = [
            serde_json::json!({}),
            serde_json::json!({"trigger": {"after_watermark": {
                "early": {"after_processing_time": "5s"},
                "late": {"after_count": 3}}},
                "allowed_lateness": "60s", "accumulation_mode": "accumulating"}),
            serde_json::json!({"trigger": {"repeatedly": {"after_any": [
                {"after_count": 2}, {"after_processing_time": "1s"}]}}}),
            serde_json::json!({"trigger": {"after_each": [
                {"after_count": 2}, {"after_all": [{"after_count": 1}, {"after_watermark": {}}]}]}}),
            serde_json::json!({"trigger": {"or_finally": {
                "main": {"repeatedly": {"after_count": 1}}, "until": "never"}}}),
        ];
        // Beam's aligned processing time has no YAML form: built as the SDK runner builds it.
        let mut aligned = triggering(serde_json::json!({}));
        aligned.trigger = riverbank_pipeline::trigger::Trigger::Repeatedly(Box::new(
            riverbank_pipeline::trigger::Trigger::AfterProcessingTime {
                delay_us: 1_000_000,
                then: vec![
                    TimeShift::AlignTo {
                        period_us: 60_000_000,
                        offset_us: 5_000_000,
                    },
                    TimeShift::Delay { us: 7 },
                ],
            },
        ));
        let specs = specs.map(triggering).into_iter().chain([aligned]);
        for t in specs {
            let spec = serde_json::to_value(&t.trigger).unwrap();
            let mut p = Panes::new(&t, 10_000_000);
            for step in 0..4 {
                let c = Clock {
                    watermark: step * 4_000_000,
                    now: step * 3_000_000,
                };
                let mut bytes = vec![];
                p.encode(&mut bytes);
                bytes.extend_from_slice(b"rest");
                let (back, used) = Panes::decode(&bytes).unwrap();
                assert_eq!(used, bytes.len() - 4, "{spec}");
                assert_eq!(
                    serde_json::to_value(&back).unwrap(),
                    serde_json::to_value(&p).unwrap(),
                    "{spec} at step {step}"
                );
                let json = serde_json::to_vec(&p).unwrap();
                let (from_json, _) = Panes::decode(&json).unwrap();
                assert_eq!(
                    serde_json::to_value(&from_json).unwrap(),
                    serde_json::to_value(&p).unwrap()
                );
                for cut in 0..bytes.len() - 4 {
                    assert!(
                        Panes::decode(&bytes[..cut]).is_err(),
                        "{spec}: cut at {cut}"
                    );
                }
                p.add_elements(2, &c);
                p.on_clock(&c);
            }
        }
        assert!(Panes::decode(&[9, 0, 0]).is_err());
    }
}
