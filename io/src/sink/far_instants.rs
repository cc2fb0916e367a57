//! Timestamps beyond what the text encoders can print. Beam's minimum timestamp (the one of
//! elements that have none, and the window around it) lies about 290,000 years before the
//! epoch, past chrono's range, where Arrow's CSV and JSON writers would write an
//! `"ERROR: Cast error…"` string in place of the value. Such columns are formatted here
//! instead, as extended ISO 8601 (`-290308-12-21T19:59:05.225Z`, the way Beam's Java SDK
//! prints `TIMESTAMP_MIN_VALUE`); values in range keep the writers' own format.
use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit, TimestampMicrosecondType};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use std::sync::Arc;

/// The batch with each microsecond-timestamp column that holds an instant chrono cannot
/// represent turned into strings; the batch itself when there is none (the usual case).
pub(super) fn printable(batch: &RecordBatch) -> RecordBatch {
    let far = |c: &ArrayRef| {
        matches!(c.data_type(), DataType::Timestamp(TimeUnit::Microsecond, _))
            && c.as_primitive::<TimestampMicrosecondType>()
                .iter()
                .flatten()
                .any(|us| chrono::DateTime::from_timestamp_micros(us).is_none())
    };
    if !batch.columns().iter().any(far) {
        return batch.clone();
    }
    let mut fields = Vec::with_capacity(batch.num_columns());
    let mut columns = Vec::with_capacity(batch.num_columns());
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        if far(column) {
            fields.push(Field::new(
                field.name(),
                DataType::Utf8,
                field.is_nullable(),
            ));
            columns.push(Arc::new(as_strings(column)) as ArrayRef);
        } else {
            fields.push(field.as_ref().clone());
            columns.push(column.clone());
        }
    }
    let schema = Arc::new(Schema::new_with_metadata(
        fields,
        batch.schema().metadata().clone(),
    ));
    RecordBatch::try_new(schema, columns).expect("same columns, same lengths")
}

fn as_strings(column: &ArrayRef) -> StringArray {
    let options = FormatOptions::default();
    let shown = ArrayFormatter::try_new(column.as_ref(), &options).ok();
    let values = column.as_primitive::<TimestampMicrosecondType>();
    (0..values.len())
        .map(|i| {
            values.is_valid(i).then(|| {
                let us = values.value(i);
                match (&shown, chrono::DateTime::from_timestamp_micros(us)) {
                    (Some(f), Some(_)) => f.value(i).to_string(),
                    _ => extended_iso(us),
                }
            })
        })
        .collect()
}

/// `us` microseconds after the epoch as `[-]YYYY…-MM-DDTHH:MM:SS.mmmZ` in the proleptic
/// Gregorian calendar, for any i64.
fn extended_iso(us: i64) -> String {
    let days = us.div_euclid(86_400_000_000);
    let in_day = us.rem_euclid(86_400_000_000);
    let (year, month, day) = riverbank_elements::utc_json::civil_from_days(days);
    let (h, m) = (in_day / 3_600_000_000, in_day / 60_000_000 % 60);
    let (s, ms) = (in_day / 1_000_000 % 60, in_day / 1_000 % 1_000);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{ms:03}Z")
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, TimestampMicrosecondArray};

    #[test]
    fn beams_minimum_timestamp_prints_as_its_java_sdk_does() {
        // BoundedWindow.TIMESTAMP_MIN_VALUE, -9223372036854775 ms.
        assert_eq!(
            extended_iso(-9_223_372_036_854_775_000),
            "-290308-12-21T19:59:05.225Z"
        );
        assert_eq!(extended_iso(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            extended_iso(951_782_400_000_000),
            "2000-02-29T00:00:00.000Z"
        );
        assert_eq!(extended_iso(-1), "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn only_columns_with_far_instants_turn_into_strings() {
        let ts = |v: Vec<Option<i64>>| {
            Arc::new(TimestampMicrosecondArray::from(v).with_timezone("UTC")) as ArrayRef
        };
        let batch = RecordBatch::try_from_iter([
            ("n", Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef),
            ("near", ts(vec![Some(0), None])),
            ("far", ts(vec![Some(i64::MIN), Some(0)])),
        ])
        .unwrap();
        let out = printable(&batch);
        assert_eq!(
            out.schema().field(1).data_type(),
            batch.schema().field(1).data_type()
        );
        assert_eq!(out.schema().field(2).data_type(), &DataType::Utf8);
        let far = out.column(2).as_string::<i32>();
        assert_eq!(far.value(0), "-290308-12-21T19:59:05.224Z");
        assert_eq!(far.value(1), "1970-01-01T00:00:00Z");
        // A batch without any keeps its columns.
        let plain = batch.project(&[0, 1]).unwrap();
        assert_eq!(printable(&plain).schema(), plain.schema());
    }
}
