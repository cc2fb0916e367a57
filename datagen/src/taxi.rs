//! Generation of one day of synthetic yellow-taxi trips as a single Arrow batch.
//!
//! A whole day is generated at once (≈100k rows, ~15 MB) because pickups are sorted by
//! time within the day, like the real files; callers slice it into smaller batches.
//! Every random draw comes from one RNG seeded by (seed, calendar date), so output is
//! independent of batch size, thread count and of which other days are generated.

use std::sync::{Arc, OnceLock};

use arrow::array::{
    ArrayRef, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
    TimestampMicrosecondArray,
};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use chrono::{Datelike, NaiveDate, Weekday};

use crate::rng::{Rng, mix64, splitmix64};
use crate::zones::{Area, EWR, Geo, JFK, LGA};

/// Pickups per hour, weekdays. Hours 0–5 are the real counts of Monday 2024-01-15; the
/// rest follows the usual weekday shape (evening peak 17–19h).
const WEEKDAY_HOURS: [f64; 24] = [
    2237.0, 1085.0, 754.0, 443.0, 358.0, 483.0, 1150.0, 2350.0, 3200.0, 3500.0, 3650.0, 3850.0,
    4100.0, 4250.0, 4550.0, 4700.0, 4800.0, 5250.0, 5400.0, 4850.0, 4300.0, 4250.0, 3900.0, 3100.0,
];

/// Pickups per hour on Saturdays and Sundays: busy nights, slow mornings.
const WEEKEND_HOURS: [f64; 24] = [
    3400.0, 2700.0, 1900.0, 1200.0, 600.0, 400.0, 450.0, 750.0, 1300.0, 1900.0, 2700.0, 3400.0,
    3900.0, 4100.0, 4200.0, 4200.0, 4200.0, 4400.0, 4600.0, 4300.0, 3900.0, 3900.0, 3900.0, 3800.0,
];

/// Typical door-to-door speed (mph) of a short Manhattan trip by hour of day.
const SPEED_MPH: [f64; 24] = [
    16.0, 17.0, 18.0, 18.0, 18.0, 17.0, 14.0, 11.0, 9.5, 9.5, 9.5, 9.0, 9.0, 9.0, 8.5, 8.5, 8.5,
    8.5, 9.0, 10.5, 11.5, 12.5, 13.5, 14.5,
];

const MICROS_PER_SECOND: i64 = 1_000_000;

/// The TLC 2024 yellow-taxi schema. Every field is nullable because that is how the
/// real parquet files declare them (they are written from pandas); only
/// passenger_count, RatecodeID, store_and_fwd_flag, congestion_surcharge and
/// Airport_fee actually contain nulls.
pub fn taxi_schema() -> SchemaRef {
    static SCHEMA: OnceLock<SchemaRef> = OnceLock::new();
    SCHEMA
        .get_or_init(|| {
            let ts = DataType::Timestamp(TimeUnit::Microsecond, None);
            let f = |name: &str, dt: DataType| Field::new(name, dt, true);
            Arc::new(Schema::new(vec![
                f("VendorID", DataType::Int32),
                f("tpep_pickup_datetime", ts.clone()),
                f("tpep_dropoff_datetime", ts),
                f("passenger_count", DataType::Int64),
                f("trip_distance", DataType::Float64),
                f("RatecodeID", DataType::Int64),
                f("store_and_fwd_flag", DataType::Utf8),
                f("PULocationID", DataType::Int32),
                f("DOLocationID", DataType::Int32),
                f("payment_type", DataType::Int64),
                f("fare_amount", DataType::Float64),
                f("extra", DataType::Float64),
                f("mta_tax", DataType::Float64),
                f("tip_amount", DataType::Float64),
                f("tolls_amount", DataType::Float64),
                f("improvement_surcharge", DataType::Float64),
                f("total_amount", DataType::Float64),
                f("congestion_surcharge", DataType::Float64),
                f("Airport_fee", DataType::Float64),
            ]))
        })
        .clone()
}

/// What kind of record a row is; drives nulls and the sign of the amounts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Ordinary trip.
    Normal,
    /// payment_type 0 ("flex fare"/unknown): the null-heavy rows of the real data.
    Unknown,
    /// Refund or correction: every amount negated.
    Refund,
    /// Voided trip: all amounts zero.
    Void,
}

