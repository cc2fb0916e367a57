//! A UTC microsecond timestamp written to JSON as Arrow's writer writes it
//! (`"2024-01-01T00:00:00.000004Z"`: RFC 3339, no fraction, or 3 or 6 digits as the value
//! needs, `Z`), without the time-zone lookup and calendar conversion through chrono that Arrow
//! does per value: a sink of Nexmark's bids spent 8 % of its time there.
use arrow::array::PrimitiveArray;
use arrow::datatypes::TimestampMicrosecondType;
use arrow::error::ArrowError;
use arrow::json::writer::Encoder;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use std::io::Write;

/// The years written here; outside them (Beam's far instants are strings by then) Arrow's
/// own formatting is used.
const YEARS: std::ops::RangeInclusive<i64> = 0..=9999;

pub(crate) struct UtcMicros<'a> {
    values: &'a PrimitiveArray<TimestampMicrosecondType>,
    /// Arrow's own, for the years outside [`YEARS`].
    arrow: ArrayFormatter<'a>,
    /// The last whole second written, as `"YYYY-MM-DDTHH:MM:SS`: a stream's consecutive
    /// timestamps mostly share it, and the calendar is most of the cost.
    second: Option<(i64, [u8; 20])>,
}

impl<'a> UtcMicros<'a> {
    pub(crate) fn new(
        values: &'a PrimitiveArray<TimestampMicrosecondType>,
    ) -> Result<Self, ArrowError> {
        // As Arrow's JSON writer makes its formatter of temporal values.
        let options = FormatOptions::new().with_display_error(true);
        Ok(UtcMicros {
            values,
            arrow: ArrayFormatter::try_new(values, &options)?,
            second: None,
        })
    }
}

impl Encoder for UtcMicros<'_> {
    fn encode(&mut self, idx: usize, out: &mut Vec<u8>) {
        let v = self.values.value(idx);
        let (secs, micros) = (v.div_euclid(1_000_000), v.rem_euclid(1_000_000));
        let second = match self.second {
            Some((s, text)) if s == secs => text,
            _ => match second_text(secs) {
                Some(text) => {
                    self.second = Some((secs, text));
                    text
                }
                None => {
                    out.push(b'"');
                    let _ = write!(out, "{}", self.arrow.value(idx));
                    out.push(b'"');
                    return;
                }
            },
        };
        out.extend_from_slice(&second);
        // chrono's `SecondsFormat::AutoSi`: as many digits as the value needs, by threes.
        let mut fraction = *b".000000Z\"";
        let text: &[u8] = match micros {
            0 => b"Z\"",
            m if m % 1000 == 0 => {
                digits(&mut fraction[1..4], (m / 1000) as u64);
                fraction[4..6].copy_from_slice(b"Z\"");
                &fraction[..6]
            }
            m => {
                digits(&mut fraction[1..7], m as u64);
                &fraction
            }
        };
        out.extend_from_slice(text);
    }
}

/// `"YYYY-MM-DDTHH:MM:SS` of a second since 1970, for the years in [`YEARS`].
fn second_text(secs: i64) -> Option<[u8; 20]> {
    let (days, of_day) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    if !YEARS.contains(&year) {
        return None;
    }
    let mut text = *b"\"0000-00-00T00:00:00";
    digits(&mut text[1..5], year as u64);
    digits(&mut text[6..8], month.into());
    digits(&mut text[9..11], day.into());
    digits(&mut text[12..14], (of_day / 3600) as u64);
    digits(&mut text[15..17], (of_day / 60 % 60) as u64);
    digits(&mut text[18..20], (of_day % 60) as u64);
    Some(text)
}

/// `v` in the decimal digits of `out`, zero-padded on the left.
fn digits(out: &mut [u8], mut v: u64) {
    for b in out.iter_mut().rev() {
        *b = b'0' + (v % 10) as u8;
        v /= 10;
    }
}

/// (year, month, day) of the day `days` after 1970-01-01, in the proleptic Gregorian calendar
/// (Howard Hinnant's `civil_from_days`), for any day an i64 of microseconds reaches.
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use arrow::array::{RecordBatch, TimestampMicrosecondArray};
    use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    use std::sync::Arc;

    /// A batch's JSON lines with Arrow's own encoders, or with Riverbank's.
    fn lines(batch: &RecordBatch, ours: bool) -> String {
        let mut b = arrow::json::WriterBuilder::new().with_explicit_nulls(true);
        if ours {
            b = b.with_encoder_factory(crate::any::encoders());
        }
        let mut w = b.build::<_, arrow::json::writer::LineDelimited>(vec![]);
        w.write(batch).unwrap();
        w.finish().unwrap();
        String::from_utf8(w.into_inner()).unwrap()
    }

    /// Whole seconds, milliseconds and microseconds, before 1970 and after, leap days, the
    /// ends of the years written here and past them, and nulls: as Arrow writes them.
    #[test]
    fn utc_timestamps_are_written_as_arrow_writes_them() {
        let day = 86_400_000_000i64;
        let mut values: Vec<Option<i64>> = vec![
            Some(0),
            Some(4),
            Some(1_000),
            Some(1_000_001),
            Some(-1),
            Some(-1_000),
            Some(-day),
            Some(1_704_067_200_000_004),
            Some(951_782_400_000_000),     // 2000-02-29
            Some(-62_167_219_200_000_000), // 0000-01-01
            Some(253_402_300_799_999_999), // 9999-12-31T23:59:59.999999
            Some(253_402_300_800_000_000), // 10000-01-01
            Some(-62_167_219_200_000_001),
            None,
        ];
        // Runs of consecutive values sharing their second (as a stream's do), across a leap
        // day's midnight and across 1970's.
        for start in [1_709_164_799_000_000i64, -2_000_000] {
            values.extend((0..10_000).map(|i| Some(start + i * 333)));
        }
        // And a spread of others, by a fixed walk.
        let mut x: i64 = 0x2545_F491_4F6C_DD1D;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            values.push(Some(x.rem_euclid(400 * 365 * day) - 200 * 365 * day));
        }
        let ts = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        let schema = Arc::new(Schema::new(vec![Field::new("t", ts, true)]));
        let array = TimestampMicrosecondArray::from(values).with_timezone("UTC");
        let batch = RecordBatch::try_new(schema, vec![Arc::new(array)]).unwrap();
        let (arrow, ours) = (lines(&batch, false), lines(&batch, true));
        for (a, o) in arrow.lines().zip(ours.lines()) {
            assert_eq!(o, a);
        }
        assert_eq!(ours, arrow);
    }
}