/// Column buffers for one day; money is kept in integer cents so that
/// total_amount is exactly the sum of its parts.
struct Columns {
    vendor: Vec<i32>,
    pickup: Vec<i64>,
    dropoff: Vec<i64>,
    passengers: Vec<i64>,
    known: Vec<bool>,
    distance: Vec<f64>,
    ratecode: Vec<i64>,
    stored: Vec<bool>,
    pu: Vec<i32>,
    dz: Vec<i32>,
    payment: Vec<i64>,
    fare: Vec<f64>,
    extra: Vec<f64>,
    mta: Vec<f64>,
    tip: Vec<f64>,
    tolls: Vec<f64>,
    improvement: Vec<f64>,
    total: Vec<f64>,
    congestion: Vec<f64>,
    airport: Vec<f64>,
}

impl Columns {
    fn with_capacity(n: usize) -> Self {
        Columns {
            vendor: Vec::with_capacity(n),
            pickup: Vec::with_capacity(n),
            dropoff: Vec::with_capacity(n),
            passengers: Vec::with_capacity(n),
            known: Vec::with_capacity(n),
            distance: Vec::with_capacity(n),
            ratecode: Vec::with_capacity(n),
            stored: Vec::with_capacity(n),
            pu: Vec::with_capacity(n),
            dz: Vec::with_capacity(n),
            payment: Vec::with_capacity(n),
            fare: Vec::with_capacity(n),
            extra: Vec::with_capacity(n),
            mta: Vec::with_capacity(n),
            tip: Vec::with_capacity(n),
            tolls: Vec::with_capacity(n),
            improvement: Vec::with_capacity(n),
            total: Vec::with_capacity(n),
            congestion: Vec::with_capacity(n),
            airport: Vec::with_capacity(n),
        }
    }

    fn into_batch(self) -> RecordBatch {
        let nulls = NullBuffer::from(self.known);
        let nulls = (nulls.null_count() > 0).then_some(nulls);
        let i64_opt = |v: Vec<i64>| Arc::new(Int64Array::new(v.into(), nulls.clone())) as ArrayRef;
        let f64_opt =
            |v: Vec<f64>| Arc::new(Float64Array::new(v.into(), nulls.clone())) as ArrayRef;
        let f64_col = |v: Vec<f64>| Arc::new(Float64Array::from(v)) as ArrayRef;
        let flags: StringArray = self
            .stored
            .iter()
            .enumerate()
            .map(|(i, &y)| {
                let known = nulls.as_ref().is_none_or(|n| n.is_valid(i));
                known.then_some(if y { "Y" } else { "N" })
            })
            .collect();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int32Array::from(self.vendor)),
            Arc::new(TimestampMicrosecondArray::from(self.pickup)),
            Arc::new(TimestampMicrosecondArray::from(self.dropoff)),
            i64_opt(self.passengers),
            f64_col(self.distance),
            i64_opt(self.ratecode),
            Arc::new(flags),
            Arc::new(Int32Array::from(self.pu)),
            Arc::new(Int32Array::from(self.dz)),
            Arc::new(Int64Array::from(self.payment)),
            f64_col(self.fare),
            f64_col(self.extra),
            f64_col(self.mta),
            f64_col(self.tip),
            f64_col(self.tolls),
            f64_col(self.improvement),
            f64_col(self.total),
            f64_opt(self.congestion),
            f64_opt(self.airport),
        ];
        RecordBatch::try_new(taxi_schema(), columns)
            .expect("columns are built to match taxi_schema")
    }
}

#[inline]
fn dollars(cents: i64) -> f64 {
    cents as f64 / 100.0
}

/// Seed for one calendar day. Keyed on the date rather than the position in the run so
/// that e.g. January 15 is the same whether generated alone or as part of a month.
fn day_seed(seed: u64, date: NaiveDate) -> u64 {
    let mut s = seed;
    splitmix64(&mut s) ^ mix64(date.num_days_from_ce() as u64 ^ 0xDA7E_0000_0000)
}

fn cdf(weights: &[f64; 24]) -> [f64; 24] {
    let total: f64 = weights.iter().sum();
    let mut acc = 0.0;
    let mut out = [0.0; 24];
    for (o, w) in out.iter_mut().zip(weights) {
        acc += w;
        *o = acc / total;
    }
    out
}

/// Tip in cents for a card payment: mostly the screen's 20/25/30% buttons, some
/// custom amounts, and about one in six riders tipping nothing.
fn card_tip(base_cents: i64, rng: &mut Rng) -> i64 {
    let u = rng.f64();
    let pct = if u < 0.18 {
        return 0;
    } else if u < 0.26 {
        15.0
    } else if u < 0.33 {
        18.0
    } else if u < 0.68 {
        20.0
    } else if u < 0.85 {
        25.0
    } else if u < 0.92 {
        30.0
    } else if u < 0.96 {
        return 100 * (1 + rng.below(5) as i64);
    } else {
        rng.range(10.0, 40.0)
    };
    (base_cents as f64 * pct / 100.0).round() as i64
}

fn passengers(vendor: i32, rng: &mut Rng) -> i64 {
    if vendor == 1 && rng.chance(0.06) {
        return 0; // only one vendor's meters report zero passengers
    }
    let u = rng.f64();
    match u {
        _ if u < 0.765 => 1,
        _ if u < 0.915 => 2,
        _ if u < 0.950 => 3,
        _ if u < 0.972 => 4,
        _ if u < 0.988 => 5,
        _ => 6,
    }
}

/// All rows of one day, pickups sorted by time.
pub(crate) fn generate_day(seed: u64, date: NaiveDate, rows: usize) -> RecordBatch {
    let geo = Geo::get();
    let mut rng = Rng::new(day_seed(seed, date));
    let weekend = matches!(date.weekday(), Weekday::Sat | Weekday::Sun);
    let hour_cdf = cdf(if weekend {
        &WEEKEND_HOURS
    } else {
        &WEEKDAY_HOURS
    });
    let day_start = date
        .and_hms_opt(0, 0, 0)
        .map(|t| t.and_utc().timestamp())
        .unwrap_or_default()
        * MICROS_PER_SECOND;

    // Pickup second-of-day for every row, then sorted like a real monthly file.
    let mut offsets: Vec<u32> = (0..rows)
        .map(|_| {
            let u = rng.f64();
            let hour = hour_cdf.partition_point(|&c| c <= u).min(23) as u32;
            hour * 3600 + rng.below(3600) as u32
        })
        .collect();
    offsets.sort_unstable();

    let mut c = Columns::with_capacity(rows);
    for off in offsets {
        let hour = (off / 3600) as usize;
        let kind = match rng.f64() {
            u if u < 0.040 => Kind::Unknown,
            u if u < 0.048 => Kind::Refund,
            u if u < 0.050 => Kind::Void,
            _ => Kind::Normal,
        };
        let vendor = match kind {
            Kind::Refund => 2,
            Kind::Unknown => 1 + i32::from(!rng.chance(0.15)),
            _ => 1 + i32::from(!rng.chance(0.24)),
        };

        // Where.
        let pu = geo.pickup.sample(&mut rng);
        let zero_trip = kind == Kind::Void || rng.chance(0.012);
        let dz = if zero_trip && rng.chance(0.8) {
            pu
        } else {
            geo.sample_dropoff(pu, &mut rng)
        };
        let (a_pu, a_do) = (geo.area(pu), geo.area(dz));
        let (px, py) = geo.pos(pu);
        let (dx, dy) = geo.pos(dz);
        let straight = (px - dx + rng.range(-0.35, 0.35)).hypot(py - dy + rng.range(-0.35, 0.35));
        let distance = if zero_trip {
            0.0
        } else if pu == dz {
            let u = rng.f64();
            0.3 + 1.5 * u * u
        } else {
            straight * rng.range(1.15, 1.45) + 0.1
        };
        let distance = (distance * 100.0).round() / 100.0;

        // When: duration from distance and the hour's traffic; highways are faster.
        let secs = if zero_trip {
            rng.range(5.0, 300.0)
        } else {
            let highway = if straight > 6.0 {
                1.7
            } else if straight > 3.0 {
                1.3
            } else {
                1.0
            };
            let weekend_boost = if weekend { 1.15 } else { 1.0 };
            let speed = SPEED_MPH[hour] * highway * weekend_boost * (0.22 * rng.normal()).exp();
            distance / speed * 3600.0 + rng.range(40.0, 200.0)
        };
        let secs = secs.clamp(5.0, 4.0 * 3600.0).round() as i64;
        let pickup = day_start + i64::from(off) * MICROS_PER_SECOND;

        // Rate code and metered fare (2023+ tariff: $3 flag drop, ~$2.80/mi blended,
        // $0.35/min blended; the meter clicks in 70-cent steps).
        let jfk_manhattan =
            (pu == JFK && a_do == Area::Manhattan) || (dz == JFK && a_pu == Area::Manhattan);
        let ratecode: i64 = if dz == EWR {
            3
        } else if jfk_manhattan && rng.chance(0.9) {
            2
        } else if rng.chance(0.004) {
            5
        } else if distance > 12.0 && a_do == Area::Outer && rng.chance(0.05) {
            4
        } else if rng.chance(0.0005) {
            99
        } else {
            1
        };
        let minutes = secs as f64 / 60.0;
        let metered = 300 + 70 * ((280.0 * distance + 35.0 * minutes) / 70.0).round() as i64;
        let mut fare = match ratecode {
            2 => 7000,
            3 => metered + 2000,
            4 => 2 * metered - 300,
            5 => 100 * (20 + rng.below(131) as i64),
            _ => metered,
        };
        let weekday_rush = !weekend && (16..20).contains(&hour);
        let night = !(6..20).contains(&hour);
        let mut extra = match ratecode {
            2 if weekday_rush => 500,
            2 | 5 => 0,
            _ if weekday_rush => 250,
            _ if night => 100,
            _ => 0,
        };
        let mut mta = if ratecode == 5 { 0 } else { 50 };
        let mut improvement = 100;
        let mut congestion = if geo.in_congestion_zone(pu) || geo.in_congestion_zone(dz) {
            250
        } else {
            0
        };
        let mut airport = if pu == JFK || pu == LGA { 175 } else { 0 };
        let mut tolls = if pu == EWR || dz == EWR {
            1706
        } else if zero_trip {
            0
        } else {
            let p = if a_pu == Area::Airport || a_do == Area::Airport {
                0.45
            } else if a_pu != a_do || (a_pu == Area::Outer && straight > 8.0) {
                0.15
            } else {
                0.0
            };
            if rng.chance(p) { 694 } else { 0 }
        };

        let payment: i64 = match kind {
            Kind::Unknown => 0,
            Kind::Normal => match rng.f64() {
                u if u < 0.82 => 1,
                u if u < 0.97 => 2,
                u if u < 0.978 => 3,
                _ => 4,
            },
            Kind::Refund => match rng.f64() {
                u if u < 0.60 => 4,
                u if u < 0.85 => 2,
                _ => 3,
            },
            Kind::Void => 3 + i64::from(rng.chance(0.5)),
        };

        let mut tip = 0;
        match kind {
            Kind::Normal => {
                if payment == 1 {
                    let base = fare + extra + mta + tolls + improvement + congestion + airport;
                    tip = card_tip(base, &mut rng);
                }
            }
            Kind::Unknown => {
                // App-dispatched rows: no meter extras, congestion/airport fees unreported.
                extra = 0;
                congestion = 0;
                airport = 0;
                if rng.chance(0.45) {
                    tip = card_tip(fare + mta + tolls + improvement, &mut rng);
                }
            }
            Kind::Refund => {
                for v in [
                    &mut fare,
                    &mut extra,
                    &mut mta,
                    &mut tolls,
                    &mut improvement,
                    &mut congestion,
                    &mut airport,
                ] {
                    *v = -*v;
                }
            }
            Kind::Void => {
                for v in [
                    &mut fare,
                    &mut extra,
                    &mut mta,
                    &mut tolls,
                    &mut improvement,
                    &mut congestion,
                    &mut airport,
                ] {
                    *v = 0;
                }
            }
        }
        let total = fare + extra + mta + tip + tolls + improvement + congestion + airport;
        let known = kind != Kind::Unknown;

        c.vendor.push(vendor);
        c.pickup.push(pickup);
        c.dropoff.push(pickup + secs * MICROS_PER_SECOND);
        c.passengers.push(if known {
            passengers(vendor, &mut rng)
        } else {
            0
        });
        c.known.push(known);
        c.distance.push(distance);
        c.ratecode.push(if known { ratecode } else { 0 });
        c.stored.push(vendor == 1 && rng.chance(0.02));
        c.pu.push(i32::from(pu));
        c.dz.push(i32::from(dz));
        c.payment.push(payment);
        c.fare.push(dollars(fare));
        c.extra.push(dollars(extra));
        c.mta.push(dollars(mta));
        c.tip.push(dollars(tip));
        c.tolls.push(dollars(tolls));
        c.improvement.push(dollars(improvement));
        c.total.push(dollars(total));
        c.congestion.push(dollars(congestion));
        c.airport.push(dollars(airport));
    }
    c.into_batch()
}
